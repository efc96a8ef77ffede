"""LASER's vLLM plug-in without an engine: the relaxed rule's batched chain output, the version/attribute
check, the proposer's refusal to run unattached, stats from vLLM's per-request metrics, pool-store pools."""

from __future__ import annotations

import importlib.util
import time
from types import SimpleNamespace

import pytest
import torch

from laser.vllm import relaxed as relaxed_mod
from laser.vllm.proposer import RowStats


def _loop_chain_output(accept, draft, argmax, bonus, num_draft, width):
    """The rule's output written row by row (the reference for the batched form)."""
    out = torch.full((len(num_draft), width), relaxed_mod.PLACEHOLDER, dtype=torch.int32)
    start = 0
    for i, n in enumerate(num_draft):
        a = 0
        while a < n and bool(accept[start + a]):
            a += 1
        out[i, :a] = draft[start : start + a].to(torch.int32)
        out[i, a] = int(argmax[start + a]) if a < n else int(bonus[i])
        start += n
    return out


@pytest.mark.parametrize("seed", range(5))
def test_chain_output_matches_the_row_by_row_rule(seed, device):
    g = torch.Generator().manual_seed(seed)
    width = 6
    num_draft = torch.randint(0, width, (7,), generator=g).tolist()
    n = sum(num_draft)
    accept = torch.rand(n, generator=g) < 0.7
    draft, argmax = torch.randint(2, 50, (n,), generator=g), torch.randint(2, 50, (n,), generator=g)
    bonus = torch.randint(2, 50, (7,), generator=g)
    on = [t.to(device) for t in (accept, draft, argmax, bonus)]
    got = relaxed_mod.chain_output(*on, num_draft, width)
    assert got.device.type == device.type
    assert torch.equal(got.cpu(), _loop_chain_output(accept, draft, argmax, bonus, num_draft, width))


def test_chain_output_with_no_drafts_gives_the_bonus(device):
    empty = torch.zeros(0, dtype=torch.long, device=device)
    out = relaxed_mod.chain_output(empty.bool(), empty, empty, torch.tensor([4, 5], device=device), [0, 0], 3)
    assert out.tolist() == [[4, -1, -1], [5, -1, -1]]


def _reference_accept(logits, draft, k, p):
    """The relaxed rule written out over the whole vocabulary at every position (paper Eq. 8)."""
    probs = logits.float().softmax(-1)
    out = []
    for i in range(len(draft)):
        x, row = int(draft[i]), logits[i]
        in_top = int((row > row[x]).sum()) < int(k[i])  # fewer than k tokens strictly above x
        out.append(x == int(row.argmax()) or (int(k[i]) > 1 and in_top and float(probs[i, x]) > float(p[i])))
    return torch.tensor(out)


@pytest.mark.parametrize("seed", range(6))
def test_relaxed_accept_is_the_rule_at_every_position(seed, device):
    """The one-pass form (top-k once, the normaliser only where the threshold decides, argmax only at
    ties) equals the rule written out, ties included; knowing kmax changes nothing."""
    g = torch.Generator().manual_seed(seed)
    n, v = 40, 30
    logits = (torch.randn(n, v, generator=g) * 3).round()  # rounded: many tied maxima and k-th values
    draft = torch.where(torch.rand(n, generator=g) < 0.5, logits.argmax(-1), torch.randint(0, v, (n,), generator=g))
    k = torch.randint(1, 4, (n,), generator=g)
    logits[:8, 5] = logits[:8, 9] = logits[:8].max(-1).values + 1  # a tied maximum; the draft is not its first
    draft[:8], k[:4] = 9, 1
    p = torch.rand(n, generator=g) * 0.3
    want = _reference_accept(logits, draft, k, p)
    on = [t.to(device) for t in (logits, draft, k, p)]
    got, top = relaxed_mod.relaxed_accept(*on)
    assert got.device.type == device.type
    assert torch.equal(got.cpu(), want) and torch.equal(top.cpu(), logits.max(-1).values)
    assert torch.equal(relaxed_mod.relaxed_accept(*on, kmax=int(k.max()))[0].cpu(), want)
    assert want.any() and not want.all()


class _PenalisingSampler:
    """Stands in for vLLM's rejection sampler: its logits processors lower token 0 by 4 (a penalty)."""

    def apply_logits_processors(self, logits, sampling_metadata, metadata):
        logits[:, 0] -= 4.0
        return logits


def test_the_relaxed_rule_on_processed_logits_row_by_row(device):
    """Mixed batch: a greedy row, two relaxed rows with their own (k, p), a relaxed row with no drafts.
    Each position's accepted draft becomes its argmax, judged on the logits after the processors (the
    penalised token 0 is refused where the raw logits would take it); every other logit stays."""
    sampler = type("Sampler", (relaxed_mod.RelaxedRule, _PenalisingSampler), {})()
    sampler.relaxed_rows = sampler.relaxed_positions = 0
    rules = [None, (3, 0.05), (2, 0.3), (4, 0.01)]
    sampler.laser_rules = lambda: rules
    counts = [2, 3, 2, 0]
    g = torch.Generator().manual_seed(0)
    raw = torch.randn(sum(counts), 12, generator=g) * 2
    draft = torch.randint(1, 12, (sum(counts),), generator=g)
    raw[2, 0] = raw[2].max() + 1  # token 0 leads the raw logits at position 2 ...
    raw[2, 3] = raw[2, 0] - 0.5
    draft[2] = 0  # ... and is drafted there; after the penalty it is 3.5 below token 3
    raw[3] = torch.randn(12, generator=g) * 0.1
    raw[3, 5], raw[3, 7] = 3.0, 2.5
    draft[3] = 7  # the runner-up at a relaxed position (k=3, p=0.05): accepted
    processed = raw.clone()
    processed[:, 0] -= 4.0
    meta = SimpleNamespace(num_draft_tokens=counts, draft_token_ids=draft.to(device))
    out = sampler.apply_logits_processors(raw.clone().to(device), SimpleNamespace(max_num_logprobs=None), meta)
    assert out.device.type == device.type
    out = out.cpu()
    k = torch.tensor([0, 0, 3, 3, 3, 2, 2])
    p = torch.tensor([0.0, 0.0, 0.05, 0.05, 0.05, 0.3, 0.3])
    want = _reference_accept(processed, draft, k.clamp(min=1), p)
    want[:2] = False  # greedy row: left to vLLM's own kernel
    for i in range(len(draft)):
        if want[i]:
            assert int(out[i].argmax()) == int(draft[i])
            assert torch.equal(out[i][torch.arange(12) != draft[i]], processed[i][torch.arange(12) != draft[i]])
        else:
            assert torch.equal(out[i], processed[i])
    assert not want[2] and bool(want[3]) and int(processed[3].argmax()) != int(draft[3])  # a non-argmax accepted
    assert (sampler.relaxed_rows, sampler.relaxed_positions) == (2, 5)


def test_a_stale_position_is_left_to_the_greedy_rule(device):
    """The runner-up accepted at a relaxed position is refused there once the proposer marks the position
    stale (its token would repeat an n-gram of the row's text); the row's other positions keep the rule."""
    sampler = type("Sampler", (relaxed_mod.RelaxedRule, _PenalisingSampler), {})()
    logits = torch.zeros(3, 8)
    logits[:, 5], logits[:, 6] = 3.0, 2.6  # token 6 is the runner-up at every position, well above p
    draft = torch.tensor([6, 6, 5])
    meta = SimpleNamespace(num_draft_tokens=[3], draft_token_ids=draft.to(device))
    accepted = {}
    for stale in ((), (False, True, False, True)):  # marks beyond the row's drafts are ignored
        sampler.relaxed_rows = sampler.relaxed_positions = 0
        sampler.laser_rules = lambda stale=stale: [(2, 0.1, stale)]
        out = sampler.apply_logits_processors(logits.clone().to(device), SimpleNamespace(max_num_logprobs=None), meta)
        accepted[stale] = [int(r.argmax()) == int(d) for r, d in zip(out.cpu(), draft)]
    assert accepted[()] == [True, True, True]
    assert accepted[(False, True, False, True)] == [True, False, True]  # position 1: only the argmax (5) passes


def test_row_stats_from_vllm_metrics():
    detailed = SimpleNamespace(per_step_accepted=[2, 0, 3], histogram=[1, 0, 1, 1], num_draft_tokens=12)
    stats = RowStats.from_spec_metrics(detailed, n_tokens=20)
    assert (stats.steps, stats.accepted_per_step, stats.drafted, stats.accepted) == (15, [2, 0, 3], 12, 5)
    summary = SimpleNamespace(per_step_accepted=[], histogram=[1, 0, 1, 1], num_draft_tokens=12)
    assert RowStats.from_spec_metrics(summary, 20).accepted == 5
    assert RowStats.from_spec_metrics(None, 20) is None


def test_store_pools_open_each_store_once_and_keep_an_lru(tmp_path):
    from laser.vllm.sources import StorePools
    from pools.store import TokenizerFingerprint, write_store

    write_store(
        tmp_path / "s", {"a": [[1, 2, 3, 4]], "b": [[5, 6, 7]], "c": [[8, 9]]}, TokenizerFingerprint("t", "0" * 64)
    )
    calls = []

    def tokenizer():
        calls.append(1)
        return TokenizerFingerprint("t", "0" * 64)

    sp = StorePools(tokenizer, capacity=2, roots=[tmp_path])
    assert sp.get(tmp_path / "s", "a") is sp.get(str(tmp_path / "s"), "a")
    assert sp.get(tmp_path / "s", "missing") is None
    sp.get(tmp_path / "s", "b")
    sp.get(tmp_path / "s", "c")  # evicts "a"
    assert [k for _, k in sp.pools] == ["b", "c"] and sp.loads == 3 and len(sp.stores) == 1 and calls == [1]
    drafter = sp.get(tmp_path / "s", "b").open([4, 5], 8, 4, 0.0)
    assert drafter.propose([4, 5], 4).first_path() == [6, 7]


def test_a_store_that_cannot_be_opened_gives_no_drafts_and_is_tried_once(tmp_path, caplog):
    """A request naming a missing store, or one built with another tokenizer, must not raise inside vLLM's
    engine core (that kills the engine for every request): no pool, one warning naming the store."""
    from laser.vllm.sources import StorePools
    from pools.store import TokenizerFingerprint, write_store

    write_store(tmp_path / "other", {"a": [[1, 2, 3]]}, TokenizerFingerprint("t", "1" * 64))
    sp = StorePools(lambda: TokenizerFingerprint("t", "0" * 64), roots=[tmp_path])
    for _ in range(2):
        assert sp.get(tmp_path / "missing", "a") is None
        assert sp.get(tmp_path / "other", "a") is None
    assert set(sp.broken) == {str(tmp_path / "missing"), str(tmp_path / "other")}
    assert "vocab" in sp.broken[str(tmp_path / "other")] or "tokenizer" in sp.broken[str(tmp_path / "other")]
    assert caplog.text.count("cannot be used") == 2


needs_vllm = pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed")


@needs_vllm
def test_an_unattached_proposer_refuses_to_run(monkeypatch):
    from laser.vllm import plugin
    from laser.vllm.proposer import LaserProposer

    cfg = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4))
    prop = LaserProposer(cfg)
    monkeypatch.setattr(plugin, "_installed", False)
    with pytest.raises(RuntimeError, match="vllm.general_plugins"):
        prop.load_model(None)
    with pytest.raises(RuntimeError, match="not loaded"):
        prop.propose([[1]], [3], torch.zeros(1, 8, dtype=torch.int32))
    monkeypatch.setattr(plugin, "PROBLEM", "laser's vLLM plug-in was written for vLLM 0.32.x, this is 9")
    with pytest.raises(RuntimeError, match="this is 9"):
        LaserProposer(cfg)


@needs_vllm
def test_the_decode_clock_times_only_steps_with_no_prefill():
    from laser.vllm.proposer import LaserProposer

    prop = LaserProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4)))
    batch = SimpleNamespace(req_ids=["a"])
    prop.runner = SimpleNamespace(input_batch=batch, requests={})  # no request asks for drafts or rules
    ids = torch.arange(1, 41, dtype=torch.int32).reshape(2, 20)

    def step(sampled, lengths):
        prop.propose(sampled, lengths, ids)
        return prop.decode_clock.seconds, prop.decode_clock.tokens

    assert step([[5]], [4]) == (0.0, 0)  # a's prefill gave its first token
    assert step([[6]], [5])[1] == 1  # a decodes alone
    batch.req_ids = ["a", "b"]
    assert step([[7], []], [6, 0])[1] == 1  # b prefills a chunk: the step is not timed
    assert step([[8, 9], [3]], [8, 3])[1] == 1  # b's first token: still a prefill step
    t0 = time.perf_counter()
    seconds, tokens = step([[1], [2, 3]], [9, 5])  # both decode: 3 more tokens
    assert tokens == 4 and 0 < seconds
    before = seconds
    time.sleep(0.05)
    seconds, tokens = step([[4], [5]], [10, 6])
    assert tokens == 6 and 0.05 <= seconds - before <= time.perf_counter() - t0


@needs_vllm
def test_each_request_drafts_its_own_length_on_the_cost_table_from_the_environment(monkeypatch):
    """The budget's table comes from COST_ENV (how it reaches vLLM's other processes); on a table where
    draft tokens are dear an ``auto`` row drafts nothing, while a row that asked for 3 drafts 3; a bad
    ``draft_len`` is refused with the request's id."""
    import json
    from dataclasses import asdict

    from laser.cost import ForwardCost
    from laser.vllm.proposer import COST_ENV, LaserProposer
    from laser.vllm.request_args import VERSION, LaserArgs

    rows, nodes = [1, 2, 4], [1, 2, 3, 5, 9]
    dear = ForwardCost("dear", rows, nodes, [[0.01 * (1 + r * (n - 1)) for n in nodes] for r in rows])
    monkeypatch.setenv(COST_ENV, json.dumps(asdict(dear)))
    prop = LaserProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4)))
    assert prop.budget.step_cost.table.key == "dear"
    prompt = (list(range(1, 9)) * 4)[:-1]  # ends ... 6, 7; the next token 8 repeats the pattern

    def state(draft_len):
        args = (
            LaserArgs(draft_len=draft_len).to_extra_args()
            if draft_len != "many"
            else {"laser": {"v": VERSION, "draft_len": draft_len}}
        )  # as a foreign writer would send it
        return SimpleNamespace(
            sampling_params=SimpleNamespace(extra_args=args, temperature=0.0), prompt_token_ids=prompt
        )

    prop.runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=["fixed", "auto"]), requests={"fixed": state(3), "auto": state("auto")}
    )
    ids = torch.tensor([prompt + [8] + [0] * 8] * 2, dtype=torch.int32)
    out = prop.propose([[8], [8]], [32, 32], ids)
    assert out == [[1, 2, 3], []]
    prop.runner = SimpleNamespace(input_batch=SimpleNamespace(req_ids=["bad"]), requests={"bad": state("many")})
    with pytest.raises(ValueError, match="request bad: draft_len"):
        prop.propose([[8]], [32], ids[:1])


@needs_vllm
def test_the_proposer_owns_its_chain_budget():
    """The budget is the proposer's: a reset forgets what it learned, a trial budget lasts one block, and
    calibration drafts junk on a throwaway budget, leaving the running one and no statistics behind."""
    from laser.cost import ForwardCost
    from laser.vllm.proposer import LaserProposer

    prop = LaserProposer(SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=4)))
    running = prop.budget
    running.observe("a", 3, 2)
    prop.reset_budget()
    assert prop.budget is not running and prop.budget.max_len == 4 and not prop.budget._slot
    running = prop.budget
    table = ForwardCost("t", [1, 2], [1, 5], [[0.01, 0.02], [0.01, 0.02]])
    with prop.trial_budget(table) as trial:
        assert prop.budget is trial and trial.step_cost.table is table
    assert prop.budget is running
    prompt = list(range(1, 9)) * 2
    params = SimpleNamespace(extra_args=None, temperature=0.0)
    prop.runner = SimpleNamespace(
        input_batch=SimpleNamespace(req_ids=["c"]),
        requests={"c": SimpleNamespace(sampling_params=params, prompt_token_ids=prompt)},
    )
    ids = torch.tensor([prompt + [1] + [0] * 8], dtype=torch.int32)
    with prop.calibrating([2, 3]) as log:
        assert prop.budget is not running and prop.budget.fixed == 4
        out = prop.propose([[1]], [17], ids)
        assert prop.rows["c"].force_cycle == (2, 3) and len(out[0]) in (2, 3) and log is prop.step_log
    prop.runner.requests = {}
    prop.finish_all()
    assert prop.budget is running and prop.step_log is None and not prop.rows and prop.stats == {}
