"""Training of what the pipeline uses beside the target: draft models (`laser train-draft`) and ReDrafter heads (`laser train-redrafter`)."""
