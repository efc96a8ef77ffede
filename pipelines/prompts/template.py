"""A prompt template: its source, version and system prompt, compiled once per process in Jinja2's sandbox,
and the checks that a template parses and names only columns the dataset has (pipelines.knowledge.prompts
renders the job's prompts with it; the decode task carries it to the workers)."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jinja2 import Template

SHIPPED = ("movie", "book", "ecommerce", "news")  # templates in templates/<name>.j2
BLOCKS = ("user", "item")
# columns every item row has (pipelines.data.schema.ITEM_COLUMNS): a shipped template may name them directly
ITEM_FIELDS = ("item_id", "title", "genres", "category", "sub_category", "year")


class PromptTemplateError(ValueError):
    """A template that cannot be read, parsed or rendered for a dataset: the message names its file."""


_VERSION_LINE = re.compile(r"\{#-?\s*version:\s*([\w.+-]+)\s*-?#\}")


@dataclass(frozen=True)
class PromptTemplate:
    """A template's source, where it came from and the system prompt it runs with (picklable: it travels to
    the workers in the decode task)."""

    name: str  # a shipped name (movie, ...) or the file's path: errors name it
    source: str
    system: str | None = None
    shipped: bool = False

    @property
    def version(self) -> str:
        """The header line's version for a shipped template without a system prompt, else ``tpl-`` and the
        sha256 (12 hex digits) of the source and the system text."""
        head = _VERSION_LINE.match(self.source)
        if self.shipped and self.system is None and head:
            return head.group(1)
        blob = self.source + "\0" + (self.system if self.system is not None else "")
        return "tpl-" + hashlib.sha256(blob.encode()).hexdigest()[:12]

    def render(self, block: str, fields: Mapping[str, Any]) -> str:
        """The text of ``block`` for ``fields`` (leading and trailing whitespace dropped)."""
        from jinja2 import TemplateError

        tmpl = _compiled(self.name, self.source)
        try:
            return "".join(tmpl.blocks[block](tmpl.new_context(dict(fields)))).strip()
        except TemplateError as exc:
            raise PromptTemplateError(f"{self.name}: {block} block: {exc}") from exc

    def names(self, block: str) -> set[str]:
        """The names ``block`` reads from its context (columns, ``history``, ``max_words``, ...)."""
        return set(_names(self.name, self.source)[block])


def _environment() -> Any:
    from jinja2 import StrictUndefined
    from jinja2.sandbox import SandboxedEnvironment

    env = SandboxedEnvironment(undefined=StrictUndefined, trim_blocks=True, lstrip_blocks=True, autoescape=False)
    env.filters["num"] = lambda x: f"{x:g}"
    return env


@functools.lru_cache(maxsize=16)
def _compiled(name: str, source: str) -> Template:
    """The template compiled once per process; a syntax error or a missing block names the file and line."""
    from jinja2 import TemplateSyntaxError, nodes

    env = _environment()
    try:
        ast = env.parse(source, filename=name)
    except TemplateSyntaxError as exc:
        raise PromptTemplateError(f"{name}, line {exc.lineno}: {exc.message}") from exc
    found = {b.name for b in ast.find_all(nodes.Block)}
    if missing := [b for b in BLOCKS if b not in found]:
        raise PromptTemplateError(
            f"{name}: no {' or '.join(repr(b) for b in missing)} block; a prompt template needs "
            "{% block user %}...{% endblock %} and {% block item %}...{% endblock %}"
        )
    template: Template = env.from_string(ast)
    return template


@functools.lru_cache(maxsize=16)
def _names(name: str, source: str) -> dict[str, frozenset[str]]:
    from jinja2 import meta, nodes

    _compiled(name, source)  # syntax and blocks first
    env = _environment()
    out = {}
    for block in env.parse(source).find_all(nodes.Block):
        body = nodes.Template(block.body, lineno=block.lineno)
        body.set_environment(env)
        out[block.name] = frozenset(meta.find_undeclared_variables(body) - set(env.globals))
    return out


def shipped_template(name: str, system: str | None = None) -> PromptTemplate:
    """A template of ``templates/`` by name (``movie``, ``book``, ``ecommerce``, ``news``)."""
    if name not in SHIPPED:
        raise ValueError(f"unknown prompt domain {name!r}; expected one of {sorted(SHIPPED)}")
    return _shipped(name, system)


@functools.lru_cache(maxsize=16)
def _shipped(name: str, system: str | None) -> PromptTemplate:
    source = resources.files("pipelines.prompts").joinpath("templates", f"{name}.j2").read_text(encoding="utf-8")
    return PromptTemplate(name, source, system, shipped=True)


def load_template(template: str | None, domain: str = "movie", system: str | None = None) -> PromptTemplate:
    """The template a job prompts with: ``template`` (a shipped name or a file's path), else the shipped one
    named by ``domain``; parsed here, so a syntax error fails now naming the file and line."""
    if template is None or template in SHIPPED:
        out = shipped_template(template or domain, system)
    else:
        path = Path(template).expanduser()
        if not path.is_file():
            raise PromptTemplateError(
                f"prompts.template: {template!r} is neither a shipped template {list(SHIPPED)} nor a file"
            )
        out = PromptTemplate(str(path), path.read_text(encoding="utf-8"), system)
    _compiled(out.name, out.source)
    return out


def check_columns(template: PromptTemplate, item_columns: Iterable[str], user_columns: Iterable[str]) -> None:
    """A template that names a column the dataset lacks fails here (before any generation), naming the
    template and the column; ``item.get("col")`` / ``user.get("col")`` read optional ones."""
    known = {
        "item": set(item_columns) | set(ITEM_FIELDS) | {"item", "max_words"},
        "user": set(user_columns) | {"user_id", "user", "history", "max_words"},
    }
    for block in BLOCKS:
        if missing := sorted(template.names(block) - known[block]):
            table = "items" if block == "item" else "users"
            raise PromptTemplateError(
                f"{template.name}: the {block} block names {', '.join(repr(m) for m in missing)}, which the "
                f"{table} table lacks (its columns: {sorted(known[block] - {'item', 'user', 'max_words', 'history'})})"
            )
