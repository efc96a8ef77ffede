"""`laser train-draft`: distil a small draft model from the job's target on the target's own generations.

Data: the job's old-knowledge store (the target's greedy texts for old histories and existing items),
each text after its own chat-templated prompt; when the store has fewer than ``samples`` rows, the
target answers a seeded sample of the job's old-history and existing-item prompts greedily (cached
like the benchmark fixtures, :func:`benchmarks.fixture.greedy_knowledge`). A tenth is held out.

Loss: TopK-ImpSpecDec's (:mod:`laser.decoders.draft_model.distill`), Smooth-L1 on projected last hidden states + 0.1 x
KL(draft || target), on the response positions only. The target runs once per example: its last
hidden states at those positions are cached and its logits recomputed from them by its head.

Start (``init``): ``truncate:N`` = the target's embeddings, first N layers, norm and head
(:func:`laser.decoders.draft_model.drafter.truncated_copy`); ``fresh:L:H`` = a Llama-style config with L layers of width
H whose tied embeddings are the target's projected on their top-H principal directions. Embeddings and
head stay frozen unless ``train_embeddings``.

Work directory ``<output.path>/draft-training/<name>/`` (``output.work_dir`` when the output is a URI): ``examples.pt`` (token ids and the target's
hidden states), ``checkpoint.pt`` every ``checkpoint_every`` steps and on an interrupt (trainable
weights, projection, optimizer, losses), ``loss.png``, ``report.json``. A re-run resumes from the
checkpoint; batches follow a seeded order per epoch, so a resumed run trains exactly as an
uninterrupted one. The draft is saved in the model cache (``laser.models.cached_model_dir(name)``),
so ``decoder.params.draft: <name>`` loads it.
"""

from __future__ import annotations

import json
import logging
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from transformers import PreTrainedModel

import laser
from laser.decoders.draft_model.distill import distill_loss_terms, hidden_projection
from laser.decoders.draft_model.drafter import truncated_copy
from laser.models import LoadedModel, cached_model_dir
from pipelines.config import JobConfig
from training.loop import LoopSettings, batch_indices, load_plain, run_steps, start_run
from pipelines.store.location import atomic_write_local

log = logging.getLogger(__name__)


@dataclass
class DraftTrainSettings:
    """How `laser train-draft` trains (CLI options)."""

    name: str | None = None  # model-cache name; default "<model>-draft"
    init: str = "truncate:2"  # truncate:N | fresh:LAYERS:HIDDEN
    steps: int = 200
    batch_size: int = 4
    lr: float = 5e-4
    warmup: int = 10
    max_prompt_tokens: int = 160  # prompt tokens kept before each response (its end)
    max_new_tokens: int = 128  # budget of generated examples (when the store lacks them)
    samples: int = 48  # examples wanted; the store's rows are topped up by greedy generation
    checkpoint_every: int = 25
    positions: int = 32  # response positions per text in the loss (seeded sample per step)
    kl_weight: float = 0.1
    train_embeddings: bool = False
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        for key in (
            "steps",
            "batch_size",
            "checkpoint_every",
            "samples",
            "positions",
            "max_prompt_tokens",
            "max_new_tokens",
        ):
            if getattr(self, key) < 1:
                raise ValueError(f"train-draft: {key} must be >= 1, got {getattr(self, key)}")
        if not self.lr > 0:
            raise ValueError(f"train-draft: lr must be > 0, got {self.lr}")
        parse_init(self.init)


@dataclass
class Example:
    """One training sequence: prompt tail + response, and the target's last hidden states that predict
    each response token (``[len(response), H]``)."""

    ids: list[int]
    start: int  # first loss position (predicts ids[start + 1])
    target_hidden: torch.Tensor


@dataclass
class TrainResult:
    name: str
    path: str
    work_dir: str
    steps: int
    resumed_from: int
    losses: list[float] = field(default_factory=list)
    agreement_before: float = 0.0  # held-out top-1 agreement with the target
    agreement_after: float = 0.0
    draft_step_ms: float = 0.0  # one cached one-token forward, this machine, at the end of training
    target_step_ms: float = 0.0
    examples: int = 0
    train_s: float = 0.0


def parse_init(init: str) -> tuple[str, list[int]]:
    """``truncate:N`` or ``fresh:L:H`` as (kind, numbers); a clear error otherwise."""
    kind, _, rest = init.partition(":")
    nums = rest.split(":") if rest else []
    want = {"truncate": 1, "fresh": 2}.get(kind)
    if want is None or len(nums) != want or not all(n.isdigit() and int(n) > 0 for n in nums):
        raise ValueError(
            f"train-draft: init {init!r}: expected truncate:N (the target's first N layers) or "
            "fresh:LAYERS:HIDDEN (a small config), with positive integers"
        )
    return kind, [int(n) for n in nums]


def build_draft(target: PreTrainedModel, init: str, seed: int = 0) -> PreTrainedModel:
    """The untrained draft for ``init`` (deterministic for a target and seed)."""
    kind, nums = parse_init(init)
    if kind == "truncate":
        return truncated_copy(target, nums[0])
    layers, hidden = nums
    return fresh_draft(target, layers, hidden, seed=seed)


def fresh_draft(target: PreTrainedModel, layers: int, hidden: int, seed: int = 0) -> PreTrainedModel:
    """A small Llama-style draft over the target's vocabulary; tied embeddings = the target's projected
    on their top-``hidden`` principal directions (so tokens start where the target put them)."""
    from transformers import AutoModelForCausalLM

    cfg = target.config.to_dict()
    head_dim = (
        getattr(target.config, "head_dim", None) or target.config.hidden_size // target.config.num_attention_heads
    )
    if hidden % head_dim:
        raise ValueError(f"train-draft: fresh hidden size {hidden} must be a multiple of the head size {head_dim}")
    heads = hidden // head_dim
    cfg.update(
        num_hidden_layers=layers,
        hidden_size=hidden,
        intermediate_size=64 * round(hidden * 8 / 3 / 64),
        num_attention_heads=heads,
        num_key_value_heads=max(1, heads // 3) if heads % 3 == 0 else heads,
        head_dim=head_dim,
        tie_word_embeddings=True,
        layer_types=None,
    )
    config = type(target.config).from_dict({k: v for k, v in cfg.items() if v is not None})
    torch.manual_seed(seed)
    draft = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        emb = _input_weight(target).float()
        basis = torch.linalg.svd(emb - emb.mean(0), full_matrices=False).Vh[:hidden]  # [hidden, H_target]
        small = emb @ basis.T
        _input_weight(draft).copy_(small / small.std() * 0.02 * 8)
    draft.tie_weights()
    return draft.eval()


def _input_weight(model: PreTrainedModel) -> torch.Tensor:
    """The input embedding matrix ``[V, H]`` (a clear error for a model whose embeddings hold none)."""
    weight = model.get_input_embeddings().weight
    if not isinstance(weight, torch.Tensor):
        raise TypeError(f"train-draft: {type(model).__name__}'s input embeddings have no weight matrix")
    return weight


# ---- data ---------------------------------------------------------------------------------------


def _old_requests(cfg: JobConfig) -> tuple[list[Any], str]:
    """The job's old-knowledge requests (old histories, existing items) and the prompt domain."""
    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.requests import item_requests, user_requests

    data = load_job_data(cfg, mode="paper")
    ds, split = data.dataset, data.split
    return user_requests(split.old_interactions, ds.items) + item_requests(split.existing_items), ds.domain


def _prompt_text(req: Any, lm: LoadedModel, cfg: JobConfig, domain: str) -> str:
    from pipelines.knowledge.prompts import item_prompt, user_prompt, words_for_budget

    words = words_for_budget(cfg.generation.max_new_tokens)
    if req.entity_type == "user":
        return user_prompt(
            req.history or [],
            domain,
            user_id=req.entity_id,
            tokenizer=lm.tokenizer,
            max_prompt_tokens=cfg.generation.max_prompt_tokens,
            max_words=words,
        )
    return item_prompt(req.item or {"item_id": req.entity_id}, domain, max_words=words)


def training_pairs(cfg: JobConfig, lm: LoadedModel, s: DraftTrainSettings) -> list[tuple[list[int], list[int]]]:
    """(prompt ids, response ids) from the job's old-knowledge store, topped up to ``s.samples`` by greedy
    answers to a seeded sample of the job's other old prompts."""
    from benchmarks.fixture import greedy_knowledge
    from pipelines.knowledge.paths import JobPaths
    from pipelines.store.knowledge import read_knowledge

    requests, domain = _old_requests(cfg)
    encode = laser.get_decoder("autoregressive", lm).encode
    store = JobPaths.of(cfg).old_knowledge
    rows = read_knowledge(store) if (store / "manifest.json").exists() else None
    texts = {} if rows is None else {(r["entity_type"], r["entity_id"]): r for r in rows.iter_rows(named=True)}
    pairs, missing = [], []
    for req in requests:
        row = texts.get((req.entity_type, req.entity_id))
        if row is None:
            missing.append(req)
            continue
        if lm.tokenizer is None:
            raise ValueError(f"train-draft: model {lm.name!r} has no tokenizer: the store's texts need one")
        answer = lm.tokenizer.encode(row["knowledge"], add_special_tokens=False)
        eos = sorted(lm.eos_ids)[:1] if row["finish_reason"] == "eos" else []
        pairs.append((encode(_prompt_text(req, lm, cfg, domain)), answer + eos))
    log.info("train-draft: %d examples from %s", len(pairs), store)
    need = s.samples - len(pairs)
    if need > 0 and missing:
        chosen = random.Random(s.seed).sample(missing, min(need, len(missing)))
        prompts = {f"{r.entity_type}:{r.entity_id}": encode(_prompt_text(r, lm, cfg, domain)) for r in chosen}
        answers = greedy_knowledge(lm, prompts, s.max_new_tokens, desc="draft training texts")
        pairs += [(prompts[k], answers[k]) for k in sorted(prompts)]
    if len(pairs) < 2:
        raise ValueError(
            f"train-draft: {len(pairs)} training texts: the job ({cfg.output.path}) has no old knowledge "
            "and no old prompts to generate it from"
        )
    return pairs


@torch.inference_mode()
def make_examples(
    target: PreTrainedModel, pairs: list[tuple[list[int], list[int]]], max_prompt_tokens: int
) -> list[Example]:
    """Examples with the target's last hidden states at the response positions (one target forward each)."""
    out = []
    for prompt, answer in tqdm(pairs, desc="target hidden states", unit="text"):
        prompt = prompt[-max_prompt_tokens:]
        ids = prompt + answer
        if len(answer) < 1:
            continue
        hidden = target.base_model(input_ids=torch.tensor([ids])).last_hidden_state[0]
        start = len(prompt) - 1
        out.append(Example(ids, start, hidden[start : len(ids) - 1].clone()))
    return out


# ---- training -----------------------------------------------------------------------------------


def _batch_loss(
    draft: PreTrainedModel,
    target: PreTrainedModel,
    proj: torch.nn.Module,
    batch: list[Example],
    kl_weight: float,
    positions: int,
    rng: random.Random,
) -> torch.Tensor:
    """The distillation loss of a right-padded batch over up to ``positions`` response positions per text
    (a seeded sample: the vocabulary head dominates a small draft's cost)."""
    width = max(len(e.ids) for e in batch)
    ids = torch.tensor([e.ids + [0] * (width - len(e.ids)) for e in batch])
    mask = torch.tensor([[1] * len(e.ids) + [0] * (width - len(e.ids)) for e in batch])
    hidden = draft.base_model(input_ids=ids, attention_mask=mask).last_hidden_state
    picks = [sorted(rng.sample(range(len(e.target_hidden)), min(positions, len(e.target_hidden)))) for e in batch]
    d_h = torch.cat([hidden[b, [e.start + i for i in pick]] for b, (e, pick) in enumerate(zip(batch, picks))])[None]
    t_h = torch.cat([e.target_hidden[pick] for e, pick in zip(batch, picks)])[None]
    with torch.no_grad():
        t_logits = target.get_output_embeddings()(t_h)
    return distill_loss_terms(d_h, t_h, draft.get_output_embeddings()(d_h), t_logits, proj, kl_weight=kl_weight)


@torch.inference_mode()
def agreement(draft: PreTrainedModel, target: PreTrainedModel, examples: list[Example]) -> float:
    """Share of response positions where the draft's argmax is the target's (greedy acceptance proxy)."""
    hits = total = 0
    for e in examples:
        hidden = draft.base_model(input_ids=torch.tensor([e.ids])).last_hidden_state[0, e.start : len(e.ids) - 1]
        head_d, head_t = draft.get_output_embeddings(), target.get_output_embeddings()
        hits += int((head_d(hidden).argmax(-1) == head_t(e.target_hidden).argmax(-1)).sum())
        total += len(e.target_hidden)
    return hits / max(total, 1)


@torch.inference_mode()
def step_ms(model: PreTrainedModel, context: int = 256, repeats: int = 15, seed: int = 0) -> float:
    """Median milliseconds of one cached one-token decoding forward after ``context`` tokens (the cost of
    one draft position, or of one target step)."""
    from transformers import DynamicCache

    g = torch.Generator().manual_seed(seed)
    vocab = model.get_output_embeddings().weight.shape[0]
    cache = DynamicCache()
    model(input_ids=torch.randint(0, vocab, (1, context), generator=g), past_key_values=cache, use_cache=True)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        model(input_ids=torch.randint(0, vocab, (1, 1), generator=g), past_key_values=cache, use_cache=True)
        times.append(time.perf_counter() - t0)
        cache.crop(-1)
    return 1000 * sorted(times)[len(times) // 2]


def default_name(cfg: JobConfig, s: DraftTrainSettings) -> str:
    base = Path(cfg.model.name).name or "model"
    return s.name or f"{base}-draft-{s.init.replace(':', '')}"


def train_draft(
    cfg: JobConfig,
    s: DraftTrainSettings,
    on_step: Callable[[int, float], None] | None = None,
    lm: LoadedModel | None = None,
) -> TrainResult:
    """Train (or resume) the draft for the job's target; save it in the model cache and plot the loss."""
    name = default_name(cfg, s)
    work, lm = start_run(cfg, "draft-training", name, s.threads, lm)
    target = lm.model
    for p in target.parameters():
        p.requires_grad_(False)
    examples = _examples(cfg, lm, s, work)
    held = max(1, len(examples) // 10)
    train, test = examples[held:], examples[:held]
    draft = build_draft(target, s.init, s.seed).float().train()
    for p in draft.get_input_embeddings().parameters():
        p.requires_grad_(s.train_embeddings)
    for p in draft.get_output_embeddings().parameters():
        p.requires_grad_(s.train_embeddings)
    torch.manual_seed(s.seed)
    proj = hidden_projection(draft, target)
    trained = torch.nn.ModuleDict({"draft": draft, "proj": proj})  # the draft's trainable weights, then proj

    def step_loss(step: int) -> torch.Tensor:
        batch = [train[i] for i in batch_indices(len(train), s.batch_size, step, s.seed)]
        return _batch_loss(draft, target, proj, batch, s.kl_weight, s.positions, random.Random(s.seed * 7_919 + step))

    before = agreement(draft, target, test)
    loop = LoopSettings(
        steps=s.steps,
        lr=s.lr,
        warmup=max(1, s.warmup),
        checkpoint_every=s.checkpoint_every,
        desc=f"train-draft {name}",
        decay=False,
    )
    res = run_steps(trained, step_loss, None, loop, work, {"init": s.init}, on_step)
    result = TrainResult(
        name=name,
        path=str(save_draft(draft, lm, name)),
        work_dir=str(work),
        steps=res.steps,
        resumed_from=res.resumed_from,
        losses=res.losses,
        agreement_before=before,
        agreement_after=agreement(draft, target, test),
        examples=len(examples),
        train_s=res.seconds,
        draft_step_ms=step_ms(draft),
        target_step_ms=step_ms(target),
    )
    plot_losses(res.losses, work / "loss.png", name)
    (work / "report.json").write_text(json.dumps({**asdict(result), "settings": asdict(s)}, indent=1))
    return result


def _examples(cfg: JobConfig, lm: LoadedModel, s: DraftTrainSettings, work: Path) -> list[Example]:
    """The examples, made once per work directory (a resumed run reuses them)."""
    path = work / "examples.pt"
    if path.exists():
        return [Example(*e) for e in load_plain(path)]
    examples = make_examples(lm.model, training_pairs(cfg, lm, s), s.max_prompt_tokens)
    plain = [(e.ids, e.start, e.target_hidden) for e in examples]  # plain: loaded with weights_only
    atomic_write_local(path, lambda tmp: torch.save(plain, tmp))
    return examples


def save_draft(draft: PreTrainedModel, lm: LoadedModel, name: str) -> Path:
    """Save a model (a draft, a fine-tuned target) with ``lm``'s generation config and tokenizer in the model
    cache under ``name``, so ``laser.load_model(name)`` loads it."""
    out = cached_model_dir(name)
    out.mkdir(parents=True, exist_ok=True)
    draft.generation_config = lm.model.generation_config
    draft.save_pretrained(out)
    if lm.tokenizer is not None:
        lm.tokenizer.save_pretrained(out)
    return out


def plot_losses(
    losses: list[float],
    path: Path,
    title: str,
    held: dict[int, float] | None = None,
    ylabel: str = "distillation loss",
    command: str = "train-draft",
) -> Path:
    """The loss curve (per step and a moving average; ``held``: held-out loss by step) as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, alpha=0.4, label="step")
    w = max(1, len(losses) // 20)
    smooth = [
        sum(losses[max(0, i - w + 1) : i + 1]) / len(losses[max(0, i - w + 1) : i + 1]) for i in range(len(losses))
    ]
    ax.plot(range(1, len(losses) + 1), smooth, label=f"mean of {w}")
    if held:
        steps = sorted(held)
        ax.plot(steps, [held[k] for k in steps], "o-", label="held-out")
    positive = all(v > 0 for v in [*losses, *(held or {}).values()])
    ax.set(xlabel="step", ylabel=ylabel, title=f"{command} {title}", yscale="log" if positive else "linear")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
