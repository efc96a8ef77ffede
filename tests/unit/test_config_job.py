"""Job config: shipped YAMLs validate, bad keys are named, `--set` overrides are typed."""

from __future__ import annotations

import pytest

from jobs.config import CONFIG_DIR, ConfigError, JobConfig, apply_overrides, bundled_config, load_config


@pytest.mark.parametrize("name", ["demo", "movielens", "amazon"])
def test_shipped_configs_validate(name):
    cfg = load_config(bundled_config(name))
    assert cfg.decoder.name == "laser"
    assert cfg.model.name == "smollm2-135m"


def test_demo_values():
    cfg = load_config(CONFIG_DIR / "demo.yaml")
    assert cfg.dataset.format == "synthetic"
    assert cfg.execution.address is None
    assert cfg.generation.max_new_tokens == 96
    assert cfg.decoder.params == {"verification": "relaxed", "k": 2, "p": 0.1}


def test_defaults_without_file():
    cfg = load_config(None)
    assert (cfg.model.name, cfg.decoder.name, cfg.execution.num_workers, cfg.execution.address) == (
        "smollm2-135m",
        "laser",
        "auto",
        None,
    )


def test_unknown_key_is_named(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("dataset:\n  format: synthetic\n  limt_users: 3\nexecution:\n  num_wrkers: 2\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    msg = str(err.value)
    assert str(path) in msg
    assert "dataset.limt_users: unknown key" in msg
    assert "execution.num_wrkers: unknown key" in msg


def test_bad_value_is_named(tmp_path):
    path = tmp_path / "job.yaml"
    path.write_text("execution:\n  num_workers: 0\n")
    with pytest.raises(ConfigError, match=r"execution\.num_workers: .*greater than or equal to 1.*got 0"):
        load_config(path)
    with pytest.raises(ConfigError, match=r"model\.dtype"):
        load_config(None, ["model.dtype=int3"])


def test_set_overrides_are_yaml_typed():
    cfg = load_config(
        CONFIG_DIR / "demo.yaml",
        [
            "dataset.limit_users=7",
            "decoder.params.k=3",
            "decoder.params.p=0.25",
            "decoder.params.verification=greedy",
            "execution.address=null",
            "output.path=/tmp/x",
            "old_knowledge.generate_missing=false",
            "dataset.seed=11",
        ],
    )
    assert cfg.dataset.limit_users == 7
    assert cfg.decoder.params == {"verification": "greedy", "k": 3, "p": 0.25}
    assert isinstance(cfg.decoder.params["k"], int) and isinstance(cfg.decoder.params["p"], float)
    assert cfg.old_knowledge.generate_missing is False
    assert cfg.output.path == "/tmp/x"
    assert cfg.dataset.seed == 11


def test_override_errors():
    with pytest.raises(ConfigError, match="expected key=value"):
        apply_overrides({}, ["decoder.name"])
    with pytest.raises(ConfigError, match=r"model\.name is not a mapping"):
        apply_overrides({"model": {"name": "x"}}, ["model.name.sub=1"])
    with pytest.raises(ConfigError, match=r"decoder\.nam: unknown key"):
        load_config(None, ["decoder.nam=resd"])
    tree = {"a": {"b": 1}}
    assert apply_overrides(tree, ["a.c=[1, 2]"]) == {"a": {"b": 1, "c": [1, 2]}}
    assert tree == {"a": {"b": 1}}  # the input is not modified


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "missing.yaml")
    (tmp_path / "list.yaml").write_text("- 1\n- 2\n")
    with pytest.raises(ConfigError, match="must be a mapping"):
        load_config(tmp_path / "list.yaml")
    with pytest.raises(ConfigError, match="no bundled config 'nope'"):
        bundled_config("nope")


def test_run_id_stable_and_sensitive():
    a, b = JobConfig(), JobConfig()
    assert a.resolved_run_id() == b.resolved_run_id()
    moved = JobConfig.model_validate({"execution": {"num_workers": 7}, "output": {"path": "elsewhere"}})
    assert moved.resolved_run_id() != a.resolved_run_id()  # output path is part of the identity
    assert JobConfig.model_validate({"execution": {"num_workers": 7}}).resolved_run_id() == a.resolved_run_id()
    assert JobConfig.model_validate({"decoder": {"name": "resd"}}).resolved_run_id() != a.resolved_run_id()
    assert JobConfig.model_validate({"output": {"run_id": "nightly"}}).resolved_run_id() == "nightly"


def test_work_dir_does_not_change_the_config_hash():
    base = load_config(None, ["output.path=s3://bucket/job"])
    moved = load_config(None, ["output.path=s3://bucket/job", "output.work_dir=/shared/work"])
    assert base.resolved_run_id() == moved.resolved_run_id()


def test_set_values_are_strings_unless_number_boolean_or_bracketed():
    cfg = load_config(
        CONFIG_DIR / "demo.yaml",
        [
            "output.path=/x/fe #1",
            "dataset.name=a: b",
            "model.name=yes",
            "decoder.params.k=3",
            "decoder.params.p=1e-1",
            "old_knowledge.generate_missing=False",
            "execution.address=~",
        ],
    )
    assert cfg.output.path == "/x/fe #1"  # never cut at '#'
    assert cfg.dataset.name == "a: b" and cfg.model.name == "yes"
    assert cfg.decoder.params["k"] == 3 and cfg.decoder.params["p"] == 0.1
    assert cfg.old_knowledge.generate_missing is False and cfg.execution.address is None
    assert apply_overrides({}, ["a={x: 1}", "b=[a, 'b #c']", "c=2020-01-01"]) == {
        "a": {"x": 1},
        "b": ["a", "b #c"],
        "c": "2020-01-01",
    }
    with pytest.raises(ConfigError, match="not a valid list or mapping"):
        apply_overrides({}, ["a=[1, 2"])


def test_config_file_that_is_not_utf8_is_named(tmp_path):
    path = tmp_path / "latin1.yaml"
    path.write_bytes("dataset:\n  name: caf\xe9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=r"latin1.yaml: not UTF-8 text \(byte 20"):
        load_config(path)


def test_where_pools_live_leaves_the_config_hash_alone():
    """Online pools and their size place drafts, not text: the hash stays that of a task from before they
    existed, so an upgrade regenerates nothing."""
    import dataclasses

    from pipelines.knowledge.provenance import generation_hash
    from pipelines.knowledge.records import DecodeTask

    task = DecodeTask("laser")
    fields = dataclasses.asdict(task)
    older = {k: v for k, v in fields.items() if k not in ("online_pools", "pool_max_size")}
    online = dataclasses.asdict(dataclasses.replace(task, online_pools=True, pool_max_size=5))
    assert generation_hash("m", "auto", fields) == generation_hash("m", "auto", older)
    assert generation_hash("m", "auto", online) == generation_hash("m", "auto", fields)
