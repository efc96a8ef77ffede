"""A third-party decoder, installed through the ``laser.decoders`` entry point, works everywhere a built-in
does: the registry, the lossless invariant, and ``laser run`` on local Ray, with no edit to pipelines/.

The plug-in is the README's example file (examples/decoders/prompt_lookup.py), installed for real: a
folder on the path with the module and a ``.dist-info`` that declares the entry point.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import laser
from laser.decoders import registry
from tests.helpers import greedy_reference, random_prompts

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "decoders" / "prompt_lookup.py"


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("site")
    shutil.copy(EXAMPLE, root / "prompt_lookup.py")
    info = root / "laser_prompt_lookup-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: laser-prompt-lookup\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[laser.decoders]\nprompt_lookup = prompt_lookup:PromptLookup\n")
    return root


@pytest.fixture
def installed(plugin_dir, monkeypatch):
    monkeypatch.syspath_prepend(str(plugin_dir))
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY))
    return plugin_dir


def test_plugin_is_registered_and_lossless(installed, tiny_lm):
    assert "prompt_lookup" in laser.available_decoders()
    dec = laser.get_decoder("prompt_lookup", tiny_lm, max_ngram=2, num_tokens=6)
    assert dec.pool == "none" and dec.greedy_params() == {}
    accepted = 0
    for prompt in random_prompts(8, 96, seed=21):
        prompt = prompt + prompt  # a repeated prompt gives lookup something to copy
        out = dec.generate(prompt, 40)
        assert out.token_ids == greedy_reference(tiny_lm, prompt, 40)
        accepted += sum(out.stats.accepted_per_step)
    assert accepted > 0
    with pytest.raises(ValueError, match="bad parameters"):
        laser.get_decoder("prompt_lookup", tiny_lm, K=4)  # it takes no K


@pytest.mark.slow
def test_plugin_runs_in_a_job(plugin_dir, tmp_path):
    from tests.helpers import save_tiny_model

    model = save_tiny_model(tmp_path / "model")
    out = tmp_path / "job"
    sets = [
        "dataset.format=synthetic",
        "dataset.seed=3",
        "dataset.synthetic.n_users=8",
        "dataset.synthetic.n_items=10",
        "dataset.synthetic.n_clusters=2",
        "dataset.synthetic.max_history=8",
        "split.mode=paper",
        "split.max_hist=4",
        f"model.name={model}",
        "model.dtype=float32",
        "decoder.name=prompt_lookup",
        "decoder.params.num_tokens=4",
        "old_knowledge.decoder=prompt_lookup",
        "generation.max_new_tokens=16",
        "generation.max_prompt_tokens=2000",
        "routing.n_clusters=2",
        "execution.num_workers=1",
        f"output.path={out}",
    ]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(plugin_dir), str(REPO)]), "OMP_NUM_THREADS": "1"}
    (tmp_path / "job.yaml").write_text("{}\n")  # everything is set below
    cmd = [
        sys.executable,
        "-c",
        "from jobs.cli import app; app()",
        "run",
        str(tmp_path / "job.yaml"),
        *[a for s in sets for a in ("--set", s)],
    ]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    from pipelines.store.knowledge import read_knowledge

    new, old = read_knowledge(out / "knowledge"), read_knowledge(out / "old_knowledge")
    assert new.height > 0 and set(new["decoder"]) == {"prompt_lookup"} and set(new["pool_kind"]) == {None}
    assert old.height > 0 and set(old["decoder"]) == {"prompt_lookup"}
