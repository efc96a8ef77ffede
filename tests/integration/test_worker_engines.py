"""The knowledge worker on both engines: what users get by default (vLLM) is tested like the reference
(hf). Each test runs once per engine on the same tiny model (one worker per engine for the module); the
vLLM runs skip without vLLM."""

from __future__ import annotations

import pytest

from pipelines.knowledge.generation import GenerationWorker
from pipelines.knowledge.records import DecodeTask
from pipelines.workers import GenerationRequest, ModelSpec
from tests.helpers import save_tiny_model


@pytest.fixture(scope="module")
def model_path(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("engines") / "tiny", hidden_size=128))


@pytest.fixture(scope="module", params=["hf", "vllm"])
def worker(request, model_path):
    if request.param == "vllm":
        pytest.importorskip("vllm")
    w = GenerationWorker(ModelSpec(model_path, dtype="float32", engine=request.param))
    yield w
    if getattr(w.adapter, "engine", None) is not None:
        w.adapter.engine.close()


def _users(n: int, pool_key: str | None = None, start: int = 0, same: bool = False) -> list[GenerationRequest]:
    """``n`` users of the global pool ``pool_key`` (None: no pool); ``same``: all with one history (one prompt)."""
    return [
        GenerationRequest(
            "user",
            f"u{i}",
            pool_key=pool_key,
            pool_kind="global" if pool_key else None,
            group_id="all" if pool_key else None,
            history=[("Heat", 4.0), ("Alien 1", 5.0)]
            if same
            else [(f"Film {i}", 4.0), ("Heat", 3.0), (f"Alien {i % 3}", 5.0)],
        )
        for i in range(start, start + n)
    ]


def _texts(result) -> dict[str, str]:
    assert not result.failures, result.failures
    return {r.entity_id: r.knowledge for r in result.rows}


def test_rows_name_the_engine_that_decoded_them(worker):
    rows = worker.generate(DecodeTask("autoregressive", max_new_tokens=6, max_prompt_tokens=2000), _users(2)).rows
    assert {r.engine for r in rows} == {worker.adapter.name}
    assert all(r.prefill_s > 0 and r.decode_s >= 0 and r.target_forwards >= 1 for r in rows)
    assert all(r.prompt_tokens > 20 and 0 <= r.cached_prompt_tokens < r.prompt_tokens for r in rows)
    if worker.adapter.name == "hf":  # no prefix cache: every prompt token prefilled
        assert all(r.cached_prompt_tokens == 0 for r in rows)


def test_sampled_rows_follow_their_entity_seed_whatever_the_batch(worker):
    sampling = {"temperature": 1.0, "top_p": 1.0, "top_k": 0, "seed": 7}
    task = DecodeTask("autoregressive", max_new_tokens=12, max_prompt_tokens=2000, sampling=sampling)
    together = _texts(worker.generate(task, _users(4), slots=4))
    apart = _texts(worker.generate(task, list(reversed(_users(4))), slots=1))
    assert together == apart  # each entity draws from its own seeded generator
    greedy = _texts(worker.generate(DecodeTask("autoregressive", max_new_tokens=12, max_prompt_tokens=2000), _users(4)))
    assert together != greedy
    other = _texts(
        worker.generate(
            DecodeTask("autoregressive", max_new_tokens=12, max_prompt_tokens=2000, sampling={**sampling, "seed": 8}),
            _users(4),
        )
    )
    assert other != together  # the job's seed reaches every entity's


def test_stop_strings_and_bad_words_hold(worker):
    plain = DecodeTask("autoregressive", max_new_tokens=16, max_prompt_tokens=2000)
    free = worker.generate(plain, _users(3)).rows
    text = free[0].knowledge
    stop = next(c for c in text[3:] if c.isascii() and c.isprintable())  # reached: decoding must end right after it
    stopped = worker.generate(
        DecodeTask("autoregressive", max_new_tokens=16, max_prompt_tokens=2000, rules={"stop_strings": (stop,)}),
        _users(1),
    ).rows[0]
    assert stopped.finish_reason == "stop" and stop in stopped.knowledge
    assert len(stopped.knowledge) < len(text)
    tok = worker.tokenizer  # byte level: a printable ASCII character is one token
    chars = sorted({c for r in free for c in r.knowledge if c.isascii() and c.isprintable() and c != " "})
    assert chars, [r.knowledge for r in free]
    banned = tuple(tuple(tok(c, add_special_tokens=False)["input_ids"]) for c in chars)
    ruled = worker.generate(
        DecodeTask("autoregressive", max_new_tokens=16, max_prompt_tokens=2000, rules={"bad_words_ids": banned}),
        _users(3),
    ).rows
    assert [r.knowledge for r in ruled] != [r.knowledge for r in free]
    for row in ruled:
        assert not set(row.knowledge) & set(chars), row.knowledge


@pytest.fixture(scope="module")
def own_pool(worker, model_path, tmp_path_factory):
    """A pool store whose global user pool holds the greedy texts of the users under test (drafts that
    are right) and of other users (drafts that are wrong)."""
    from pools.store import TokenizerFingerprint, write_store

    plain = DecodeTask("autoregressive", max_new_tokens=24, max_prompt_tokens=2000)
    rows = worker.generate(plain, _users(8)).rows
    tok = worker.tokenizer
    store = tmp_path_factory.mktemp(f"pools-{worker.adapter.name}") / "pools"
    write_store(
        store,
        {"user/global/all": [tok(r.knowledge, add_special_tokens=False)["input_ids"] for r in rows]},
        TokenizerFingerprint.of(tok),
    )
    return str(store), {r.entity_id: r.knowledge for r in rows}


@pytest.mark.parametrize("K", ["auto", 4])
def test_resd_drafts_from_its_pool_and_stays_lossless(worker, own_pool, K):
    store, greedy = own_pool
    task = DecodeTask("resd", {"K": K}, max_new_tokens=24, max_prompt_tokens=2000, pool_store=store)
    rows = worker.generate(task, _users(4, pool_key="user/global/all"), slots=4).rows
    assert {r.entity_id: r.knowledge for r in rows} == {k: greedy[k] for k in ("u0", "u1", "u2", "u3")}
    assert all(r.pool_kind == "global" for r in rows)
    if K != "auto":  # auto drafts only where the engine's cost model says it pays
        assert sum(r.accepted_tokens for r in rows) > 0 and all(r.retrieval_s > 0 for r in rows)
        assert sum(r.target_forwards for r in rows) < sum(r.n_tokens for r in rows)


def test_a_request_without_a_pool_drafts_nothing(worker, own_pool):
    store, greedy = own_pool
    task = DecodeTask(
        "laser", {"verification": "greedy", "K": 4}, max_new_tokens=24, max_prompt_tokens=2000, pool_store=store
    )
    rows = worker.generate(task, _users(2, pool_key="user/global/none")).rows  # a group the store lacks
    assert [r.pool_kind for r in rows] == [None, None]
    assert all(r.accepted_tokens == 0 and r.target_forwards == r.n_tokens for r in rows)
    assert {r.entity_id: r.knowledge for r in rows} == {"u0": greedy["u0"], "u1": greedy["u1"]}


@pytest.mark.parametrize("online", [True, False])
def test_a_group_without_a_pool_drafts_from_the_texts_the_worker_wrote_before(worker, own_pool, online):
    """Online pools (a first run): three entities with the same prompt, in a group the store lacks, one
    after another; each text written joins the group's pool (two at most here), and every text stays
    greedy's."""
    store, _ = own_pool

    plain = DecodeTask("autoregressive", max_new_tokens=24, max_prompt_tokens=2000)
    greedy = _texts(worker.generate(plain, _users(1, same=True)))["u0"]
    task = DecodeTask(
        "laser",
        {"verification": "greedy", "K": 4},
        max_new_tokens=24,
        max_prompt_tokens=2000,
        pool_store=store,
        online_pools=online,
        pool_max_size=2,
        run_id=f"online-{online}",
    )
    rows = {r.entity_id: r for r in worker.generate(task, _users(3, "user/global/none", same=True), slots=1).rows}
    assert {r.knowledge for r in rows.values()} == {greedy}  # lossless, whatever the pool
    pool = worker.pools.online.get((task.run_id, "user/global/none"))
    if online:  # the texts written joined the group's pool (up to its size), the one the engine drafts from
        assert all(r.pool_kind == "global" for r in rows.values()) and pool is not None and pool.texts == 2
        if worker.adapter.name == "vllm":
            from laser.vllm import sources

            assert sources.get_source(f"online:{task.run_id}:user/global/none") is pool
    else:  # no pool: nothing drafted (the failure online pools mend)
        assert pool is None
        assert all(r.pool_kind is None and r.target_forwards == r.n_tokens for r in rows.values())


@pytest.mark.parametrize("decoder, params", [("autoregressive", {}), ("laser", {"verification": "relaxed", "K": 4})])
def test_flawed_rows_are_retried_on_the_same_engine_beside_the_others(worker, own_pool, monkeypatch, decoder, params):
    """A flawed row's greedy retry joins the pass's engine as an ordinary request, never decoded alone while
    the others wait (a relaxed LASER pass's retry is LASER under greedy verification, an exact row on `hf`),
    and writes the target's greedy text under the retry rules."""
    store, _ = own_pool
    rules = {"repetition_penalty": 1.3}
    first = worker.generate(DecodeTask("autoregressive", max_new_tokens=8, max_prompt_tokens=2000), _users(4)).rows
    assert all(r.cut or r.fragment for r in first)  # random tiny model: nothing ends at a sentence
    submit, step, out = worker.adapter.submit, worker.adapter.step, {"retries": 0, "most": 0}

    def spy_submit(attempt):
        submit(attempt)
        if attempt.first is not None:  # a retry, in flight until a step hands it back
            out["retries"] += 1
            out["most"] = max(out["most"], out["retries"])

    def spy_step():
        finished = step()
        out["retries"] -= sum(f.attempt.first is not None for f in finished)
        return finished

    monkeypatch.setattr(worker.adapter, "submit", spy_submit)
    monkeypatch.setattr(worker.adapter, "step", spy_step)
    if worker.adapter.name == "hf":
        monkeypatch.setattr(worker.adapter, "_alone", lambda *a: pytest.fail("a retry was decoded alone"))
    task = DecodeTask(
        decoder,
        params,
        max_new_tokens=8,
        max_prompt_tokens=2000,
        pool_store=store,
        degenerate="retry",
        retry_rules=rules,
    )
    rows = worker.generate(task, _users(4, pool_key="user/global/all" if decoder == "laser" else None), slots=4).rows
    expected = _texts(
        worker.generate(DecodeTask("autoregressive", max_new_tokens=8, max_prompt_tokens=2000, rules=rules), _users(4))
    )
    assert {r.entity_id: r.knowledge for r in rows} == expected
    assert all(r.greedy_retry for r in rows)
    assert out["most"] == 4  # the retries decode together, as ordinary requests


def test_a_failed_engine_step_fails_only_the_bad_request(worker, monkeypatch):
    """A step that fails takes every request in it down; the worker then decodes them one by one, so only
    the request that breaks the engine fails, and the others keep their text."""
    task = DecodeTask("autoregressive", max_new_tokens=6, max_prompt_tokens=2000)
    expected = _texts(worker.generate(task, _users(3)))
    submit, step, broken = worker.adapter.submit, worker.adapter.step, []

    def failing_step():
        if not broken:  # the engine holds every request, then its step fails
            broken.append(True)
            raise RuntimeError("engine step failed")
        return step()

    def submit_or_break(attempt):
        if broken and attempt.req.entity_id == "u1":  # decoded by itself, u1 breaks the engine
            raise RuntimeError("u1 breaks the engine")
        submit(attempt)

    monkeypatch.setattr(worker.adapter, "step", failing_step)
    monkeypatch.setattr(worker.adapter, "submit", submit_or_break)
    result = worker.generate(task, _users(3), slots=3)
    assert [f.entity_id for f in result.failures] == ["u1"] and "breaks the engine" in result.failures[0].reason
    assert {r.entity_id: r.knowledge for r in result.rows} == {k: v for k, v in expected.items() if k != "u1"}


def test_a_first_text_stops_once_surely_degenerate_and_its_retry_runs_whole(worker, monkeypatch):
    """Under a policy that acts on degenerate rows, the engine stops a first text at its first check once it
    is surely degenerate (here: always, from the 8th token); the retry is never stopped, nor is any text
    under ``keep``."""
    from pipelines.knowledge import retry

    monkeypatch.setattr(retry, "surely_degenerate", lambda text, more_words: True)
    task = DecodeTask("autoregressive", max_new_tokens=16, max_prompt_tokens=2000, degenerate="retry", retry_rules={})
    result = worker.generate(task, _users(2))
    assert not result.failures
    texts = result.rows + result.discarded
    firsts = [r for r in texts if not r.greedy_retry]
    retries = [r for r in texts if r.greedy_retry]
    assert len(firsts) == len(retries) == 2
    assert [(r.finish_reason, r.n_tokens) for r in firsts] == [("loop", retry.LoopStop.every)] * 2
    assert all(r.finish_reason != "loop" and r.n_tokens > retry.LoopStop.every for r in retries)
    kept = worker.generate(
        DecodeTask("autoregressive", max_new_tokens=16, max_prompt_tokens=2000, degenerate="keep"), _users(2)
    ).rows
    assert all(r.finish_reason != "loop" and r.n_tokens > retry.LoopStop.every for r in kept)
