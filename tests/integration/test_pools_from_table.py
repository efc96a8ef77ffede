"""`laser pools build`: a pool store from a team's own texts, readable by the store opener vLLM's engine uses."""

from __future__ import annotations

from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from jobs.cli import app
from pools.from_table import TableError, build_from_table
from pools.store import open_store
from tests.helpers import save_tiny_model

TEXTS = {
    "comedy": ["a funny film about a dog", "a funny film about a cat", "jokes all the way"],
    "drama": ["a sad story of loss", "a sad story of hope"],
    "7": ["seven seas and seven skies"],
}


@pytest.fixture(scope="module")
def model(tmp_path_factory) -> str:
    return str(save_tiny_model(tmp_path_factory.mktemp("tiny")))


@pytest.fixture(scope="module")
def tokenizer(model):
    import laser

    return laser.load_tokenizer(model)


def _rows(texts: dict[str, list[str]] = TEXTS) -> pl.DataFrame:
    return pl.DataFrame(
        [{"review": t, "genre": g, "n": i} for g, ts in texts.items() for i, t in enumerate(ts)],
        schema={"review": pl.String, "genre": pl.String, "n": pl.Int64},
    )


def _check_store(out: Path, tokenizer, texts: dict[str, list[str]], prefix: str = "") -> None:
    """Keys, token ids (as the tokenizer encodes each text without special tokens), and a draft from each pool."""
    store = open_store(out, tokenizer=tokenizer)  # the tokenizer check the engine's opener makes
    assert sorted(store.keys()) == sorted(prefix + g for g in texts)
    for group, expected in texts.items():
        key = prefix + group
        ids = store.token_ids(key)
        assert ids == [tokenizer(t, add_special_tokens=False)["input_ids"] for t in expected]
        assert [tokenizer.decode(t) for t in ids] == expected
        first = ids[0]
        tree = store.get(key).retrieve(first[:4], max_nodes=8)
        assert len(tree.tokens) > 1 and tree.tokens[1] == first[4]  # drafts the text's next token


def test_a_parquet_file_becomes_one_pool_per_group(tmp_path, tokenizer):
    _rows().sort("n", maintain_order=True).write_parquet(tmp_path / "texts.parquet")  # groups interleaved
    build = build_from_table(tmp_path / "texts.parquet", "review", "genre", tokenizer, tmp_path / "store")
    assert build.pools == {"7": 1, "comedy": 3, "drama": 2}
    assert (build.rows, build.empty_texts, build.no_group, build.capped) == (6, 0, 0, 0)
    _check_store(tmp_path / "store", tokenizer, TEXTS)


def test_a_folder_of_parquet_files_in_several_parts_with_a_key_prefix(tmp_path, tokenizer):
    rows = _rows()
    (tmp_path / "table" / "sub").mkdir(parents=True)
    rows.head(2).write_parquet(tmp_path / "table" / "a.parquet")
    rows.slice(2).write_parquet(tmp_path / "table" / "sub" / "b.parquet")
    build = build_from_table(
        tmp_path / "table", "review", "genre", tokenizer, tmp_path / "store", key_prefix="item/", part_texts=2
    )
    assert build.texts == 6
    assert len(list((tmp_path / "store").glob("part-*.arrow"))) == 2  # 7 + comedy (4 texts), then drama (2)
    _check_store(tmp_path / "store", tokenizer, TEXTS, prefix="item/")


def test_hive_partitions_and_integer_groups_give_string_keys(tmp_path, tokenizer):
    for group, texts in (("1", TEXTS["comedy"]), ("22", TEXTS["drama"])):
        (tmp_path / "table" / f"cluster={group}").mkdir(parents=True)
        pl.DataFrame({"text": texts}).write_parquet(tmp_path / "table" / f"cluster={group}" / "part.parquet")
    build_from_table(tmp_path / "table", "text", "cluster", tokenizer, tmp_path / "store")
    _check_store(tmp_path / "store", tokenizer, {"1": TEXTS["comedy"], "22": TEXTS["drama"]})


def test_csv_with_skipped_rows_counted(tmp_path, tokenizer):
    rows = _rows().vstack(
        pl.DataFrame(
            {"review": [None, "   ", "no group here"], "genre": ["drama", "comedy", None], "n": [0, 0, 0]},
            schema={"review": pl.String, "genre": pl.String, "n": pl.Int64},
        )
    )
    rows.write_csv(tmp_path / "texts.csv")
    build = build_from_table(tmp_path / "texts.csv", "review", "genre", tokenizer, tmp_path / "store")
    assert (build.rows, build.empty_texts, build.no_group, build.texts) == (9, 2, 1, 6)
    _check_store(tmp_path / "store", tokenizer, TEXTS)


def test_max_pool_size_caps_each_pool_and_keeps_its_picks(tmp_path, tokenizer):
    many = {"big": [f"text number {i}" for i in range(20)], "small": ["only one"]}
    _rows(many).write_parquet(tmp_path / "t.parquet")
    first = build_from_table(tmp_path / "t.parquet", "review", "genre", tokenizer, tmp_path / "s1", max_pool_size=5)
    assert first.pools == {"big": 5, "small": 1} and first.capped == 15
    picks = open_store(tmp_path / "s1").token_ids("big")
    _rows({"big": many["big"] + ["a new one"], "small": ["only one"]}).write_parquet(tmp_path / "t.parquet")
    build_from_table(tmp_path / "t.parquet", "review", "genre", tokenizer, tmp_path / "s2", max_pool_size=5)
    again = open_store(tmp_path / "s2").token_ids("big")
    assert len(set(map(tuple, picks)) & set(map(tuple, again))) >= 4  # one new row moves at most one pick


def test_a_rebuild_replaces_the_store(tmp_path, tokenizer):
    """A rebuild replaces the store; the files of the generation it replaced stay for the readers that hold it,
    and go with the next rebuild."""
    _rows().write_parquet(tmp_path / "t.parquet")
    first = build_from_table(tmp_path / "t.parquet", "review", "genre", tokenizer, tmp_path / "store", snapshot=True)
    held = open_store(tmp_path / "store")
    first_files = set((tmp_path / "store").glob("*.arrow"))
    _rows({"drama": TEXTS["drama"]}).write_parquet(tmp_path / "t.parquet")
    build_from_table(tmp_path / "t.parquet", "review", "genre", tokenizer, tmp_path / "store")
    again = open_store(tmp_path / "store")
    assert again.keys() == ["drama"] and again.generation == held.generation + 1 and held.changed()
    assert held.token_ids("comedy") and first_files <= set((tmp_path / "store").glob("*.arrow"))  # still readable
    build_from_table(tmp_path / "t.parquet", "review", "genre", tokenizer, tmp_path / "store")
    assert not first_files & set((tmp_path / "store").glob("*.arrow"))  # two generations on: gone
    assert len(list((tmp_path / "store").glob("*.arrow"))) == 2 and first.pools


def test_the_engine_s_store_opener_reads_it(tmp_path, tokenizer):
    from laser.vllm.sources import StorePools

    _rows().write_parquet(tmp_path / "t.parquet")
    build_from_table(tmp_path / "t.parquet", "review", "genre", tokenizer, tmp_path / "store")
    pools = StorePools(lambda: tokenizer, roots=[tmp_path])
    assert pools.get(tmp_path / "store", "drama") is not None
    assert pools.get(tmp_path / "store", "western") is None


def test_the_cli_builds_and_prints_the_keys(tmp_path, model, tokenizer):
    _rows().write_parquet(tmp_path / "t.parquet")
    out = tmp_path / "store"
    args = ["pools", "build", str(tmp_path / "t.parquet"), "--text-column", "review", "--group-column", "genre"]
    result = CliRunner().invoke(app, [*args, "--model", model, "--out", str(out), "--snapshot"])
    assert result.exit_code == 0, result.output
    assert f"{out}: 3 pools, 6 texts from 6 rows" in result.output and "comedy\t3 texts" in result.output
    _check_store(out, tokenizer, TEXTS)
    assert all(e.get("snapshot") for e in open_store(out).manifest["pools"].values())
    assert open_store(out).manifest["meta"]["model"] == model
    help_text = CliRunner().invoke(app, ["pools", "build", "--help"], terminal_width=200).output
    assert "--text-column" in help_text and "pool_store" in help_text


def _bad_tables(tmp: Path) -> dict[str, tuple[Path, list[str], str]]:
    """Case -> (table, extra args, the message's words)."""
    _rows().write_parquet(tmp / "ok.parquet")
    pl.DataFrame({"review": [1, 2], "genre": ["a", "b"]}).write_parquet(tmp / "ints.parquet")
    _rows().clear().write_parquet(tmp / "none.parquet")
    pl.DataFrame(
        {"review": [None, " "], "genre": ["a", "b"]}, schema={"review": pl.String, "genre": pl.String}
    ).write_parquet(tmp / "blank.parquet")
    pl.DataFrame({"review": ["x"], "genre": [[1, 2]]}).write_parquet(tmp / "nested.parquet")
    (tmp / "junk.parquet").write_text("not parquet")
    (tmp / "emptydir").mkdir()
    (tmp / "full").mkdir()
    (tmp / "full" / "notes.txt").write_text("mine")
    return {
        "missing text column": (
            tmp / "ok.parquet",
            ["--text-column", "txt"],
            "no text column 'txt'; its columns: review, genre, n",
        ),
        "missing group column": (
            tmp / "ok.parquet",
            ["--group-column", "g"],
            "no group column 'g'; its columns: review, genre, n",
        ),
        "non-string text": (tmp / "ints.parquet", [], "text column 'review' is Int64, not strings"),
        "nested group": (tmp / "nested.parquet", [], "group column 'genre' is List(Int64)"),
        "empty table": (tmp / "none.parquet", [], "the table has no rows"),
        "only blank texts": (
            tmp / "blank.parquet",
            [],
            "no texts to build pools from (2 rows: 2 null or empty in column 'review'",
        ),
        "not parquet": (tmp / "junk.parquet", [], "cannot read the table"),
        "no such file": (tmp / "nope.parquet", [], "no such file or folder"),
        "empty folder": (tmp / "emptydir", [], "no .parquet or .csv files"),
        "out holds other files": (
            tmp / "ok.parquet",
            ["--out", str(tmp / "full")],
            "not empty and holds no pool store",
        ),
    }


def test_bad_input_is_one_line_naming_the_file_and_column(tmp_path, model):
    for case, (table, extra, words) in _bad_tables(tmp_path).items():
        args = {"--text-column": "review", "--group-column": "genre", "--out": str(tmp_path / "out"), "--model": model}
        args.update(dict(zip(extra[::2], extra[1::2])))
        flat = [x for kv in args.items() for x in kv]
        result = CliRunner().invoke(app, ["pools", "build", str(table), *flat])
        assert result.exit_code == 2, (case, result.output)
        lines = [line for line in result.output.splitlines() if line.strip()]
        assert len(lines) == 1 and lines[0].startswith(
            str(table if case != "out holds other files" else tmp_path / "full")
        ), (case, lines)
        assert words in lines[0], (case, lines[0])
    assert not (tmp_path / "out").exists()  # nothing written


def test_an_unknown_model_is_one_line(tmp_path):
    _rows().write_parquet(tmp_path / "t.parquet")
    args = ["pools", "build", str(tmp_path / "t.parquet"), "--text-column", "review", "--group-column", "genre"]
    result = CliRunner().invoke(app, [*args, "--model", str(tmp_path / "no-model"), "--out", str(tmp_path / "s")])
    assert result.exit_code == 2 and "cannot load the tokenizer" in result.output
    with pytest.raises(TableError, match="at least 1"):
        build_from_table(tmp_path / "t.parquet", "review", "genre", None, tmp_path / "s", max_pool_size=0)
