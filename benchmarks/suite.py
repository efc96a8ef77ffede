"""`laser bench suite`: the LASER paper's speed studies on this machine, beside what users would pick instead.

Fixture (per task): the dataset is split into old and new (LASER 2.1 streaming simulation). Old
histories (user task) and existing items (item task) are answered once by greedy decoding: the
"earlier knowledge", cached on disk (:mod:`benchmarks.fixture`). New histories and new items are
the measured prompts. Groups: users by the router's collaborative groups (LightGCN + K-means), items by
attribute groups, as the paper's binary router does; pools are built by :mod:`pools.build`:

- **CRP**: the pool of the prompt's own group; **GRP**: one global pool of all earlier knowledge (ReSD's);
  **RRP**: a seeded random sample of the same size as the CRP pool.

Methods, on the same prompts in one process, warm-up first, interleaved prompt by prompt (machine noise
hits all alike), each request the median of ``repeats`` timings:

- baselines: transformers greedy ``generate`` (the reference), transformers prompt-lookup decoding,
  our ``autoregressive``;
- Table 3 ablation: GRP (= ``resd``) / RRP / CRP with greedy verification, and RV+GRP / RV+RRP /
  LASER (RV+CRP) with relaxed verification;
- Figure 6 verification variants on CRP: top-1 (= CRP), top-k (k=2, p=0), top-p (accept when p(x) > p:
  ``k = ceil(1/p)`` is exactly "any k", since at most ``1/p - 1`` tokens can have probability > p), RV;
- Figure 2 pool-size sweep: the global pool capped at fractions of the earlier knowledge (greedy ``resd``);
- draft-budget sweep: LASER with K tree tokens per step;
- the item task: generate, prompt lookup, ``resd``, CRP greedy, LASER;
- the ``draft`` study (:mod:`benchmarks.draft_study`): ``spec_sampling`` and ``topk_imp`` (K in
  ``draft_ks``, paper and lossless) at temperatures 0 and 1 against ``generate``, the paper's Table 1.
  ``studies=("draft",)`` runs it alone: only the measured user prompts are built (no pools, no earlier
  knowledge).
"""

from __future__ import annotations

import json
import logging
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import torch
from rich.console import Console
from tqdm import tqdm

import laser
from laser.defaults import N_MAX, RELAXED_K, RELAXED_P
import router
from benchmarks.draft_study import markdown_draft_table, plot_draft_study, print_draft_table, run_draft_study
from benchmarks.fixture import encode_item_prompts, encode_user_prompts, greedy_knowledge
from benchmarks.plots import plot_studies
from benchmarks.report import (
    Run,
    hf_generate,
    machine_info,
    markdown_breakdown,
    markdown_methods,
    print_breakdown,
    print_methods,
    repeat_median,
    summarise,
    timed_decode,
    versions,
    wide_console,
    save_report,
)
from pipelines.data.config import DatasetConfig
from pipelines.data.load import load_dataset
from pipelines.data.schema import Dataset
from pipelines.data.split import split_old_new
from pipelines.store.frames import as_frame
from pipelines.knowledge.routing import ITEM_ATTRIBUTES
from pools.build import PoolBuildConfig, collect_sources, group_key, materialize
from pools.retrieval import RetrievalPool
from router.groups import GROUP_SCHEMA

log = logging.getLogger(__name__)

REFERENCE = "transformers generate"
PROMPT_LOOKUP = "transformers prompt lookup"


@dataclass
class SuiteSettings:
    """What the suite measures; ``quick()`` is the smoke-check size."""

    model: str = laser.DEFAULT_MODEL
    device: str = "cpu"
    threads: int = 2
    user_prompts: int = 6  # measured new histories
    item_prompts: int = 4  # measured new items
    old_users: int = 64  # earlier profiles sampled (plus the measured users' own old profiles)
    old_items: int = 32  # earlier item descriptions
    max_new_tokens: int = 192  # measured budget: above the prompts' ~120 words, so lengths can differ
    knowledge_tokens: int = 128  # budget of the earlier knowledge (fixture)
    max_prompt_tokens: int = 512
    max_hist: int = 30  # split: the old history is the first min((n+1)//2, max_hist) interactions
    n_clusters: int = 5  # collaborative groups (the paper uses 3-10)
    item_group_size: int = 1000  # attribute groups larger than this are split by the next attribute
    repeats: int = 1
    seed: int = 0
    K: int | str = "auto"  # LASER's draft budget: "auto" (adaptive, the default) or fixed nodes
    n_max: int = N_MAX
    k: int = RELAXED_K
    p: float = RELAXED_P
    prompt_lookup_tokens: int = 10
    pool_fractions: tuple[float, ...] = (0.25, 0.5, 1.0)
    draft_budgets: tuple[int, ...] = (8, 16, 32, 64)
    studies: tuple[str, ...] = ("laser", "draft")  # "laser": every LASER study and the item task
    draft: str | None = None  # draft study: the draft model (None: the decoders' default truncated copy)
    gamma: int = 4
    draft_ks: tuple[int, ...] = (1, 5, 20, 50)
    draft_temperatures: tuple[float, ...] = (0.0, 1.0)
    redrafter_head: str | None = None  # the redrafter study runs when a trained head is named
    redrafter_widths: tuple[int, ...] = (1, 2, 4, 8)
    redrafter_lengths: tuple[int, ...] = (3, 4, 5)
    redrafter_nodedup_lengths: tuple[int, ...] = (3, 4, 5)  # lengths also measured without dedup
    only_redrafter: bool = False  # the redrafter study alone (no LASER tasks)

    @classmethod
    def quick(cls, **overrides: Any) -> "SuiteSettings":
        """A few prompts and short outputs: a smoke check in minutes."""
        small = dict(
            user_prompts=2,
            item_prompts=1,
            old_users=16,
            old_items=8,
            max_new_tokens=48,
            knowledge_tokens=48,
            pool_fractions=(0.5, 1.0),
            draft_budgets=(16, 64),
        )
        return cls(**{**small, **overrides})


@dataclass
class TaskFixture:
    """One task's measured prompts, earlier knowledge and group memberships."""

    entity_type: str  # "user" | "item"
    pool_kind: str  # the group kind LASER routes this task's prompts to
    prompts: dict[str, list[int]]  # measured entity -> prompt ids
    knowledge: dict[str, list[int]]  # earlier entity -> greedy answer ids (the pools' texts)
    memberships: pa.Table  # routing schema; measured entities included

    def group_of(self) -> dict[str, str]:
        frame = as_frame(self.memberships).filter(pl.col("pool_kind") == self.pool_kind)
        return dict(zip(frame["entity_id"].to_list(), frame["group_id"].to_list()))


@dataclass(frozen=True)
class Method:
    """A decoding method: transformers (``decoder`` "generate"/"prompt_lookup") or one of ours, and its pool."""

    name: str
    decoder: str
    params: dict[str, Any] = field(default_factory=dict, hash=False)
    pool: str | None = None  # "crp" | "rrp" | "global" | "global@<texts>"


# ---- fixture ------------------------------------------------------------------------------------


def _sample(ids: list[str], n: int, seed: int) -> list[str]:
    """A seeded sample of ``n`` ids (all when fewer), in sorted order. Nested: a smaller ``n`` takes a subset
    of a larger one, so fixtures of different sizes share their cached answers."""
    order = np.random.default_rng(seed).permutation(sorted(ids))
    return sorted(order[:n].tolist())


def user_fixture(lm: laser.LoadedModel, ds: Dataset, s: SuiteSettings, cache_root: Path | None) -> TaskFixture:
    """User task: collaborative groups (LightGCN + K-means on old interactions), new histories measured."""
    split = split_old_new(ds, seed=s.seed, max_hist=s.max_hist)
    emb = router.train_lightgcn(split.old_interactions, router.LightGCNConfig(seed=s.seed, progress=False))
    collab = router.collaborative_groups(emb.users, n_clusters=min(s.n_clusters, len(emb.users)), seed=s.seed)
    grouped = set(collab["entity_id"].to_list())
    new_users = set(split.new_interactions["user_id"].to_list()) & grouped
    measured = _sample(list(new_users), s.user_prompts, s.seed)
    old_pool = list(set(split.old_interactions["user_id"].to_list()) & grouped)
    old_users = sorted(set(measured) | set(_sample(old_pool, s.old_users, s.seed + 1)))
    history = pl.concat([split.old_interactions, split.new_interactions])
    prompts = encode_user_prompts(lm, history, ds, measured, s.max_prompt_tokens)
    old_prompts = encode_user_prompts(lm, split.old_interactions, ds, old_users, s.max_prompt_tokens)
    knowledge = greedy_knowledge(lm, old_prompts, s.knowledge_tokens, cache_root, desc="earlier user profiles")
    no_attribute = pl.DataFrame(schema=GROUP_SCHEMA)
    return TaskFixture(
        "user", router.COLLABORATIVE, prompts, knowledge, router.group_memberships("user", no_attribute, collab)
    )


def item_fixture(lm: laser.LoadedModel, ds: Dataset, s: SuiteSettings, cache_root: Path | None) -> TaskFixture:
    """Item task: attribute groups over every item, new items measured."""
    split = split_old_new(ds, seed=s.seed, max_hist=s.max_hist)
    hierarchy = [c for c in ITEM_ATTRIBUTES if c in ds.items.columns]
    attr = router.attribute_groups(
        ds.items,
        router.AttributeGrouping(
            hierarchy=hierarchy, max_group_size=s.item_group_size, bucket_widths={"year": 10}, seed=s.seed
        ),
        "item_id",
    )
    measured = _sample(split.new_items["item_id"].to_list(), s.item_prompts, s.seed)
    old = _sample(split.existing_items["item_id"].to_list(), s.old_items, s.seed + 1)
    by_id = lambda ids: ds.items.filter(pl.col("item_id").is_in(ids)).sort("item_id")  # noqa: E731
    prompts = encode_item_prompts(lm, by_id(measured), ds.domain)
    knowledge = greedy_knowledge(
        lm,
        encode_item_prompts(lm, by_id(old), ds.domain),
        s.knowledge_tokens,
        cache_root,
        desc="earlier item descriptions",
    )
    return TaskFixture("item", router.ATTRIBUTE, prompts, knowledge, router.group_memberships("item", attr))


# ---- pools and methods ---------------------------------------------------------------------------


def _knowledge_table(task: TaskFixture) -> pa.Table:
    ids = sorted(task.knowledge)
    return pa.table(
        {"entity_type": [task.entity_type] * len(ids), "entity_id": ids, "token_ids": [task.knowledge[i] for i in ids]}
    )


def build_task_pools(task: TaskFixture, s: SuiteSettings) -> dict[str, RetrievalPool]:
    """CRP, RRP and GRP pools keyed as :func:`pools.build.group_key`, plus ``global@<texts>`` for the sweep."""
    table = _knowledge_table(task)
    sources = collect_sources(
        table,
        task.memberships,
        config=PoolBuildConfig(max_pool_size=None, with_global=True, with_random=True, on_missing="skip", seed=s.seed),
    )
    pools = {key: materialize(texts) for key, texts in sources.texts.items()}
    total = len(sources.texts.get(group_key(task.entity_type, "global", "all"), []))
    for texts in _sweep_sizes(total, s.pool_fractions):
        capped = collect_sources(
            table,
            task.memberships.slice(0, 0),
            config=PoolBuildConfig(  # global pool only
                max_pool_size=None, global_max_size=texts, with_global=True, on_missing="skip", seed=s.seed
            ),
        )
        pools[f"global@{texts}"] = materialize(capped.texts[group_key(task.entity_type, "global", "all")])
    return pools


def _sweep_sizes(total: int, fractions: tuple[float, ...]) -> list[int]:
    """Pool sizes (texts) of the sweep below the full pool, which is GRP itself."""
    return sorted({max(1, round(f * total)) for f in fractions if f < 1.0} - {total})


def pool_for(method: Method, task: TaskFixture, group: str | None, pools: dict[str, RetrievalPool]):
    """The pool a method drafts from for a prompt in ``group`` (None: no pool)."""
    kind, etype = task.pool_kind, task.entity_type
    if method.pool is None:
        return None
    if method.pool.startswith("global@"):
        return pools[method.pool]
    key = {
        "global": group_key(etype, "global", "all"),
        "crp": group_key(etype, kind, group) if group is not None else None,
        "rrp": group_key(etype, "random", f"{kind}.{group}") if group is not None else None,
    }[method.pool]
    return pools.get(key) if key else None


def user_methods(s: SuiteSettings, pool_sizes: list[int]) -> list[Method]:
    """Every user-task method (names are the table rows)."""
    greedy, relaxed = {"verification": "greedy"}, {"verification": "relaxed", "k": s.k, "p": s.p}
    ms = [
        Method(REFERENCE, "generate"),
        Method(PROMPT_LOOKUP, "prompt_lookup"),
        Method("autoregressive", "autoregressive"),
        Method("GRP (resd)", "resd", {}, "global"),
        Method("RRP", "laser", greedy, "rrp"),
        Method("CRP", "laser", greedy, "crp"),
        Method("RV+GRP", "laser", relaxed, "global"),
        Method("RV+RRP", "laser", relaxed, "rrp"),
        Method("LASER (RV+CRP)", "laser", relaxed, "crp"),
        Method(f"top-k (k={s.k}, p=0)", "laser", {"verification": "relaxed", "k": s.k, "p": 0.0}, "crp"),
        Method(f"top-p (p={s.p})", "laser", {"verification": "relaxed", "k": math.ceil(1 / s.p), "p": s.p}, "crp"),
    ]
    ms += [Method(f"GRP (resd) {n} texts", "resd", {}, f"global@{n}") for n in pool_sizes]
    ms += [Method(f"LASER K={K}", "laser", {**relaxed, "K": K}, "crp") for K in s.draft_budgets if K != s.K]
    return ms


def item_methods(s: SuiteSettings) -> list[Method]:
    relaxed = {"verification": "relaxed", "k": s.k, "p": s.p}
    return [
        Method(REFERENCE, "generate"),
        Method(PROMPT_LOOKUP, "prompt_lookup"),
        Method("GRP (resd)", "resd", {}, "global"),
        Method("CRP", "laser", {"verification": "greedy"}, "crp"),
        Method("LASER (RV+CRP)", "laser", relaxed, "crp"),
    ]


# ---- measuring ----------------------------------------------------------------------------------


class _Runner:
    """Runs methods on prompts with one decoder object per method."""

    def __init__(self, lm: laser.LoadedModel, methods: list[Method], s: SuiteSettings):
        self.lm, self.s = lm, s
        common = {"K": s.K, "n_max": s.n_max}  # the retrieval decoders' draft budget
        known = laser.available_decoders()
        self.decoders = {
            m.name: laser.get_decoder(
                m.decoder, lm, **({**common, **m.params} if known[m.decoder].pool != "none" else m.params)
            )
            for m in methods
            if m.decoder not in ("generate", "prompt_lookup")
        }

    def run(self, m: Method, ids: list[int], max_new_tokens: int, pool: Any) -> Run:
        if m.decoder == "generate":
            return hf_generate(self.lm, ids, max_new_tokens)
        if m.decoder == "prompt_lookup":
            return hf_generate(self.lm, ids, max_new_tokens, prompt_lookup_num_tokens=self.s.prompt_lookup_tokens)
        return timed_decode(self.decoders[m.name], ids, max_new_tokens, pool)


def measure_task(
    lm: laser.LoadedModel, task: TaskFixture, methods: list[Method], pools: dict[str, RetrievalPool], s: SuiteSettings
) -> dict[str, list[Run]]:
    """Every method on every prompt, interleaved, after a warm-up; {method: runs in prompt order}."""
    runner = _Runner(lm, methods, s)
    groups = task.group_of()
    prompts = sorted(task.prompts.items())
    first_id, first = prompts[0]
    for m in methods:  # warm-up: allocator, kernels, first-call caches
        runner.run(m, first, 8, pool_for(m, task, groups.get(first_id), pools))
    rows: dict[str, list[Run]] = {m.name: [] for m in methods}
    for entity, ids in tqdm(prompts, desc=f"bench suite: {task.entity_type} task", unit="prompt"):
        for m in methods:
            pool = pool_for(m, task, groups.get(entity), pools)
            rows[m.name].append(repeat_median(lambda: runner.run(m, ids, s.max_new_tokens, pool), s.repeats))
    return rows


def _pool_summary(task: TaskFixture, pools: dict[str, RetrievalPool]) -> dict[str, Any]:
    groups = task.group_of()
    return {
        "earlier_texts": len(task.knowledge),
        "measured_prompts": len(task.prompts),
        "prompts_without_group_pool": sum(
            group_key(task.entity_type, task.pool_kind, groups.get(e, "")) not in pools for e in task.prompts
        ),
        "pools": {key: {"texts": p.texts, "nodes": len(p)} for key, p in sorted(pools.items())},
    }


def run_studies(
    lm: laser.LoadedModel,
    tasks: dict[str, TaskFixture],
    s: SuiteSettings,
    json_out: Path,
    extra: dict[str, Any] | None = None,
    console: Console | None = None,
) -> dict[str, Any]:
    """Measure every task, print the tables, write the JSON and the PNG plots beside it; return the report."""
    console = console or wide_console()
    started = time.perf_counter()
    report: dict[str, Any] = {
        "settings": _jsonable(asdict(s)),
        "seeds": {"data_split_groups_pools": s.seed, "torch": s.seed},
        "machine": machine_info(),
        "versions": versions(),
        **(extra or {}),
        "tasks": {},
    }
    for name, task in tasks.items():
        pools = build_task_pools(task, s)
        sizes = sorted(int(key.removeprefix("global@")) for key in pools if key.startswith("global@"))
        methods = user_methods(s, sizes) if task.entity_type == "user" else item_methods(s)
        rows = measure_task(lm, task, methods, pools, s)
        metrics = summarise(rows, REFERENCE)
        report["tasks"][name] = {"fixture": _pool_summary(task, pools), "methods": metrics}
        if task.entity_type == "user":
            report["studies"] = _studies(s, sizes, pools)
            report["targets"] = check_targets(metrics)
        print_methods(
            f"{name} task: {lm.name}, {s.threads} threads, {len(task.prompts)} prompts, "
            f"{s.max_new_tokens} new tokens max",
            metrics,
            console,
        )
        print_breakdown(f"{name} task: time per decoding step (ms)", metrics, console)
    report["duration_s"] = time.perf_counter() - started
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    json_out.parent.mkdir(parents=True, exist_ok=True)
    report["plots"] = [str(p) for p in plot_studies(report, json_out)]
    save_report(report, json_out, markdown_report(report))
    _print_targets(report.get("targets", []), console)
    return report


def markdown_report(report: dict[str, Any]) -> str:
    """Every task's tables and the targets as Markdown (written next to the JSON as ``<stem>.md``)."""
    parts = []
    for name, task in report["tasks"].items():
        parts += [
            f"**{name} task** ({task['fixture']['measured_prompts']} prompts, "
            f"{task['fixture']['earlier_texts']} earlier texts)",
            "",
            markdown_methods(task["methods"]),
            "",
            f"Time per decoding step (ms), {name} task:",
            "",
            markdown_breakdown(task["methods"]),
            "",
        ]
    for t in report.get("targets", []):
        parts.append(
            f"- {'met' if t['met'] else '**missed**'}: {t['target']}: {t['value']:.2f} "
            f"(needs >= {t['minimum']}{', <= ' + str(t['maximum']) if 'maximum' in t else ''})"
        )
    return "\n".join(parts) + "\n"


def _studies(s: SuiteSettings, sizes: list[int], pools: dict[str, RetrievalPool]) -> dict[str, Any]:
    """Which method rows make up each study (the plots and README read these)."""
    full = pools[group_key("user", "global", "all")]
    sweep = [{"texts": n, "nodes": len(pools[f"global@{n}"]), "method": f"GRP (resd) {n} texts"} for n in sizes]
    sweep.append({"texts": full.texts, "nodes": len(full), "method": "GRP (resd)"})
    return {
        "ablation": {
            "GRP": "GRP (resd)",
            "RRP": "RRP",
            "CRP": "CRP",
            "RV+GRP": "RV+GRP",
            "RV+RRP": "RV+RRP",
            "LASER": "LASER (RV+CRP)",
        },
        "verification": {
            "top-1": "CRP",
            "top-k": f"top-k (k={s.k}, p=0)",
            "top-p": f"top-p (p={s.p})",
            "RV": "LASER (RV+CRP)",
        },
        "pool_size": sweep,
        "draft_budget": [{"K": K, "method": "LASER (RV+CRP)" if K == s.K else f"LASER K={K}"} for K in s.draft_budgets],
    }


TARGETS = (  # (what, method, against, minimum ratio of tokens/s)
    ("relaxed LASER (CRP) vs generate", "LASER (RV+CRP)", REFERENCE, 3.0),
    ("greedy LASER (CRP) vs generate", "CRP", REFERENCE, 2.0),
    ("LASER vs ReSD", "LASER (RV+CRP)", "GRP (resd)", 1.5),
    ("LASER vs prompt lookup", "LASER (RV+CRP)", PROMPT_LOOKUP, 1.8),
)
GREEDY_METHODS = ("autoregressive", "GRP (resd)", "RRP", "CRP")


def check_targets(m: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """The issue's targets on the user task: value, target, met."""
    out = [
        {
            "target": what,
            "value": m[a]["tokens_per_s"] / m[b]["tokens_per_s"],
            "minimum": need,
            "met": m[a]["tokens_per_s"] >= need * m[b]["tokens_per_s"],
        }
        for what, a, b, need in TARGETS
        if a in m and b in m
    ]
    ratio = m["LASER (RV+CRP)"]["length_ratio_vs_greedy"]
    out.append(
        {
            "target": "relaxed length within 10% of greedy",
            "value": ratio,
            "minimum": 0.9,
            "maximum": 1.1,
            "met": 0.9 <= ratio <= 1.1,
        }
    )
    same = [n for n in GREEDY_METHODS if n in m]
    out.append(
        {
            "target": "greedy methods identical to greedy",
            "value": sum(m[n]["identical_to_greedy"] for n in same),
            "minimum": len(same),
            "met": all(m[n]["identical_to_greedy"] for n in same),
        }
    )
    return out


def _print_targets(targets: list[dict[str, Any]], console: Console) -> None:
    for t in targets:
        console.print(
            f"{'met ' if t['met'] else 'MISS'}  {t['target']}: {t['value']:.2f} (needs >= {t['minimum']}"
            f"{', <= ' + str(t['maximum']) if 'maximum' in t else ''})"
        )


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return json.loads(json.dumps(d, default=list))


def measured_user_prompts(lm: laser.LoadedModel, ds: Dataset, s: SuiteSettings) -> dict[str, list[int]]:
    """The user task's measured prompts alone: new histories of a seeded sample of users with an old one."""
    split = split_old_new(ds, seed=s.seed, max_hist=s.max_hist)
    users = set(split.new_interactions["user_id"].to_list()) & set(split.old_interactions["user_id"].to_list())
    history = pl.concat([split.old_interactions, split.new_interactions])
    return encode_user_prompts(lm, history, ds, _sample(list(users), s.user_prompts, s.seed), s.max_prompt_tokens)


def draft_study(
    lm: laser.LoadedModel,
    prompts: dict[str, list[int]],
    s: SuiteSettings,
    json_out: Path,
    console: Console | None = None,
) -> dict[str, Any]:
    """The draft study: measured, printed, plotted to ``<stem>-draft.png``."""
    result = run_draft_study(
        lm,
        prompts,
        draft=s.draft,
        gamma=s.gamma,
        ks=s.draft_ks,
        temperatures=s.draft_temperatures,
        max_new_tokens=s.max_new_tokens,
        seed=s.seed,
    )
    print_draft_table(result, console or wide_console())
    json_out.parent.mkdir(parents=True, exist_ok=True)
    result["plot"] = str(plot_draft_study(result, Path(f"{json_out.with_suffix('')}-draft.png")))
    return result


def run_suite(
    json_out: Path, settings: SuiteSettings, dataset: DatasetConfig | None = None, cache_root: Path | None = None
) -> dict[str, Any]:
    """The whole suite: model, dataset, fixtures (cached), measurements, tables, JSON and plots."""
    started = time.perf_counter()
    torch.manual_seed(settings.seed)
    torch.set_num_threads(settings.threads)
    dataset = dataset or DatasetConfig(seed=settings.seed)
    lm = laser.load_model(settings.model, device=settings.device, dtype="float32")
    ds = load_dataset(dataset)
    if "laser" not in settings.studies:
        return _draft_only(lm, ds, settings, dataset, json_out, started)
    tasks = {"user": user_fixture(lm, ds, settings, cache_root)}
    if settings.item_prompts > 0:
        tasks["item"] = item_fixture(lm, ds, settings, cache_root)
    fixture_s = time.perf_counter() - started
    extra = {"dataset": dataset.model_dump(), "fixture_s": fixture_s}
    report = run_studies(lm, tasks, settings, json_out, extra)
    if "draft" in settings.studies:
        report["draft_study"] = draft_study(lm, tasks["user"].prompts, settings, json_out)
        with json_out.with_suffix(".md").open("a") as md:
            md.write("\n**draft study** (user task)\n\n" + markdown_draft_table(report["draft_study"]) + "\n")
    report["total_s"] = time.perf_counter() - started
    save_report(report, json_out)
    return report


def _draft_only(
    lm: laser.LoadedModel, ds: Dataset, s: SuiteSettings, dataset: DatasetConfig, json_out: Path, started: float
) -> dict[str, Any]:
    """``studies=("draft",)``: the draft study on the measured user prompts, nothing else."""
    report: dict[str, Any] = {
        "settings": _jsonable(asdict(s)),
        "machine": machine_info(),
        "versions": versions(),
        "dataset": dataset.model_dump(),
    }
    report["draft_study"] = draft_study(lm, measured_user_prompts(lm, ds, s), s, json_out)
    report["machine"]["load_average_after"] = machine_info()["load_average"]
    report["total_s"] = time.perf_counter() - started
    save_report(
        report, json_out, "**draft study** (user task)\n\n" + markdown_draft_table(report["draft_study"]) + "\n"
    )
    return report
