"""Pool building from old knowledge + memberships, and the pool store: caps, keys, baselines, round trips."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.compute  # noqa: F401  (pa.compute)
import pyarrow.parquet as pq
import pytest

from pools.build import PoolBuildConfig, build_pools, collect_sources, group_key
from pools.store import PoolStore, PoolStoreError, TokenizerFingerprint, write_store
from router.router import ROUTING_SCHEMA


class WordTokenizer:
    """Whitespace tokenizer with a fixed vocabulary (Hugging Face call convention)."""

    def __init__(self, words: list[str], name: str = "words") -> None:
        self.vocab = {w: i for i, w in enumerate(words)}
        self.name_or_path = name

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def __call__(self, texts: list[str], add_special_tokens: bool = False) -> dict:
        return {"input_ids": [[self.vocab[w] for w in t.split()] for t in texts]}


WORDS = "the film is a dark war drama funny comedy with great cast".split()


def _members(rows: list[tuple[str, str, str, str]]) -> pa.Table:
    return pa.table({n: [r[i] for r in rows] for i, n in enumerate(ROUTING_SCHEMA.names[:4])}).append_column(
        "reason", pa.array(["membership"] * len(rows))
    )


def _knowledge() -> pa.Table:
    ids = ["u1", "u2", "u3", "u4", "u1", "i1"]
    types = ["user"] * 5 + ["item"]
    texts = ["the film is a dark war drama", "a funny comedy", "great cast", "   ", "the war drama", "a film"]
    return pa.table({"entity_type": types, "entity_id": ids, "knowledge": texts})


MEMBERS = _members(
    [
        ("user", "u1", "collaborative", "0"),
        ("user", "u2", "collaborative", "1"),
        ("user", "u3", "collaborative", "1"),
        ("user", "u4", "collaborative", "1"),
        ("user", "u1", "attribute", "Drama"),
        ("user", "u5", "attribute", "Horror"),
        ("item", "i1", "attribute", "Drama"),
    ]
)


def test_groups_get_their_members_texts_and_baselines():
    tok = WordTokenizer(WORDS)
    sources = collect_sources(_knowledge(), MEMBERS, tok, PoolBuildConfig(with_random=True))
    enc = lambda text: tok([text])["input_ids"][0]  # noqa: E731
    assert sources.texts["user/collaborative/0"] == [enc("the film is a dark war drama"), enc("the war drama")]
    assert sources.texts["user/collaborative/1"] == [enc("a funny comedy"), enc("great cast")]
    assert sources.texts["user/attribute/Drama"] == sources.texts["user/collaborative/0"]
    assert len(sources.texts["user/global/all"]) == 4 and sources.texts["item/global/all"] == [enc("a film")]
    assert sources.sizes()["user/random/collaborative.1"] == 2
    assert sources.empty_groups == ["user/attribute/Horror"]
    assert ("user", "u4", "empty knowledge") in sources.skipped
    assert group_key("user", "attribute", "Drama|1990-1999") == "user/attribute/Drama|1990-1999"


def test_cap_is_respected_seeded_and_samples_without_replacement():
    texts = [[k, k + 1, k + 2] for k in range(50)]
    knowledge = pa.table({"entity_type": ["item"] * 50, "entity_id": [f"i{k}" for k in range(50)], "token_ids": texts})
    members = _members([("item", f"i{k}", "attribute", "all") for k in range(50)])
    config = PoolBuildConfig(max_pool_size=10, global_max_size=20, with_random=True, seed=3)
    first = collect_sources(knowledge, members, config=config)
    assert first.sizes() == {"item/attribute/all": 10, "item/random/attribute.all": 10, "item/global/all": 20}
    chosen = first.texts["item/attribute/all"]
    assert len({tuple(t) for t in chosen}) == 10 and all(t in texts for t in chosen)
    assert collect_sources(knowledge, members, config=config).texts == first.texts
    other_seed = collect_sources(knowledge, members, config=PoolBuildConfig(max_pool_size=10, seed=4))
    assert other_seed.texts["item/attribute/all"] != chosen


def test_bad_input_is_named(tmp_path):
    without_u1 = MEMBERS.filter(pa.compute.not_equal(MEMBERS["entity_id"], "u1"))
    with pytest.raises(ValueError, match=r"missing from the membership.*user 'u1'"):
        collect_sources(_knowledge(), without_u1, WordTokenizer(WORDS))
    relaxed = collect_sources(_knowledge(), without_u1, WordTokenizer(WORDS), PoolBuildConfig(on_missing="skip"))
    assert ("user", "u1", "no group in the membership table") in relaxed.skipped
    with pytest.raises(ValueError, match="no tokenizer"):
        collect_sources(_knowledge(), MEMBERS)
    path = tmp_path / "k.parquet"
    pq.write_table(pa.table({"entity_id": ["a"], "text": ["x"]}), path)
    with pytest.raises(ValueError, match=r"k.parquet.*entity_type"):
        collect_sources(path, MEMBERS)
    with pytest.raises(ValueError, match="lacks column"):
        collect_sources(_knowledge(), MEMBERS.drop_columns(["group_id"]), WordTokenizer(WORDS))


def test_knowledge_read_from_a_parquet_directory(tmp_path):
    pq.write_table(_knowledge().slice(0, 3), tmp_path / "part-0.parquet")
    pq.write_table(_knowledge().slice(3), tmp_path / "part-1.parquet")
    (tmp_path / "manifest.json").write_text("{}")
    pools = build_pools(tmp_path, MEMBERS, WordTokenizer(WORDS), PoolBuildConfig(with_global=False))
    assert set(pools) == {
        "user/collaborative/0",
        "user/collaborative/1",
        "user/attribute/Drama",
        "item/attribute/Drama",
    }
    assert pools["user/collaborative/0"].texts == 2


@pytest.mark.parametrize("snapshot", [False, True])
def test_store_round_trip_gives_the_same_drafts(tmp_path, snapshot):
    tok = WordTokenizer(WORDS)
    sources = collect_sources(_knowledge(), MEMBERS, tok)
    built = build_pools(_knowledge(), MEMBERS, tok)
    store = write_store(tmp_path / "pools", sources.texts, TokenizerFingerprint.of(tok), {"seed": 0}, snapshot=snapshot)
    loaded = PoolStore.open(tmp_path / "pools", tokenizer=tok)
    assert loaded.sizes() == sources.sizes() == store.sizes()
    drafted = 0
    for key, texts in sources.texts.items():
        assert loaded.token_ids(key) == texts
        pool = loaded.get(key)
        assert pool is loaded.get(key)  # cached after first use
        for text in texts:
            for cut in range(1, len(text)):
                want, got = built[key].retrieve(text[:cut]), pool.retrieve(text[:cut])
                assert (got.tokens.tolist(), got.parents.tolist()) == (want.tokens.tolist(), want.parents.tolist())
                drafted += len(got.tokens) > 1
    assert drafted > 10  # the comparison is not between empty trees
    assert json.loads((tmp_path / "pools" / "manifest.json").read_text())["meta"] == {"seed": 0}


def test_store_rejects_other_tokenizer_old_format_and_unknown_keys(tmp_path):
    tok = WordTokenizer(WORDS)
    write_store(tmp_path, {"user/attribute/x": [[1, 2, 3]]}, TokenizerFingerprint.of(tok))
    with pytest.raises(PoolStoreError, match=r"built with tokenizer 'words'.*not 'other'"):
        PoolStore.open(tmp_path, tokenizer=WordTokenizer(WORDS[::-1], name="other"))
    assert "user/attribute/x" in PoolStore.open(tmp_path, tokenizer=WordTokenizer(WORDS, name="./same-vocab"))
    with pytest.raises(PoolStoreError, match="'user/attribute/y'"):
        PoolStore.open(tmp_path, tokenizer=tok).get("user/attribute/y")
    with pytest.raises(PoolStoreError, match="empty"):
        write_store(tmp_path, {"user/attribute/x": []}, TokenizerFingerprint.of(tok))
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "format_version": 99}))
    with pytest.raises(PoolStoreError, match="format version 99"):
        PoolStore.open(tmp_path)
    with pytest.raises(PoolStoreError, match="no pool store"):
        PoolStore.open(tmp_path / "nowhere")
