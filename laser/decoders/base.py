"""The decoder interface: a request in, a generation with stats out.

A decoder is a drafter + a verifier + what it needs, declared on its class so that the pipeline never
tests a decoder's name:

- ``pool``: which retrieval pool each request gets: ``"routed"`` (the entity's group pool),
  ``"global"`` (one pool per entity type) or ``"none"``;
- ``requires``: other artefacts it loads from its parameters (e.g. ``("draft_model",)``), for listings;
- ``greedy_params()``: parameters under which it writes the target's greedy text (used for old
  knowledge, which must be lossless), or None when it cannot;
- ``produces``: ``"text"`` (a generation) or ``"ranking"`` (top-K item identifiers);
- ``engines``: the engines that can run it (``"hf"``, this package's tree-attention engine; ``"vllm"``,
  vLLM with LASER as its drafter, :mod:`laser.vllm`, for decoders with a vLLM form);
- ``check_params()``: its own parameter check, run before any model is loaded.

A subclass sets its fields after ``super().__init__(lm)`` and overrides two hooks: ``verifier()`` (how a
step's tree is accepted) and ``drafter(prompt_ids, pool, sampling, state)`` (the one drafter hook: what a
request drafts from). Decoders that draft from retrieval pools derive from :class:`RetrievalDecoder`,
which owns the draft budget ``K`` and the retrieval knobs. A request's ``state`` is a typed object the
drafter and the verifier share (beam decoders: their beams), never a string-keyed dict.
"""

from __future__ import annotations

import difflib
import inspect
from dataclasses import dataclass
from functools import cached_property
from typing import Any, ClassVar, Literal, Sequence


from laser.budget import AdaptiveBudget, BudgetPolicy
from laser.cost import forward_cost
from laser.decoder_card import PoolNeed
from laser.defaults import N_MAX
from laser.drafting import DraftSource, Drafter, NoDrafter
from laser.engine import TreeDecodingEngine, check_tree_attention
from laser.models import LoadedModel, chat_ids
from laser.request import DecodeStats, Halt, Request
from laser.rules import NO_RULES, GenerationRules, TokenText
from laser.sampling import GREEDY, SamplingParams
from laser.verify import RejectionSampler, TopKVerifier, Verifier

Prompt = str | Sequence[int]


MAX_BUDGET = 64  # the largest tree the adaptive budget may choose (draft nodes)


@dataclass
class Generation:
    token_ids: list[int]  # generated tokens only (the end-of-sequence token included when reached)
    text: str
    stats: DecodeStats


class Decoder:
    """Base class. Subclasses declare ``name``, ``summary``, ``pool``, and override ``verifier`` and/or
    ``drafter``. The default drafts nothing and verifies greedily at temperature 0 and by exact rejection
    sampling above it.

    ``generate`` decodes one request, ``generate_batch`` several, continuously batched (up to ``slots``
    at a time). The engine is built on first use, from the subclass's ``verifier()`` and
    ``budget_policy()``.
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    pool: ClassVar[PoolNeed] = "none"
    requires: ClassVar[tuple[str, ...]] = ()
    produces: ClassVar[Literal["text", "ranking"]] = "text"
    engines: ClassVar[tuple[str, ...]] = ("hf",)
    beam_sampling: ClassVar[bool] = False  # draws beams at temperature 1 with a width ``W``

    def __init__(self, lm: LoadedModel):
        check_tree_attention(lm.model)  # a model whose attention cannot take tree masks fails here
        self.lm = lm

    @cached_property
    def engine(self) -> TreeDecodingEngine:
        engine = TreeDecodingEngine(self.lm.model, self.verifier(), self.lm.eos_ids, self.budget_policy())
        engine.token_text = TokenText(self.lm.tokenizer) if self.lm.tokenizer is not None else None  # stop strings
        return engine

    def budget_policy(self) -> BudgetPolicy | None:
        """How many draft nodes each step may use; None: each drafter's own limit."""
        return None

    @classmethod
    def check_params(cls, params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        """``params`` if this decoder takes them: a parameter it does not take, or a value it rejects, is a
        ``ValueError`` naming it. ``model`` is the target, for decoders whose parameters name other models."""
        cls.check_names(params)
        cls.probe(params)
        return dict(params)

    @classmethod
    def check_names(cls, params: dict[str, Any]) -> None:
        """Refuse a parameter the constructor does not take."""
        sig = inspect.signature(cls.__init__)
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
            return
        accepted = [n for n in sig.parameters if n not in ("self", "lm")]
        unknown = sorted(set(params) - set(accepted))
        if unknown:
            near = difflib.get_close_matches(unknown[0].lower(), [a.lower() for a in accepted], n=1, cutoff=0.6)
            hint = f"; did you mean {accepted[[a.lower() for a in accepted].index(near[0])]!r}?" if near else ""
            raise ValueError(
                f"params.{unknown[0]}: decoder {cls.name!r} takes no parameter {unknown[0]!r} "
                f"(it takes {accepted}){hint}"
            )

    @classmethod
    def probe(cls, params: dict[str, Any], layers: int = 2) -> None:
        """Check the values by building the decoder once on a tiny random model of ``layers`` layers."""
        from laser.testing import tiny_llama

        try:
            cls(tiny_llama(layers=layers), **params)
        except (ValueError, TypeError) as exc:
            raise ValueError(f"params: {exc}") from None

    @classmethod
    def greedy_params(cls) -> dict[str, Any] | None:
        """Parameters under which this decoder writes exactly the target's greedy text (None: it cannot)."""
        return {}

    def verifier(self) -> Verifier:
        return RejectionSampler()

    def check_sampling(self, sampling: SamplingParams) -> None:
        """Refuse sampling settings this decoder cannot honour (before any work)."""
        self.refuse_sampling(sampling, self.params())

    @classmethod
    def refuse_sampling(cls, sampling: SamplingParams, params: dict[str, Any]) -> None:
        """Raise ``ValueError`` when a decoder with ``params`` cannot honour ``sampling`` (none refused here)."""

    def params(self) -> dict[str, Any]:
        """The decoder's settings, recorded with every generated row."""
        return {}

    @classmethod
    def settings(cls, params: dict[str, Any]) -> dict[str, Any]:
        """What :meth:`params` of a decoder built with ``params`` would be, without a model: the
        constructor's defaults with ``params`` over them (an engine that runs the decoder in its own form,
        such as vLLM, reads them here)."""
        sig = inspect.signature(cls.__init__)
        defaults = {
            n: p.default
            for n, p in sig.parameters.items()
            if n not in ("self", "lm") and p.default is not inspect.Parameter.empty
        }
        return {**defaults, **params}

    def drafter(
        self,
        prompt_ids: list[int],
        pool: DraftSource | None = None,
        sampling: SamplingParams = GREEDY,
        state: Any = None,
    ) -> Drafter:
        """The drafter of one request: from its prompt, its pool, its sampling settings (their seed) and the
        state it shares with the verifier. The default drafts nothing."""
        return NoDrafter()

    def generate(
        self,
        prompt: Prompt,
        max_new_tokens: int = 256,
        pool: DraftSource | None = None,
        sampling: SamplingParams = GREEDY,
        rules: GenerationRules = NO_RULES,
    ) -> Generation:
        return self.generate_batch([prompt], max_new_tokens, [pool], [sampling], rules)[0]

    def generate_batch(
        self,
        prompts: Sequence[Prompt],
        max_new_tokens: int = 256,
        pools: Sequence[DraftSource | None] | None = None,
        sampling: SamplingParams | Sequence[SamplingParams] = GREEDY,
        rules: GenerationRules = NO_RULES,
        slots: int | None = None,
    ) -> list[Generation]:
        """Decode ``prompts`` continuously batched, at most ``slots`` at a time (default: all); ``sampling``
        is one setting for all or one per prompt; ``rules`` (repetition penalty, no-repeat n-grams, min new
        tokens, bad words) apply inside verification."""
        if self.produces != "text":
            raise ValueError(
                f"decoder {self.name!r} produces a {self.produces}, not text: use recommend_batch "
                "(the `laser recommend` job)"
            )
        if max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
        pools = list(pools) if pools is not None else [None] * len(prompts)
        samplings = [sampling] * len(prompts) if isinstance(sampling, SamplingParams) else list(sampling)
        if not len(pools) == len(samplings) == len(prompts):
            raise ValueError(f"{len(prompts)} prompts but {len(pools)} pools and {len(samplings)} sampling settings")
        ids = [self.encode(p) for p in prompts]
        seqs = [self.request(t, max_new_tokens, pool, s, rules) for t, pool, s in zip(ids, pools, samplings)]
        self.engine.run(seqs, slots)
        return [self.result(s) for s in seqs]

    def result(self, request: Request) -> Generation:
        """The generation of a finished request."""
        return Generation(request.new_tokens, self.decode(request.new_tokens), request.stats)

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
        """One engine request for prompt token ids (for callers that stream requests into ``engine``);
        ``halt``: :attr:`laser.request.Request.halt`; ``exact``: verified by the target's greedy rule on this
        decoder's engine (see :meth:`runs_greedy_of`)."""
        if exact and not (sampling.greedy and isinstance(self.engine.verifier, (TopKVerifier, RejectionSampler))):
            raise ValueError(
                f"decoder {self.name!r}: an exact request needs greedy sampling and a top-k or "
                "rejection verifier (greedy rows exact)"
            )
        self.check_sampling(sampling)
        return Request(
            tokens=list(ids),
            prompt_len=len(ids),
            drafter=self.drafter(list(ids), pool, sampling),
            max_new_tokens=max_new_tokens,
            sampling=sampling,
            rules=rules,
            halt=halt,
            exact=exact,
        )

    def runs_greedy_of(self, other: "Decoder") -> bool:
        """Whether ``other``'s greedy requests can decode on this decoder's engine, beside its own, as
        ``exact`` requests with the same text: ``other`` drafts and budgets as this decoder does and differs
        only by verifying greedily. No decoder's by default."""
        return False

    def encode(self, prompt: Prompt) -> list[int]:
        """Token ids of a prompt: text becomes one user chat message (chat template applied)."""
        if isinstance(prompt, str):
            if not prompt.strip():
                raise ValueError("empty prompt")
            if self.lm.tokenizer is None:
                raise ValueError(f"model {self.lm.name!r} has no tokenizer: pass token ids")
            ids = chat_ids(self.lm.tokenizer, prompt)
        else:
            ids = [int(t) for t in prompt]
            if not ids:
                raise ValueError("empty prompt")
        if len(ids) >= self.lm.context_length:
            raise ValueError(
                f"prompt of {len(ids)} tokens does not fit the model's context of {self.lm.context_length}"
            )
        return ids

    def decode(self, token_ids: list[int]) -> str:
        tok = self.lm.tokenizer
        if tok is None:
            return ""
        text = tok.decode(token_ids, skip_special_tokens=True)
        if not isinstance(text, str):  # one sequence's ids decode to one text
            raise TypeError(f"the tokenizer of {self.lm.name!r} decoded one sequence into {type(text).__name__}")
        return text


class RetrievalDecoder(Decoder):
    """A decoder that drafts prefix subtrees from a retrieval pool (``pools.RetrievalPool``).

    ``K`` is the draft budget in tree nodes: ``None`` or ``"auto"`` chooses it every step from the measured
    forward cost model and the running acceptance (:class:`laser.budget.AdaptiveBudget`, at most
    ``MAX_BUDGET``); an integer fixes it (for studies). ``n_max`` caps the branches per node and
    ``min_prob`` drops rare continuations. Without a pool every step drafts nothing (autoregressive).
    """

    def __init__(self, lm: LoadedModel, K: int | str | None = None, n_max: int = N_MAX, min_prob: float = 0.0):
        super().__init__(lm)
        self.adaptive = K is None or K == "auto"
        K = MAX_BUDGET if self.adaptive else K
        if not isinstance(K, int) or K < 0 or n_max < 1:
            raise ValueError(
                f"K must be 'auto' or an integer >= 0 and n_max an integer >= 1, got K={K!r}, n_max={n_max!r}"
            )
        if not 0.0 <= min_prob < 1.0:
            raise ValueError(f"min_prob must lie in [0, 1), got {min_prob}")
        self.K, self.n_max, self.min_prob = K, n_max, min_prob

    def budget_policy(self) -> BudgetPolicy | None:
        """The adaptive budget of ``K="auto"`` (the cost model is measured once per machine and cached)."""
        if not self.adaptive or self.K == 0:
            return None
        return AdaptiveBudget(lambda: forward_cost(self.lm.model), max_budget=self.K)

    def params(self) -> dict[str, Any]:
        return {"K": "auto" if self.adaptive else self.K, "n_max": self.n_max, "min_prob": self.min_prob}

    @classmethod
    def settings(cls, params: dict[str, Any]) -> dict[str, Any]:
        out = super().settings(params)
        if out.get("K") is None:
            out["K"] = "auto"
        return out

    def drafter(
        self,
        prompt_ids: list[int],
        pool: DraftSource | None = None,
        sampling: SamplingParams = GREEDY,
        state: Any = None,
    ) -> Drafter:
        if pool is None or self.K == 0:
            return NoDrafter()
        return pool.open(prompt_ids, max_nodes=self.K, n_max=self.n_max, min_prob=self.min_prob)
