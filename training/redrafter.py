"""`laser train-redrafter CONFIG`: distil a ReDrafter head from the target's own generations.

Data: the target's greedy answers to the job's old-knowledge prompts (old user histories, existing
items), generated once and cached (``benchmarks.fixture.greedy_knowledge``), or the texts of the
job's old-knowledge store (``source="store"``). On the target's own greedy text, the next T tokens of
the sequence *are* the target's greedy continuation at every position, so teacher forcing on them is the
paper's local distillation (Eq. 2) with T future tokens per position.

Training: one frozen target forward per sequence gives the last hidden state h_t at every answer
position; the head starts from (h_t, y_{t+1}) and predicts y_{t+2} .. y_{t+1+T} with teacher forcing
(cross-entropy summed over the T depths). AdamW, cosine schedule with 10% warm-up. Batches are drawn
from a generator seeded by (seed, step), so a resumed run draws what an uninterrupted one would.
Checkpoints every ``checkpoint_every`` steps (atomic); a killed run resumes from the last one. The head
is written to ``<laser cache>/heads/<name>.pt`` with a loss/accuracy curve PNG and JSON beside it.
"""

from __future__ import annotations

import json
import logging
import math
from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from tqdm import tqdm

import laser
from laser.drafting import Drafter
from laser.engine import TreeDecodingEngine
from laser.decoders.redrafter.head import HEAD_KINDS, RecurrentDraftHead, head_path
from laser.request import Request
from laser.verify import RejectionSampler
from training.loop import load_plain

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainSettings:
    kind: str = "shortlist"  # full | tied | shortlist (see laser.decoders.redrafter.head)
    shortlist: int = 4096  # tokens of a shortlist head: the most frequent in the training answers
    blocks: int = 2  # residual blocks
    depth: int = 4  # future tokens predicted per position (T = beam_length - 1)
    steps: int = 300
    batch_positions: int = 256
    lr: float = 1e-3
    warmup: float = 0.1
    weight_decay: float = 0.0
    checkpoint_every: int = 50
    seed: int = 0

    def __post_init__(self) -> None:
        if self.kind not in HEAD_KINDS:
            raise ValueError(f"kind must be one of {HEAD_KINDS}, got {self.kind!r}")
        if self.depth < 1 or self.steps < 1 or self.batch_positions < 1 or self.checkpoint_every < 1:
            raise ValueError("depth, steps, batch_positions and checkpoint_every must be >= 1")


# ---- data -----------------------------------------------------------------------------------------


@dataclass
class Features:
    """Teacher-forcing examples: the target's hidden state at a position and the next 1 + T tokens."""

    hidden: torch.Tensor  # [P, d] h_t (predicts y_{t+1})
    tokens: torch.Tensor  # [P, 1 + T] y_{t+1} .. y_{t+1+T}; -100 past the end of the sequence


@torch.no_grad()
def extract_features(
    lm: laser.LoadedModel,
    sequences: Sequence[tuple[list[int], list[int]]],
    depth: int,
    desc: str = "target hidden states",
) -> Features:
    """One frozen target forward per (prompt, answer): an example at every position whose next token is
    an answer token."""
    hiddens, tokens = [], []
    for prompt, answer in tqdm(sequences, desc=desc, unit="seq"):
        if len(answer) < 2:
            continue
        ids = prompt + answer
        out = lm.model(torch.tensor([ids]), output_hidden_states=True)
        start = len(prompt) - 1  # h at the last prompt token predicts answer[0]
        h = out.hidden_states[-1][0, start : len(ids) - 1].float().cpu()  # one per answer token
        padded = torch.tensor(answer + [-100] * (depth + 1))
        idx = torch.arange(len(answer))[:, None] + torch.arange(depth + 1)[None, :]
        hiddens.append(h)
        tokens.append(padded[idx])
    if not hiddens:
        raise ValueError("no training sequence has an answer of 2 tokens or more")
    return Features(torch.cat(hiddens), torch.cat(tokens))


class _HiddenRecorder(Drafter):
    """Drafts nothing; keeps the target's hidden state at each step's root (the state that predicts the
    step's token), which the engine hands to drafters that ask for it."""

    needs_hidden = True

    def __init__(self) -> None:
        self.hidden: list[torch.Tensor] = []

    def commit(self, new_tokens: Sequence[int], hidden: torch.Tensor | None = None) -> None:
        if hidden is not None and new_tokens:  # after prefill (no tokens) the state predicts the prompt's last token
            self.hidden.append(hidden.float().cpu().clone())


Example = tuple[list[int], list[int], torch.Tensor | None]  # prompt, answer, hidden states (None: recompute)


def generate_examples(
    lm: laser.LoadedModel,
    prompts: Sequence[list[int]],
    max_new_tokens: int,
    workdir: Path,
    batch: int = 8,
    progress: bool = True,
) -> list[Example]:
    """The target's greedy answers with the hidden state at every answer position, captured during
    generation (no second forward); saved after every batch in ``workdir`` so a killed run keeps them."""
    path = workdir / "generated.pt"
    kept: list[Example] = [tuple(e) for e in load_plain(path)] if path.exists() else []
    have = {tuple(e[0]): e for e in kept}  # by prompt content: another sample reuses what it shares
    engine = TreeDecodingEngine(lm.model, RejectionSampler(), lm.eos_ids)
    todo = [list(p) for p in dict.fromkeys(tuple(p) for p in prompts) if p not in have]
    for start in tqdm(range(0, len(todo), batch), desc="target greedy answers", unit="batch", disable=not progress):
        chunk = todo[start : start + batch]
        recorders = [_HiddenRecorder() for _ in chunk]
        reqs = [
            Request(tokens=list(p), prompt_len=len(p), drafter=rec, max_new_tokens=max_new_tokens)
            for p, rec in zip(chunk, recorders)
        ]
        engine.run(reqs)
        for r, rec in zip(reqs, recorders):
            hidden = torch.stack(rec.hidden) if rec.hidden else torch.zeros(0, lm.model.config.hidden_size)
            example = (r.tokens[: r.prompt_len], r.new_tokens, hidden.half())
            kept.append(example)
            have[tuple(example[0])] = example
        workdir.mkdir(parents=True, exist_ok=True)
        torch.save(kept, path.with_suffix(".tmp"))
        path.with_suffix(".tmp").replace(path)
    return [have[tuple(p)] for p in prompts]


def generated_examples(workdir: Path) -> list[Example]:
    """The examples a previous run generated in ``workdir`` (:func:`generate_examples`)."""
    path = workdir / "generated.pt"
    if not path.exists():
        raise ValueError(f"no generated answers in {workdir}: run without --from-generated first")
    return [tuple(e) for e in load_plain(path)]


def examples_features(lm: laser.LoadedModel, examples: Sequence[Example], depth: int, desc: str) -> Features:
    """Features of examples: captured hidden states where present, one target forward otherwise."""
    recompute = [(p, a) for p, a, h in examples if h is None]
    hiddens, tokens = [], []
    for _, answer, h in examples:
        if h is None or len(h) == 0:
            continue
        padded = torch.tensor(answer + [-100] * (depth + 1))
        idx = torch.arange(len(h))[:, None] + torch.arange(depth + 1)[None, :]  # h[i] predicts answer[i]
        hiddens.append(h.float())
        tokens.append(padded[idx])
    if recompute:
        more = extract_features(lm, recompute, depth, desc)
        hiddens.append(more.hidden)
        tokens.append(more.tokens)
    if not hiddens:
        raise ValueError("no training example has an answer of 2 tokens or more")
    return Features(torch.cat(hiddens), torch.cat(tokens))


def shortlist_tokens(answers: Sequence[list[int]], size: int, extra: Sequence[int] = ()) -> tuple[torch.Tensor, float]:
    """The ``size`` most frequent answer tokens (``extra`` first, e.g. EOS) and the share of answer tokens
    they cover."""
    counts = Counter(t for a in answers for t in a)
    ranked = list(dict.fromkeys([*extra, *(t for t, _ in counts.most_common())]))[:size]
    total = sum(counts.values())
    covered = sum(counts[t] for t in ranked)
    return torch.tensor(sorted(ranked)), (covered / total if total else 0.0)


# ---- training -------------------------------------------------------------------------------------


def head_loss(
    head: RecurrentDraftHead, hidden: torch.Tensor, tokens: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Summed cross-entropy over the T depths (teacher forcing), and per-depth (hits, counted) tensors."""
    k = head.out_size
    to_head = torch.full((head.vocab_size,), -100, dtype=torch.long)
    to_head[head.token_ids.cpu()] = torch.arange(k)
    state = head.start(tokens[:, 0].clamp(min=0))
    losses, hits, counted = [], [], []
    for depth in range(1, tokens.shape[1]):
        label = tokens[:, depth]
        valid = label >= 0
        target = torch.where(valid, to_head[label.clamp(min=0)], torch.full_like(label, -100))
        logits = head.logits(hidden, state).float()
        losses.append(F.cross_entropy(logits, target, ignore_index=-100, reduction="sum") / max(int(valid.sum()), 1))
        hits.append(((logits.argmax(-1) == target) & valid).sum())
        counted.append(valid.sum())
        state = head.advance(state, label.clamp(min=0))
    return torch.stack(losses).sum(), torch.stack(hits), torch.stack(counted)


def _schedule(settings: TrainSettings):
    warm = max(1, int(settings.warmup * settings.steps))

    def factor(step: int) -> float:
        if step < warm:
            return (step + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(1, settings.steps - warm)))

    return factor


def _batch(n: int, size: int, seed: int, step: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 1_000_003 + step)
    return torch.randint(0, n, (min(size, n),), generator=g)


def train_head(
    lm: laser.LoadedModel,
    feats: Features,
    settings: TrainSettings,
    workdir: Path,
    shortlist: torch.Tensor | None = None,
    progress: bool = True,
) -> tuple[RecurrentDraftHead, list[dict]]:
    """Train (or resume) a head on ``feats``; checkpoints under ``workdir``; returns the head and the history."""
    torch.manual_seed(settings.seed)
    lm.model.requires_grad_(False)
    head = RecurrentDraftHead(lm.model, settings.kind, settings.blocks, shortlist).float().train()
    opt = torch.optim.AdamW(
        [p for p in head.parameters() if p.requires_grad], lr=settings.lr, weight_decay=settings.weight_decay
    )
    sched = torch.optim.lr_scheduler.LambdaLR(opt, _schedule(settings))
    history: list[dict[str, Any]] = []
    start = 0
    ckpt = workdir / "checkpoint.pt"
    if ckpt.exists():
        start, history = load_checkpoint(ckpt, head, opt, sched, settings)
        log.info("Resuming ReDrafter training from step %d (%s)", start, ckpt)
    hidden = feats.hidden.to(head.rnn_w.weight.dtype)
    bar = tqdm(
        range(start, settings.steps),
        desc="train redrafter head",
        unit="step",
        disable=not progress,
        initial=start,
        total=settings.steps,
    )
    for step in bar:
        idx = _batch(len(hidden), settings.batch_positions, settings.seed, step)
        loss, hits, counted = head_loss(head, hidden[idx], feats.tokens[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        acc = (hits.float() / counted.clamp(min=1)).tolist()
        history.append({"step": step + 1, "loss": loss.item(), "accuracy": acc, "lr": sched.get_last_lr()[0]})
        bar.set_postfix(loss=f"{history[-1]['loss']:.3f}", acc1=f"{acc[0]:.2f}")
        if (step + 1) % settings.checkpoint_every == 0 or step + 1 == settings.steps:
            save_checkpoint(ckpt, head, opt, sched, settings, step + 1, history)
    return head.eval().requires_grad_(False), history


def save_checkpoint(path: Path, head, opt, sched, settings: TrainSettings, step: int, history: list) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    torch.save(
        {
            "step": step,
            "settings": asdict(settings),
            "head": head.state_dict(),
            "opt": opt.state_dict(),
            "sched": sched.state_dict(),
            "history": history,
        },
        tmp,
    )
    tmp.replace(path)


def load_checkpoint(path: Path, head, opt, sched, settings: TrainSettings) -> tuple[int, list]:
    blob = load_plain(path)
    if blob["settings"] != asdict(settings):
        changed = sorted(k for k in blob["settings"] if blob["settings"][k] != asdict(settings).get(k))
        raise ValueError(
            f"{path} was written with other training settings ({', '.join(changed)}); "
            "delete it to start over, or resume with the same settings"
        )
    head.load_state_dict(blob["head"])
    opt.load_state_dict(blob["opt"])
    sched.load_state_dict(blob["sched"])
    return int(blob["step"]), list(blob["history"])


def plot_history(history: list[dict], png: Path, title: str) -> Path:
    """Loss and per-depth teacher-forced accuracy against the step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [h["step"] for h in history]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    ax1.plot(steps, [h["loss"] for h in history])
    ax1.set(xlabel="step", ylabel="loss (CE summed over depths)", title=title)
    for d in range(len(history[0]["accuracy"])):
        ax2.plot(steps, [h["accuracy"][d] for h in history], label=f"token +{d + 1}")
    ax2.set(xlabel="step", ylabel="top-1 accuracy (teacher forced)", ylim=(0, 1), title="draft accuracy by depth")
    ax2.legend()
    fig.tight_layout()
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=100)
    plt.close(fig)
    return png


def evaluate(head: RecurrentDraftHead, feats: Features) -> list[float]:
    """Per-depth teacher-forced accuracy on held-out features."""
    with torch.no_grad():
        _, hits, counted = head_loss(head, feats.hidden.to(head.rnn_w.weight.dtype), feats.tokens)
    return (hits.float() / counted.clamp(min=1)).tolist()


def fit_and_save(
    lm: laser.LoadedModel,
    examples: Sequence[Example],
    settings: TrainSettings,
    name: str,
    workdir: Path,
    progress: bool = True,
    held_out: float = 0.1,
) -> dict[str, Any]:
    """Features, shortlist, training (resumable), held-out accuracy; head, PNG and JSON written; a summary.

    ``examples``: (prompt, answer, hidden states or None); pairs (prompt, answer) are accepted too.
    """
    examples = [e if len(e) == 3 else (e[0], e[1], None) for e in examples]
    n_eval = max(1, int(len(examples) * held_out)) if len(examples) > 4 else 0
    train_ex, eval_ex = examples[n_eval:], examples[:n_eval]
    shortlist, coverage = shortlist_tokens([a for _, a, _ in train_ex], settings.shortlist, sorted(lm.eos_ids))
    feats = examples_features(lm, train_ex, settings.depth, "target hidden states")
    eval_feats = examples_features(lm, eval_ex, settings.depth, "held-out hidden states") if eval_ex else None
    head, history = train_head(
        lm, feats, settings, workdir, shortlist if settings.kind == "shortlist" else None, progress
    )
    summary = {
        "model": lm.name,
        "head": name,
        "settings": asdict(settings),
        "train_sequences": len(train_ex),
        "eval_sequences": len(eval_ex),
        "positions": len(feats.hidden),
        "shortlist_coverage": coverage if settings.kind == "shortlist" else 1.0,
        "final_train_accuracy": history[-1]["accuracy"],
        "eval_accuracy": evaluate(head, eval_feats) if eval_feats else None,
    }
    out = head_path(name)
    head.save(out, summary)
    summary["path"] = str(out)
    summary["plot"] = str(plot_history(history, out.with_suffix(".png"), f"ReDrafter head {name} ({lm.name})"))
    out.with_suffix(".json").write_text(json.dumps({**summary, "history": history}, indent=1))
    return summary


# ---- the job's data -------------------------------------------------------------------------------


def job_examples(
    cfg: Any,
    lm: laser.LoadedModel,
    workdir: Path,
    limit: int | None = None,
    source: str = "auto",
    progress: bool = True,
) -> list[Example]:
    """(prompt ids, answer ids) for the job's old-knowledge prompts (old user histories, existing items).

    ``source``: ``greedy`` (the target's greedy answers with their hidden states, generated once and kept in
    ``workdir``), ``store`` (the texts of the job's old-knowledge store, tokenised; hidden states by one
    target forward) or ``auto`` (the store when it has rows, else greedy).
    ``limit`` keeps a seeded sample of that many entities.
    """
    import random

    from pipelines.knowledge.inputs import load_job_data
    from pipelines.knowledge.paths import JobPaths
    from pipelines.knowledge.requests import item_requests, user_requests
    from pipelines.store.knowledge import knowledge_texts
    from pipelines.store.shards import MANIFEST
    from pipelines.knowledge.prompts import item_prompt, user_prompt, words_for_budget

    if source not in ("auto", "greedy", "store"):
        raise ValueError(f"source must be auto, greedy or store, got {source!r}")
    data = load_job_data(cfg, mode="paper")
    reqs = user_requests(data.split.old_interactions, data.dataset.items) + item_requests(data.split.existing_items)
    if limit is not None and limit < len(reqs):
        reqs = random.Random(cfg.dataset.seed).sample(reqs, limit)
    max_new = cfg.old_knowledge.max_new_tokens or cfg.generation.max_new_tokens
    words, domain = words_for_budget(max_new), data.dataset.domain
    encode = laser.get_decoder("autoregressive", lm).encode
    prompts = {}
    for r in reqs:
        text = (
            user_prompt(
                r.history or [],
                domain,
                user_id=r.entity_id,
                tokenizer=lm.tokenizer,
                max_prompt_tokens=cfg.generation.max_prompt_tokens,
                max_words=words,
            )
            if r.entity_type == "user"
            else item_prompt(r.item or {}, domain, max_words=words)
        )
        prompts[(r.entity_type, r.entity_id)] = encode(text)
    store = JobPaths.of(cfg).old_knowledge
    texts = knowledge_texts(store) if source != "greedy" and (store / MANIFEST).exists() else {}
    if source == "store" and not texts:
        raise ValueError(
            f"old-knowledge store {store} is empty or missing: run `laser generate CONFIG --old` or use source greedy"
        )
    if texts:
        log.info("Training on %d texts of the old-knowledge store %s", len(texts), store)
        if lm.tokenizer is None:
            raise ValueError(f"train-redrafter: model {lm.name!r} has no tokenizer: the store's texts need one")
        return [
            (prompts[k], lm.tokenizer.encode(t, add_special_tokens=False), None)
            for k, t in sorted(texts.items())
            if k in prompts
        ]
    return generate_examples(lm, [ids for _, ids in sorted(prompts.items())], max_new, workdir, progress=progress)
