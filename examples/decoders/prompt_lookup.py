"""An example third-party decoder: prompt lookup (drafts copied from the request's own context).

It is a complete plug-in: a drafter, the decoder class that declares what it needs, and registration
through the ``laser.decoders`` entry-point group in the plug-in's own package metadata::

    [project.entry-points."laser.decoders"]
    prompt_lookup = "prompt_lookup:PromptLookup"

Once installed beside laser (on every Ray node, or through ``runtime_env``), ``decoder.name:
prompt_lookup`` works in ``laser run`` with no change to laser. The test suite installs this file that
way and runs a job with it (tests/unit/test_decoder_plugins.py).
"""

from __future__ import annotations

from typing import Any, Sequence

from laser import Decoder, DraftTree, Drafter, LoadedModel


class LookupDrafter(Drafter):
    """Finds the latest earlier occurrence of the context's last n tokens and drafts what followed it."""

    def __init__(self, max_ngram: int, num_tokens: int):
        self.max_ngram, self.num_tokens = max_ngram, num_tokens

    def propose(self, context: Sequence[int], budget: int | None = None) -> DraftTree:
        limit = self.num_tokens if budget is None else min(budget, self.num_tokens)
        ctx = list(context)
        for n in range(min(self.max_ngram, len(ctx) - 1), 0, -1):
            tail = ctx[-n:]
            for start in range(len(ctx) - n - 1, -1, -1):  # latest match first, never the tail itself
                if ctx[start : start + n] == tail:
                    draft = ctx[start + n : start + n + limit]
                    return DraftTree.chain(ctx[-1], draft)
        return DraftTree.chain(ctx[-1])


class PromptLookup(Decoder):
    name = "prompt_lookup"
    summary = "prompt lookup: chains copied from the request's own context, greedy (lossless) verification"
    pool = "none"  # drafts come from the request itself; no retrieval pool

    def __init__(self, lm: LoadedModel, max_ngram: int = 3, num_tokens: int = 8):
        if max_ngram < 1 or num_tokens < 1:
            raise ValueError(f"max_ngram and num_tokens must be >= 1, got {max_ngram}, {num_tokens}")
        super().__init__(lm)
        self.max_ngram, self.num_tokens = max_ngram, num_tokens

    @classmethod
    def greedy_params(cls) -> dict[str, Any]:
        return {}  # the default verifier is greedy at temperature 0: lossless as it is

    def params(self) -> dict[str, Any]:
        return {"max_ngram": self.max_ngram, "num_tokens": self.num_tokens}

    def drafter(self, prompt_ids: list[int], pool=None, sampling=None, state=None) -> Drafter:
        return LookupDrafter(self.max_ngram, self.num_tokens)
