"""The closing summary of a knowledge job run: per pass speed and text quality, as JSON and rich tables."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipelines.config import JobConfig
from pipelines.knowledge.generation import GenerationReport
from pipelines.knowledge.time_account import TimeAccount
from pipelines.store.shards import done_keys, read_failures
from pipelines.ops.schedule.ledger import RunRecord
from pipelines.store.location import Location

if TYPE_CHECKING:
    from rich.console import Console
    from rich.table import Table


@dataclass
class JobSummary:
    """Closing numbers of a job run."""

    output: str
    run_id: str
    old: GenerationReport
    new: GenerationReport
    total_rows: int
    open_failures: int
    wall_s: float
    skipped: dict[str, int] = field(default_factory=dict)  # entities without knowledge, by reason
    input_notes: dict[str, object] = field(default_factory=dict)  # rows the loader and the sample skipped
    mode: str = "full"  # full | incremental (which entities the run planned)
    record: RunRecord | None = None  # the run's ledger row: status, planned entities, watermark
    other_config: int = 0  # entities whose newest row another config wrote (regenerated, or kept: keep_existing)
    first_wave: int = 0  # entities decoded before the pools were rebuilt (groups with no earlier knowledge)
    time: TimeAccount = field(default_factory=TimeAccount)  # where the wall time went

    @classmethod
    def of(
        cls, cfg: JobConfig, old: GenerationReport, new: GenerationReport, store: Path | Location, wall_s: float
    ) -> "JobSummary":
        """The summary of a run whose knowledge went to ``store``."""
        return cls(
            output=str(store),
            run_id=cfg.resolved_run_id(),
            old=old,
            new=new,
            total_rows=len(done_keys(store)),
            open_failures=read_failures(store).height,
            wall_s=wall_s,
        )

    def to_json(self) -> dict[str, object]:
        return {
            **asdict(self),
            "old": _report_json(self.old),
            "new": _report_json(self.new),
            "time": self.time.to_json(),
        }


def _report_json(rep: GenerationReport) -> dict[str, object]:
    """A pass's figures for summary.json, with the derived rates and the quality shares."""
    return {
        **asdict(rep),
        "aal": rep.aal,
        "tokens_per_s_wall": rep.tokens_per_s,
        "own_share": own_share(rep),
        "tokens_per_s_engine": rep.engine_tokens_per_s,
        "tokens_per_s_decode": rep.decode_tokens_per_s,
        "quality": rep.quality.as_dict(),
    }


def own_share(rep: GenerationReport) -> float | None:
    """The share of accepted draft tokens that came from the entities' own earlier texts (None: none accepted)."""
    return rep.own_accepted / rep.decoded_accepted if rep.decoded_accepted else None


def _prompt_cell(rep: GenerationReport) -> str:
    """Prompt tokens of every attempt of the pass and the share the engine's prefix cache served (``-`` if
    none counted)."""
    if not rep.prompt_tokens:
        return "-"
    return f"{rep.prompt_tokens} ({rep.cached_prompt_tokens / rep.prompt_tokens:.0%})"


def _rate(tokens_per_s: float) -> str:
    """A throughput cell (``-`` where the engine did not time it)."""
    return f"{tokens_per_s:.1f}" if tokens_per_s else "-"


_SPEED_COLUMNS = (
    "step",
    "done",
    "failed",
    "tokens (decoded)",
    "tok/s wall",
    "tok/s engine",
    "tok/s decode",
    "AAL",
    "forwards saved",
    "prompt tokens (cached)",
)
_QUALITY_COLUMNS = ("step", "rows", "EOS", "repeat 4-grams", "degenerate", "retries (kept)")
_SPEED_NOTE = (
    "tokens = generated tokens of the rows written (decoded: of every attempt, a retried entity's "
    "two texts both); tok/s wall = tokens written / wall seconds of the pass, including actor "
    "start-up, model load, pool loads, prefill, decoding and writing; tok/s engine = every attempt's "
    "tokens over the actors' engine seconds (every step, prefill included; a shared step once; "
    "actors run in parallel); tok/s decode = tokens over seconds of the engine steps in which no "
    "request prefilled (prefill excluded on both engines); AAL, forwards saved: of every attempt; "
    "prompt tokens (cached) = prompt tokens of every attempt "
    "and the share vLLM's prefix cache served instead of prefilling (hf has none); retries "
    "(kept) = flawed texts decoded again (those whose retry was written)."
)


def _table(title: str, columns: tuple[str, ...]) -> "Table":
    """An empty table with ``columns``: the first ("step") left-aligned, the figures right-aligned."""
    from rich.table import Table

    table = Table(title=title)
    for col in columns:
        table.add_column(col, justify="right" if col != "step" else "left", no_wrap=True)
    return table


def _add_pass_rows(speed: "Table", quality: "Table", name: str, rep: GenerationReport) -> None:
    """A pass's speed row and quality row (only a zero speed row when the pass generated nothing)."""
    if rep.done == rep.failed == 0:
        speed.add_row(name, "0", "0", "-", "-", "-", "-", "-", "-", "-")  # nothing generated in this pass
        return
    # every accepted draft token is a target forward saved against one forward per token
    share = f" ({rep.decoded_accepted / rep.decoded_tokens:.0%})" if rep.decoded_tokens else ""
    speed.add_row(
        name,
        str(rep.done),
        str(rep.failed),
        f"{rep.n_tokens} ({rep.decoded_tokens})",
        f"{rep.tokens_per_s:.1f}",
        _rate(rep.engine_tokens_per_s),
        _rate(rep.decode_tokens_per_s),
        f"{rep.aal:.2f}",
        f"{rep.decoded_accepted}{share}",
        _prompt_cell(rep),
    )
    q = rep.quality
    quality.add_row(
        name,
        str(q.n),
        f"{q.finished_eos} ({q.eos_share:.0%})",
        f"{q.mean_repeat_4gram:.1%}",
        str(q.degenerate),
        f"{rep.retries} ({rep.greedy_retries})",
    )


def _print_notes(console: "Console", summary: JobSummary) -> None:
    """The lines under the tables: retry reasons, skipped entities, input notes, the ledger row, rows of
    other configs and drafts from the entities' own texts (each only when there is something to say)."""
    for name, rep in (("old knowledge", summary.old), ("new knowledge", summary.new)):
        if rep.retry_reasons:
            console.print(f"{name}: retried because " + retry_line(rep))
    if summary.skipped:
        console.print("skipped (no new knowledge): " + "; ".join(f"{n} {why}" for why, n in summary.skipped.items()))
    if summary.input_notes:
        console.print("input: " + "; ".join(f"{k.replace('_', ' ')}: {v}" for k, v in summary.input_notes.items()))
    if (rec := summary.record) is not None:
        console.print(
            f"{summary.mode} run {rec.run_id}, {rec.status}: new knowledge for {rec.entities_new} new and "
            f"{rec.entities_changed} changed entities, {rec.entities_unchanged} unchanged"
        )
    if summary.other_config:
        console.print(
            f"rows another config wrote (model, decoder, generation rules or prompt version differ): "
            f"{summary.other_config}"
        )
    if summary.new.own_accepted:
        console.print(
            f"drafts from the entities' own earlier texts: {summary.new.own_accepted} accepted tokens, "
            f"{own_share(summary.new):.0%} of the accepted drafts"
            + (f"; first wave {summary.first_wave} entities" if summary.first_wave else "")
        )


def print_summary(summary: JobSummary) -> None:
    """The closing summary as rich tables: per pass speed (wall and decode-only), then text quality."""
    from rich.console import Console

    speed = _table(f"laser job {summary.run_id}", _SPEED_COLUMNS)
    quality = _table("knowledge quality (pipelines/quality/)", _QUALITY_COLUMNS)
    for name, rep in (("old knowledge", summary.old), ("new knowledge", summary.new)):
        _add_pass_rows(speed, quality, name, rep)
    console = Console()
    if not console.is_terminal:  # logs and pipes: wide enough that no figure is cut
        console = Console(width=max(console.width, 160))
    console.print(speed)
    console.print(_SPEED_NOTE)
    console.print(quality)
    _print_notes(console, summary)
    if summary.time.wall_s:
        console.print(time_table(summary.time))
    console.print(
        f"knowledge rows in store: {summary.total_rows}; unresolved failures: {summary.open_failures}; "
        f"wall {summary.wall_s:.1f}s\noutput: {summary.output}"
    )


def retry_line(rep: GenerationReport) -> str:
    """Each flaw that sent first texts to a retry: how many, how many retries were written (the retry read
    better), and the tokens those retries decoded."""
    return ", ".join(
        f"{why} {n} (kept {rep.retry_kept.get(why, 0)}, {rep.retry_cost.get(why, 0)} tokens)"
        for why, n in sorted(rep.retry_reasons.items())
    )


def time_table(account: TimeAccount, title: str = "where the time went") -> "Table":
    """The time account as a table: each phase's seconds and share of the wall, then fixed costs."""
    from rich.table import Table

    table = Table(title=title)
    for col in ("phase", "seconds", "share"):
        table.add_column(col, justify="left" if col == "phase" else "right", no_wrap=True)
    wall = account.wall_s or 1.0
    for name, sec in account.ordered():
        table.add_row(name, f"{sec:.1f}", f"{sec / wall:.0%}")
    table.add_row("wall", f"{account.wall_s:.1f}", "100%", end_section=True)
    table.add_row("fixed (all but prefill and decode)", f"{account.fixed_s:.1f}", f"{account.fixed_s / wall:.0%}")
    if account.engine_ready_s:
        table.add_row("engine start, measured in the actors", f"{account.engine_ready_s:.1f}", "")
    return table
