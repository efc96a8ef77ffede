"""`laser train-align CONFIG --mode strict|relaxed`: AtSpeed draft alignment for the `atspeed` decoder
(pipelines/tools/train/align.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt
from jobs.train_recommender import load_recommend_config, settings_or_exit


def train_align(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt,
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
                threads: int = typer.Option(1, help="torch threads.")) -> None:
    """Align a draft to the frozen target with AtSpeed's losses; resumes after a kill."""
    from pipelines.tools.train.align import AlignSettings, train_align as run

    cfg = load_recommend_config(config, set_)
    s = settings_or_exit(lambda: AlignSettings(
        mode=mode, name=name, init=init, lam=lam, alpha=alpha, K=k, top_n=top_n, steps=steps, batch_size=batch_size,
        lr=lr, checkpoint_every=checkpoint_every, eval_every=eval_every, seed=seed, threads=threads))
    res = run(cfg, s)
    b, a = res.before, res.after
    typer.echo(f"AtSpeed-{res.mode[0].upper()} draft {res.name!r} saved in {res.path} ({res.steps} steps, resumed "
               f"from {res.resumed_from}; {res.s_per_step:.2f} s/step)")
    typer.echo(f"held-out alignment loss {b['held']['align']:.4f} -> {a['held']['align']:.4f}; target top-K in draft "
               f"top-N {b['mean_coverage']:.1%} -> {a['mean_coverage']:.1%}; atspeed beam steps per target forward "
               f"{b['atspeed_steps_per_forward']:.2f} -> {a['atspeed_steps_per_forward']:.2f}")
    typer.echo(f"loss curve: {res.work_dir}/loss.png; use it with --set decoder.name=atspeed "
               f"--set decoder.params.draft={res.name}")
