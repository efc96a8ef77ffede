"""`laser ctr-eval`: config errors name the key; end to end on synthetic data with real MiniLM encoding."""

from __future__ import annotations

import json

import polars as pl
import pytest
import yaml
from typer.testing import CliRunner

from jobs.cli import app
from jobs.config import CONFIG_DIR, ConfigError
from jobs.ctr_eval import load_ctr_config
from pipelines.data import SyntheticParams
from pipelines.data.synthetic import generate

SYNTH = {"n_users": 40, "n_items": 30, "n_clusters": 3, "min_history": 10, "max_history": 20, "cold_user_fraction": 0.0}


def _write(path, tree) -> str:
    path.write_text(yaml.safe_dump(tree))
    return str(path)


@pytest.mark.parametrize(
    "tree, key",
    [
        ({"train": {"lrr": 0.1}}, "train.lrr: unknown key"),
        ({"knowledge": {"none": "x.parquet"}}, "knowledge: Value error, 'none' is reserved"),
        ({"seeds": "abc"}, "seeds:"),
        ({"models": ["din", "xgboost"]}, "models.1:"),
        ({"dataset": {"fromat": "synthetic"}}, "dataset.fromat: unknown key"),
    ],
)
def test_config_errors_name_the_key(tmp_path, tree, key):
    with pytest.raises(ConfigError) as err:
        load_ctr_config(_write(tmp_path / "bad.yaml", tree))
    assert "bad.yaml" in str(err.value) and key in str(err.value)


def test_bundled_demo_config_is_valid():
    cfg = load_ctr_config(CONFIG_DIR / "ctr_eval_demo.yaml")
    assert set(cfg.knowledge) == {"greedy", "relaxed"} and cfg.seeds == [0, 1, 2] and cfg.label_threshold() == 4.0


@pytest.mark.slow
def test_ctr_eval_end_to_end_identical_sources_are_lossless(tmp_path):
    ds, truth = generate(SyntheticParams(**SYNTH), seed=0)
    rows = [
        ("user", r["user_id"], f"This viewer enjoys {' and '.join(r['liked_genres'])} films.")
        for r in truth.iter_rows(named=True)
    ]
    rows += [
        ("item", r["item_id"], f"{r['title']} is a {', '.join(r['genres'])} movie.")
        for r in ds.items.iter_rows(named=True)
    ]
    knowledge = pl.DataFrame(rows, schema=["entity_type", "entity_id", "knowledge"], orient="row")
    knowledge.write_parquet(tmp_path / "greedy.parquet")
    knowledge.write_parquet(tmp_path / "relaxed.parquet")  # identical text: must train to identical models
    config = _write(
        tmp_path / "ctr.yaml",
        {
            "dataset": {"format": "synthetic", "seed": 0, "synthetic": SYNTH},
            "split": {"max_hist": 8},
            "knowledge": {"greedy": str(tmp_path / "greedy.parquet"), "relaxed": str(tmp_path / "relaxed.parquet")},
            "seeds": [0, 1],
            "split_fractions": [0.6, 0.2, 0.2],
            "threads": 1,
            "train": {"lr": 0.003, "batch_size": 64, "max_epochs": 3, "patience": 1},
        },
    )
    out = tmp_path / "out" / "ctr.json"
    result = CliRunner().invoke(app, ["ctr-eval", config, "--json", str(out)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    assert "DIN AUC" in result.output and "DCNv2 LL" in result.output and "relaxed: lossless vs greedy" in result.output
    data = json.loads(out.read_text())
    assert list(data["table"]) == ["none", "greedy", "relaxed"]
    for source in data["table"].values():
        assert set(source) == {"din", "dcnv2"} and all(m["n"] == 2 for m in source.values())
    assert data["verdicts"]["relaxed"] == {"delta_auc": {"din": 0.0, "dcnv2": 0.0}, "lossless": True}
    assert (tmp_path / "greedy.vectors.parquet").is_file()
    assert len(data["runs"]) == 3 * 2 * 2
    assert data["deltas"]["relaxed"]["vs_greedy"]["din"]["auc_ci95"] == [0.0, 0.0]
    assert set(data["deltas"]["greedy"]) == {"vs_none"} and data["knowledge_rows"]["greedy"]["user"] == 40
    assert "relaxed: " in data["verdict"] and "| relaxed | DIN |" in out.with_suffix(".md").read_text()
    assert out.with_suffix(".png").read_bytes()[:4] == b"\x89PNG"


def test_ctr_eval_cli_reports_config_error(tmp_path):
    result = CliRunner().invoke(app, ["ctr-eval", _write(tmp_path / "c.yaml", {"seed": [1]})])
    assert result.exit_code == 2 and "seed: unknown key" in result.output


def test_movielens_1m_configs_agree_on_the_sample_the_knowledge_was_written_for():
    from jobs.config import load_config

    job = load_config(CONFIG_DIR / "movielens_1m_ctr.yaml")
    ctr = load_ctr_config(CONFIG_DIR / "ctr_eval_movielens_1m.yaml")
    assert job.dataset.sample_items == "most_rated" and job.dataset.limit_users == 500
    # ctr-eval rebuilds the samples from these blocks: they must be the generation job's
    assert ctr.dataset.model_dump() == job.dataset.model_dump()
    assert ctr.split.model_dump() == job.split.model_dump()
    assert len(ctr.seeds) >= 3 and ctr.reference == "greedy" and "relaxed" in ctr.knowledge


@pytest.mark.parametrize(
    "tree, key",
    [
        ({"negatives": 2}, "negatives: implicit feedback only"),
        ({"dataset": {"feedback": "implicit"}, "rating_threshold": 3}, "rating_threshold: explicit feedback only"),
    ],
)
def test_feedback_specific_keys_name_the_other_kind(tmp_path, tree, key):
    with pytest.raises(ConfigError, match=key):
        load_ctr_config(_write(tmp_path / "bad.yaml", tree))


def test_ctr_eval_on_implicit_feedback_samples_negatives(tmp_path):
    config = _write(
        tmp_path / "ctr.yaml",
        {
            "dataset": {"format": "synthetic", "seed": 0, "synthetic": SYNTH, "feedback": "implicit"},
            "split": {"max_hist": 8},
            "negatives": 3,
            "seeds": [0],
            "models": ["din"],
            "split_fractions": [0.6, 0.2, 0.2],
            "threads": 1,
            "train": {"batch_size": 64, "max_epochs": 1, "patience": 1},
        },
    )
    out = tmp_path / "ctr.json"
    result = CliRunner().invoke(app, ["ctr-eval", config, "--json", str(out)], env={"COLUMNS": "160"})
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    positives = data["sample"]["new_interactions"]  # synthetic implicit weights are all 1: every one positive
    assert data["n_samples"] == 4 * positives and data["positive_rate"] == pytest.approx(0.25)
    assert data["table"]["none"]["din"]["auc_mean"] is not None
