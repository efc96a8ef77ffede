"""Training of models the pipeline uses beside the target (e.g. the draft model of `laser train-draft`)."""
