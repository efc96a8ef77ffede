"""`laser init DATA`: a commented job config for a team's own tables, guessed from their schemas and a small
sample (pipelines/data/guess.py), that `laser run` takes as written."""

from __future__ import annotations

import json
import posixpath
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

if TYPE_CHECKING:  # loaded when the command runs: `laser --help` stays fast
    from pipelines.data.guess import Guess

PLAIN = re.compile(r"^[A-Za-z_][A-Za-z0-9_.\-]*$")
YAML_WORDS = {"true", "false", "yes", "no", "on", "off", "null", "y", "n"}
GENERIC_TABLES = {"ratings", "events", "interactions", "clicks", "views", "data", "train", "logs", "behaviors"}
COLUMN_KEYS = ("user_id", "item_id", "timestamp", "rating", "weight", "event", "title", "genres", "category",
               "sub_category", "year")  # fmt: skip


def _value(v: Any) -> str:
    """A YAML scalar, list or mapping on one line (JSON is YAML; plain words stay plain)."""
    if isinstance(v, str) and PLAIN.match(v) and v.lower() not in YAML_WORDS:
        return v
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return json.dumps(v)


def _line(indent: int, key: str, value: Any, why: str = "") -> str:
    text = f"{' ' * indent}{key}: {_value(value)}"
    return f"{text:<40} # {why}" if why else text


def _where(path: str) -> str:
    """A local path made absolute (the config then runs from any folder); a URI as written."""
    from pipelines.store.location import is_uri

    return path if is_uri(path) else str(Path(path).resolve())


def _name(data: str) -> str:
    """The dataset's name: the table's file or folder name, or the folder above a generic one (ratings/)."""
    from pipelines.store.location import Location

    loc = Location.of(data)
    path = loc.path.split("*")[0].rstrip("/")
    base = posixpath.basename(path).split(".")[0]
    parent = posixpath.basename(posixpath.dirname(path))
    name = parent if base.lower() in GENERIC_TABLES and parent else base
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "data"


def render(guess: Guess, data: str, items: str | None, users: str | None, model: str) -> str:
    """The job config's YAML text: the guessed ``dataset:`` keys with their evidence, then the job's blocks."""
    keys, why = guess.keys, guess.why
    items_file = _where(items) if items is not None and keys.get("items_file", True) is not None else None
    name = _name(data)
    out = [
        "# Written by `laser init` from the tables' schemas and a sample of their rows. Check the guesses",
        "# (each key says what it saw), then: laser run THIS_FILE   (docs/your-data.md)",
        "",
        "dataset:",
        _line(2, "format", "table"),
        _line(2, "path", _where(data), f"the interactions: {why['path']}"),
        _line(2, "items_file", items_file, why.get("items_file", "no items table: the item id is the title")),
        _line(2, "users_file", _where(users) if users else None, why.get("users_file", "no users table")),
        _line(2, "name", name, "the dataset's name in outputs"),
        _line(2, "feedback", keys["feedback"], why["feedback"]),
        "  columns:                              # canonical name: the column in your tables",
    ]
    out += [_line(4, k, keys[f"columns.{k}"], why[f"columns.{k}"]) for k in COLUMN_KEYS if f"columns.{k}" in keys]
    for key in ("genres_separator", "timestamp_format", "rating_scale", "min_positive_rating", "event_weights"):
        if key in keys:
            out.append(_line(2, key, keys[key], why[key]))
    out += [
        _line(2, "limit_users", 50, "a trial: 50 users drawn in a seeded order (null: every user)"),
        _line(2, "limit_items", 100, "at most the 100 items they interacted with most (null: every item)"),
        _line(2, "seed", 0),
        "",
        "prompts:",
        _line(2, "template", guess.template, guess.template_why),
        "",
    ]
    if guess.notes:
        out += ["# Also seen (choices made, columns kept):", *(f"#   - {n}" for n in guess.notes), ""]
    out += JOB_BLOCKS.format(model=_value(model), name=name).splitlines()
    return "\n".join(out) + "\n"


JOB_BLOCKS = """\
split:
  mode: latest                          # each user's knowledge from their latest interactions
  max_hist: 20

model:
  name: {model}
  dtype: auto                           # float32 on CPU, bfloat16 on GPU

decoder:
  name: laser
  params:
    verification: relaxed               # greedy: token for token the model's own greedy text
    k: 2
    p: 0.1

generation:
  max_new_tokens: 96
  max_prompt_tokens: 768

routing:
  user_policy: warm_cold                # warm users -> collaborative pools, cold ones -> attribute pools
  item_policy: attribute
  warm_threshold: 5
  n_clusters: 4
  max_group_size: 200
  max_pool_size: 2000

execution:
  num_workers: auto
  threads_per_worker: auto
  address: null                         # null: Ray in-process; "auto" or ray://head:10001 for a cluster
  batch_size: 16

output:
  path: runs/{name}
"""


def init(
    data: str = typer.Argument(..., help="The interactions: a file, a Parquet folder, a glob or a URI (s3://...)."),
    items: str | None = typer.Option(None, "--items", help="The items table (id, title, attributes)."),
    users: str | None = typer.Option(None, "--users", help="The users table (id, attributes)."),
    output: Path = typer.Option(Path("laser.yaml"), "--output", "-o", help="Where the config is written."),
    model: str = typer.Option("smollm2-135m", "--model", help="model.name: bundled name, local path or hub id."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing --output file."),
) -> None:
    """Write a commented job config for your tables, guessed from their schemas and a small sample."""
    from jobs.config import load_config
    from pipelines.config import ConfigError
    from pipelines.data.guess import guess_dataset

    if output.exists() and not force:
        raise ConfigError(f"{output} exists; pass --force to overwrite it")
    guess = guess_dataset(data, items, users)
    text = render(guess, data, items, users, model)
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = output.with_name(output.name + ".tmp")
    tmp.write_text(text, encoding="utf-8")
    try:
        load_config(tmp)  # what was written validates, or nothing is left behind
    except ConfigError:
        tmp.unlink()
        raise
    tmp.replace(output)
    typer.echo(f"wrote {output} (template {guess.template}, {guess.keys['feedback']} feedback); check it, then:")
    typer.echo(f"  laser run {output} --dry-run")


def register(app: typer.Typer) -> None:
    """Add `laser init` to the app."""
    from jobs.errors import clean_errors

    app.command("init")(clean_errors(init))
