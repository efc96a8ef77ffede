"""The optimisation loop shared by `laser train-draft`, `laser train-recommender` and `laser train-align`.

:func:`run_steps` trains the parameters of ``model`` that require gradients for ``steps`` AdamW steps
(linear warm-up, then cosine decay to a tenth of the peak, or a constant rate), with a tqdm bar, a held-out loss every
``eval_every`` steps, ``checkpoint.pt`` in the work directory every ``checkpoint_every`` steps and on an
interrupt (trainable weights, optimizer, losses). A re-run resumes from the checkpoint; each step's batch
is a pure function of the step (seeded order per epoch, :func:`batch_indices`), so a
resumed run trains exactly as an uninterrupted one.
"""

from __future__ import annotations

import logging
import math
import pickle
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from tqdm.auto import tqdm

from pipelines.store.location import atomic_write_local

log = logging.getLogger(__name__)


@dataclass
class LoopSettings:
    steps: int
    lr: float
    warmup: int = 5
    checkpoint_every: int = 20
    eval_every: int = 10
    desc: str = "train"
    decay: bool = True  # cosine decay after the warm-up; False: the peak rate from then on


@dataclass
class LoopResult:
    steps: int
    resumed_from: int
    losses: list[float] = field(default_factory=list)
    held_losses: dict[int, float] = field(default_factory=dict)  # step -> held-out loss (step 0 = before)
    seconds: float = 0.0  # training time of this run (its own steps only), wall clock
    cpu_seconds: float = 0.0  # the same in CPU time of this process (all its threads)

    @property
    def s_per_step(self) -> float:
        done = self.steps - self.resumed_from
        return self.seconds / done if done else 0.0

    @property
    def cpu_s_per_step(self) -> float:
        done = self.steps - self.resumed_from
        return self.cpu_seconds / done if done else 0.0


def start_run(cfg: Any, kind: str, name: str, threads: int, lm: Any = None) -> tuple[Path, Any]:
    """A training command's start: torch threads, its work directory ``<work>/<kind>/<name>`` (the job's
    output.path, or output.work_dir for a URI output), and the job's target (``lm``, else loaded fp32)."""
    import laser
    from pipelines.knowledge.paths import JobPaths

    torch.set_num_threads(threads)
    work = JobPaths.of(cfg).work / kind / name
    work.mkdir(parents=True, exist_ok=True)
    return work, lm or laser.load_model(cfg.model.name, device="cpu", dtype="float32")


def batch_indices(n_examples: int, batch_size: int, step: int, seed: int) -> list[int]:
    """Indices of the examples of ``step`` (0-based): a seeded permutation per epoch."""
    per_epoch = max(1, n_examples // batch_size)
    epoch, k = divmod(step, per_epoch)
    order = list(range(n_examples))
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[k * batch_size : (k + 1) * batch_size]


def lr_at(step: int, s: LoopSettings) -> float:
    """Learning rate of 0-based ``step``: linear warm-up, then cosine decay to lr/10."""
    if step < s.warmup:
        return s.lr * (step + 1) / s.warmup
    if not s.decay:
        return s.lr
    frac = (step - s.warmup) / max(1, s.steps - s.warmup)
    return s.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, frac))))


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]


def save_checkpoint(
    path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, res: LoopResult, meta: dict[str, Any]
) -> None:
    weights = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    state = {
        "step": res.steps,
        "meta": meta,
        "weights": weights,
        "optimizer": opt.state_dict(),
        "losses": res.losses,
        "held_losses": res.held_losses,
    }
    atomic_write_local(path, lambda tmp: torch.save(state, tmp))


def load_plain(path: Path) -> Any:
    """A cache or checkpoint of a training work directory: tensors, numbers, strings, lists, tuples and
    dicts only (``weights_only=True``), so a planted file cannot run code. Anything else is refused."""
    from pipelines.knowledge.validation import JobInputError

    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise JobInputError(
            f"{path}: not a plain tensor file, refused ({reason[:160]}); delete it to start over"
        ) from None


def load_checkpoint(path: Path, model: torch.nn.Module, opt: torch.optim.Optimizer, meta: dict[str, Any]) -> LoopResult:
    ckpt = load_plain(path)
    if ckpt.get("meta") != meta:
        raise ValueError(
            f"{path}: checkpoint of another training ({ckpt['meta']}), not {meta}; "
            "use another --name or delete the work directory"
        )
    missing = set(ckpt["weights"]) - {n for n, _ in model.named_parameters()}
    if missing:
        raise ValueError(f"{path}: checkpoint weights {sorted(missing)[:3]} are not in the model")
    model.load_state_dict(ckpt["weights"], strict=False)
    opt.load_state_dict(ckpt["optimizer"])
    step = int(ckpt["step"])
    return LoopResult(
        steps=step,
        resumed_from=step,
        losses=list(ckpt["losses"]),
        held_losses={int(k): v for k, v in ckpt["held_losses"].items()},
    )


def run_steps(
    model: torch.nn.Module,
    step_loss: Callable[[int], torch.Tensor],
    held_loss: Callable[[], float] | None,
    s: LoopSettings,
    work: Path,
    meta: dict[str, Any],
    on_step: Callable[[int, float], None] | None = None,
) -> LoopResult:
    """Train (or resume) ``model``'s trainable parameters; ``step_loss(step)`` is the loss of a step's batch,
    ``held_loss()`` the held-out loss (no gradients; None: none). ``meta`` must match a checkpoint to resume it."""
    params = trainable(model)
    opt = torch.optim.AdamW(params, lr=s.lr, weight_decay=0.0)
    ckpt = work / "checkpoint.pt"
    res = load_checkpoint(ckpt, model, opt, meta) if ckpt.exists() else LoopResult(0, 0)
    if res.steps:
        log.info("%s: resuming at step %d of %d", s.desc, res.steps, s.steps)
    if held_loss is not None and 0 not in res.held_losses:
        model.eval()
        res.held_losses[0] = held_loss()
    started, cpu_started = time.perf_counter(), time.process_time()
    updating = False  # True between an optimizer step and its bookkeeping: no consistent state to save
    try:
        with tqdm(total=s.steps, initial=res.steps, desc=s.desc, unit="step") as bar:
            while res.steps < s.steps:
                for group in opt.param_groups:
                    group["lr"] = lr_at(res.steps, s)
                model.train()
                loss = step_loss(res.steps)
                opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                updating = True
                opt.step()
                res.steps += 1
                res.losses.append(float(loss.detach()))
                updating = False
                bar.update(1)
                bar.set_postfix(loss=f"{res.losses[-1]:.4f}")
                if held_loss is not None and (res.steps % s.eval_every == 0 or res.steps == s.steps):
                    model.eval()
                    res.held_losses[res.steps] = held_loss()
                if res.steps % s.checkpoint_every == 0 or res.steps == s.steps:
                    save_checkpoint(ckpt, model, opt, res, meta)
                if on_step is not None:
                    on_step(res.steps, res.losses[-1])
    except BaseException:  # an interrupt keeps the work done so far
        if res.steps > res.resumed_from and not updating:
            save_checkpoint(ckpt, model, opt, res, meta)
            log.warning("%s interrupted: checkpoint at step %d in %s; re-run to resume", s.desc, res.steps, ckpt)
        raise
    finally:
        res.seconds = time.perf_counter() - started
        res.cpu_seconds = time.process_time() - cpu_started
    model.eval()
    return res
