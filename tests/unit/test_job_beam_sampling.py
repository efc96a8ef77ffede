"""generation.strategy beam_sample: config keys and errors, the decoder it selects, and the knowledge
it writes through the new-knowledge step (in-process workers, no Ray)."""

from __future__ import annotations

import json

import polars as pl
import pytest

from jobs.config import ConfigError, load_config
from pipelines.knowledge import job as jobmod
from pipelines.knowledge.generation import GenerationWorker
from pipelines.workers import LocalGroup, ModelSpec
from pipelines.store.knowledge import read_knowledge
from pipelines.knowledge.sampling import entity_seed
from pipelines.knowledge.decoders import check_job_decoders as check_job_decoder
from pipelines.knowledge.decoders import new_knowledge_decoder
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.paths import JobPaths
from pipelines.knowledge.validation import JobInputError

BEAM = ["generation.strategy=beam_sample", "decoder.name=beam_sample"]


def test_default_strategy_keeps_todays_decoder_and_run_id():
    cfg = load_config(None)
    assert (cfg.generation.strategy, cfg.generation.beam_width) == ("default", 4)
    assert new_knowledge_decoder(cfg).name == cfg.decoder.name == "laser"
    assert load_config(None, ["generation.beam_width=8"]).resolved_run_id() == cfg.resolved_run_id()
    assert load_config(None, BEAM).resolved_run_id() != cfg.resolved_run_id()


def test_beam_sample_selects_the_decoder_and_width():
    cfg = load_config(None, BEAM + ["generation.beam_width=3"])
    dec = new_knowledge_decoder(cfg)
    assert (dec.name, dec.params) == ("beam_sample", {"W": 3})
    assert cfg.generation.sampling()["temperature"] == 1.0
    check_job_decoder(cfg)
    dsbd = load_config(None, BEAM + ["decoder.name=dsbd", "decoder.params.draft=truncate:1", "decoder.params.W_S=4"])
    assert new_knowledge_decoder(dsbd).params == {"draft": "truncate:1", "W_S": 4, "W": 4}
    check_job_decoder(dsbd)


@pytest.mark.parametrize(
    "overrides,pattern",
    [
        (["decoder.name=laser"], r"generation\.strategy=beam_sample: decoder\.name='laser' cannot beam-sample"),
        (["decoder.name=dsbd", "decoder.params.W=2"], r"decoder\.params\.W=2 conflicts with generation\.beam_width=4"),
    ],
)
def test_decoders_that_cannot_beam_sample_are_input_errors(overrides, pattern):
    with pytest.raises(JobInputError, match=pattern):
        check_job_decoder(load_config(None, BEAM + overrides))


@pytest.mark.parametrize("key,value", [("temperature", 0.7), ("top_p", 0.9), ("top_k", 5)])
def test_beam_sampling_refuses_warps(key, value):
    with pytest.raises(ConfigError, match=rf"generation: .*generation\.temperature must be 0 or 1.*{key}={value}"):
        load_config(None, BEAM + [f"generation.{key}={value}"])
    with pytest.raises(ConfigError, match=r"beam_width: .*greater than or equal to 1"):
        load_config(None, BEAM + ["generation.beam_width=0"])


@pytest.fixture(scope="module")
def workers(tiny_model) -> LocalGroup:
    import torch

    torch.set_num_threads(1)
    return LocalGroup(GenerationWorker(ModelSpec(tiny_model, dtype="float32")))


def knowledge(workers, tiny_model, out, *extra: str) -> pl.DataFrame:
    cfg = load_config(
        None,
        BEAM
        + [
            f"model.name={tiny_model}",
            "model.dtype=float32",
            f"output.path={out}",
            "generation.max_new_tokens=10",
            "generation.beam_width=2",
            "dataset.synthetic.n_users=4",
            "dataset.synthetic.n_items=6",
            "dataset.synthetic.n_clusters=2",
            "dataset.synthetic.max_history=6",
            "split.max_hist=3",
            "generation.degenerate=keep",
            *extra,
        ],
    )  # a random model never ends a sentence: no retry hiding the sampling
    data = load_job_data(cfg)
    report = jobmod.step_generate(cfg, data, pl.DataFrame(), workers)
    assert report.done > 0 and report.failed == 0
    return read_knowledge(JobPaths.of(cfg).knowledge).sort("entity_type", "entity_id")


def test_beam_sample_writes_knowledge_deterministically(workers, tiny_model, tmp_path):
    a = knowledge(workers, tiny_model, tmp_path / "a", "generation.seed=7")
    b = knowledge(workers, tiny_model, tmp_path / "b", "generation.seed=7")
    other = knowledge(workers, tiny_model, tmp_path / "c", "generation.seed=8")
    assert a["knowledge"].to_list() == b["knowledge"].to_list()
    assert a["knowledge"].to_list() != other["knowledge"].to_list()
    assert set(a["decoder"]) == {"beam_sample"}
    assert {json.loads(p)["W"] for p in a["decoder_params"]} == {2}
    row = a.row(0, named=True)
    assert json.loads(row["sampling"]) == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": 0,
        "seed": entity_seed(7, row["entity_type"], row["entity_id"]),
    }
    assert (a["n_tokens"] >= 1).all() and (a["target_forwards"] >= a["n_tokens"]).all()


def test_dsbd_strategy_records_what_ran(workers, tiny_model, tmp_path):
    rows = knowledge(
        workers,
        tiny_model,
        tmp_path / "d",
        "decoder.name=dsbd",
        "decoder.params.draft=truncate:1",
        "decoder.params.gamma=2",
        "decoder.params.W_S=3",
        "decoder.params.one_cache=true",
    )
    assert set(rows["decoder"]) == {"dsbd"}
    params = json.loads(rows["decoder_params"][0])
    assert params["W"] == 2 and params["W_S"] == 3 and params["one_cache"] is True
    assert params["draft"] == "truncate:1" and params["gamma"] == 2
