"""`laser train-recommender`: fine-tune the job's model on next-item prediction from the old histories.

Examples (:mod:`training.rec_examples`): per user, history[:i] -> item i, the target the item's
identifier tokens + the trie's end token; loss = cross-entropy on those tokens only. Methods: ``lora``
(peft LoRA on the attention and MLP projections, merged into the weights before saving) or ``full``
(every weight trained). The model is trained in place on the loaded copy.

Work directory ``<output work dir>/recommender-training/<name>/``: ``checkpoint.pt`` every
``checkpoint_every`` steps and on an interrupt, ``loss.png`` (train and held-out loss), ``report.json``
(recall@K / NDCG@K of ``beam`` on held-out new items before and after, trainable parameters, seconds per
step). A re-run resumes from the checkpoint and trains exactly as an uninterrupted run. The result is
saved in the model cache under ``name`` (``laser.load_model(name)``; ``--set model.name=<name>``).
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
from transformers import PreTrainedModel

from laser.models import LoadedModel
from pipelines.recommend.config import RecommendJobConfig
from training.draft import plot_losses, save_draft
from training.loop import LoopSettings, batch_indices, run_steps, start_run, trainable
from training.rec_examples import RecData, RecExample, beam_metrics, rec_data, rec_loss, transformers_model

log = logging.getLogger(__name__)

LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
DEFAULT_LR = {"lora": 1e-3, "full": 5e-5}


@dataclass
class RecTrainSettings:
    """How `laser train-recommender` trains (CLI options)."""

    method: str = "lora"  # lora | full
    name: str | None = None  # model-cache name; default "<model>-rec-<method>"
    steps: int = 60
    batch_size: int = 4
    lr: float | None = None  # default: 1e-3 (lora), 5e-5 (full)
    warmup: int = 5
    lora_r: int = 8
    lora_alpha: int = 16
    checkpoint_every: int = 20
    eval_every: int = 10  # steps between held-out losses
    eval_users: int = 8  # users whose held-out new items rate the model before and after
    held_fraction: float = 0.1  # users whose examples give the held-out loss
    seed: int = 0
    threads: int = 1

    def __post_init__(self) -> None:
        if self.method not in DEFAULT_LR:
            raise ValueError(f"train-recommender: method must be 'lora' or 'full', got {self.method!r}")
        for key in ("steps", "batch_size", "checkpoint_every", "eval_every", "lora_r", "lora_alpha", "threads"):
            if getattr(self, key) < 1:
                raise ValueError(f"train-recommender: {key} must be >= 1, got {getattr(self, key)}")
        if self.lr is not None and not self.lr > 0:
            raise ValueError(f"train-recommender: lr must be > 0, got {self.lr}")
        if not 0.0 <= self.held_fraction < 1.0:
            raise ValueError(f"train-recommender: held_fraction must lie in [0, 1), got {self.held_fraction}")

    @property
    def peak_lr(self) -> float:
        return self.lr if self.lr is not None else DEFAULT_LR[self.method]


@dataclass
class RecTrainResult:
    name: str
    path: str
    work_dir: str
    method: str
    steps: int
    resumed_from: int
    trainable_params: int
    total_params: int
    s_per_step: float
    cpu_s_per_step: float
    train_examples: int
    held_examples: int
    before: dict[str, float] = field(default_factory=dict)  # beam recall@K / NDCG@K on held-out new items
    after: dict[str, float] = field(default_factory=dict)
    losses: list[float] = field(default_factory=list)
    held_losses: dict[int, float] = field(default_factory=dict)


def default_name(cfg: RecommendJobConfig, s: RecTrainSettings) -> str:
    return s.name or f"{Path(cfg.model.name).name or 'model'}-rec-{s.method}"


def prepare(model: torch.nn.Module, s: RecTrainSettings) -> torch.nn.Module:
    """The model to train: a peft LoRA wrapper (adapters only trainable) or the model itself (all weights)."""
    if s.method == "full":
        for p in model.parameters():
            p.requires_grad_(True)
        return model
    from peft import LoraConfig, get_peft_model

    names = {n.rsplit(".", 1)[-1] for n, _ in model.named_modules()}
    targets = [t for t in LORA_TARGETS if t in names]
    if not targets:
        raise ValueError(f"train-recommender: the model has none of the LoRA target modules {LORA_TARGETS}")
    torch.manual_seed(s.seed)  # the adapters' initialisation
    config = LoraConfig(r=s.lora_r, lora_alpha=s.lora_alpha, lora_dropout=0.0, target_modules=targets, bias="none")
    return get_peft_model(model, config)


def finish(model: torch.nn.Module) -> PreTrainedModel:
    """The plain transformers model to save: LoRA merged into the weights, nothing trainable."""
    merge = getattr(model, "merge_and_unload", None)
    out = transformers_model(merge() if merge is not None else model, "train-recommender")
    for p in out.parameters():
        p.requires_grad_(False)
    return out.eval()


def held_out_loss(model: torch.nn.Module, examples: list[RecExample], batch_size: int) -> float:
    if not examples:
        return float("nan")
    with torch.no_grad():
        total = sum(
            float(rec_loss(model, examples[i : i + batch_size])) * len(examples[i : i + batch_size])
            for i in range(0, len(examples), batch_size)
        )
    return total / len(examples)


def _before(work: Path, lm: LoadedModel, data: RecData, K: int) -> dict[str, float]:
    """The untrained model's metrics, measured once per work directory (a resumed run reuses them)."""
    path = work / "before.json"
    if path.exists():
        return json.loads(path.read_text())
    metrics = beam_metrics(lm, data, K)
    path.write_text(json.dumps(metrics))
    return metrics


def train_recommender(
    cfg: RecommendJobConfig,
    s: RecTrainSettings,
    on_step: Callable[[int, float], None] | None = None,
    lm: LoadedModel | None = None,
) -> RecTrainResult:
    """Fine-tune (or resume), save in the model cache, evaluate, plot and report."""
    name = default_name(cfg, s)
    work, lm = start_run(cfg, "recommender-training", name, s.threads, lm)
    data = rec_data(cfg, lm, s.held_fraction, s.eval_users, s.seed)
    K = cfg.recommend.K
    before = _before(work, lm, data, K)
    model = prepare(lm.model, s)
    n_train = sum(p.numel() for p in trainable(model))

    def step_loss(step: int) -> torch.Tensor:
        return rec_loss(model, [data.train[i] for i in batch_indices(len(data.train), s.batch_size, step, s.seed)])

    loop = LoopSettings(
        steps=s.steps,
        lr=s.peak_lr,
        warmup=s.warmup,
        checkpoint_every=s.checkpoint_every,
        eval_every=s.eval_every,
        desc=f"train-recommender {name}",
    )
    meta = {"method": s.method, "model": cfg.model.name, "lora_r": s.lora_r if s.method == "lora" else None}
    res = run_steps(model, step_loss, lambda: held_out_loss(model, data.held, s.batch_size), loop, work, meta, on_step)
    tuned = finish(model)
    path = save_draft(tuned, lm, name)
    out_lm = LoadedModel(tuned, lm.tokenizer, name)
    result = RecTrainResult(
        name=name,
        path=str(path),
        work_dir=str(work),
        method=s.method,
        steps=res.steps,
        resumed_from=res.resumed_from,
        trainable_params=n_train,
        total_params=sum(p.numel() for p in tuned.parameters()),
        s_per_step=res.s_per_step,
        cpu_s_per_step=res.cpu_s_per_step,
        train_examples=len(data.train),
        held_examples=len(data.held),
        before=before,
        after=beam_metrics(out_lm, data, K),
        losses=res.losses,
        held_losses=res.held_losses,
    )
    plot_losses(
        res.losses,
        work / "loss.png",
        name,
        held=res.held_losses,
        ylabel="identifier cross-entropy",
        command="train-recommender",
    )
    (work / "report.json").write_text(json.dumps({**asdict(result), "K": K, "settings": asdict(s)}, indent=1))
    return result
