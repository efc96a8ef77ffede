"""Beam-search decoders for generative recommendation: the top-K item identifiers after a prompt.

- ``beam``: plain constrained beam search of width K (the reference), one target forward per step.
- ``atspeed``: speculative beam search (AtSpeed): a draft model's beam search of width ``N`` for ``gamma``
  steps is laid out with the live beams as one tree, verified in one target forward; strict top-K
  verification returns exactly ``beam``'s ranked items and scores.

Both run on the engine (``laser.engine``) through its beam hook: the request's beams live in its
``request.state`` (a :class:`BeamState`); their shared prefixes stay in the target's KV cache between steps
(``laser.decoders.beam.search.PrefixTree``), so a step feeds only the live beams' ends and the drafted nodes.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Sequence

from laser.decoders.beam.search import BeamDrafter, BeamSearchVerifier, BeamState, ItemTrie
from laser.decoders.base import Decoder, Prompt
from laser.decoders.draft_model.decoders import UsesDraftModel
from laser.decoders.registry import register_decoder
from laser.drafting import Drafter
from laser.models import LoadedModel
from laser.request import DecodeStats, Request
from laser.sampling import GREEDY, SamplingParams
from laser.verify import Verifier


def beam_state(state: BeamState | None) -> BeamState:
    """A beam request's state (``recommend_batch`` always passes one)."""
    if state is None:
        raise ValueError("a beam decoder's drafter needs the request's BeamState")
    return state


@dataclass
class Recommendation:
    """The top-K items of one prompt, best first, with the decoding counters."""

    items: list[tuple[str, float]]  # (item_id, cumulative log-probability of its identifier)
    stats: DecodeStats
    beam_steps: int  # beam steps done (identifier length of the longest search path)
    seconds: float = 0.0


class BeamDecoder(Decoder):
    """Base of the item-recommending decoders: ``recommend_batch`` instead of text generation."""

    pool = "none"
    produces = "ranking"

    @classmethod
    def greedy_params(cls) -> dict[str, Any] | None:
        return None  # it ranks items; it does not write text

    def verifier(self) -> Verifier:
        return BeamSearchVerifier()

    def drafter(
        self, prompt_ids: list[int], pool: Any = None, sampling: SamplingParams = GREEDY, state: BeamState | None = None
    ) -> Drafter:
        """Lays the request's live beams (``state``) out as each step's tree."""
        return BeamDrafter(beam_state(state))

    def sampling(self, seed: int | None = None) -> SamplingParams:
        """The request's sampling settings (its seeded generator drives sampling verifiers)."""
        return GREEDY

    def recommend_batch(
        self, prompts: Sequence[Prompt], trie: ItemTrie, K: int, seeds: Sequence[int] | None = None
    ) -> list[Recommendation]:
        """The top-``K`` items of ``trie`` after each prompt, decoded together in one padded batch.
        ``seeds`` (sampling verifiers only): one per prompt, default the decoder's own seed."""
        t0 = time.perf_counter()
        seqs = []
        chosen: list[int | None] = list(seeds) if seeds is not None else [None] * len(prompts)
        if len(chosen) != len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(chosen)} seeds")
        for p, seed in zip(prompts, chosen):
            ids, state, sampling = self.encode(p), BeamState(trie, K), self.sampling(seed)
            seqs.append(
                Request(
                    tokens=list(ids),
                    prompt_len=len(ids),
                    drafter=self.drafter(ids, None, sampling, state),
                    max_new_tokens=trie.max_len + 1,
                    sampling=sampling,
                    state=state,
                )
            )
        self.engine.run(seqs)
        dt = time.perf_counter() - t0
        out = []
        for s in seqs:
            st: BeamState = s.state
            if not st.finished:
                raise RuntimeError(f"beam search stopped before every beam was complete ({s.stats.finish_reason})")
            out.append(Recommendation(st.ranked(), s.stats, sum(st.steps_per_forward), dt))
        return out

    def recommend(self, prompt: Prompt, trie: ItemTrie, K: int) -> Recommendation:
        return self.recommend_batch([prompt], trie, K)[0]


@register_decoder
class Beam(BeamDecoder):
    name = "beam"
    summary = "constrained beam search of width K over item identifiers (the recommendation reference)"


@register_decoder
class AtSpeed(UsesDraftModel, BeamDecoder):
    """AtSpeed speculative beam search: ``gamma`` draft steps of width ``N`` verified in one target forward.

    ``verification="strict"``: the target's own beam step is run on the tree's rows for as long as every
    live target beam was drafted, so the ranked items and scores are exactly ``beam``'s. ``draft`` as for
    ``spec_sampling`` (a path, bundled name, cached hub id, ``truncate:N``, or a LoadedModel in code).
    """

    name = "atspeed"
    summary = "AtSpeed speculative beam search: a draft model's beams verified in one forward; strict top-K is lossless"

    def __init__(
        self,
        lm: LoadedModel,
        draft: Any = None,
        gamma: int = 4,
        N: int = 20,
        verification: str = "strict",
        seed: int = 0,
    ):
        from laser.decoders.draft_model.decoders import load_draft

        if gamma < 1 or N < 1:
            raise ValueError(f"gamma and N must be >= 1, got gamma={gamma}, N={N}")
        if verification not in ("strict", "relaxed"):
            raise ValueError(f"verification must be 'strict' or 'relaxed', got {verification!r}")
        super().__init__(lm)
        self.gamma, self.N, self.verification, self.seed = gamma, N, verification, seed
        self.draft_model, self.draft_name = load_draft(lm, draft)

    def params(self) -> dict[str, Any]:
        out = {"draft": self.draft_name, "gamma": self.gamma, "N": self.N, "verification": self.verification}
        return out | ({"seed": self.seed} if self.verification == "relaxed" else {})

    def verifier(self) -> Verifier:
        from laser.decoders.beam.relaxed import RelaxedBeamVerifier

        return RelaxedBeamVerifier() if self.verification == "relaxed" else BeamSearchVerifier()

    def sampling(self, seed: int | None = None) -> SamplingParams:
        seed = self.seed if seed is None else seed
        return SamplingParams(temperature=1.0, seed=seed) if self.verification == "relaxed" else GREEDY

    def drafter(
        self, prompt_ids: list[int], pool: Any = None, sampling: SamplingParams = GREEDY, state: BeamState | None = None
    ) -> Drafter:
        from laser.decoders.beam.draft import BeamTreeDrafter, TreeDraftModel

        state = beam_state(state)
        if self.N < state.width:
            raise ValueError(f"atspeed: N={self.N} draft beams cannot cover K={state.width} target beams; use N >= K")
        seed = self.seed if sampling.greedy else int(sampling.seed)
        return BeamTreeDrafter(
            state,
            TreeDraftModel(self.draft_model, prompt_ids, state.trie.vocab),
            self.gamma,
            self.N,
            self.verification == "relaxed",
            seed,
        )
