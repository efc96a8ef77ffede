"""Operations around the job: scheduled incremental runs (``schedule``) and the feature store
(``features``)."""
