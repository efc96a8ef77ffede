"""The `laser train-*` commands: a draft model (`train-draft`, training/draft.py), the recommender's fine-tune
(`train-recommender`, training/recommender.py), an AtSpeed-aligned draft (`train-align`, training/align.py) and a
ReDrafter head (`train-redrafter`, training/redrafter.py).

Registered on the `laser` app by :mod:`jobs.cli` only when one of them runs (`laser --help` never imports them).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Callable, Optional

import typer

from jobs.run import ConfigArg, SetOpt, _load


def load_recommend_config(config: Path, set_: Optional[list[str]]):
    """The recommendation job's config, or one red line and exit 2."""
    from jobs.config import ConfigError, load_config
    from pipelines.recommend.config import RecommendJobConfig

    try:
        return load_config(config, set_ or [], schema=RecommendJobConfig)
    except ConfigError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def settings_or_exit(make):
    try:
        return make()
    except ValueError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None


def train_draft(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    name: Optional[str] = typer.Option(None, help="Model-cache name of the draft (default <model>-draft-<init>)."),
    init: str = typer.Option("truncate:2", help="truncate:N (the target's first N layers) or fresh:LAYERS:HIDDEN."),
    steps: int = typer.Option(200, help="Optimizer steps."),
    batch_size: int = typer.Option(4, help="Texts per step."),
    lr: float = typer.Option(5e-4, help="Peak learning rate (AdamW, linear warm-up)."),
    samples: int = typer.Option(
        48,
        help="Training texts wanted; the old-knowledge store is topped up "
        "with greedy answers to the job's other old prompts.",
    ),
    max_prompt_tokens: int = typer.Option(160, help="Prompt tokens kept before each text."),
    checkpoint_every: int = typer.Option(25, help="Steps between checkpoints."),
    positions: int = typer.Option(32, help="Response positions per text in each step's loss."),
    train_embeddings: bool = typer.Option(False, help="Also train the (tied) embeddings and head."),
    seed: int = typer.Option(0, help="Data order and initialisation seed."),
    threads: int = typer.Option(1, help="torch threads."),
) -> None:
    """Distil a draft from the target on its own generations for the job's prompts; resumes after a kill."""
    from training.draft import DraftTrainSettings, train_draft as run

    cfg = _load(config, set_)
    try:
        settings = DraftTrainSettings(
            name=name,
            init=init,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            samples=samples,
            max_prompt_tokens=max_prompt_tokens,
            checkpoint_every=checkpoint_every,
            positions=positions,
            train_embeddings=train_embeddings,
            seed=seed,
            threads=threads,
        )
    except ValueError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    res = run(cfg, settings)
    typer.echo(
        f"draft {res.name!r} saved in {res.path} ({res.steps} steps, resumed from {res.resumed_from}; "
        f"held-out top-1 agreement with the target {res.agreement_before:.1%} -> {res.agreement_after:.1%}; "
        f"one decoding forward: draft {res.draft_step_ms:.1f} ms, target {res.target_step_ms:.1f} ms)"
    )
    typer.echo(f"loss curve: {res.work_dir}/loss.png; use it with --set decoder.params.draft={res.name}")


def train_recommender(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    method: str = typer.Option("lora", help="lora (peft adapters, merged before saving) or full."),
    name: Optional[str] = typer.Option(None, help="Model-cache name (default <model>-rec-<method>)."),
    steps: int = typer.Option(60, help="Optimizer steps."),
    batch_size: int = typer.Option(4, help="Next-item examples per step."),
    lr: Optional[float] = typer.Option(None, help="Peak learning rate (default 1e-3 lora, 5e-5 full)."),
    lora_r: int = typer.Option(8, help="LoRA rank."),
    checkpoint_every: int = typer.Option(20, help="Steps between checkpoints."),
    eval_every: int = typer.Option(10, help="Steps between held-out losses."),
    eval_users: int = typer.Option(8, help="Users whose held-out new items rate the model before/after."),
    seed: int = typer.Option(0, help="Data order, held-out users and adapter initialisation."),
    threads: int = typer.Option(1, help="torch threads."),
) -> None:
    """Fine-tune the recommender on next-item prediction from the old histories; resumes after a kill."""
    from training.recommender import RecTrainSettings, train_recommender as run

    cfg = load_recommend_config(config, set_)
    s = settings_or_exit(
        lambda: RecTrainSettings(
            method=method,
            name=name,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            lora_r=lora_r,
            lora_alpha=2 * lora_r,
            checkpoint_every=checkpoint_every,
            eval_every=eval_every,
            eval_users=eval_users,
            seed=seed,
            threads=threads,
        )
    )
    res = run(cfg, s)
    K = cfg.recommend.K
    typer.echo(
        f"{res.method} fine-tune {res.name!r} saved in {res.path} ({res.steps} steps, resumed from "
        f"{res.resumed_from}; {res.trainable_params:,} trainable parameters; {res.s_per_step:.2f} s/step)"
    )
    typer.echo(
        f"beam on held-out new items ({int(res.after.get('users', 0))} users): recall@{K} "
        f"{res.before[f'recall@{K}']:.3f} -> {res.after[f'recall@{K}']:.3f}, NDCG@{K} "
        f"{res.before[f'ndcg@{K}']:.3f} -> {res.after[f'ndcg@{K}']:.3f}"
    )
    typer.echo(f"loss curve: {res.work_dir}/loss.png; use it with --set model.name={res.name}")


def train_align(
    config: Path = ConfigArg,
    set_: Optional[list[str]] = SetOpt,
    mode: str = typer.Option("strict", help="strict (AtSpeed-S: mixture beams) or relaxed (AtSpeed-R: target beams)."),
    name: Optional[str] = typer.Option(None, help="Model-cache name of the draft (default <model>-atspeed-<mode>)."),
    init: str = typer.Option("truncate:2", help="truncate:N, fresh:LAYERS:HIDDEN, or a model-cache name/path."),
    lam: float = typer.Option(0.5, help="strict data: weight of the target in the (1-lam)q + lam p mixture."),
    alpha: float = typer.Option(0.5, help="Weight of the alignment loss (the rest: cross-entropy on the true item)."),
    k: Optional[int] = typer.Option(None, "--K", help="Beams K (default recommend.K)."),
    top_n: int = typer.Option(20, "--N", help="Draft beams N of the coverage and atspeed measures."),
    steps: int = typer.Option(60, help="Optimizer steps."),
    batch_size: int = typer.Option(2, help="Prompts per step."),
    lr: float = typer.Option(1e-3, help="Peak learning rate (AdamW, warm-up then cosine)."),
    checkpoint_every: int = typer.Option(20, help="Steps between checkpoints."),
    eval_every: int = typer.Option(10, help="Steps between held-out losses."),
    seed: int = typer.Option(0, help="Data order and initialisation seed."),
    threads: int = typer.Option(1, help="torch threads."),
) -> None:
    """Align a draft to the frozen target with AtSpeed's losses; resumes after a kill."""
    from training.align import AlignSettings, train_align as run

    cfg = load_recommend_config(config, set_)
    s = settings_or_exit(
        lambda: AlignSettings(
            mode=mode,
            name=name,
            init=init,
            lam=lam,
            alpha=alpha,
            K=k,
            top_n=top_n,
            steps=steps,
            batch_size=batch_size,
            lr=lr,
            checkpoint_every=checkpoint_every,
            eval_every=eval_every,
            seed=seed,
            threads=threads,
        )
    )
    res = run(cfg, s)
    b, a = res.before, res.after
    typer.echo(
        f"AtSpeed-{res.mode[0].upper()} draft {res.name!r} saved in {res.path} ({res.steps} steps, resumed "
        f"from {res.resumed_from}; {res.s_per_step:.2f} s/step)"
    )
    typer.echo(
        f"held-out alignment loss {b['held']['align']:.4f} -> {a['held']['align']:.4f}; target top-K in draft "
        f"top-N {b['mean_coverage']:.1%} -> {a['mean_coverage']:.1%}; atspeed beam steps per target forward "
        f"{b['atspeed_steps_per_forward']:.2f} -> {a['atspeed_steps_per_forward']:.2f}"
    )
    typer.echo(
        f"loss curve: {res.work_dir}/loss.png; use it with --set decoder.name=atspeed "
        f"--set decoder.params.draft={res.name}"
    )


def train_redrafter(
    config: Path = typer.Argument(..., help="Job config YAML: its model, dataset and old-knowledge prompts."),
    set_: Optional[list[str]] = SetOpt,
    name: Optional[str] = typer.Option(None, help="Head name for decoder.params.head (default <model>-redrafter)."),
    samples: Optional[int] = typer.Option(200, help="Old-knowledge entities to train on (seeded sample)."),
    source: str = typer.Option(
        "auto",
        help="greedy: the target's greedy answers (cached); store: the "
        "old-knowledge store; auto: the store when it has rows.",
    ),
    kind: str = typer.Option("shortlist", help="Vocabulary head: shortlist, tied or full."),
    shortlist: int = typer.Option(4096, help="Tokens of a shortlist head."),
    depth: int = typer.Option(4, help="Future tokens per position (beam_length - 1)."),
    steps: int = typer.Option(300, help="Optimiser steps."),
    batch: int = typer.Option(256, help="Positions per step."),
    lr: float = typer.Option(1e-3, help="Peak learning rate (cosine, 10% warm-up)."),
    checkpoint_every: int = typer.Option(50, help="Steps between checkpoints."),
    workdir: Optional[Path] = typer.Option(
        None, help="Checkpoints and features (default <output.path>/redrafter/<name>)."
    ),
    from_generated: bool = typer.Option(
        False,
        "--from-generated",
        help=("Train on the answers already generated in the work folder (e.g. by a run stopped while generating)."),
    ),
    threads: int = typer.Option(2, help="torch threads."),
    seed: int = typer.Option(0, help="Training seed."),
) -> None:
    """Train a ReDrafter head by distillation on the target's own generations (resumes after a kill)."""
    import torch

    import laser
    from training.redrafter import TrainSettings, fit_and_save, generated_examples, job_examples

    torch.set_num_threads(threads)
    cfg = _load(config, set_)
    try:
        settings = TrainSettings(
            kind=kind,
            shortlist=shortlist,
            depth=depth,
            steps=steps,
            batch_positions=batch,
            lr=lr,
            checkpoint_every=checkpoint_every,
            seed=seed,
        )
        head = name or f"{cfg.model.name.replace('/', '--')}-redrafter"
        lm = laser.load_model(cfg.model.name, dtype="float32" if cfg.model.dtype == "auto" else cfg.model.dtype)
        work = workdir or Path(cfg.output.path) / "redrafter" / head
        examples = generated_examples(work) if from_generated else job_examples(cfg, lm, work, samples, source)
        summary = fit_and_save(lm, examples, settings, head, work)
    except ValueError as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    typer.echo(json.dumps({k: v for k, v in summary.items() if k != "settings"}, indent=1))
    typer.echo(f"use it with: --set decoder.name=redrafter --set decoder.params.head={head}")


COMMANDS: dict[str, Callable[..., None]] = {
    "train-draft": train_draft,
    "train-recommender": train_recommender,
    "train-align": train_align,
    "train-redrafter": train_redrafter,
}


def register(app: typer.Typer) -> None:
    """Add the training commands to the `laser` app."""
    from jobs.errors import clean_errors

    for name, fn in COMMANDS.items():
        app.command(name)(clean_errors(fn))
