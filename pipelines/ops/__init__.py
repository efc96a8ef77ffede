"""Operations around the knowledge: the run's ledger and latest view, scheduler exit codes (``schedule``),
the feature store (``features``) and the run's figures pushed to Prometheus (``pushgateway``)."""
