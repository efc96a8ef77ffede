"""The `laser bench` commands: each measures one part of the house, prints a table and writes JSON (+ Markdown and
a PNG plot) through its module in this package.

Registered on the `laser` app by :mod:`jobs.cli` only when `laser bench` runs (`laser --help` never imports it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks: each prints a table and writes JSON + a PNG plot.")


@bench_app.callback()
def _needs_research_extra() -> None:
    """Every benchmark plots: without matplotlib, one line before anything is measured."""
    from importlib.util import find_spec

    if find_spec("matplotlib") is None:
        typer.secho("laser bench: matplotlib is not installed: pip install 'laser-knowledge[research]'", err=True)
        raise typer.Exit(1)


@bench_app.command("pools")
def bench_pools(
    json_out: Path = typer.Option(Path("bench-pools.json"), "--json", help="JSON output (PNG beside it)."),
    sizes: str = typer.Option("500,1000,2000,3000,5000", help="Pool sizes in texts, comma-separated."),
    seed: int = typer.Option(0, help="Seed for synthetic data and training."),
    skip_lightgcn: bool = typer.Option(False, help="Only the pool measurements."),
) -> None:
    """LightGCN training time, pool build/load time, memory and retrieval time vs pool size."""
    from benchmarks.pools import run_pools_bench

    run_pools_bench(json_out, tuple(int(s) for s in sizes.split(",")), seed, skip_lightgcn)


@bench_app.command("decode")
def bench_decode(
    json_out: Path = typer.Option(Path("bench-decode.json"), "--json", help="JSON output."),
    model: str = typer.Option("smollm2-135m", help="Target model (bundled name, path or hub id)."),
    users: int = typer.Option(6, help="Measured prompts (new histories)."),
    old_users: int = typer.Option(48, help="Earlier profiles that fill the pools."),
    max_new_tokens: int = typer.Option(160, help="Generation budget per prompt."),
    threads: int = typer.Option(2, help="torch threads."),
    seed: int = typer.Option(0, help="Data seed."),
) -> None:
    """Decoders side by side on user profiles: tokens/s, speedup vs generate, AAL, retrieval, identity to greedy."""
    from benchmarks.decode import DecodeBenchSettings, run_decode_bench

    run_decode_bench(
        json_out,
        DecodeBenchSettings(
            model=model, users=users, old_users=old_users, max_new_tokens=max_new_tokens, threads=threads, seed=seed
        ),
    )


@bench_app.command("throughput")
def bench_throughput(
    json_out: Path = typer.Option(
        Path("bench-throughput.json"), "--json", help="JSON output (Markdown and PNG beside it)."
    ),
    dataset_config: Path | None = typer.Option(
        None,
        "--dataset-config",
        help=(
            "YAML with a DatasetConfig (a `dataset:` block of a job config, or its keys at the top); "
            "default: the synthetic demo data."
        ),
    ),
    model: str = typer.Option("smollm2-135m", help="Target model (bundled name, path or hub id)."),
    concurrency: str | None = typer.Option(
        None, help="Requests in flight, comma-separated (default: 1,4,8,16,32,64 on hf, 1,4,16,64,128 on vllm)."
    ),
    max_new_tokens: int = typer.Option(96, help="Generation budget per request."),
    min_prompts: int | None = typer.Option(
        None, help="Prompts measured at a concurrency below this (default: 8 on hf, 16 on vllm)."
    ),
    fixed_k: str = typer.Option("8,32", "--fixed-k", help="Fixed draft budgets compared with the adaptive one."),
    threads: int = typer.Option(2, help="torch threads."),
    device: str = typer.Option(
        "auto", help="hf: auto (the GPU where CUDA is available), cpu or cuda; the model in fp32 either way."
    ),
    remeasure_cost: bool = typer.Option(
        False, help="Time the forward cost model again (else the cached one; on vllm: the vLLM step-cost model)."
    ),
    seed: int = typer.Option(0, help="Seed of data, split, groups and pools."),
    engine: str = typer.Option(
        "hf",
        help="hf: our engine and generate; vllm: vLLM (plain, ngram, "
        "suffix) and LASER as vLLM's drafter beside them (needs vLLM, "
        "docs/engines.md).",
    ),
    old_users: int = typer.Option(48, help="Earlier user profiles generated for the pools."),
    repeats: int = typer.Option(
        3, help="vllm: interleaved runs of every method at each concurrency (median and min-max reported)."
    ),
    methods: str | None = typer.Option(
        None,
        help=(
            "Rows to run, comma-separated (default all). vllm: 'transformers generate', "
            "'laser relaxed (auto)', 'laser relaxed (auto), chains', vllm, 'vllm ngram', 'vllm suffix', "
            "'laser-vllm greedy', 'laser-vllm relaxed' (the first three are slow at high concurrency); "
            "hf: 'transformers generate', autoregressive, resd, 'laser greedy (auto)', "
            "'laser relaxed (auto)', 'laser relaxed K=<K>' per --fixed-k (generate always runs: the baseline)."
        ),
    ),
    warm_tokens: int = typer.Option(
        8, help="vllm: new tokens per prompt of each engine's untimed warm-up pass over the level's prompts."
    ),
    kv_cache_gib: float = typer.Option(
        0, help="vllm: KV cache per engine, GiB (0: sized per level for every request in flight)."
    ),
    max_model_len: int = typer.Option(1024, help="vllm: tokens per request (prompt, output, drafts)."),
    fresh_engines: bool = typer.Option(
        False,
        help="vllm: a fresh engine per repeat for every row "
        "(default: one engine per row and concurrency for all repeats "
        "when they fit in memory; suffix always fresh).",
    ),
    render: Path | None = typer.Option(
        None,
        metavar="<path>",
        help=(
            "vllm: render an earlier run's JSON (one stopped before its last level included) into "
            "the table, Markdown and PNG, with its targets checked, and measure nothing."
        ),
    ),
) -> None:
    """Tokens/s against concurrency: generate (static batches) vs our engine (continuous), adaptive vs fixed K;
    with --engine vllm, vLLM with and without LASER as its drafter."""
    from benchmarks.throughput import GENERATE, ThroughputSettings, default_methods, run_throughput, select_rows

    ints = lambda text: tuple(int(x) for x in text.split(",") if x.strip())  # noqa: E731
    if render is not None:
        import json

        from benchmarks.throughput_vllm import finish_vllm_report

        if not render.is_file():
            raise typer.BadParameter(f"{render} is not a file", param_hint="--render")
        finish_vllm_report(json.loads(render.read_text()), render)
        return
    if engine == "vllm":
        from benchmarks.throughput_vllm import VllmThroughputSettings, run_throughput_vllm, select_methods

        if json_out == Path("bench-throughput.json"):
            json_out = Path("docs/results/throughput-vllm.json")
        names = _names(methods)
        try:
            select_methods(names)
        except ValueError as err:
            raise typer.BadParameter(str(err), param_hint="--methods") from err
        defaults = VllmThroughputSettings()
        run_throughput_vllm(
            json_out,
            VllmThroughputSettings(
                model=model,
                threads=threads,
                concurrency=ints(concurrency) if concurrency else defaults.concurrency,
                min_prompts=defaults.min_prompts if min_prompts is None else min_prompts,
                max_new_tokens=max_new_tokens,
                old_users=old_users,
                seed=seed,
                repeats=repeats,
                methods=names,
                warm_tokens=warm_tokens,
                kv_cache_gib=kv_cache_gib,
                max_model_len=max_model_len,
                remeasure_cost=remeasure_cost,
                reuse_engines="never" if fresh_engines else "auto",
            ),
            _dataset(dataset_config),
        )
        return
    if engine != "hf":
        raise typer.BadParameter(f"--engine must be hf or vllm, got {engine!r}")
    if device not in ("auto", "cpu") and not device.startswith("cuda"):
        raise typer.BadParameter(f"--device must be auto, cpu or cuda[:N], got {device!r}")
    settings = ThroughputSettings(
        model=model,
        threads=threads,
        min_prompts=8 if min_prompts is None else min_prompts,
        max_new_tokens=max_new_tokens,
        fixed_K=ints(fixed_k),
        remeasure_cost=remeasure_cost,
        old_users=old_users,
        seed=seed,
        device=device,
        concurrency=ints(concurrency) if concurrency else ThroughputSettings.concurrency,
    )
    rows = {m.name: m for m in default_methods(settings.fixed_K)}
    try:
        names = _names(methods)  # generate always runs: it is every ratio's baseline
        chosen = [rows[n] for n in select_rows(names + (GENERATE,) if names else (), list(rows))]
    except ValueError as err:
        raise typer.BadParameter(str(err), param_hint="--methods") from err
    run_throughput(json_out, settings, _dataset(dataset_config), methods=chosen)


def _names(text: str | None) -> tuple[str, ...]:
    """The names of a comma-separated option, blanks dropped."""
    return tuple(x.strip() for x in (text or "").split(",") if x.strip())


def _dataset(path: Path | None):
    """The DatasetConfig of a YAML file (None: the demo data)."""
    if path is None:
        return None
    from pydantic import ValidationError

    from jobs.config import read_yaml
    from pipelines.data.config import DatasetConfig

    tree = read_yaml(path)
    try:
        return DatasetConfig(**tree.get("dataset", tree))
    except ValidationError as err:
        raise typer.BadParameter(f"{path}: not a dataset config: {err}") from err


@bench_app.command("driver")
def bench_driver(
    json_out: Path = typer.Option(
        Path("bench-driver.json"), "--json", help="JSON output (Markdown and PNG beside it)."
    ),
    config: str = typer.Option("jobs/configs/demo.yaml", help="Job config whose old-knowledge requests are decoded."),
    model: str | None = typer.Option(None, help="Target model (default: the config's)."),
    workers: int = typer.Option(2, help="Actors."),
    threads: int = typer.Option(1, help="torch threads per actor."),
    slots: int = typer.Option(4, help="Requests decoding together per actor (Ray Data: the batch size)."),
    max_new_tokens: int = typer.Option(48, help="Generation budget per request."),
    repeats: int = typer.Option(2, help="Interleaved runs of each method."),
) -> None:
    """The job's driver against Ray Data's map_batches on the same worker and requests: wall time, rows lost."""
    from jobs.config import load_config
    from benchmarks.driver import DriverBenchSettings, run_driver_bench

    run_driver_bench(
        json_out,
        load_config(config),
        DriverBenchSettings(
            model=model, workers=workers, threads=threads, slots=slots, max_new_tokens=max_new_tokens, repeats=repeats
        ),
    )


@bench_app.command("recommend")
def bench_recommend(
    json_out: Path = typer.Option(
        Path("bench-recommend.json"), "--json", help="JSON output (Markdown and PNG beside it)."
    ),
    model: str = typer.Option(
        "smollm2-135m",
        help="Target model (bundled name, model-cache name, path or hub id), "
        "e.g. one fine-tuned by `laser train-recommender`.",
    ),
    draft: str = typer.Option("truncate:2", help="Draft model (model-cache name, path or truncate:N)."),
    aligned_strict: str | None = typer.Option(None, help="Draft from `laser train-align --mode strict`."),
    aligned_relaxed: str | None = typer.Option(None, help="Draft from `laser train-align --mode relaxed`."),
    ks: str = typer.Option("1,3,5,10,20", "--ks", help="K values, comma-separated."),
    gamma: int = typer.Option(4, help="Draft steps per iteration."),
    n: int = typer.Option(30, "--n", help="Draft beams N (max(N, K) at each K)."),
    users: int = typer.Option(6, help="Measured users."),
    dataset_config: Path | None = typer.Option(
        None,
        "--dataset-config",
        help=("YAML with a `dataset:` block (or a job config); default: the recommendation demo data."),
    ),
    dsbd_draft: str | None = typer.Option(None, help="Draft of the DSBD section (default --draft)."),
    dsbd_prompts: int = typer.Option(3, help="Knowledge prompts of the DSBD section (0: skip it)."),
    dsbd_tokens: int = typer.Option(32, help="New tokens per DSBD/beam-sampling request."),
    threads: int = typer.Option(1, help="torch threads."),
) -> None:
    """The AtSpeed tables (beam vs atspeed strict/relaxed, with and without aligned drafts: WS@K, AS@K,
    recall@K, NDCG@K) and DSBD against beam sampling."""
    from benchmarks.recommend import RecommendBenchSettings, run_recommend_bench

    run_recommend_bench(
        json_out,
        RecommendBenchSettings(
            model=model,
            draft=draft,
            aligned_strict=aligned_strict,
            aligned_relaxed=aligned_relaxed,
            gamma=gamma,
            N=n,
            users=users,
            threads=threads,
            Ks=tuple(int(k) for k in ks.split(",")),
            dataset=_dataset(dataset_config),
            dsbd_draft=dsbd_draft,
            dsbd_prompts=dsbd_prompts,
            dsbd_tokens=dsbd_tokens,
        ),
    )


@bench_app.command("suite")
def bench_suite(
    json_out: Path = typer.Option(Path("bench-suite.json"), "--json", help="JSON output (PNGs beside it)."),
    quick: bool = typer.Option(False, "--quick", help="A few prompts, short outputs: a smoke check."),
    dataset_config: Path | None = typer.Option(
        None,
        "--dataset-config",
        help=(
            "YAML with a DatasetConfig (a `dataset:` block of a job config, or its keys at the top); "
            "default: the synthetic demo data."
        ),
    ),
    model: str = typer.Option("smollm2-135m", help="Target model (bundled name, path or hub id)."),
    user_prompts: int | None = typer.Option(None, help="Measured new histories (default 6, quick 2)."),
    item_prompts: int | None = typer.Option(None, help="Measured new items (default 4, quick 1; 0: none)."),
    max_new_tokens: int | None = typer.Option(None, help="Generation budget (default 192, quick 48)."),
    repeats: int = typer.Option(1, help="Timings per request; the median is kept."),
    threads: int = typer.Option(2, help="torch threads."),
    seed: int = typer.Option(0, help="Seed of data, split, groups and pools."),
    only: str = typer.Option(
        "laser,draft",
        help="Studies, comma-separated: laser (Table 3, Figures 2 "
        "and 6, budgets, item task), draft (draft-model decoders, Table 1).",
    ),
    draft: str | None = typer.Option(
        None,
        help="Draft study: the draft model (a name saved by "
        "`laser train-draft`, a path, or truncate:N; default truncate:N/4).",
    ),
    gamma: int = typer.Option(4, help="Draft study: draft tokens per step."),
    draft_temperatures: str = typer.Option("0,1", help="Draft study: temperatures, comma-separated."),
    redrafter_head: str | None = typer.Option(
        None,
        "--redrafter-head",
        help=(
            "A head trained by `laser train-redrafter`: adds the redrafter study (BW x L, with and without "
            "dedup), written to <json stem>-redrafter.json."
        ),
    ),
    study: str | None = typer.Option(None, "--study", help="'redrafter': that study alone, to --json."),
    widths: str | None = typer.Option(None, help="redrafter study beam widths (default 1,2,4,8)."),
    lengths: str | None = typer.Option(None, help="redrafter study beam lengths (default 3,4,5)."),
    nodedup_lengths: str | None = typer.Option(
        None, help=("redrafter study lengths also measured without dedup (default: all lengths).")
    ),
) -> None:
    """Table 3 ablation, verification variants, pool-size and draft-budget sweeps, user vs item task, draft models;
    the redrafter study with --redrafter-head."""
    from benchmarks.suite import SuiteSettings, run_suite

    studies = _names(only)
    if not studies or set(studies) - {"laser", "draft"}:
        raise typer.BadParameter(f"--only {only!r}: choose among laser, draft")
    if study not in (None, "redrafter"):
        raise typer.BadParameter(f"unknown study {study!r}; known: redrafter")
    ints = lambda text: tuple(int(x) for x in text.split(",")) if text else None  # noqa: E731
    given: dict[str, Any] = {
        "model": model,
        "repeats": repeats,
        "threads": threads,
        "seed": seed,
        "user_prompts": user_prompts,
        "item_prompts": item_prompts,
        "max_new_tokens": max_new_tokens,
        "studies": studies,
        "draft": draft,
        "gamma": gamma,
        "draft_temperatures": tuple(float(t) for t in draft_temperatures.split(",")),
        "redrafter_head": redrafter_head,
        "only_redrafter": study == "redrafter" or None,
        "redrafter_widths": ints(widths),
        "redrafter_lengths": ints(lengths),
        "redrafter_nodedup_lengths": ints(nodedup_lengths),
    }
    given = {k: v for k, v in given.items() if v is not None}
    settings = SuiteSettings.quick(**given) if quick else SuiteSettings(**given)
    if study != "redrafter":
        run_suite(json_out, settings, _dataset(dataset_config))
    if settings.only_redrafter or settings.redrafter_head:
        from benchmarks.redrafter_study import run_redrafter_bench

        out = json_out if settings.only_redrafter else json_out.with_name(json_out.stem + "-redrafter.json")
        run_redrafter_bench(out, settings, _dataset(dataset_config))


@bench_app.command("incremental")
def bench_incremental(
    json_out: Path = typer.Option(
        Path("docs/results/incremental.json"), "--json", help="JSON output (run logs beside it)."
    ),
    config: Path | None = typer.Option(None, help="Job config (default: the demo job)."),
    work: Path = typer.Option(..., help="A fresh directory for the data tables and the output."),
    share: float = typer.Option(0.1, help="Share of the users whose newest rating changes."),
    seed: int = typer.Option(0, help="Seed of the choice of changed users."),
) -> None:
    """Wall time of an incremental run after `share` of the users changed, vs the full run (target <= 20%)."""
    from jobs.config import bundled_config, load_config
    from benchmarks.incremental import run_incremental_bench

    config = config or bundled_config("demo")
    run_incremental_bench(json_out, config, load_config(config).dataset, work, share, seed)


@bench_app.command("store")
def bench_store(
    json_out: Path = typer.Option(Path("docs/results/store-scale.json"), "--json", help="JSON output."),
    sizes: str = typer.Option("10000,100000,1000000", help="Rows per store, comma-separated."),
    work: Path | None = typer.Option(None, help="Folder for the stores (default: a temporary one, removed after)."),
) -> None:
    """Knowledge-store cost as it grows: commits (log entry vs the old manifest rewrite), open, index, latest."""
    from benchmarks.store import run_store_bench

    run_store_bench(json_out, tuple(int(s) for s in sizes.split(",")), work)


@bench_app.command("fuzz-server")
def bench_fuzz_server(
    json_out: Path = typer.Option(Path("docs/results/fuzz-server.json"), "--json", help="JSON output (PNG beside it)."),
    work: Path = typer.Option(..., help="A folder for the tiny model, the pool stores and the server's log."),
    hostile: int = typer.Option(2000, min=1, help="Hostile requests sent."),
    concurrency: int = typer.Option(2, min=1, help="Threads sending them."),
    seed: int = typer.Option(0, help="Seed of the hostile arguments and the stores' texts."),
    open_roots: bool = typer.Option(
        False, "--open-roots", help="The server's roots cover the other team's store too (the read check must fail)."
    ),
) -> None:
    """A live vLLM OpenAI server with LASER's plug-in under generated hostile LASER arguments while a normal client
    keeps asking: every answer 200 or 400, the engine alive, no stall, latency within 2x, memory flat, no store
    outside LASER_POOL_ROOTS read. Exits 1 when a target is missed."""
    from benchmarks.fuzz_server import FuzzSettings, run_fuzz_bench

    report = run_fuzz_bench(
        json_out, work, FuzzSettings(hostile=hostile, concurrency=concurrency, seed=seed, open_roots=open_roots)
    )
    if not all(report["passed"].values()):
        raise typer.Exit(1)


@bench_app.command("own-text")
def bench_own_text(
    json_out: Path = typer.Option(Path("docs/results/own-text.json"), "--json", help="JSON output (PNG beside it)."),
    length: int = typer.Option(6144, min=2, help="Tokens of each text (prompt plus earlier text at their limits)."),
    n_max: int = typer.Option(32, min=1, help="How deep a request asks the index (LaserArgs.n_max; its limit: 32)."),
    steps: int = typer.Option(50, min=1, help="Lookup steps timed per text."),
) -> None:
    """What one request's own-text index costs in vLLM's engine loop (build, memory, a step's lookup): capped
    as built, and with the caps lifted, side by side."""
    from benchmarks.own_text import run_own_text_bench

    run_own_text_bench(json_out, length, n_max, steps)


@bench_app.command("lightgcn")
def bench_lightgcn(
    json_out: Path = typer.Option(Path("docs/results/lightgcn-ml100k.json"), "--json", help="JSON output."),
    data: Path = typer.Option(Path("data/ml-100k"), help="A MovieLens folder (ml-100k: u.data, ...)."),
    seed: int = typer.Option(0, help="Seed of the split, the training and K-means."),
    n_clusters: int = typer.Option(8, help="K-means groups whose agreement is measured."),
    warm_share: float = typer.Option(0.1, help="Newest share of the interactions the warm row adds."),
    threads: int = typer.Option(1, help="torch threads of each training."),
) -> None:
    """LightGCN per-batch propagation (before) vs linear vs warm: epoch s, peak RSS, recall@20, group agreement."""
    from benchmarks.lightgcn import run_lightgcn_bench

    run_lightgcn_bench(json_out, data, seed, n_clusters, warm_share, threads)


@bench_app.command("refresh")
def bench_refresh(
    json_out: Path = typer.Option(
        Path("docs/results/refresh.json"), "--json", help="JSON output (run logs beside it)."
    ),
    config: Path | None = typer.Option(None, help="Job config (default: the demo job)."),
    work: Path = typer.Option(..., help="A fresh directory for the data tables and the outputs."),
    users: int = typer.Option(50, help="Users that get one new interaction on day 2."),
    min_history: int = typer.Option(100, help="Interactions those users have at least."),
    seed: int = typer.Option(0, help="Seed of the choice of changed users."),
    set_: list[str] | None = typer.Option(
        None, "--set", "-s", help=("Override a config key in every run: --set dataset.path=/data/ml-100k (repeatable).")
    ),
    day1_from: Path | None = typer.Option(
        None,
        "--day1-from",
        help=("An earlier --work directory of this bench: take its day 1 as it was, run day 2 only."),
    ),
    repeats: int = typer.Option(
        3, "--repeats", help="Day 2 runs each way (order alternating; the ratio is of the medians)."
    ),
) -> None:
    """A scheduled sequence (day 1, one new interaction for `users` heavy users and one new item, day 2),
    drafting on and off side by side: day 2 decode tok/s (target >= 1.5x), day 1 entities/min (>= 1.1x)."""
    from jobs.config import bundled_config, load_config
    from benchmarks.refresh import run_refresh_bench

    config = config or bundled_config("demo")
    run_refresh_bench(
        json_out,
        config,
        load_config(config, set_ or []).dataset,
        work,
        users,
        min_history,
        seed,
        list(set_ or []),
        day1_from,
        repeats,
    )


@bench_app.command("first-run")
def bench_first_run(
    a: list[str] = typer.Option(..., "--a", help="A config override of side A (repeatable)."),
    b: list[str] = typer.Option(..., "--b", help="A config override of side B (repeatable)."),
    json_out: Path = typer.Option(
        Path("docs/results/first-run.json"), "--json", help="JSON output (run logs and the plot beside it)."
    ),
    config: Path | None = typer.Option(None, help="Job config (default: the demo job)."),
    work: Path = typer.Option(..., help="A fresh directory for the data tables and the outputs."),
    set_: list[str] | None = typer.Option(None, "--set", "-s", help="Override a config key in every run (repeatable)."),
    repeats: int = typer.Option(2, "--repeats", help="First runs each side (order alternating)."),
) -> None:
    """A first run on the same tables under two configs (A and B overrides), alternating: walls, time
    accounts, decode tok/s, AAL, retries and text quality side by side; the ratio of median walls."""
    from jobs.config import bundled_config, load_config
    from benchmarks.first_run import run_first_run_bench

    config = config or bundled_config("demo")
    dataset = load_config(config, set_ or []).dataset
    run_first_run_bench(json_out, config, dataset, work, list(set_ or []), list(a), list(b), repeats)


@bench_app.command("engines")
def bench_engines(
    json_out: Path = typer.Option(
        Path("docs/results/engines.json"), "--json", help="JSON output (Markdown, PNG and run logs beside it)."
    ),
    config: Path | None = typer.Option(
        None, help="Job config (default: the demo job); its dataset block is the data of every row."
    ),
    work: Path = typer.Option(..., help="A fresh directory for the runs' outputs and caches."),
    engines: str = typer.Option(
        "hf,vllm,ray-data-llm",
        help=(
            "Rows, comma-separated: hf, vllm (the job), ray-data-llm (the same work on Ray Data LLM, "
            "plain vLLM), ray-data-llm-ngram, ray-data-llm-suffix (with vLLM's speculation)."
        ),
    ),
    repeats: int = typer.Option(1, help="Warm runs per row, interleaved."),
    cold: bool = typer.Option(
        True,
        "--cold/--no-cold",
        help=(
            "First run each row once on empty compile and cost-model caches (cold), then warm runs on "
            "the caches it filled; --no-cold: every run on the machine's own caches."
        ),
    ),
    overrides: list[str] = typer.Option(
        [], "--set", help=("Config override KEY=VALUE for every row (repeatable), e.g. dataset.path=/data/ml-1m.")
    ),
) -> None:
    """The job's entities per minute on each engine and on Ray Data LLM, each run a fresh process."""
    from jobs.config import bundled_config
    from benchmarks.engines import run_engines_bench

    run_engines_bench(json_out, config or bundled_config("demo"), work, _names(engines), repeats, overrides, cold)


@bench_app.command("quality")
def bench_quality(
    json_out: Path = typer.Option(
        Path("docs/results/quality.json"), "--json", help="JSON output (Markdown and PNG beside it)."
    ),
    config: Path | None = typer.Option(None, help="Job config (default: the demo job)."),
    work: Path = typer.Option(
        Path("runs/bench-quality"), help=("Job directory for old knowledge and pools (kept: a second run reuses them).")
    ),
    entities: int = typer.Option(24, help="New-knowledge entities measured (half users, half items)."),
    threads: int = typer.Option(1, help="torch threads."),
    engines: str = typer.Option(
        "hf",
        help=(
            "Engines, comma-separated (hf, vllm): every method on each, and each engine after the first "
            "compared with it."
        ),
    ),
    overrides: list[str] = typer.Option([], "--set", help="Config override KEY=VALUE (repeatable)."),
) -> None:
    """Quality of new knowledge: autoregressive greedy, laser greedy and laser relaxed on the same entities."""
    from jobs.config import bundled_config, load_config
    from benchmarks.quality import QualityBenchSettings, run_quality_bench

    path = config or bundled_config("demo")
    cfg = load_config(path, [*overrides, f"output.path={work}"])
    try:
        settings = QualityBenchSettings(entities=entities, threads=threads, engines=_names(engines))
    except ValueError as err:
        raise typer.BadParameter(f"--engines: {err}") from err
    run_quality_bench(json_out, cfg, settings, path.name)


@bench_app.command("scale")
def bench_scale(
    json_out: Path = typer.Option(Path("docs/results/scale.json"), "--json", help="JSON output (PNG beside it)."),
    sizes: str = typer.Option("10000,100000,1000000", help="Entities (users + items), comma-separated."),
    stages: str | None = typer.Option(
        None,
        help=(
            "Stages, comma-separated (default: all): load_split, lightgcn, route, pools, plan, store_write, "
            "latest_view, incremental."
        ),
    ),
    budget_s: float = typer.Option(
        1800.0, "--budget-s", help=("Seconds a size's stages may take together; a size projected past it is skipped.")
    ),
    stage_timeout_s: float | None = typer.Option(
        None,
        "--stage-timeout-s",
        help=("A stage process running longer is killed (default: what is left of --budget-s)."),
    ),
    max_gb: float = typer.Option(12.0, "--max-gb", help="A stage process resident above this is killed."),
    lightgcn_epochs: int = typer.Option(1, help="LightGCN epochs (recall@k evaluated once at the end)."),
    mean_history: float = typer.Option(20.0, help="Synthetic interactions a user, on average."),
    repeats: int = typer.Option(3, min=1, help=("Runs of a stage that takes under a minute; the median is reported.")),
    dataset_config: Path | None = typer.Option(
        None,
        "--dataset-config",
        help=("YAML with a DatasetConfig: measure that dataset (one size) instead of synthetic catalogues."),
    ),
    work: Path | None = typer.Option(
        None, help="Folder for the sizes' data and outputs (default: a temporary one, removed after)."
    ),
    seed: int = typer.Option(0, help="Seed of the catalogue, split, groups and changed users."),
    merge: bool = typer.Option(
        False,
        "--merge",
        help=(
            "Keep the sizes --json already holds (what this run measures replaces them stage by stage) and "
            "reuse the catalogues and finished stages --work holds from a run on the same data."
        ),
    ),
) -> None:
    """Seconds and peak memory of every stage but generation at growing catalogue sizes, with log-log slopes."""
    from benchmarks.scale import STAGES, ScaleSettings, run_scale_bench

    dataset = _dataset(dataset_config)
    try:
        settings = ScaleSettings(
            sizes=tuple(int(s) for s in _names(sizes)),
            stages=_names(stages) or STAGES,
            budget_s=budget_s,
            stage_timeout_s=stage_timeout_s,
            max_gb=max_gb,
            lightgcn_epochs=lightgcn_epochs,
            repeats=repeats,
            mean_history=mean_history,
            seed=seed,
            dataset=dataset.model_dump() if dataset is not None else None,
        )
    except ValueError as err:
        raise typer.BadParameter(str(err)) from err
    run_scale_bench(json_out, settings, work, merge)


def register(app: typer.Typer) -> None:
    """Add `laser bench` to the `laser` app."""
    app.add_typer(bench_app, name="bench")
