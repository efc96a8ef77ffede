"""LASER as vLLM's drafter (laser.vllm): greedy is lossless, pool keys reach their pools, the relaxed rule
holds inside vLLM. Skipped where vLLM is not installed (the project's main environment); run with the
vLLM environment of docs/engines.md.

One laser engine and one plain vLLM engine serve the whole module (vLLM's start is the slow part).
"""
from __future__ import annotations

import pytest

pytest.importorskip("vllm")

import torch  # noqa: E402

from laser.vllm import VllmEngine  # noqa: E402
from laser.vllm.budget import ChainBudget  # noqa: E402
from laser.vllm import relaxed as relaxed_mod  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402

MAX_DRAFT = 4
NEW = 40


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [[0] + torch.randint(2, 250, (int(torch.randint(4, 24, (1,), generator=g)),), generator=g).tolist()
            for _ in range(n)]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return str(save_tiny_model(tmp_path_factory.mktemp("vllm-tiny") / "tiny", hidden_size=128))


@pytest.fixture(scope="module")
def engines(model_dir):
    common = dict(threads=1, max_num_seqs=40, max_model_len=512, kv_cache_gib=1, enforce_eager=True)
    laser_eng = VllmEngine(model_dir, speculation="laser", max_draft=MAX_DRAFT, draft_len=MAX_DRAFT, **common)
    plain = VllmEngine(model_dir, speculation=None, **common)
    yield laser_eng, plain
    laser_eng.close()
    plain.close()


def _self_pool(engine, prompts, key):
    """A pool holding the target's own greedy answers to ``prompts`` (drafts it will accept)."""
    from pools.retrieval import RetrievalPool

    outs = engine.generate(prompts, NEW)
    pool = RetrievalPool.from_token_ids([o.token_ids for o in outs])
    engine.register_pool(key, pool)
    return outs


@pytest.mark.parametrize("n", [1, 32])
def test_greedy_identical_to_vllm(engines, n):
    laser_eng, plain = engines
    prompts = _prompts(n, seed=n)
    want = [o.token_ids for o in plain.generate(prompts, NEW)]
    _self_pool(plain, prompts[: max(1, n // 2)], key=f"self{n}")  # half the rows draft from a good pool
    keys = [f"self{n}" if i < max(1, n // 2) else None for i in range(n)]
    got = laser_eng.generate(prompts, NEW, pool_keys=keys)
    assert [o.token_ids for o in got] == want
    assert sum(o.accepted_tokens for o in got) > 0, "no draft was ever accepted: the proposer did not draft"
    assert all(o.finish_reason in ("eos", "length") for o in got)


def test_pool_key_reaches_its_pool(engines):
    """Two groups' pools draft different text; a request drafts from the one its key names."""
    laser_eng, plain = engines
    prompts = _prompts(4, seed=7)
    seen: dict[str, list[list[int]]] = {"a": [], "b": []}

    class Recording:
        def __init__(self, name, pool):
            self.name, self.pool = name, pool

        def open(self, prompt_ids, max_nodes, n_max, min_prob):
            seen[self.name].append(list(prompt_ids))
            return self.pool.open(prompt_ids, max_nodes, n_max, min_prob)

    from pools.retrieval import RetrievalPool

    answers = [o.token_ids for o in plain.generate(prompts, NEW)]
    good = RetrievalPool.from_token_ids(answers)  # the target's own text: accepted
    other = RetrievalPool.from_token_ids([[(t * 7 + 3) % 250 + 2 for t in a] for a in answers])  # other text
    laser_eng.register_pool("group/a", Recording("a", good))
    laser_eng.register_pool("group/b", Recording("b", other))
    try:
        out_a = laser_eng.generate(prompts, NEW, pool_keys=["group/a"] * 4)
        out_b = laser_eng.generate(prompts, NEW, pool_keys=["group/b"] * 4)
    finally:
        laser_eng.unregister_pool("group/a")
        laser_eng.unregister_pool("group/b")
    assert sorted(seen["a"]) == sorted(seen["b"]) == sorted(prompts)  # each request opened its own pool once
    assert [o.token_ids for o in out_a] == [o.token_ids for o in out_b] == answers
    aal_a = sum(len(o.token_ids) for o in out_a) / sum(o.target_forwards for o in out_a)
    aal_b = sum(len(o.token_ids) for o in out_b) / sum(o.target_forwards for o in out_b)
    assert aal_a > 1.5 and aal_a > aal_b + 0.5, (aal_a, aal_b)


# relaxed rule -----------------------------------------------------------------------------------------

def _violations(logits: torch.Tensor, tokens: list[int], k: int, p: float, slack: float = 1e-4) -> list[int]:
    """Positions whose token is neither the argmax nor in the top-k with probability > p."""
    probs = logits.float().softmax(-1)
    bad = []
    for j, t in enumerate(tokens):
        top = probs[j].topk(k)
        is_argmax = probs[j, t] >= probs[j].max() - slack
        ok = is_argmax or (t in top.indices.tolist() and probs[j, t] > p - slack)
        if not ok:
            bad.append(j)
    return bad


def test_relaxed_rule_on_a_toy_distribution():
    """The docstring's worked example, and each clause of the rule on its own."""
    V = 12

    def row(peaks):
        r = torch.full((V,), (1 - sum(peaks.values())) / (V - len(peaks)))
        for t, q in peaks.items():
            r[t] = q
        return r

    logits = torch.stack([row({7: .6, 3: .3}), row({5: .5, 9: .45}), row({2: .9})]).log()
    draft = torch.tensor([3, 9, 4])
    acc = relaxed_mod.relaxed_accept(logits, draft, torch.tensor([2, 2, 2]), torch.tensor([.1, .1, .1]))
    assert acc.tolist() == [True, True, False]
    out = relaxed_mod.chain_output(acc, draft, logits.argmax(-1), torch.tensor([0]), [3], 5)
    assert out[0].tolist() == [3, 9, 2, -1, -1]
    # a draft under p is refused; k=1 is greedy (the argmax alone)
    acc = relaxed_mod.relaxed_accept(logits, torch.tensor([3, 9, 2]), torch.tensor([2, 2, 1]),
                                     torch.tensor([.31, .44, .95]))
    assert acc.tolist() == [False, True, True]
    # not in the top-k, however likely
    acc = relaxed_mod.relaxed_accept(logits[1:2], torch.tensor([9]), torch.tensor([1]), torch.tensor([0.]))
    assert acc.tolist() == [False]


def _broken_accept_all(logits, draft, k, p):
    return torch.ones_like(draft, dtype=torch.bool)


_REAL_ACCEPT = relaxed_mod.relaxed_accept


def _broken_ignores_p(logits, draft, k, p):
    return _REAL_ACCEPT(logits, draft, k, torch.zeros_like(p))


def _check_relaxed_run(engines, hf_logits, k=3, p=0.2):
    """Run relaxed requests drafting from a pool of other text; every emitted token must obey the rule."""
    laser_eng, plain = engines
    from pools.retrieval import RetrievalPool

    prompts = _prompts(6, seed=11)
    noisy = [[(t * 5 + 1) % 250 + 2 for t in o.token_ids] for o in plain.generate(prompts, NEW)]
    # the pool mixes the target's likely continuations with noise: many non-argmax drafts get verified
    laser_eng.register_pool("relax", RetrievalPool.from_token_ids(noisy))
    try:
        outs = laser_eng.generate(prompts, NEW, pool_keys=["relax"] * 6, verification="relaxed", k=k, p=p)
    finally:
        laser_eng.unregister_pool("relax")
    bad = 0
    for prompt, o in zip(prompts, outs):
        logits = hf_logits(prompt, o.token_ids)
        bad += len(_violations(logits, o.token_ids, k, p))
    return outs, bad


@pytest.fixture(scope="module")
def hf_logits(model_dir):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()

    def logits(prompt, tokens):
        with torch.no_grad():
            out = model(torch.tensor([prompt + tokens])).logits[0]
        return out[len(prompt) - 1: len(prompt) - 1 + len(tokens)]

    return logits


def test_relaxed_run_obeys_the_rule(engines, hf_logits):
    laser_eng, _ = engines
    outs, bad = _check_relaxed_run(engines, hf_logits)
    assert bad == 0
    assert laser_eng.proposer.runner.rejection_sampler.relaxed_rows > 0, "the relaxed rule never ran"
    assert sum(o.accepted_tokens for o in outs) > 0


@pytest.mark.parametrize("broken", [_broken_accept_all, _broken_ignores_p])
def test_a_broken_relaxed_rule_is_caught(engines, hf_logits, monkeypatch, broken):
    monkeypatch.setattr(relaxed_mod, "relaxed_accept", broken)
    _, bad = _check_relaxed_run(engines, hf_logits)
    assert bad > 0, "the rule check did not notice a broken rule"


def test_draft_length_follows_the_load(engines):
    """With a cost model where extra tokens are free, rows draft; where they are dear, drafting stops."""
    from laser.cost import ForwardCost

    laser_eng, plain = engines
    rows, nodes = [1, 2, 4, 8, 16, 32, 64], [1, 2, 3, 5]
    cheap = ForwardCost("cheap", rows, nodes, [[0.01 for _ in nodes] for _ in rows], 256)
    dear = ForwardCost("dear", rows, nodes, [[0.01 * n * r for n in nodes] for r in rows], 256)
    prompts = _prompts(8, seed=3)
    _self_pool(plain, prompts, key="load")
    saved = laser_eng.proposer.budget
    try:
        totals = {}
        for name, cost in (("cheap", cheap), ("dear", dear)):
            laser_eng.proposer.budget = ChainBudget(cost=cost, max_len=MAX_DRAFT)
            outs = laser_eng.generate(prompts, NEW, pool_keys=["load"] * 8)
            totals[name] = sum(o.accepted_tokens for o in outs), laser_eng.proposer.budget.chosen
        assert totals["cheap"][0] > 0 and max(totals["cheap"][1]) > 0
        assert totals["dear"][0] < totals["cheap"][0]
    finally:
        laser_eng.proposer.budget = saved
        laser_eng.unregister_pool("load")
