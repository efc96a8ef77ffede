"""`laser train-align`: AtSpeed draft alignment training for the ``atspeed`` decoder.

The target (the job's ``model.name``, possibly a `laser train-recommender` result) stays frozen; the draft
starts from ``init`` (``truncate:N`` / ``fresh:L:H`` as in `laser train-draft`, or a model-cache name or
path). Prompts are the next-item examples of :mod:`training.rec_examples`. Per prompt, the data are
K identifier sequences, made once with the initial draft and cached in the work directory:

- ``strict`` (AtSpeed-S): the top-K of a constrained beam search over the token-level mixture
  (1 - lam) * q + lam * p (draft q, target p);
- ``relaxed`` (AtSpeed-R): the target's own top-K (the ``beam`` decoder).

Loss (:func:`laser.decoders.beam.align.alignment_objective`): alpha * alignment (strict: AtSpeed-S, relaxed:
AtSpeed-R) at every identifier position of the K sequences, teacher-forced, ``valid`` = the tokens the
item trie allows there; + (1 - alpha) * cross-entropy on the ground-truth next item.

Work directory ``<output work dir>/align-training/<name>/``: ``align_data.pt``, ``checkpoint.pt``,
``loss.png``, ``report.json`` (held-out loss terms before/after; per beam step, the share of the
target's top-K beams that are among the draft's top-N grown from the same parents, before/after; the
``atspeed`` decoder's beam steps per target forward before/after). The draft is saved in the model cache
under ``name``: ``decoder.params.draft: <name>``.
"""

from __future__ import annotations

import json
import logging
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch
from transformers import PreTrainedModel

import laser
from laser.decoders.beam.align import alignment_objective
from laser.decoders.beam.search import Hyp, ItemTrie, Seq, beam_step, initial_beams
from laser.models import LoadedModel
from pipelines.recommend.config import RecommendJobConfig
from training.draft import build_draft, plot_losses, save_draft
from training.loop import LoopSettings, batch_indices, load_plain, run_steps, start_run
from training.rec_examples import (
    PrefixRows,
    RecExample,
    identifier_logits,
    labels_of,
    model_beam_search,
    ranking_decoder,
    rec_data,
    valid_mask,
)
from pipelines.knowledge.validation import JobInputError
from pipelines.store.location import atomic_write_local

log = logging.getLogger(__name__)


@dataclass
class AlignSettings:
    """How `laser train-align` trains (CLI options)."""

    mode: str = "strict"  # strict (AtSpeed-S) | relaxed (AtSpeed-R)
    name: str | None = None  # model-cache name; default "<model>-atspeed-<mode>"
    init: str = "truncate:2"  # truncate:N | fresh:L:H | a model-cache name or path
    lam: float = 0.5  # strict data: weight of the target in the mixture
    alpha: float = 0.5  # weight of the alignment loss (1 - alpha: cross-entropy)
    K: int | None = None  # default recommend.K
    top_n: int = 20  # draft beams N in the coverage measure and the atspeed check
    gamma: int = 4  # draft steps of the atspeed check
    steps: int = 60
    batch_size: int = 2  # prompts per step (each with K sequences and its true next item)
    lr: float = 1e-3
    warmup: int = 5
    checkpoint_every: int = 20
    eval_every: int = 10
    eval_prompts: int = 4  # held-out prompts of the coverage and atspeed measures
    held_fraction: float = 0.1
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.mode not in ("strict", "relaxed"):
            raise ValueError(f"train-align: mode must be 'strict' or 'relaxed', got {self.mode!r}")
        for key in ("steps", "batch_size", "checkpoint_every", "eval_every", "top_n", "gamma", "threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"train-align: {key} must be >= 1, got {getattr(self, key)}")
        if self.K is not None and self.K < 1:
            raise ValueError(f"train-align: K must be >= 1, got {self.K}")
        for key in ("lam", "alpha"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ValueError(f"train-align: {key} must lie in [0, 1], got {getattr(self, key)}")
        if not self.lr > 0:
            raise ValueError(f"train-align: lr must be > 0, got {self.lr}")


@dataclass
class AlignExample:
    prompt: list[int]
    seqs: list[list[int]]  # K identifier sequences (end token included), teacher-forced
    truth: list[int]  # the true next item's identifier + end token


@dataclass
class AlignResult:
    name: str
    path: str
    work_dir: str
    mode: str
    steps: int
    resumed_from: int
    s_per_step: float
    cpu_s_per_step: float
    trainable_params: int
    train_prompts: int
    held_prompts: int
    before: dict = field(default_factory=dict)  # held-out loss terms, coverage, atspeed steps/forward
    after: dict = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    held_losses: dict[int, float] = field(default_factory=dict)


# ---- draft and data -----------------------------------------------------------------------------


def init_draft(lm: LoadedModel, init: str, seed: int = 0) -> PreTrainedModel:
    """The draft to train: built from the target (``truncate:N``, ``fresh:L:H``) or loaded by name/path."""
    if init.split(":")[0] in ("truncate", "fresh"):
        draft = build_draft(lm.model, init, seed)
    else:
        draft = laser.load_model(init, device="cpu", dtype="float32").model
    vocab_d, vocab_t = draft.get_output_embeddings().weight.shape[0], lm.model.get_output_embeddings().weight.shape[0]
    if vocab_d != vocab_t:
        raise ValueError(f"train-align: draft {init!r} has a vocabulary of {vocab_d}, the target {vocab_t}")
    return draft.float()


def mixture_rows(
    q_rows: PrefixRows | None, p_rows: PrefixRows | None, seqs: list[Seq], lam: float
) -> dict[Seq, torch.Tensor]:
    """log((1 - lam) * q + lam * p) of each sequence's next token (exactly log p at lam = 1, log q at 0)."""
    if lam >= 1:
        return _needed(p_rows, "target", lam)(seqs)
    q = _needed(q_rows, "draft", lam)(seqs)
    if lam <= 0:
        return q
    p = _needed(p_rows, "target", lam)(seqs)
    w = torch.log(torch.tensor([1.0 - lam, lam]))
    return {s: torch.logsumexp(torch.stack([w[0] + q[s], w[1] + p[s]]), 0) for s in seqs}


def _needed(rows: PrefixRows | None, model: str, lam: float) -> PrefixRows:
    if rows is None:
        raise ValueError(f"train-align: the mixture at lam={lam} needs the {model}'s rows")
    return rows


def mixture_beams(
    draft: PreTrainedModel, target: PreTrainedModel, prompt: Sequence[int], trie: ItemTrie, K: int, lam: float
) -> list[list[int]]:
    """AtSpeed-S data: the top-K identifier sequences of beam search over the draft/target mixture."""
    q_rows = PrefixRows(draft, prompt) if lam < 1 else None
    p_rows = PrefixRows(target, prompt) if lam > 0 else None
    with torch.inference_mode():
        hyps = model_beam_search(lambda seqs: mixture_rows(q_rows, p_rows, seqs, lam), trie, K)
    return [list(h.seq) for h in hyps]


def target_beams(
    lm: LoadedModel, prompts: list[list[int]], trie: ItemTrie, K: int, codes: dict[str, list[int]], chunk: int = 8
) -> list[list[list[int]]]:
    """AtSpeed-R data: the target's own top-K (the ``beam`` decoder) as identifier sequences."""
    from tqdm.auto import tqdm

    dec = ranking_decoder("beam", lm)
    out = []
    for i in tqdm(range(0, len(prompts), chunk), desc="target beams", unit="chunk"):
        for rec in dec.recommend_batch(prompts[i : i + chunk], trie, K):
            out.append([codes[item] + [trie.end_token] for item, _ in rec.items])
    return out


def align_examples(
    lm: LoadedModel,
    draft: PreTrainedModel,
    examples: list[RecExample],
    trie: ItemTrie,
    codes: dict[str, list[int]],
    K: int,
    mode: str,
    lam: float,
) -> list[AlignExample]:
    from tqdm.auto import tqdm

    prompts = [e.prompt for e in examples]
    if mode == "relaxed":
        seqs = target_beams(lm, prompts, trie, K, codes)
    else:
        seqs = [
            mixture_beams(draft, lm.model, p, trie, K, lam) for p in tqdm(prompts, desc="mixture beams", unit="prompt")
        ]
    return [AlignExample(e.prompt, s, e.target) for e, s in zip(examples, seqs)]


def _cached_data(path: Path, meta: dict, make: Callable[[], dict]) -> dict:
    """The generated data, made once per work directory (a resumed run reuses them)."""
    if path.exists():
        data = load_plain(path)
        if data["meta"] != meta:
            raise ValueError(f"{path}: data made for {data['meta']}, not {meta}; use another --name or delete it")
        return {k: [AlignExample(*e) for e in v] if k != "meta" else v for k, v in data.items()}
    data = {"meta": meta, **make()}
    plain = {k: [(e.prompt, e.seqs, e.truth) for e in v] if k != "meta" else v for k, v in data.items()}
    atomic_write_local(path, lambda tmp: torch.save(plain, tmp))  # plain lists: loaded back with weights_only=True
    return data


# ---- loss and measures --------------------------------------------------------------------------


def align_loss(
    draft: torch.nn.Module,
    target: torch.nn.Module,
    batch: Sequence[AlignExample],
    trie: ItemTrie,
    K: int,
    alpha: float,
    mode: str,
) -> torch.Tensor:
    """The AtSpeed objective of a batch: alignment on the K sequences, cross-entropy on the true items."""
    pairs = [(e.prompt, s) for e in batch for s in e.seqs]
    truth = [(e.prompt, e.truth) for e in batch]
    d_all = identifier_logits(draft, pairs + truth)
    n = sum(len(s) for _, s in pairs)
    with torch.no_grad():
        t = identifier_logits(target, pairs)
    valid = valid_mask(trie, [s for _, s in pairs], t.shape[-1])
    return alignment_objective(d_all[:n], t, valid, labels_of(truth), K, alpha, mode, rec_logits=d_all[n:])


def held_terms(
    draft, target, held: Sequence[AlignExample], trie: ItemTrie, K: int, alpha: float, mode: str, batch_size: int
) -> dict[str, float]:
    """Held-out objective and its two terms (alignment alone: alpha = 1; cross-entropy: alpha = 0)."""
    out = {}
    with torch.no_grad():
        for key, a in (("objective", alpha), ("align", 1.0), ("rec", 0.0)):
            parts = [
                float(align_loss(draft, target, held[i : i + batch_size], trie, K, a, mode))
                for i in range(0, len(held), batch_size)
            ]
            out[key] = sum(parts) / len(parts) if parts else float("nan")
    return out


@torch.no_grad()
def topk_coverage(
    draft: PreTrainedModel, target: PreTrainedModel, prompts: Sequence[Sequence[int]], trie: ItemTrie, K: int, N: int
) -> dict[str, list[float]]:
    """Per beam step of the target's search: the mean share of its top-K beams among the draft's top-N
    grown from the same parents (``coverage``), and how often all K are (``all_in``: a strict step accepted)."""
    cover, all_in = defaultdict(list), defaultdict(list)
    for prompt in prompts:
        hyps = initial_beams()
        q_score: dict[Seq, float] = {(): 0.0}
        p_rows, q_rows = PrefixRows(target, prompt), PrefixRows(draft, prompt)
        step = 0
        while any(not h.done for h in hyps):
            live = [h.seq for h in hyps if not h.done]
            lp, lq = p_rows(live), q_rows(live)
            drafted = {h.seq for h in beam_step([Hyp(h.seq, q_score[h.seq], h.done) for h in hyps], lq, trie, N)}
            nxt = beam_step(hyps, lp, trie, K)
            hit = sum(h.seq in drafted for h in nxt)
            cover[step].append(hit / len(nxt))
            all_in[step].append(float(hit == len(nxt)))
            for h in nxt:
                if h.seq not in q_score:
                    q_score[h.seq] = q_score[h.seq[:-1]] + float(lq[h.seq[:-1]][h.seq[-1]])
            hyps, step = nxt, step + 1
    mean = lambda d: [sum(d[j]) / len(d[j]) for j in sorted(d)]  # noqa: E731
    return {"coverage": mean(cover), "all_in": mean(all_in)}


def atspeed_steps_per_forward(
    lm: LoadedModel, draft: PreTrainedModel, prompts: list[list[int]], trie: ItemTrie, K: int, s: AlignSettings
) -> float:
    """Beam steps per target forward of the ``atspeed`` decoder (verification = the mode) with this draft."""
    if not prompts:
        return 0.0
    dec = ranking_decoder(
        "atspeed",
        lm,
        draft=LoadedModel(draft.eval(), lm.tokenizer, "draft"),
        gamma=s.gamma,
        N=max(s.top_n, K),
        verification=s.mode,
        seed=s.seed,
    )
    recs = dec.recommend_batch(prompts, trie, K)
    return sum(r.beam_steps for r in recs) / max(1, sum(r.stats.target_forwards for r in recs))


def measures(
    lm: LoadedModel, draft: PreTrainedModel, held: list[AlignExample], trie: ItemTrie, K: int, s: AlignSettings
) -> dict:
    prompts = [e.prompt for e in held[: s.eval_prompts]]
    draft.eval()
    cov = topk_coverage(draft, lm.model, prompts, trie, K, max(s.top_n, K))
    return {
        "held": held_terms(draft, lm.model, held, trie, K, s.alpha, s.mode, s.batch_size),
        **cov,
        "mean_coverage": sum(cov["coverage"]) / max(1, len(cov["coverage"])),
        "atspeed_steps_per_forward": atspeed_steps_per_forward(lm, draft, prompts, trie, K, s),
    }


# ---- training -----------------------------------------------------------------------------------


def default_name(cfg: RecommendJobConfig, s: AlignSettings) -> str:
    return s.name or f"{Path(cfg.model.name).name or 'model'}-atspeed-{s.mode}"


def train_align(
    cfg: RecommendJobConfig,
    s: AlignSettings,
    on_step: Callable[[int, float], None] | None = None,
    lm: LoadedModel | None = None,
) -> AlignResult:
    """Align (or resume aligning) a draft to the job's frozen target; save it, plot and report."""
    name = default_name(cfg, s)
    work, lm = start_run(cfg, "align-training", name, s.threads, lm)
    for p in lm.model.parameters():
        p.requires_grad_(False)
    lm.model.eval()
    data = rec_data(cfg, lm, s.held_fraction, 0, s.seed, command="train-align")
    K = s.K or cfg.recommend.K
    if K > len(data.trie):
        raise JobInputError(f"train-align: K={K} is larger than the number of valid items ({len(data.trie)})")
    if not data.held:
        raise JobInputError("train-align: one user with old history; held-out prompts need at least two users")
    draft = init_draft(lm, s.init, s.seed)
    meta = {
        "mode": s.mode,
        "init": s.init,
        "lam": s.lam if s.mode == "strict" else None,
        "K": K,
        "model": cfg.model.name,
    }
    made = _cached_data(
        work / "align_data.pt",
        meta,
        lambda: {
            "train": align_examples(lm, draft, data.train, data.trie, data.codes, K, s.mode, s.lam),
            "held": align_examples(lm, draft, data.held, data.trie, data.codes, K, s.mode, s.lam),
        },
    )
    train, held = made["train"], made["held"]
    before_path = work / "before.json"
    if not before_path.exists():
        before_path.write_text(json.dumps(measures(lm, draft, held, data.trie, K, s)))
    before = json.loads(before_path.read_text())

    def step_loss(step: int) -> torch.Tensor:
        batch = [train[i] for i in batch_indices(len(train), s.batch_size, step, s.seed)]
        return align_loss(draft, lm.model, batch, data.trie, K, s.alpha, s.mode)

    def held_loss() -> float:
        return held_terms(draft, lm.model, held, data.trie, K, s.alpha, s.mode, s.batch_size)["objective"]

    loop = LoopSettings(
        steps=s.steps,
        lr=s.lr,
        warmup=s.warmup,
        checkpoint_every=s.checkpoint_every,
        eval_every=s.eval_every,
        desc=f"train-align {name}",
    )
    n_train = sum(p.numel() for p in draft.parameters() if p.requires_grad)
    res = run_steps(draft, step_loss, held_loss, loop, work, {**meta, "alpha": s.alpha}, on_step)
    path = save_draft(draft, lm, name)
    result = AlignResult(
        name=name,
        path=str(path),
        work_dir=str(work),
        mode=s.mode,
        steps=res.steps,
        resumed_from=res.resumed_from,
        s_per_step=res.s_per_step,
        cpu_s_per_step=res.cpu_s_per_step,
        trainable_params=n_train,
        train_prompts=len(train),
        held_prompts=len(held),
        before=before,
        after=measures(lm, draft, held, data.trie, K, s),
        losses=res.losses,
        held_losses=res.held_losses,
    )
    plot_losses(
        res.losses,
        work / "loss.png",
        name,
        held=res.held_losses,
        ylabel=f"AtSpeed-{s.mode[0].upper()} loss",
        command="train-align",
    )
    (work / "report.json").write_text(json.dumps({**asdict(result), "K": K, "settings": asdict(s)}, indent=1))
    return result
