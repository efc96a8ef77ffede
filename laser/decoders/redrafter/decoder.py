"""The ``redrafter`` decoder: a recurrent draft head on the target's last hidden state drafts ``beam_width``
beams of ``beam_length`` tokens (the guaranteed token included), packed by their shared prefixes into
one tree and verified in one target forward (``laser.decoders.redrafter.head``).

- Greedy (temperature 0): exact, the target's greedy tokens for every width and length.
- Sampling: ``sampling_rule="exact"`` (default) verifies the tree by multi-draft rejection with the
  beams as deterministic drafts (exact sampling from the target); ``"paper"`` is the paper's rule
  (u < p/q per beam with the head's q, residual ``norm(relu(p - q))``; not provably exact).

``head`` names a head trained by ``laser train-redrafter`` (``<laser cache>/heads/<name>.pt``), a path,
or, in code, a :class:`RecurrentDraftHead`. A head trained for another model is refused.
"""

from __future__ import annotations

from typing import Any, Literal

from laser.decoders.base import Decoder
from laser.decoders.registry import register_decoder
from laser.drafting import DraftSource, Drafter
from laser.models import LoadedModel
from laser.decoders.redrafter.head import (
    PaperSamplingVerifier,
    ReDrafter,
    RecurrentDraftHead,
    head_path,
    model_fingerprint,
)
from laser.sampling import GREEDY, SamplingParams
from laser.verify import RejectionSampler, Verifier


@register_decoder
class ReDrafterDecoder(Decoder):
    name = "redrafter"
    summary = (
        "ReDrafter: recurrent draft head on the target's hidden state, beam search, beams packed by "
        "shared prefix (dynamic tree attention); greedy (lossless) or sampling ('exact' or 'paper' rule)"
    )
    pool = "none"
    requires = ("head",)

    def __init__(
        self,
        lm: LoadedModel,
        head: str | RecurrentDraftHead | None = None,
        beam_width: int = 2,
        beam_length: int = 4,
        dedup: bool = True,
        sampling_rule: Literal["exact", "paper"] = "exact",
    ):
        if not isinstance(beam_width, int) or beam_width < 1:
            raise ValueError(f"beam_width must be an integer >= 1, got {beam_width!r}")
        if not isinstance(beam_length, int) or beam_length < 2:
            raise ValueError(
                f"beam_length must be an integer >= 2 (the guaranteed token + drafts), got {beam_length!r}"
            )
        if sampling_rule not in ("exact", "paper"):
            raise ValueError(f"sampling_rule must be 'exact' or 'paper', got {sampling_rule!r}")
        if head is None:
            raise ValueError("redrafter needs decoder.params.head: a head trained with `laser train-redrafter CONFIG`")
        super().__init__(lm)
        self.sampling_rule = sampling_rule
        if isinstance(head, RecurrentDraftHead):
            self.head, self.head_name = head, getattr(head, "name", "in-memory head")
            if head.fingerprint != model_fingerprint(lm.model):
                raise ValueError(f"this ReDrafter head was built for another model than {lm.name!r}")
        else:
            self.head = RecurrentDraftHead.load(head_path(head), lm.model, repr(lm.name))
            self.head_name = head
        self.beam_width, self.beam_length, self.dedup = beam_width, beam_length, dedup

    @classmethod
    def greedy_params(cls) -> dict[str, Any] | None:
        return None  # lossless at temperature 0, but only with a trained head, which a job must name

    def verifier(self) -> Verifier:
        return PaperSamplingVerifier() if self.sampling_rule == "paper" else RejectionSampler()

    def params(self) -> dict[str, Any]:
        return {
            "head": self.head_name,
            "beam_width": self.beam_width,
            "beam_length": self.beam_length,
            "dedup": self.dedup,
            "sampling_rule": self.sampling_rule,
        }

    def drafter(
        self,
        prompt_ids: list[int],
        pool: DraftSource | None = None,
        sampling: SamplingParams = GREEDY,
        state: Any = None,
    ) -> Drafter:
        return ReDrafter(
            self.head,
            self.beam_width,
            self.beam_length,
            self.dedup,
            sampling,
            paper_sampling=self.sampling_rule == "paper",
        )
