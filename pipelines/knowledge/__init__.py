"""The knowledge job: its steps, requests and prompts, the generation workers, text quality and the
knowledge store."""
