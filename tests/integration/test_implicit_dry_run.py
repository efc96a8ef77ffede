"""A job on implicit feedback (no rating column; an event and a count column) validates, loads, routes (LightGCN
trained on the weighted interactions), plans and renders its prompts in a dry run, as written."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import yaml
from typer.testing import CliRunner

from jobs.cli import app
from jobs.config import load_config
from pipelines.knowledge.inputs import load_job_data
from pipelines.prompts.template import shipped_template
from pipelines.knowledge.prompts import user_prompt
from pipelines.knowledge.requests import new_requests
from pipelines.knowledge.routing import groups_of

EVENTS = ("view", "click", "cart", "purchase")


def _write_shop(root: Path) -> None:
    """12 users x 6 items each, deterministic; events and counts; no rating anywhere."""
    rows = [
        (u, f"i{(u * 3 + k) % 10}", EVENTS[(u + k) % 4], 1 + (u * k) % 3, 1_700_000_000 + 60 * (u * 6 + k))
        for u in range(12)
        for k in range(6)
    ]
    (root / "events").mkdir(parents=True)
    pl.DataFrame(rows, schema=["user", "item", "event", "count", "ts"], orient="row").write_parquet(
        root / "events" / "part-0.parquet"
    )
    pl.DataFrame(
        {
            "item": [f"i{n}" for n in range(10)],
            "title": [f"Gadget {n}" for n in range(10)],
            "category": ["Home", "Tech"] * 5,
        }
    ).write_parquet(root / "items.parquet")


def _config(root: Path, out: Path) -> Path:
    cfg = yaml.safe_load(Path("jobs/configs/table.yaml").read_text())
    data = cfg["dataset"]
    data.update(
        path=str(root),
        feedback="implicit",
        event_weights={"purchase": 3, "cart": 2, "click": 1, "view": 0.5},
        rating_scale=None,
        users_file=None,
        domain=None,
    )
    data["columns"] = {"user_id": "user", "item_id": "item", "timestamp": "ts", "event": "event", "weight": "count"}
    cfg["routing"]["user_policy"] = "warm_cold"
    cfg["output"]["path"] = str(out)
    path = root / "implicit.yaml"
    path.write_text(yaml.safe_dump(cfg))
    return path


def test_implicit_job_dry_run(tmp_path):
    root = tmp_path / "shop"
    _write_shop(root)
    path = _config(root, tmp_path / "out")
    result = CliRunner().invoke(app, ["run", str(path), "--dry-run"])
    assert result.exit_code == 0, result.output
    assert "to generate: 22 entities" in " ".join(result.output.split())  # 12 users, 10 items

    cfg = load_config(path)
    data = load_job_data(cfg)
    assert data.dataset.interactions["rating"].null_count() == data.dataset.interactions.height
    user_groups = groups_of(cfg, data, write=False)["user"][1]
    assert user_groups is not None and user_groups.height == 12  # LightGCN trained on the weights
    (req,) = [r for r in new_requests(data.dataset, data.split, {}) if r.entity_id == "0"]
    text = user_prompt(req.history or [], template=shipped_template("movie"), max_words=50)
    assert "rating" not in text.lower() and "4. Title: Gadget 3 | Action: purchased (weight 3)\n" in text, text
