"""Knowledge quality: the repetition score, the degenerate rule, quality columns in the store and the
configured policy for degenerate rows (keep, greedy retry, failure)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from laser.decoders.builtin import Autoregressive
from pipelines.store import knowledge as kn
from pipelines.knowledge.generation import GenerationReport, GenerationWorker
from pipelines.knowledge.records import DecodeTask
from pipelines.workers import GenerationRequest, ModelSpec
from pipelines.quality import (
    MAX_REPEAT_4GRAM,
    repeated_ngram_share,
    summarise_quality,
    surely_degenerate,
    text_quality,
    words,
)
from tests.helpers import save_tiny_model
from tests.helpers import knowledge_row as row

LOOP = "This user enjoys a dark underbelly with a dark underbelly with a dark underbelly with a dark underbelly"
PROSE = (
    "This user enjoys slow, character-driven dramas from the seventies and eighties, with a soft spot for "
    "quiet westerns; loud action films and broad comedies leave them cold."
)


def test_repeat_share_counts_repeated_word_4grams():
    assert words("It's A dark, dark night.") == ["it's", "a", "dark", "dark", "night"]
    assert repeated_ngram_share("a b c d a b c d") == pytest.approx(1 - 4 / 5)  # abcd, bcda, cdab, dabc, abcd
    assert repeated_ngram_share("one two three") == 0.0
    assert repeated_ngram_share(PROSE) == 0.0
    assert repeated_ngram_share(LOOP) > 0.5


def test_degenerate_rule():
    assert text_quality(LOOP, "length").degenerate and not text_quality(LOOP, "length").finished_eos
    assert not text_quality(PROSE, "eos").degenerate and text_quality(PROSE, "eos").finished_eos
    assert text_quality("Drama.", "eos").degenerate  # fewer than three words
    assert "limit 20%" in text_quality(LOOP, "length").reason() and MAX_REPEAT_4GRAM == 0.2


@pytest.mark.parametrize("seed", range(6))
def test_a_surely_degenerate_text_stays_degenerate_whatever_follows(seed):
    import random

    rng = random.Random(seed)
    vocab = [f"w{i}" for i in range(40)]
    loop = " ".join(rng.choice(vocab) for _ in range(rng.randint(2, 5)))
    text = " ".join(rng.choice(vocab) for _ in range(rng.randint(0, 12))) + (" " + loop) * 12 + " w"
    prefixes = [text[:i] for i in range(1, len(text) + 1)]
    for more in (0, 3, 10, 30):
        sure = [p for p in prefixes if surely_degenerate(p, more)]
        assert sure, (text, more)  # it says so somewhere before the end ...
        for prefix in rng.sample(sure, min(12, len(sure))):
            assert text_quality(prefix, "length").degenerate
            for _ in range(20):  # ... and every continuation within the budget is degenerate
                tail = " ".join(f"n{rng.randrange(10**6)}" for _ in range(more))
                glue = rng.choice(["", " ", "'", "x "])  # may extend the prefix's last word
                assert text_quality(prefix + glue + tail, "length").degenerate, (prefix, tail)


def test_surely_degenerate_needs_the_budget_to_be_unable_to_dilute_the_loop():
    looped = "it is a film it is a film it is a film it is a film"  # 13 4-grams, 8 repeats
    assert text_quality(looped, "length").degenerate
    assert surely_degenerate(looped, 0) and surely_degenerate(looped, 20)
    assert not surely_degenerate(looped, 40)  # 40 new words could bring the share under a fifth
    diluted = looped + " " + " ".join(f"n{i}" for i in range(40))
    assert not text_quality(diluted, "length").degenerate
    assert not surely_degenerate(PROSE, 0)


def test_loop_stop_checks_every_few_tokens_and_says_loop():
    from pipelines.knowledge.retry import LoopStop

    asked: list[int] = []

    def text(ids: list[int]) -> str:
        asked.append(len(ids))
        return PROSE if len(ids) < 16 else LOOP

    stop = LoopStop(text, max_new_tokens=40, per_token=1)
    assert [stop(list(range(n))) for n in (3, 8, 12, 15, 16)] == [None] * 5  # the loop could be outgrown by 24 more
    assert asked == [8, 16]  # at every 8th token, once each
    stop = LoopStop(text, max_new_tokens=20, per_token=1)
    assert stop(list(range(19))) == ("loop", 16)  # 4 tokens left at 16: kept up to there, whatever the step added


def test_summary_for_benchmarks():
    s = summarise_quality([LOOP, PROSE, PROSE], ["length", "eos", "eos"])
    assert (s.n, s.finished_eos, s.degenerate) == (3, 2, 1)
    assert s.mean_repeat_4gram == pytest.approx(text_quality(LOOP, "length").repeat_4gram / 3)


def test_store_rows_carry_quality_computed_when_absent(tmp_path):
    with kn.KnowledgeWriter(tmp_path, shard_rows=8) as w:
        w.add(row(0) | {"knowledge": LOOP, "finish_reason": "length"})
        w.add(row(1) | {"knowledge": PROSE})
    frame = kn.read_knowledge(tmp_path)
    assert frame["finished_eos"].to_list() == [False, True]
    assert frame["degenerate"].to_list() == [True, False]
    assert frame["greedy_retry"].to_list() == [False, False]
    assert frame["repeat_4gram"][0] > 0.5 and frame["repeat_4gram"][1] == 0.0


def test_shards_written_before_the_quality_columns_still_read(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    old_schema = pa.schema([f for f in kn.KNOWLEDGE_SCHEMA if f.name not in kn.OPTIONAL_COLUMNS])
    pq.write_table(pa.Table.from_pylist([row(0)], schema=old_schema), tmp_path / "part-00000.parquet")
    frame = kn.read_knowledge(tmp_path)
    assert frame.height == 1 and frame["degenerate"][0] is None


class Looper(Autoregressive):
    """A stand-in decoder whose every generation reads as a looping text (the policy, not the decoder, is
    under test); it decodes through the engine like any decoder, so the actors' streaming path runs."""

    name = "looper"
    summary = "test: loops"

    def __init__(self, lm, **params):
        super().__init__(lm)

    def result(self, request):
        from laser.decoders.base import Generation

        ids = self.lm.tokenizer(LOOP, add_special_tokens=False)["input_ids"]
        request.stats.finish_reason = "length"
        return Generation(ids, LOOP, request.stats)


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    return GenerationWorker(ModelSpec(str(save_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))))


@pytest.fixture
def looper(monkeypatch):
    from laser.decoders import registry

    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY) | {"looper": Looper})


REQS = [
    GenerationRequest("user", "u1", history=[("Heat", 4.0)]),
    GenerationRequest("item", "i1", item={"item_id": "i1", "title": "Alien", "genres": ["Sci-Fi"]}),
]


def test_policy_keep_flags_the_row(worker, looper):
    result = worker.generate(DecodeTask("looper", max_new_tokens=8, degenerate="keep"), REQS)
    assert [(r.degenerate, r.greedy_retry, r.decoder) for r in result.rows] == [(True, False, "looper")] * 2
    report = GenerationReport()
    from pipelines.knowledge.generation import record_result

    class Sink:
        def add(self, r):
            pass

        def add_failure(self, *a):
            pass

    record_result(result, Sink(), report)
    assert (report.quality.n, report.quality.degenerate, report.quality.finished_eos) == (2, 2, 0)
    steps = max(r.target_forwards for r in result.rows)
    assert result.decode_s == report.decode_s > 0  # the engine's decoding seconds: the two rows' shared steps once
    assert result.decode_s < sum(r.decode_s for r in result.rows) or steps == 0


def test_policy_retry_greedy_regenerates_with_autoregressive(worker, looper):
    task = DecodeTask("looper", max_new_tokens=8, degenerate="retry_greedy")
    result = worker.generate(task, REQS)
    plain = worker.generate(DecodeTask("autoregressive", max_new_tokens=8), REQS).rows
    assert [r.decoder for r in result.rows] == ["autoregressive"] * 2
    assert all(r.greedy_retry for r in result.rows)
    assert [r.knowledge for r in result.rows] == [r.knowledge for r in plain]
    assert result.decode_s > sum(r.decode_s for r in result.rows) > 0  # the looping decode, and retries too


def test_policy_fail_sends_the_row_to_failures(worker, looper):
    result = worker.generate(DecodeTask("looper", max_new_tokens=8, degenerate="fail"), REQS)
    assert not result.rows
    assert [f.entity_id for f in result.failures] == ["u1", "i1"]
    assert result.failures[0].reason.startswith("DegenerateTextError: degenerate text")


def _asked_words(prompt: str) -> int:
    import re

    return int(re.search(r"at most (\d+) words", prompt).group(1))


@pytest.mark.parametrize("name", ["demo", "movielens", "amazon"])
def test_shipped_configs_ask_for_what_their_token_budget_holds(name, worker):
    from jobs.config import bundled_config, load_config
    from pipelines.knowledge.prompts import TOKENS_PER_WORD

    cfg = load_config(bundled_config(name))
    for budget in {cfg.generation.max_new_tokens, cfg.old_knowledge.max_new_tokens or cfg.generation.max_new_tokens}:
        task = DecodeTask("autoregressive", max_new_tokens=budget, domain=cfg.dataset.resolved_domain())
        for req in REQS:
            words_asked = _asked_words(worker.prompt(task, req))
            assert words_asked * TOKENS_PER_WORD <= budget, (name, budget, req.entity_type)
            assert words_asked >= 10


def test_policy_retry_keeps_a_still_flawed_retry_marked(worker, looper):
    result = worker.generate(
        DecodeTask("looper", max_new_tokens=8, degenerate="retry", retry_rules={"no_repeat_ngram_size": 3}), REQS
    )
    assert not result.failures
    assert [(r.decoder, r.greedy_retry, r.degenerate) for r in result.rows] == [("looper", True, True)] * 2


def test_policy_retry_regenerates_a_cut_row_greedily_with_the_retry_rules(worker):
    from laser.rules import GenerationRules

    rules = {"repetition_penalty": 1.2, "no_repeat_ngram_size": 2}
    task = DecodeTask("autoregressive", max_new_tokens=8, degenerate="retry", retry_rules=rules)
    first = worker.generate(DecodeTask("autoregressive", max_new_tokens=8, degenerate="keep"), REQS).rows
    assert all(r.cut or r.fragment for r in first)  # random tiny model: nothing ends at a sentence
    rows = worker.generate(task, REQS).rows
    decoder = worker.adapter.decoders.get(task.decoder, task.decoder_params)[0]
    expected = [decoder.generate(worker.prompt(task, req), 8, rules=GenerationRules(**rules)).text for req in REQS]
    assert [r.knowledge for r in rows] == expected != [r.knowledge for r in first]
    assert all(r.greedy_retry for r in rows)


def test_job_default_policy_is_retry_with_stronger_rules():
    from pipelines.config import GenerationConfig

    g = GenerationConfig()
    assert g.degenerate == "retry"
    assert g.retry_rules() == {
        "repetition_penalty": 1.1,
        "no_repeat_ngram_size": 3,
        "min_new_tokens": 0,
        "stop_strings": (),
    }
    strong = GenerationConfig(repetition_penalty=1.5, no_repeat_ngram_size=2, stop_strings=["\n\n"])
    assert strong.retry_rules()["repetition_penalty"] == 1.5 and strong.retry_rules()["no_repeat_ngram_size"] == 2
    assert strong.rules()["stop_strings"] == ("\n\n",)


def test_task_rules_reach_the_decoder(worker):
    from laser.rules import GenerationRules

    rules = {"no_repeat_ngram_size": 1, "min_new_tokens": 6}
    task = DecodeTask("autoregressive", max_new_tokens=12, degenerate="keep", rules=rules)
    rows = worker.generate(task, REQS).rows
    decoder = worker.adapter.decoders.get(task.decoder, task.decoder_params)[0]
    assert [r.knowledge for r in rows] == [
        decoder.generate(worker.prompt(task, req), 12, rules=GenerationRules(**rules)).text for req in REQS
    ]


LIE = "A gripping horror movie for fans of slow suspense."  # the item below is Sci-Fi: the genre is invented


class Liar(Autoregressive):
    """A stand-in decoder that names a genre its item does not have; under banned words (the retry) it writes
    ``RETRY`` instead. It records the rules of every request it is given."""

    name = "liar"
    summary = "test: invents a genre"
    RETRY = "A science fiction movie for fans of space."
    seen: list = []

    def __init__(self, lm, **params):
        super().__init__(lm)

    def request(self, ids, max_new_tokens, pool=None, sampling=None, rules=None, **kw):
        Liar.seen.append(rules)
        return super().request(ids, max_new_tokens, pool, rules=rules)

    def result(self, request):
        from laser.decoders.base import Generation

        text = self.RETRY if request.rules.bad_words_ids else LIE
        request.stats.finish_reason = "eos"
        return Generation(self.lm.tokenizer(text, add_special_tokens=False)["input_ids"], text, request.stats)


@pytest.fixture
def liar(monkeypatch):
    from laser.decoders import registry

    Liar.seen = []
    monkeypatch.setattr(registry, "_REGISTRY", dict(registry._REGISTRY) | {"liar": Liar})
    return Liar


def test_an_items_first_text_can_name_no_year_but_its_own(worker):
    """Under the ban, every year item grounding counts is banned for an item but its own (and none for a
    user): a text the mask lets through cannot name a wrong year."""
    from laser.bans import BanIndex
    from pipelines.knowledge.retry import first_rules
    from pipelines.quality import item_grounding

    task = DecodeTask("autoregressive", max_new_tokens=16, degenerate="retry", ban_unsupported_genres=True)
    item = {"item_id": "i1", "title": "Heat (1995)", "genres": ["Crime"], "year": 1995}
    rules = first_rules(task, GenerationRequest("item", "i1", item=item), worker.genre_ban)
    index, tok = BanIndex(rules["bad_words_ids"]), worker.tokenizer

    def allowed(text: str) -> bool:  # no token of the text is banned after the ones before it
        ids = tok(text, add_special_tokens=False)["input_ids"]
        return all(ids[i] not in index.banned(ids[:i]) for i in range(len(ids)))

    assert allowed("A crime film from 1995.") and item_grounding("A crime film from 1995.", item).share == 1.0
    for wrong in ("A crime film from 1994.", "Released in 2003.", "A 1960 crime classic"):
        assert not allowed(wrong), wrong
    user = GenerationRequest("user", "u1", history=[("Heat", 4.0, ("Crime",))])
    assert not any(
        w == tuple(tok("1994", add_special_tokens=False)["input_ids"])
        for w in first_rules(task, user, worker.genre_ban)["bad_words_ids"]
    )


def test_grounding_names_the_unsupported_genres():
    from pipelines.quality import item_grounding, user_grounding

    g = user_grounding("This user loves horror films and crime comedies.", [("Heat", 4.0, ("Action", "Crime"))])
    assert sorted(g.unsupported_genres) == ["comedy", "horror"] and (g.n_mentioned, g.n_matched) == (3, 1)
    assert item_grounding(LIE, {"genres": ["Sci-Fi"]}).unsupported_genres == ["horror"]
    assert item_grounding("A science fiction film.", {"genres": ["Sci-Fi"]}).unsupported_genres == []


def test_unsupported_genres_are_the_mentions_grounding_counts_against_the_entity():
    from pipelines.quality import genre_forms, item_grounding, unsupported_genres, user_grounding

    history = [("Heat", 4.0, ("Action", "Crime")), ("Alien", 5.0, ("Sci-Fi",))]
    banned = unsupported_genres("user", history)
    assert {"Action", "Crime", "Sci-Fi", "Science Fiction"}.isdisjoint(banned)
    assert {"Horror", "Comedy", "War"} <= set(banned)
    item = {"title": "Heat", "genres": ["Action", "Crime"]}
    assert set(unsupported_genres("item", item=item)) == set(banned) | {"Sci-Fi", "Science Fiction"}
    for genre in banned:  # each names a genre the entity lacks; each of the entity's own is grounded
        for form in genre_forms(genre):
            assert user_grounding(f"A fan of {form} stories.", history).share == 0.0
            assert item_grounding(f"A {form} story.", item).share == 0.0
    assert user_grounding("A fan of science fiction and crime stories.", history).share == 1.0
    assert unsupported_genres("item", item={"title": "No genres"}) == unsupported_genres("user", []) == []


def test_ban_genres_bans_them_in_the_first_text_so_it_needs_no_retry(worker, liar):
    item = [GenerationRequest("item", "i1", item={"item_id": "i1", "title": "Alien", "genres": ["Sci-Fi"]})]
    task = DecodeTask("liar", max_new_tokens=16, degenerate="retry", ban_unsupported_genres=True)
    rows = worker.generate(task, item).rows
    assert [(r.knowledge, r.greedy_retry, r.grounding) for r in rows] == [(Liar.RETRY, False, 1.0)]
    (first,) = Liar.seen  # one attempt: the first text could not name the genre
    ids = worker.tokenizer
    assert tuple(ids(" horror", add_special_tokens=False)["input_ids"]) in first.bad_words_ids
    assert tuple(ids(" science fiction", add_special_tokens=False)["input_ids"]) not in first.bad_words_ids


def test_banned_words_cover_the_forms_of_a_genre(worker):
    from pipelines.knowledge.retry import banned_words

    tok = worker.tokenizer
    banned = banned_words(tok, ["comedy"])
    for surface in (" comedy", " Comedy", " comedies", "comedy"):
        assert tuple(tok(surface, add_special_tokens=False)["input_ids"]) in banned
    assert banned_words(None, ["comedy"]) == ()


def test_policy_retry_bans_an_invented_genre_and_keeps_the_grounded_retry(worker, liar):
    item = [GenerationRequest("item", "i1", item={"item_id": "i1", "title": "Alien", "genres": ["Sci-Fi"]})]
    result = worker.generate(DecodeTask("liar", max_new_tokens=16, degenerate="retry"), item)
    rows = result.rows
    assert [(r.knowledge, r.greedy_retry, r.grounding) for r in rows] == [(Liar.RETRY, True, 1.0)]
    assert [(r.knowledge, r.greedy_retry) for r in result.discarded] == [(LIE, False)]  # decoded, not written
    first, second = Liar.seen
    assert not first.bad_words_ids
    assert tuple(worker.tokenizer(" horror", add_special_tokens=False)["input_ids"]) in second.bad_words_ids
    from pipelines.knowledge.generation import record_result

    report = GenerationReport()
    record_result(result, SimpleNamespace(add=lambda row: None, add_failure=lambda *a: None), report)
    assert report.retry_kept == {"ungrounded": 1}  # the retry was written: it paid
    assert report.retry_cost == {"ungrounded": rows[0].n_tokens} and report.retry_tokens == rows[0].n_tokens
    kept = worker.generate(DecodeTask("liar", max_new_tokens=16, degenerate="keep"), item).rows
    assert [(r.knowledge, r.greedy_retry) for r in kept] == [(LIE, False)]


def test_policy_retry_keeps_the_first_text_when_the_retry_reads_worse(worker, liar, monkeypatch):
    monkeypatch.setattr(Liar, "RETRY", "A sci-fi movie for fans of")  # grounded but cut: worse than the first
    item = [GenerationRequest("item", "i1", item={"item_id": "i1", "title": "Alien", "genres": ["Sci-Fi"]})]
    result = worker.generate(DecodeTask("liar", max_new_tokens=16, degenerate="retry"), item)
    rows = result.rows
    assert [(r.knowledge, r.greedy_retry) for r in rows] == [(LIE, False)] and len(Liar.seen) == 2
    assert [(r.knowledge, r.greedy_retry) for r in result.discarded] == [(Liar.RETRY, True)]
    from pipelines.knowledge.generation import record_result

    report, written = GenerationReport(), []
    record_result(result, SimpleNamespace(add=written.append, add_failure=lambda *a: None), report)
    both = rows + result.discarded  # the pass counts the work of both texts and writes one
    assert (len(written), report.retries, report.greedy_retries) == (1, 1, 0)
    assert report.retry_reasons == {"ungrounded": 1}  # the first text named a genre the item lacks
    assert report.retry_kept == {} and report.retry_cost == {"ungrounded": result.discarded[0].n_tokens}
    assert report.n_tokens == rows[0].n_tokens and report.decoded_tokens == sum(r.n_tokens for r in both)
    assert report.decoded_forwards == sum(r.target_forwards for r in both)


def test_worse_orders_flawed_then_grounding():
    from pipelines.knowledge.retry import worse
    from pipelines.store.knowledge import KnowledgeRow

    def row(**flags) -> KnowledgeRow:
        return KnowledgeRow(
            entity_type="item",
            entity_id="i1",
            knowledge="",
            model="m",
            decoder="d",
            decoder_params="{}",
            prompt_version="",
            n_tokens=0,
            target_forwards=0,
            accepted_tokens=0,
            retrieval_s=0.0,
            generation_s=0.0,
            finish_reason="eos",
            run_id="r",
            **{"degenerate": False, "cut": False, "fragment": False, **flags},
        )

    assert worse(row(cut=True, grounding=1.0), row(grounding=0.5))
    assert worse(row(grounding=0.5), row(grounding=1.0))
    assert not worse(row(grounding=None), row(grounding=0.5))
    assert not worse(row(grounding=0.5), row(grounding=0.5))  # a tie keeps the retry
    cut, loop = {"cut": True}, {"cut": True, "degenerate": True}
    assert worse(row(**loop, grounding=1.0), row(**cut, grounding=0.0))
    assert not worse(row(**cut, grounding=0.0), row(**loop, grounding=1.0))


# ---- the fast text checks equal their plain definitions (the store scores every row it writes) -------------


def _plain_quality(text: str, finish_reason: str) -> tuple:
    """The quality rules written out the slow, obvious way: per-character counts, a regex sentence end,
    tuples of 4 words, Fraction comparison."""
    import re
    from fractions import Fraction

    ws = re.findall(r"\w+(?:'\w+)*", text.lower())
    grams = [tuple(ws[i : i + 4]) for i in range(len(ws) - 3)]
    rep, total = len(grams) - len(set(grams)), len(grams)
    body = text.strip()
    at_end = bool(re.search(r"[.!?][\"'”’)\]]*$", body))
    chars = [c for c in body if not c.isspace()]
    few_letters = bool(chars) and sum(c.isalpha() for c in chars) / len(chars) < 0.6
    unbalanced = body.count("(") != body.count(")") or body.count("[") != body.count("]") or body.count('"') % 2
    return (
        finish_reason == "eos",
        rep / total if total else 0.0,
        len(ws) < 3 or (total > 0 and Fraction(rep, total) >= Fraction(1, 5)),
        finish_reason in ("eos", "stop") or at_end,
        finish_reason == "length" and not at_end,
        not at_end or bool(unbalanced) or few_letters,
        len(ws),
    )


TRICKY = [
    "",
    "   ",
    ".",
    "a.",
    "Hi!)",
    "Hi!)\n",
    "Hi!) x",
    "Done.”",
    "Done’.",
    "“Quoted.”  ",
    "(a [b] c).",
    "x\x1cy\x1d.",
    "\x1f\x1e a.",
    "na\u00efve caf\u00e9 r\u00e9sum\u00e9.",
    "cafe\u0301 cafe\u0301 ok.",
    "x\u00a0y\u2003z\u3000w.",
    "2\u00b2 \u00bd \u2162 \u0663 12 34.",
    "\U0001f600\U0001f600 ok?",
    "ab12 cd34 ef56 gh78.",
    "it's it's it's it's it's it's.",
    "1995, 1996, 1997, 1998, 2000 ... 12 34.",
    LOOP,
    PROSE,
    PROSE[:-1],
    'He said "stop.',
    "Tab\tand\nnewline\r\n.",
    "\u0130stanbul \u03a3\u0391\u03a3.",
]


@pytest.mark.parametrize("reason", ["eos", "length", "stop"])
def test_fast_text_checks_equal_their_plain_definitions(reason):
    import random

    rng = random.Random(7)
    alphabet = "ab c.!?\"'”’)]([ 1_\x1c\u00a0\u00e9\u0301\u00b2\u2162\n\t-"
    fuzz = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 40))) for _ in range(3000)]
    for text in TRICKY + fuzz:
        q = text_quality(text, reason)
        got = (q.finished_eos, q.repeat_4gram, q.degenerate, q.ended, q.cut, q.fragment, q.n_words)
        assert got == _plain_quality(text, reason), repr(text)


def test_the_largest_first_text_ban_fits_vllms_bad_word_limit(worker, monkeypatch):
    """vLLM refuses a request with more bad words after its tokenization than the engine's limit (512, which
    the job's engines set): the ban of an item with a year and one genre (every other genre and year banned)
    stays under it."""
    pytest.importorskip("vllm")
    from vllm import SamplingParams

    from laser.vllm.env import BAD_WORDS_LIMITS
    from laser.vllm.forms import rule_params

    for key, value in BAD_WORDS_LIMITS.items():
        monkeypatch.setenv(key, value)
    from pipelines.knowledge.retry import first_rules

    task = DecodeTask("autoregressive", max_new_tokens=16, degenerate="retry", ban_unsupported_genres=True)
    item = {"item_id": "i1", "title": "Heat (1995)", "genres": ["Crime"], "year": 1995}
    rules = first_rules(task, GenerationRequest("item", "i1", item=item), worker.genre_ban)
    params = SamplingParams(max_tokens=4, **rule_params(rules, worker.tokenizer))
    tok = worker.tokenizer  # as vLLM's tokenizer wrapper shows it
    params.update_from_tokenizer(SimpleNamespace(encode=tok.encode, max_token_id=len(tok) - 1))  # raises past the limit
    assert 100 < len(params.bad_words_token_ids or []) <= int(BAD_WORDS_LIMITS["VLLM_MAX_NUM_BAD_WORDS"]), len(
        params.bad_words_token_ids or []
    )
