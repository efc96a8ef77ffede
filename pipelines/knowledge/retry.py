"""The ``retry`` policy for flawed knowledge rows, and the generation rules of a decode task.

A row that is degenerate, cut at the token limit or a fragment (pipelines/quality.py) is
regenerated once: greedily (the task's decoder with its ``greedy_params()``, same pool; the autoregressive
decoder when it has none) under the task's ``retry_rules`` (a stronger repetition penalty and a no-repeat
n-gram size). The retry is kept whatever it reads like, with its own quality flags and ``greedy_retry``
set, so a still-flawed row stays visible.
"""
from __future__ import annotations

import dataclasses
import logging
from typing import Any

from laser.rules import NO_RULES, GenerationRules
from pipelines.quality import GREEDY_RETRY_DECODER

log = logging.getLogger(__name__)


def task_rules(rules: dict[str, Any] | None) -> GenerationRules:
    """A task's rules (keywords of :class:`laser.GenerationRules`) as the decoder takes them."""
    return GenerationRules(**rules) if rules else NO_RULES


def flawed(row: dict[str, Any]) -> bool:
    """Degenerate, cut or a fragment: what the retry regenerates."""
    return bool(row.get("degenerate") or row.get("cut") or row.get("fragment"))


def retry_decoder(decoder: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    """(decoder, params) of the greedy retry: ``decoder`` under its greedy parameters, else autoregressive."""
    import laser

    cls = laser.available_decoders().get(decoder)
    greedy = cls.greedy_params() if cls is not None else None
    if greedy is None:
        return GREEDY_RETRY_DECODER, {}
    return decoder, {**params, **greedy}


def retry_once(worker: Any, task: Any, req: Any, prompt: str, row: dict[str, Any]) -> dict[str, Any]:
    """``row``, or when it is flawed the row of one greedy retry under ``task.retry_rules`` (module docstring)."""
    if not flawed(row):
        return row
    name, params = retry_decoder(task.decoder, task.decoder_params)
    retry = dataclasses.replace(task, decoder=name, decoder_params=params, sampling=None,
                                rules=task.retry_rules or task.rules)
    decoder, params_json = worker._decoder(retry)
    pool = worker._pool(retry, req.pool_key) if name == task.decoder else None
    log.info("%s %s: flawed text (degenerate %s, cut %s, fragment %s); retrying with %s %s", req.entity_type,
             req.entity_id, row.get("degenerate"), row.get("cut"), row.get("fragment"), name, retry.rules)
    res = decoder.generate(prompt, task.max_new_tokens, pool, rules=task_rules(retry.rules))
    return {**worker._row(retry, req, pool, res, params_json), "greedy_retry": True}
