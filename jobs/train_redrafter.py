"""`laser train-redrafter CONFIG`: distil a ReDrafter draft head for the job's model (pipelines.tools.train.redrafter)."""
from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from jobs.run import SetOpt, _load


def train_redrafter(
        config: Path = typer.Argument(..., help="Job config YAML: its model, dataset and old-knowledge prompts."),
        set_: Optional[list[str]] = SetOpt,
        name: Optional[str] = typer.Option(None, help="Head name for decoder.params.head (default <model>-redrafter)."),
        samples: Optional[int] = typer.Option(200, help="Old-knowledge entities to train on (seeded sample)."),
        source: str = typer.Option("auto", help="greedy: the target's greedy answers (cached); store: the "
                                                "old-knowledge store; auto: the store when it has rows."),
        kind: str = typer.Option("shortlist", help="Vocabulary head: shortlist, tied or full."),
        shortlist: int = typer.Option(4096, help="Tokens of a shortlist head."),
        depth: int = typer.Option(4, help="Future tokens per position (beam_length - 1)."),
        steps: int = typer.Option(300, help="Optimiser steps."),
        batch: int = typer.Option(256, help="Positions per step."),
        lr: float = typer.Option(1e-3, help="Peak learning rate (cosine, 10% warm-up)."),
        checkpoint_every: int = typer.Option(50, help="Steps between checkpoints."),
        workdir: Optional[Path] = typer.Option(None, help="Checkpoints and features (default <output.path>/redrafter/<name>)."),
        from_generated: bool = typer.Option(False, "--from-generated", help=(
            "Train on the answers already generated in the work folder (e.g. by a run stopped while generating).")),
        threads: int = typer.Option(2, help="torch threads."),
        seed: int = typer.Option(0, help="Training seed.")) -> None:
    """Train a ReDrafter head by distillation on the target's own generations (resumes after a kill)."""
    import torch

    import laser
    from pipelines.tools.train.redrafter import TrainSettings, fit_and_save, generated_examples, job_examples

    torch.set_num_threads(threads)
    cfg = _load(config, set_)
    try:
        settings = TrainSettings(kind=kind, shortlist=shortlist, depth=depth, steps=steps, batch_positions=batch,
                                 lr=lr, checkpoint_every=checkpoint_every, seed=seed)
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
