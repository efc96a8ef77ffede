"""Developer tools: benchmarks (``bench``) and training of drafts, heads and fine-tunes (``train``)."""
