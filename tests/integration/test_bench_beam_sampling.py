"""The beam-sampling study on a tiny model: every method's figures, speedups against beam_sample and
the teacher-forced scoring of the returned sequences."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import laser
from benchmarks.beam_sampling import METHODS, run_beam_sampling_study, target_log_probs


@pytest.fixture(scope="module")
def study():
    torch.set_num_threads(1)
    lm = laser.tiny_llama(seed=3)
    return lm, run_beam_sampling_study(
        lm,
        lm,
        [[5, 6, 7], [9, 10, 11, 12]],
        W=3,
        gamma=3,
        W_S=3,
        seeds=(1, 2),
        max_new_tokens=12,
        methods=(*METHODS, "dsbd_fixed"),
    )


def test_every_method_is_measured_on_the_same_runs(study):
    _, result = study
    assert set(result["methods"]) == {*METHODS, "dsbd_fixed"}
    assert result["settings"]["prompts"] == 2 and result["settings"]["seeds"] == [1, 2]
    base = result["methods"]["beam_sample"]
    assert base["speedup"] == pytest.approx(1.0) and base["layers_per_forward"] == pytest.approx(1.0)
    for fig in result["methods"].values():
        assert fig["runs"] == 4 and fig["tokens"] >= 4 and fig["target_forwards"] >= 4
        assert fig["wall_s"] >= fig["decode_s"] > 0 and fig["tokens_per_s"] > 0
        assert fig["logprob_per_token"] < 0 and fig["logprob_per_sequence"] < 0


def test_dsbd_with_the_target_as_draft_needs_fewer_forwards(study):
    _, result = study
    m = result["methods"]
    for name in ("dsbd", "dsbd_one_cache", "dsbd_fixed"):
        assert m[name]["target_forwards"] < m["beam_sample"]["target_forwards"]
        assert m[name]["layers_per_forward"] > 1.5
    assert m["dsbd_one_cache"]["mean_input_beams"] == 1.0
    assert m["dsbd_one_cache"]["max_forest_nodes"] <= m["dsbd"]["max_forest_nodes"]
    assert m["beam_sample"]["mean_width"] == m["dsbd_fixed"]["mean_width"] == 3.0
    assert m["dsbd"]["mean_width"] == 3.0  # p = q: the dynamic width keeps all W_S drafts


def test_unknown_methods_are_named(study):
    lm, _ = study
    with pytest.raises(ValueError, match="unknown method 'dsbd_wide'"):
        run_beam_sampling_study(lm, lm, [[5, 6]], methods=("dsbd_wide",))


def test_scoring_is_one_teacher_forced_forward(study):
    lm, _ = study
    ids, tokens = [5, 6, 7], [8, 9, 10]
    want = 0.0
    for i, tok in enumerate(tokens):  # token by token, no cache
        with torch.no_grad():
            logits = lm.model(torch.tensor([ids + tokens[:i]])).logits[0, -1]
        want += float(torch.log_softmax(logits.double(), -1)[tok])
    assert target_log_probs(lm, ids, tokens).sum() == pytest.approx(want, abs=1e-4)
    assert target_log_probs(lm, ids, []).shape == (0,) and np.isfinite(target_log_probs(lm, ids, tokens)).all()
