"""Prompts from config: prompts.template (shipped or a team's file) and prompts.system, what a template sees
(every item column, user attributes, the history), its version, and the errors that name file, line, column."""

from __future__ import annotations

import hashlib
from pathlib import Path

import polars as pl
import pytest

import laser
from jobs.config import ConfigError, validate_config
from laser.models import chat_ids
from pipelines.knowledge.decoders import new_knowledge_decoder
from pipelines.knowledge.inputs import load_job_data
from pipelines.knowledge.job import knowledge_task
from pipelines.prompts.template import SHIPPED, PromptTemplateError, load_template, shipped_template
from pipelines.knowledge.prompts import (
    HistoryEntry,
    entity_input,
    entity_prompt,
    item_prompt,
    user_prompt,
)
from pipelines.knowledge.requests import new_requests

TEMPLATES = Path(__file__).resolve().parents[2] / "pipelines" / "prompts" / "templates"
# a shipped template's wording changes only with its version line: edit both, then this pin
PINNED = {  # movie, book, ecommerce: implicit histories added; explicit prompts byte-identical, versions kept
    "movie": ("kar-v5", "c146b741f1a63739"),
    "book": ("kar-v5", "1f001c3f88ecbbeb"),
    "ecommerce": ("ecommerce-v1", "7b9d5438b64d3626"),
    "news": ("news-v1", "2cece60b7ce259d5"),
}

TEAM = """{#- our own -#}
{% block user %}
Customer aged {{ age }} bought:
{% for e in history %}
- {{ e.title }} ({{ e.rating | num }})
{% endfor %}
Describe them in {{ max_words }} words.
{% endblock %}
{% block item %}
{{ title }} by {{ brand }} at {{ price }}{% if item.get("colour") %} in {{ item.get("colour") }}{% endif %}

{% endblock %}
"""


class WhitespaceTokenizer:
    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return list(range(len(text.split())))


class SystemTokenizer(WhitespaceTokenizer):
    """A chat template of 2 tokens a message around the messages' words."""

    chat_template = "fake"

    def apply_chat_template(self, messages, add_generation_prompt=True, tokenize=True, return_dict=False):
        return list(range(sum(2 + len(m["content"].split()) for m in messages)))


def _sha(name: str) -> str:
    return hashlib.sha256((TEMPLATES / f"{name}.j2").read_bytes()).hexdigest()[:16]


def test_shipped_templates_are_pinned_to_their_version():
    assert set(PINNED) == set(SHIPPED) == {p.stem for p in TEMPLATES.glob("*.j2")}
    for name, (version, sha) in PINNED.items():
        assert (shipped_template(name).version, _sha(name)) == (version, sha), name


def test_ecommerce_and_news_show_their_columns_when_present():
    row = {"item_id": "p1", "title": "Kettle", "genres": ["Home", "Kitchen"], "category": "Home"}
    full = item_prompt(
        {**row, "sub_category": "Kitchen", "brand": "Acme", "price": 19.5, "description": "Boils </s> water."},
        "ecommerce",
        max_words=30,
    )
    assert full.startswith(
        "A product:\nTitle: Kettle\nBrand: Acme\nPrice: 19.5\nCategory: Home > Kitchen\n"
        "Description: Boils < /s> water.\n\nIn 1 or 2 sentences (at most 30 words in all)"
    )
    bare = item_prompt(row, "ecommerce")
    assert "Brand" not in bare and "Price" not in bare and "Description" not in bare and "Category: Home\n" in bare
    news = item_prompt({"item_id": "n1", "title": "Rain", "category": "weather", "abstract": "Wet week."}, "news")
    assert news.startswith("A news article:\nTitle: Rain\nCategory: weather\nAbstract: Wet week.\n\n")
    hist = [HistoryEntry("Kettle", 4.0, ("Home", "Kitchen")), HistoryEntry("Rain (2020)", 5.0)]
    assert "1. Product: Kettle | Categories: Home, Kitchen | Rating: 4\n2. Product: Rain (2020) | Rating: 5\n" in (
        user_prompt(hist, "ecommerce")
    )
    assert "1. Title: Kettle | Topics: Home, Kitchen\n2. Title: Rain\n\n" in user_prompt(hist, "news")


def test_config_errors_name_the_file_and_line(tmp_path):
    bad = tmp_path / "bad.j2"
    bad.write_text("{% block user %}x{% endblock %}\n{% block item %}\n{% if title %}\n{{ title }}\n{% endblock %}\n")
    with pytest.raises(ConfigError, match=rf"prompts\.template: .*{bad}, line 5: .*endblock"):
        validate_config({"prompts": {"template": str(bad)}}, "job.yaml")
    with pytest.raises(ConfigError, match="'moviez' is neither a shipped template"):
        validate_config({"prompts": {"template": "moviez"}}, "job.yaml")
    one = tmp_path / "one.j2"
    one.write_text("{% block user %}x{% endblock %}")
    with pytest.raises(ConfigError, match=rf"{one}: no 'item' block"):
        validate_config({"prompts": {"template": str(one)}}, "job.yaml")
    assert validate_config({"prompts": {"template": "news", "system": "Be brief."}}).prompts.template == "news"


def _table(tmp_path: Path, brand: bool = True) -> Path:
    pl.DataFrame(
        {"uid": ["u1", "u1", "u2"], "iid": ["a", "b", "a"], "stars": [5, 2, 4], "ts": [10, 20, 30]}
    ).write_parquet(tmp_path / "events.parquet")
    items = {"iid": ["a", "b"], "name": ["Kettle", "Mug"], "price": [19.5, 4.0], "colour": ["red", None]}
    pl.DataFrame({**items, **({"brand": ["Acme", "Mugs & Co"]} if brand else {})}).write_parquet(
        tmp_path / "items.parquet"
    )
    pl.DataFrame({"uid": ["u1", "u2"], "age": [31, 45]}).write_parquet(tmp_path / "users.parquet")
    (tmp_path / "team.j2").write_text(TEAM)
    return tmp_path


def _cfg(tmp_path: Path, **prompts):
    return validate_config(
        {
            "dataset": {
                "format": "table",
                "path": str(tmp_path),
                "interactions_file": "events.parquet",
                "items_file": "items.parquet",
                "users_file": "users.parquet",
                "columns": {"user_id": "uid", "item_id": "iid", "rating": "stars", "timestamp": "ts", "title": "name"},
            },
            "output": {"path": str(tmp_path / "out")},
            "prompts": prompts,
        }
    )


def test_a_team_template_sees_every_item_column_and_user_attribute(tmp_path):
    cfg = _cfg(_table(tmp_path), template=str(tmp_path / "team.j2"))
    data = load_job_data(cfg)
    task = knowledge_task(cfg, new_knowledge_decoder(cfg), "r", data.dataset.domain, None)
    prompts = {r.key: entity_prompt(task, r, WhitespaceTokenizer()) for r in new_requests(data.dataset, data.split, {})}
    assert prompts[("item", "a")] == "Kettle by Acme at 19.5 in red"
    assert prompts[("item", "b")] == "Mug by Mugs & Co at 4.0"
    assert prompts[("user", "u1")].startswith("Customer aged 31 bought:\n- Kettle (5)\n- Mug (2)\nDescribe them in")
    # the version is the template's hash, and the config hash follows it
    default = knowledge_task(_cfg(tmp_path), new_knowledge_decoder(cfg), "r", data.dataset.domain, None)
    assert task.prompt_version.startswith("tpl-") and default.prompt_version == "kar-v5"
    assert task.config_hash != default.config_hash
    (tmp_path / "team.j2").write_text(TEAM.replace("bought", "purchased"))
    edited = knowledge_task(cfg, new_knowledge_decoder(cfg), "r", data.dataset.domain, None)
    assert edited.prompt_version != task.prompt_version and edited.config_hash != task.config_hash


def test_a_template_naming_a_missing_column_fails_at_data_load(tmp_path):
    cfg = _cfg(_table(tmp_path, brand=False), template=str(tmp_path / "team.j2"))
    with pytest.raises(
        PromptTemplateError, match=rf"{tmp_path / 'team.j2'}: the item block names 'brand', which the items table lacks"
    ):
        load_job_data(cfg)
    (tmp_path / "team.j2").write_text(TEAM.replace("{{ brand }}", "x").replace("{{ age }}", "{{ shoe_size }}"))
    with pytest.raises(PromptTemplateError, match="the user block names 'shoe_size', which the users table lacks"):
        load_job_data(cfg)


def test_dataset_domain_picks_the_shipped_template_unless_prompts_template_is_set(tmp_path):
    cfg = _cfg(_table(tmp_path))
    data = load_job_data(cfg)
    task = knowledge_task(cfg, new_knowledge_decoder(cfg), "r", "book", None)
    assert (task.domain, task.prompt_version) == ("book", "kar-v5")
    news = _cfg(tmp_path, template="news")
    task = knowledge_task(news, new_knowledge_decoder(news), "r", "book", None)
    assert (task.domain, task.prompt_version) == ("news", "news-v1")
    req = next(r for r in new_requests(data.dataset, data.split, {}) if r.entity_type == "item")
    assert entity_prompt(task, req, WhitespaceTokenizer()).startswith("A news article:\nTitle: ")


def test_a_system_prompt_is_the_chat_templates_system_message(tmp_path):
    system = "You write short, factual profiles."
    cfg = _cfg(_table(tmp_path), system=system)
    data = load_job_data(cfg)
    task = knowledge_task(cfg, new_knowledge_decoder(cfg), "r", "movie", None)
    assert task.prompt_version.startswith("tpl-")  # the shipped movie template with a system prompt
    smol = laser.load_tokenizer("smollm2-135m")
    user = next(r for r in new_requests(data.dataset, data.split, {}) if r.entity_type == "user")
    text = entity_prompt(task, user, smol)
    ids = entity_input(task, user, smol)
    assert ids == chat_ids(smol, text, system=system) and ids != chat_ids(smol, text)
    rendered = smol.decode(ids)
    assert system in rendered and "SmolLM" not in rendered  # the model's default system message replaced
    # no system prompt: the text itself, as before
    plain = knowledge_task(_cfg(tmp_path), new_knowledge_decoder(cfg), "r", "movie", None)
    assert entity_input(plain, user, smol) == entity_prompt(plain, user, smol)


def test_the_history_cut_counts_the_system_prompt():
    hist = [HistoryEntry(f"Movie{k} (199{k})", 4.0) for k in range(10)]
    tok, system = SystemTokenizer(), "one two three four five six seven eight nine"  # 9 words: one entry
    plain, with_system = shipped_template("movie"), shipped_template("movie", system=system)
    budget = 2 + len(user_prompt(hist[-5:], template=plain).split())
    assert user_prompt(hist, tokenizer=tok, max_prompt_tokens=budget, template=plain).count(" | Rating") == 5
    cut = user_prompt(hist, tokenizer=tok, max_prompt_tokens=budget, template=with_system)
    assert cut.count(" | Rating") == 3  # the system message (9 words + 2) costs two 9-word entries
    assert load_template(None, "book").version == "kar-v5"


def test_a_job_writes_knowledge_from_the_template_and_system_message(tiny_model, tmp_path):
    """In-process workers: rows carry the template's version, and each text is the model's greedy decoding
    of the system and user messages through the chat template."""
    from jobs.config import load_config
    from pipelines.knowledge import job as jobmod
    from pipelines.knowledge.generation import GenerationWorker
    from pipelines.knowledge.paths import JobPaths
    from pipelines.store.knowledge import read_knowledge
    from pipelines.workers import LocalGroup, ModelSpec

    sets = [f"model.name={tiny_model}", "model.dtype=float32", f"output.path={tmp_path}", "decoder.name=autoregressive"]
    sets += ["generation.max_new_tokens=6", "generation.degenerate=keep", "dataset.synthetic.n_users=3"]
    sets += ["dataset.synthetic.n_items=5", "dataset.synthetic.max_history=6", "prompts.template=news"]
    cfg = load_config(None, [*sets, "prompts.system=Write one line."])
    data = load_job_data(cfg)
    worker = GenerationWorker(ModelSpec(tiny_model, dtype="float32"))
    report = jobmod.step_generate(cfg, data, pl.DataFrame(), LocalGroup(worker))
    rows = read_knowledge(JobPaths.of(cfg).knowledge)
    task = knowledge_task(cfg, new_knowledge_decoder(cfg), "r", data.dataset.domain, None)
    assert report.failed == 0 and rows.height == report.done > 0
    assert set(rows["prompt_version"]) == {task.prompt_version} and task.prompt_version.startswith("tpl-")
    decoder = worker.adapter.decoders.get("autoregressive", {})[0]
    texts = dict(zip(rows["entity_id"], rows["knowledge"]))
    for req in new_requests(data.dataset, data.split, {})[:3]:
        ids = chat_ids(worker.tokenizer, entity_prompt(task, req, worker.tokenizer), system="Write one line.")
        assert worker.prompt(task, req) == ids  # what the engine is handed
        assert texts[req.entity_id] == decoder.generate(ids, 6).text, req.key
