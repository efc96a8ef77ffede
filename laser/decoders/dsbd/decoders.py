"""Beam-sampling decoders: ``beam_sample`` (the target's own beam sampling of width W, one forward per
layer) and ``dsbd`` (dynamic-width speculative beam sampling, ``laser.decoders.dsbd.algorithm``). Both return the beam with
the highest target log-probability; the engine runs them through its beam hook (the beams' prefixes stay
in the KV cache, each iteration feeds the open beams' ends and the drafted forest).

Both draw at temperature 1 from the beam-level distribution; a request's generator is seeded by its
sampling seed (the decoder's ``seed`` when the request's sampling is unset, i.e. greedy). ``beam_sampling = True`` marks the
decoders that write knowledge under ``generation.strategy: beam_sample`` with width ``W``."""

from __future__ import annotations

from typing import Any

from laser.decoders.base import Decoder
from laser.decoders.draft_model.decoders import UsesDraftModel
from laser.decoders.registry import register_decoder
from laser.decoders.dsbd.algorithm import BeamSampleState, BeamSampleVerifier, ForestDrafter
from laser.drafting import DraftSource
from laser.models import LoadedModel
from laser.request import Halt, Request
from laser.rules import NO_RULES, GenerationRules
from laser.sampling import GREEDY, SamplingParams
from laser.verify import Verifier


def sample_state(state: BeamSampleState | None) -> BeamSampleState:
    """A beam-sampling request's state (``request`` always passes one)."""
    if state is None:
        raise ValueError("a beam-sampling decoder's drafter needs the request's BeamSampleState")
    return state


@register_decoder
class BeamSample(Decoder):
    name = "beam_sample"
    summary = "beam sampling of width W (W beams drawn i.i.d. per step from the beam-level distribution)"
    pool = "none"
    beam_sampling = True

    def __init__(self, lm: LoadedModel, W: int = 4, seed: int = 0):
        super().__init__(lm)
        if W < 1:
            raise ValueError(f"W must be >= 1, got {W}")
        self.W, self.seed = W, seed

    @classmethod
    def greedy_params(cls) -> dict[str, Any] | None:
        return None

    def params(self) -> dict[str, Any]:
        return {"W": self.W, "seed": self.seed}

    def verifier(self) -> Verifier:
        return BeamSampleVerifier()

    @classmethod
    def refuse_sampling(cls, sampling: SamplingParams, params: dict[str, Any]) -> None:
        """Beam sampling draws at temperature 1 without filters (temperature 0 = unset, also temperature 1)."""
        if sampling.temperature not in (0.0, 1.0) or sampling.top_p < 1.0 or sampling.top_k > 0:
            raise ValueError(
                f"{cls.name} samples beams at temperature 1 without top-p/top-k filters; got "
                f"temperature={sampling.temperature}, top_p={sampling.top_p}, top_k={sampling.top_k}"
            )

    def request(
        self,
        ids: list[int],
        max_new_tokens: int,
        pool: DraftSource | None = None,
        sampling: SamplingParams = GREEDY,
        rules: GenerationRules = NO_RULES,
        halt: Halt | None = None,
        exact: bool = False,
    ) -> Request:
        """One engine request; its beams draw from a generator seeded by ``sampling.seed`` (the decoder's
        seed when ``sampling`` is greedy, i.e. unset). ``pool``, ``rules`` and ``halt`` are not used (the
        text is chosen among the beams at the end, so there is no one text to stop early); beams have no
        ``exact`` rows."""
        if exact:
            raise ValueError(f"decoder {self.name!r}: beam sampling has no exact requests")
        self.check_sampling(sampling)
        seed = self.seed if sampling.greedy else int(sampling.seed)
        sampling = SamplingParams(temperature=1.0, seed=seed)
        st = BeamSampleState(self.W, max_new_tokens, self.lm.eos_ids)
        return Request(
            tokens=list(ids),
            prompt_len=len(ids),
            drafter=self.drafter(list(ids), None, sampling, st),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            state=st,
        )

    def drafter(
        self,
        prompt_ids: list[int],
        pool: Any = None,
        sampling: SamplingParams = GREEDY,
        state: BeamSampleState | None = None,
    ) -> ForestDrafter:
        return ForestDrafter(sample_state(state))


@register_decoder
class Dsbd(UsesDraftModel, BeamSample):
    """DSBD: a draft model samples ``W_S`` beams per layer for ``gamma`` layers; layer-wise verification
    with width ``W`` (fixed) or the dynamic width (``dynamic``: threshold ``t``, at least ``W_min``).

    ``one_cache`` (the memory-saving variant): after every iteration only the output beam with the
    highest mean target log-probability per token (lowest perplexity) goes on, so the forest is a single
    tree. Not distribution-equivalent to beam sampling."""

    name = "dsbd"
    summary = "DSBD: dynamic-width speculative beam sampling with a draft model (forest verified in one forward)"

    def __init__(
        self,
        lm: LoadedModel,
        draft: Any = None,
        gamma: int = 4,
        W: int = 4,
        W_S: int = 8,
        dynamic: bool = True,
        t: float = 0.7,
        W_min: int = 1,
        one_cache: bool = False,
        seed: int = 0,
    ):
        from laser.decoders.draft_model.decoders import load_draft

        if gamma < 1 or W_S < 1 or not 1 <= W_min:
            raise ValueError(f"gamma, W_S and W_min must be >= 1, got gamma={gamma}, W_S={W_S}, W_min={W_min}")
        if not 0.0 < t <= 1.0:
            raise ValueError(f"t must lie in (0, 1], got {t}")
        super().__init__(lm, W=W, seed=seed)
        self.gamma, self.W_S, self.dynamic, self.t, self.W_min = gamma, W_S, dynamic, t, W_min
        self.one_cache = bool(one_cache)
        self.draft_model, self.draft_name = load_draft(lm, draft)

    def params(self) -> dict[str, Any]:
        return {
            "draft": self.draft_name,
            "gamma": self.gamma,
            "W": self.W,
            "W_S": self.W_S,
            "dynamic": self.dynamic,
            "t": self.t,
            "W_min": self.W_min,
            "one_cache": self.one_cache,
            "seed": self.seed,
        }

    def verifier(self) -> Verifier:
        return BeamSampleVerifier(dynamic=self.dynamic, t=self.t, w_min=self.W_min, one_cache=self.one_cache)

    def drafter(
        self,
        prompt_ids: list[int],
        pool: Any = None,
        sampling: SamplingParams = GREEDY,
        state: BeamSampleState | None = None,
    ) -> ForestDrafter:
        from laser.decoders.beam.draft import TreeDraftModel

        return ForestDrafter(
            sample_state(state), TreeDraftModel(self.draft_model, prompt_ids), self.gamma, self.W_S, int(sampling.seed)
        )
