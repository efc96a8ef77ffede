"""`laser ctr-eval CONFIG`: does knowledge from a faster decoder serve CTR models as well as greedy?

Reads the config, runs the comparison (:mod:`pipelines.ctr.evaluate`), prints the paper's Table 2 layout
and writes JSON, Markdown and a plot.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.table import Table

from jobs.config import ConfigError, apply_overrides, format_errors, read_yaml
from pipelines.ctr.config import MODEL_LABELS, CtrEvalConfig
from pipelines.ctr.evaluate import nan_to_none, run_ctr_eval

log = logging.getLogger(__name__)


def load_ctr_config(path: str | Path, overrides: list[str] | None = None) -> CtrEvalConfig:
    """Read a ctr-eval YAML, apply ``key=value`` overrides and validate; errors name the bad key."""
    try:
        return CtrEvalConfig.model_validate(apply_overrides(read_yaml(path), overrides))
    except ValidationError as exc:
        raise ConfigError(format_errors(exc, str(path))) from None


def _fmt(x: float) -> str:
    return "nan" if math.isnan(x) else f"{x:.4f}"


def render_table(result: dict) -> Table:
    """The paper's Table 2 layout: one row per knowledge source, AUC / LL per model (means over seeds)."""
    models = result["config"]["models"]
    seeds = result["config"]["seeds"]
    table = Table(title=f"Downstream CTR on {result['dataset']} (test set, mean over seeds {seeds})")
    table.add_column("knowledge")
    for m in models:
        table.add_column(f"{MODEL_LABELS[m]} AUC", justify="right")
        table.add_column(f"{MODEL_LABELS[m]} LL", justify="right")
    compared = [m for m in models if any(m in v["delta_auc"] for v in result["verdicts"].values())]
    for m in compared:
        table.add_column(f"ΔAUC {MODEL_LABELS[m]}", justify="right")
    table.add_column(f"vs {result['reference']}")
    for source, per_model in result["table"].items():
        cells = [c for m in models for c in (_fmt(per_model[m]["auc_mean"]), _fmt(per_model[m]["logloss_mean"]))]
        verdict = result["verdicts"].get(source)
        if verdict is None:
            table.add_row(source, *cells, *[""] * len(compared), "")
            continue
        deltas = [f"{verdict['delta_auc'][m]:+.4f}" if m in verdict["delta_auc"] else "" for m in compared]
        table.add_row(source, *cells, *deltas, "lossless" if verdict["lossless"] else "differs")
    return table


def ctr_eval(
    config: Path = typer.Argument(..., help="ctr-eval YAML (see jobs/configs/ctr_eval_demo.yaml)"),
    json_out: Path | None = typer.Option(
        None,
        "--json",
        help="write the full results here, with a Markdown table and a PNG beside it (same name, .md / .png)",
    ),
    overrides: list[str] = typer.Option([], "--set", help="override a config key: key.path=value"),
) -> None:
    """Train DIN and DCNv2 with no knowledge and with each knowledge source; print Table 2, write JSON."""
    try:
        cfg = load_ctr_config(config, overrides)
    except ConfigError as exc:
        typer.echo(str(exc), err=True)
        raise typer.Exit(2) from None
    if cfg.reference not in cfg.knowledge:
        log.warning(
            "reference source %r not in knowledge %s: no lossless verdicts", cfg.reference, sorted(cfg.knowledge)
        )
    result = run_ctr_eval(cfg)
    Console().print(render_table(result))
    for source, verdict in result["verdicts"].items():
        if verdict["lossless"]:
            Console().print(
                f"[green]{source}: lossless vs {cfg.reference}[/green] "
                f"(|mean ΔAUC| <= {cfg.lossless_tolerance} for every model over {len(cfg.seeds)} seeds)"
            )
    Console().print(f"verdict (95% intervals over {len(cfg.seeds)} seeds): {result['verdict']}")
    if json_out is not None:
        from pipelines.ctr.report import markdown, plot

        json_out.parent.mkdir(parents=True, exist_ok=True)
        clean = nan_to_none(result)
        json_out.write_text(json.dumps(clean, indent=2, allow_nan=False))
        json_out.with_suffix(".md").write_text(markdown(clean))
        plot(clean, json_out.with_suffix(".png"))
        log.info("wrote %s and its .md and .png", json_out)


def register(app: typer.Typer) -> None:
    app.command("ctr-eval")(ctr_eval)
