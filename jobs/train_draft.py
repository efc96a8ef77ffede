"""`laser train-draft CONFIG`: distil a draft model for the job's target (pipelines/tools/train/draft.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt, _load


def train_draft(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt,
                name: Optional[str] = typer.Option(None, help="Model-cache name of the draft (default <model>-draft-<init>)."),
                init: str = typer.Option("truncate:2", help="truncate:N (the target's first N layers) or fresh:LAYERS:HIDDEN."),
                steps: int = typer.Option(200, help="Optimizer steps."),
                batch_size: int = typer.Option(4, help="Texts per step."),
                lr: float = typer.Option(5e-4, help="Peak learning rate (AdamW, linear warm-up)."),
                samples: int = typer.Option(48, help="Training texts wanted; the old-knowledge store is topped up "
                                                     "with greedy answers to the job's other old prompts."),
                max_prompt_tokens: int = typer.Option(160, help="Prompt tokens kept before each text."),
                checkpoint_every: int = typer.Option(25, help="Steps between checkpoints."),
                positions: int = typer.Option(32, help="Response positions per text in each step's loss."),
                train_embeddings: bool = typer.Option(False, help="Also train the (tied) embeddings and head."),
                seed: int = typer.Option(0, help="Data order and initialisation seed."),
                threads: int = typer.Option(1, help="torch threads.")) -> None:
    """Distil a draft from the target on its own generations for the job's prompts; resumes after a kill."""
    from pipelines.tools.train.draft import DraftTrainSettings, train_draft as run

    cfg = _load(config, set_)
    try:
        settings = DraftTrainSettings(name=name, init=init, steps=steps, batch_size=batch_size, lr=lr, samples=samples,
                                      max_prompt_tokens=max_prompt_tokens, checkpoint_every=checkpoint_every, positions=positions,
                                      train_embeddings=train_embeddings, seed=seed, threads=threads)
    except ValueError as exc:
        typer.secho(str(exc), fg=typer.colors.RED, err=True)
        raise typer.Exit(2) from None
    res = run(cfg, settings)
    typer.echo(f"draft {res.name!r} saved in {res.path} ({res.steps} steps, resumed from {res.resumed_from}; "
               f"held-out top-1 agreement with the target {res.agreement_before:.1%} -> {res.agreement_after:.1%}; "
               f"one decoding forward: draft {res.draft_step_ms:.1f} ms, target {res.target_step_ms:.1f} ms)")
    typer.echo(f"loss curve: {res.work_dir}/loss.png; use it with --set decoder.params.draft={res.name}")
