"""Knowledge as features: vectors of the latest view (``encode``) and a Feast repository over them (``feast_repo``)."""
