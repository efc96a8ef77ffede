"""Operations around the knowledge: the run's lock, ledger and latest view, scheduler exit codes
(``schedule``), and the feature store (``features``)."""
