"""The `laser` command line. Each sub-command lives in the module that owns its work."""
from __future__ import annotations

import logging
from pathlib import Path

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, rich_markup_mode=None, help="LASER: fast LLM knowledge generation for recommenders.")


def _version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"laser {version('laser-knowledge')}")
        except PackageNotFoundError:  # run from a source tree that was never installed
            typer.echo("laser (laser-knowledge not installed)")
        raise typer.Exit()


@app.callback()
def main(verbose: bool = typer.Option(False, "--verbose", "-v", help="Debug logging."),
         version: bool = typer.Option(False, "--version", callback=_version, is_eager=True,
                                      help="Print the laser-knowledge version and exit.")) -> None:
    logging.basicConfig(level=logging.DEBUG if verbose else logging.INFO, format="%(levelname)s %(name)s: %(message)s")


@app.command("decoders")
def decoders() -> None:
    """List the registered decoders (built-ins and `laser.decoders` entry-point plug-ins)."""
    from laser import available_decoders

    for name, cls in available_decoders().items():
        typer.echo(f"{name:16s} pool={cls.pool:7s} {cls.summary}")


from jobs import run as _job_commands  # noqa: E402  (run, demo, route, build-pools, generate, submit)

_job_commands.register(app)

from jobs import features as _feature_commands  # noqa: E402  (latest, encode, ingest feast)

_feature_commands.register(app)

from jobs.ctr_eval import ctr_eval as _ctr_eval  # noqa: E402

app.command("ctr-eval")(_ctr_eval)

from jobs.train_redrafter import train_redrafter as _train_redrafter  # noqa: E402

app.command("train-redrafter")(_train_redrafter)

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: each prints a table and writes JSON + a PNG plot.")
app.add_typer(bench_app, name="bench")


@bench_app.command("pools")
def bench_pools(json_out: Path = typer.Option(Path("bench-pools.json"), "--json", help="JSON output (PNG beside it)."),
                sizes: str = typer.Option("500,1000,2000,3000,5000", help="Pool sizes in texts, comma-separated."),
                seed: int = typer.Option(0, help="Seed for synthetic data and training."),
                skip_lightgcn: bool = typer.Option(False, help="Only the pool measurements.")) -> None:
    """LightGCN training time, pool build/load time, memory and retrieval time vs pool size."""
    from pipelines.bench.pools import run_pools_bench

    run_pools_bench(json_out, tuple(int(s) for s in sizes.split(",")), seed, skip_lightgcn)


@bench_app.command("decode")
def bench_decode(json_out: Path = typer.Option(Path("bench-decode.json"), "--json", help="JSON output."),
                 model: str = typer.Option("smollm2-135m", help="Target model (bundled name, path or hub id)."),
                 users: int = typer.Option(6, help="Measured prompts (new histories)."),
                 old_users: int = typer.Option(48, help="Earlier profiles that fill the pools."),
                 max_new_tokens: int = typer.Option(160, help="Generation budget per prompt."),
                 threads: int = typer.Option(2, help="torch threads."),
                 seed: int = typer.Option(0, help="Data seed.")) -> None:
    """Decoders side by side on user profiles: tokens/s, speedup vs generate, AAL, retrieval, identity to greedy."""
    from pipelines.bench.decode import DecodeBenchSettings, run_decode_bench

    run_decode_bench(json_out, DecodeBenchSettings(model=model, users=users, old_users=old_users,
                                                   max_new_tokens=max_new_tokens, threads=threads, seed=seed))


@bench_app.command("suite")
def bench_suite(json_out: Path = typer.Option(Path("bench-suite.json"), "--json", help="JSON output (PNGs beside it)."),
                quick: bool = typer.Option(False, "--quick", help="A few prompts, short outputs: a smoke check."),
                dataset_config: Path | None = typer.Option(None, "--dataset-config", help=(
                    "YAML with a DatasetConfig (a `dataset:` block of a job config, or its keys at the top); "
                    "default: the synthetic demo data.")),
                model: str = typer.Option("smollm2-135m", help="Target model (bundled name, path or hub id)."),
                user_prompts: int | None = typer.Option(None, help="Measured new histories (default 6, quick 2)."),
                item_prompts: int | None = typer.Option(None, help="Measured new items (default 4, quick 1; 0: none)."),
                max_new_tokens: int | None = typer.Option(None, help="Generation budget (default 192, quick 48)."),
                repeats: int = typer.Option(1, help="Timings per request; the median is kept."),
                threads: int = typer.Option(2, help="torch threads."),
                seed: int = typer.Option(0, help="Seed of data, split, groups and pools."),
                redrafter_head: str | None = typer.Option(None, "--redrafter-head", help=(
                    "A head trained by `laser train-redrafter`: adds the redrafter study (BW x L, with and without "
                    "dedup), written to <json stem>-redrafter.json.")),
                study: str | None = typer.Option(None, "--study", help="'redrafter': that study alone, to --json."),
                widths: str | None = typer.Option(None, help="redrafter study beam widths (default 1,2,4,8)."),
                lengths: str | None = typer.Option(None, help="redrafter study beam lengths (default 3,4,5)."),
                nodedup_lengths: str | None = typer.Option(None, help=(
                    "redrafter study lengths also measured without dedup (default: all lengths)."))) -> None:
    """Table 3 ablation, verification variants, pool-size and draft-budget sweeps, user vs item task; the
    redrafter study with --redrafter-head."""
    from jobs.config import read_yaml
    from pipelines.bench.suite import SuiteSettings, run_suite
    from pipelines.data.config import DatasetConfig

    if study not in (None, "redrafter"):
        raise typer.BadParameter(f"unknown study {study!r}; known: redrafter")
    ints = lambda text: tuple(int(x) for x in text.split(",")) if text else None  # noqa: E731
    given = {"model": model, "repeats": repeats, "threads": threads, "seed": seed, "user_prompts": user_prompts,
             "item_prompts": item_prompts, "max_new_tokens": max_new_tokens, "redrafter_head": redrafter_head,
             "only_redrafter": study == "redrafter" or None, "redrafter_widths": ints(widths),
             "redrafter_lengths": ints(lengths), "redrafter_nodedup_lengths": ints(nodedup_lengths)}
    given = {k: v for k, v in given.items() if v is not None}
    settings = SuiteSettings.quick(**given) if quick else SuiteSettings(**given)
    dataset = None
    if dataset_config is not None:
        from pydantic import ValidationError

        tree = read_yaml(dataset_config)
        try:
            dataset = DatasetConfig(**tree.get("dataset", tree))
        except ValidationError as err:
            raise typer.BadParameter(f"{dataset_config}: not a dataset config: {err}") from err
    run_suite(json_out, settings, dataset)


if __name__ == "__main__":
    app()
