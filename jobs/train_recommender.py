"""`laser train-recommender CONFIG`: fine-tune the job's model on next-item prediction (pipelines/tools/train/recommender.py)."""
from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer

from jobs.run import ConfigArg, SetOpt


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


def train_recommender(config: Path = ConfigArg, set_: Optional[list[str]] = SetOpt,
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
                      threads: int = typer.Option(1, help="torch threads.")) -> None:
    """Fine-tune the recommender on next-item prediction from the old histories; resumes after a kill."""
    from pipelines.tools.train.recommender import RecTrainSettings, train_recommender as run

    cfg = load_recommend_config(config, set_)
    s = settings_or_exit(lambda: RecTrainSettings(
        method=method, name=name, steps=steps, batch_size=batch_size, lr=lr, lora_r=lora_r, lora_alpha=2 * lora_r,
        checkpoint_every=checkpoint_every, eval_every=eval_every, eval_users=eval_users, seed=seed, threads=threads))
    res = run(cfg, s)
    K = cfg.recommend.K
    typer.echo(f"{res.method} fine-tune {res.name!r} saved in {res.path} ({res.steps} steps, resumed from "
               f"{res.resumed_from}; {res.trainable_params:,} trainable parameters; {res.s_per_step:.2f} s/step)")
    typer.echo(f"beam on held-out new items ({int(res.after.get('users', 0))} users): recall@{K} "
               f"{res.before[f'recall@{K}']:.3f} -> {res.after[f'recall@{K}']:.3f}, NDCG@{K} "
               f"{res.before[f'ndcg@{K}']:.3f} -> {res.after[f'ndcg@{K}']:.3f}")
    typer.echo(f"loss curve: {res.work_dir}/loss.png; use it with --set model.name={res.name}")
