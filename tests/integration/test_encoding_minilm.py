"""Knowledge encoding with the real packaged all-MiniLM-L6-v2 (no download), and the content-hash cache."""

from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from pipelines.ops.features import encoding
from pipelines.ops.features.encoding import encode_knowledge, get_encoder, read_vectors, vectors_path_for

pytestmark = pytest.mark.slow  # loads the packaged sentence encoder


@pytest.fixture(scope="module")
def encoder():
    return get_encoder()


def test_minilm_similar_sentences_are_closer_and_vectors_are_unit_384(encoder):
    texts = [
        "This user loves science fiction films about space travel.",
        "The viewer enjoys sci-fi movies set among the stars and spaceships.",
        "A recipe for baking sourdough bread at home.",
    ]
    v = encoder.encode(texts, batch_size=2, progress=False)
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    sim = v @ v.T
    assert sim[0, 1] > sim[0, 2] + 0.3 and sim[0, 1] > sim[1, 2] + 0.3
    # deterministic, and padding in a batch does not change a text's vector (mean over the attention mask)
    alone = encoder.encode(texts[2:], batch_size=1, progress=False)
    np.testing.assert_allclose(alone[0], v[2], atol=1e-5)


def _knowledge(path, texts: dict[tuple[str, str], str | None]) -> None:
    pl.DataFrame(
        [(t, i, k) for (t, i), k in texts.items()], schema=["entity_type", "entity_id", "knowledge"], orient="row"
    ).write_parquet(path)


def test_encode_knowledge_writes_beside_and_caches_by_content(tmp_path, encoder, monkeypatch):
    src = tmp_path / "greedy.parquet"
    _knowledge(src, {("user", "u1"): "Likes war films.", ("item", "i1"): "A war film.", ("user", "u2"): None})
    calls: list[list[str]] = []
    real = encoder.encode
    monkeypatch.setattr(encoder, "encode", lambda texts, **kw: (calls.append(list(texts)), real(texts, **kw))[1])

    out = encode_knowledge(src, encoder)
    assert out == vectors_path_for(src) == tmp_path / "greedy.vectors.parquet"
    frame = read_vectors(out)
    assert frame.schema["vector"] == pl.Array(pl.Float32, 384)
    assert frame.select("entity_type", "entity_id").rows() == [("user", "u1"), ("item", "i1")]  # empty row skipped
    assert sorted(calls[0]) == ["A war film.", "Likes war films."]

    before = out.stat().st_mtime_ns
    assert encode_knowledge(src, encoder) == out
    assert len(calls) == 1 and out.stat().st_mtime_ns == before  # same content: nothing encoded or written

    _knowledge(src, {("user", "u1"): "Likes war films.", ("item", "i1"): "A romantic comedy."})
    encode_knowledge(src, encoder)
    assert calls[1] == ["A romantic comedy."]  # only the changed text is encoded
    again = read_vectors(out)
    np.testing.assert_array_equal(again["vector"][0].to_numpy(), frame["vector"][0].to_numpy())


def test_bad_knowledge_files_name_the_problem(tmp_path):
    bad_type = tmp_path / "bad.parquet"
    pl.DataFrame({"entity_type": ["shop"], "entity_id": ["s9"], "knowledge": ["x"]}).write_parquet(bad_type)
    with pytest.raises(ValueError, match=r"bad.parquet.*'shop'.*s9"):
        encoding.load_knowledge_texts(bad_type)
    no_col = tmp_path / "nocol.parquet"
    pl.DataFrame({"entity_type": ["user"], "entity_id": ["u1"]}).write_parquet(no_col)
    with pytest.raises(ValueError, match=r"nocol.parquet lacks column\(s\) \['knowledge'\]"):
        encoding.load_knowledge_texts(no_col)
    with pytest.raises(FileNotFoundError, match="neither"):
        encoding.resolve_encoder(str(tmp_path / "no-model"))
