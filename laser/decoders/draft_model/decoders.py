"""Draft-model decoders: a small causal LM sharing the target's vocabulary drafts a chain of ``gamma``
tokens per step (all requests of a step in one draft forward per position).

- ``spec_sampling``: standard speculative sampling (Leviathan et al. 2023): greedy and lossless at
  temperature 0, exact sampling from the target above it (``RejectionSampler`` with the draft distributions).
- ``topk_imp``: TopK-ImpSpecDec (``laser.decoders.draft_model.topk_imp``), ``paper`` or ``lossless`` mode.

``draft`` is a local path, a bundled name or a cached hub id (loaded with ``laser.load_model``), or
``truncate:N``: the target's first N layers (``truncated_copy``), a draft that needs no training. None
means ``truncate:`` a quarter of the target's layers. In code a ``LoadedModel`` may be passed too.
"""

from __future__ import annotations

import os
from typing import Any, Literal

from transformers import PreTrainedModel

from laser.decoders.base import Decoder
from laser.decoders.registry import register_decoder
from laser.decoders.draft_model.drafter import ModelDrafter, truncated_copy
from laser.drafting import DraftSource, Drafter
from laser.engine import check_tree_attention
from laser.models import BUNDLED, LoadedModel, load_model
from laser.sampling import GREEDY, SamplingParams
from laser.decoders.draft_model.topk_imp import TopKImportanceVerifier
from laser.verify import Verifier


def load_draft(target: LoadedModel, draft: str | LoadedModel | None) -> tuple[PreTrainedModel, str]:
    """The draft model for ``target`` and its canonical name (``truncate:N``, the path/id given, or a
    loaded model's name)."""
    if isinstance(draft, LoadedModel):
        check_vocab(target, draft)
        return draft.model, draft.name
    layers = target.model.config.num_hidden_layers
    if draft is None:
        draft = f"truncate:{max(1, layers // 4)}"
    if draft.startswith("truncate:"):
        n = draft.split(":", 1)[1]
        if not n.isdigit():
            raise ValueError(f"draft {draft!r}: expected truncate:N with N an integer number of layers")
        return truncated_copy(target.model, int(n)), draft
    param = next(target.model.parameters())
    if draft.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(draft)):
        raise ValueError(f"draft model path not found: {draft!r}")
    try:
        loaded = load_model(os.path.expanduser(draft), device=str(param.device), dtype=param.dtype)
    except ValueError as err:
        raise ValueError(
            f"draft model {draft!r} not found: not a local model directory, a bundled name "
            f"({', '.join(sorted(BUNDLED))}) or a cached hub id ({err})"
        ) from err
    check_vocab(target, loaded)
    return loaded.model, draft


def check_vocab(target: LoadedModel, draft: LoadedModel) -> None:
    """Refuse a draft whose next-token distributions are not over the target's vocabulary."""
    sizes = [m.model.get_output_embeddings().weight.shape[0] for m in (target, draft)]
    same_tokens = (
        target.tokenizer is None
        or draft.tokenizer is None
        or target.tokenizer.get_vocab() == draft.tokenizer.get_vocab()
    )
    if sizes[0] != sizes[1] or not same_tokens:
        names = [getattr(m.tokenizer, "name_or_path", None) or m.name for m in (target, draft)]
        raise ValueError(
            f"draft {draft.name!r} does not share the target's vocabulary: target {names[0]!r} has "
            f"{sizes[0]} logits, draft {names[1]!r} has {sizes[1]}"
            + ("" if same_tokens else " and their tokenizers map tokens differently")
        )


class UsesDraftModel(Decoder):
    """Base of decoders with a ``draft`` parameter (a model name or path, or ``truncate:N``): its check
    loads no weights. A named draft must exist and share the target's vocabulary (tokenizers compared);
    ``truncate:N`` is probed on a tiny model of at least N layers."""

    requires = ("draft_model",)

    @classmethod
    def check_params(cls, params: dict[str, Any], model: str | None = None) -> dict[str, Any]:
        cls.check_names(params)
        draft, probe, layers = params.get("draft"), dict(params), 2
        if isinstance(draft, str) and draft.startswith("truncate:") and draft.split(":", 1)[1].isdigit():
            layers = max(layers, int(draft.split(":", 1)[1]))
        elif isinstance(draft, str) and not draft.startswith("truncate:"):
            check_draft_name(draft, model)
            probe["draft"] = None
        cls.probe(probe, layers)
        return dict(params)


def check_draft_name(draft: str, model: str | None) -> None:
    """A named draft model exists and, when the target ``model`` is given, shares its vocabulary."""
    from laser.models import load_tokenizer

    if draft.startswith((".", "/", "~")) and not os.path.exists(os.path.expanduser(draft)):
        raise ValueError(f"params.draft: draft model path not found: {draft!r}")
    try:
        draft_vocab = load_tokenizer(os.path.expanduser(draft)).get_vocab()
    except ValueError as exc:
        raise ValueError(
            f"params.draft: draft model {draft!r} not found: not a local model directory, a bundled "
            f"name, a name saved by `laser train-draft` or a cached hub id ({exc})"
        ) from None
    if model is None:
        return
    target_vocab = load_tokenizer(model).get_vocab()
    if draft_vocab != target_vocab:
        raise ValueError(
            f"params.draft: draft {draft!r} does not share the target's vocabulary: target {model!r} "
            f"has {len(target_vocab)} tokens, draft {draft!r} has {len(draft_vocab)}"
            + (" mapped differently" if len(draft_vocab) == len(target_vocab) else "")
        )


class DraftModelDecoder(UsesDraftModel, Decoder):
    """Common part: the draft model, ``gamma``, and one :class:`ModelDrafter` per request."""

    pool = "none"

    def __init__(self, lm: LoadedModel, draft: str | LoadedModel | None = None, gamma: int = 4):
        if not isinstance(gamma, int) or gamma < 1:
            raise ValueError(f"gamma (draft tokens per step) must be an integer >= 1, got {gamma!r}")
        super().__init__(lm)
        self.draft_model, self.draft = load_draft(lm, draft)
        check_tree_attention(self.draft_model)  # batched drafting passes 4D padding masks
        self.gamma = gamma

    def params(self) -> dict[str, Any]:
        return {"draft": self.draft, "gamma": self.gamma}

    def drafter(
        self,
        prompt_ids: list[int],
        pool: DraftSource | None = None,
        sampling: SamplingParams = GREEDY,
        state: Any = None,
    ) -> Drafter:
        return ModelDrafter(self.draft_model, prompt_ids, self.gamma, sampling)


@register_decoder
class SpecSampling(DraftModelDecoder):
    name = "spec_sampling"
    summary = (
        "speculative sampling with a draft model: greedy (lossless) at temperature 0, exact sampling "
        "from the target above it"
    )


@register_decoder
class TopKImp(DraftModelDecoder):
    name = "topk_imp"
    summary = (
        "TopK-ImpSpecDec: the draft's top-K candidates weighted by p/q; 'paper' rule (not lossless) or "
        "'lossless' (tested against the proposal used); greedy at temperature 0"
    )

    def __init__(
        self,
        lm: LoadedModel,
        draft: str | LoadedModel | None = None,
        gamma: int = 4,
        K: int = 50,
        mode: Literal["paper", "lossless"] = "lossless",
    ):
        TopKImportanceVerifier(K, mode)  # validate before loading the draft
        super().__init__(lm, draft=draft, gamma=gamma)
        self.topk, self.mode = K, mode

    def verifier(self) -> Verifier:
        return TopKImportanceVerifier(self.topk, self.mode)

    def params(self) -> dict[str, Any]:
        return {**super().params(), "K": self.topk, "mode": self.mode}
