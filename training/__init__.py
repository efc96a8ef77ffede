"""Training of what the pipeline uses beside the target (a research tool, above the pipeline: nothing in `laser`,
`pools`, `router`, `pipelines` or `jobs` imports it): draft models (`laser train-draft`), ReDrafter heads
(`laser train-redrafter`), the recommender's fine-tune (`laser train-recommender`) and AtSpeed-aligned drafts
(`laser train-align`); the commands are in `cli.py`, their shared loop in `loop.py`."""
