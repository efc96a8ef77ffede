"""Which decoder writes new knowledge, from ``decoder`` and ``generation.strategy``.

Strategy ``default``: the configured decoder with its parameters. Strategy ``beam_sample``: beam
sampling of width ``generation.beam_width`` at temperature 1, the text being the beam of highest target
log-probability. It runs the configured decoder when that decoder beam-samples (its class sets
``beam_sampling = True``: ``beam_sample``, ``dsbd``, which then run with ``W = beam_width``), and the
target's own ``beam_sample`` when ``decoder.name`` is left unset. Any other decoder named explicitly is a
configuration error: it cannot beam-sample, and running something else in its place would hide it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.knowledge.validation import JobInputError, check_decoder

BEAM_SAMPLE = "beam_sample"


@dataclass(frozen=True)
class KnowledgeDecoder:
    """The decoder the new-knowledge pass builds: registry name and keyword parameters."""

    name: str
    params: dict[str, Any]


def new_knowledge_decoder(cfg: Any) -> KnowledgeDecoder:
    """The decoder and parameters that write new knowledge for the job config ``cfg``."""
    name, params = cfg.decoder.name, dict(cfg.decoder.params)
    if cfg.generation.strategy != "beam_sample":
        return KnowledgeDecoder(name, params)
    width = cfg.generation.beam_width
    if "name" not in cfg.decoder.model_fields_set:
        name = BEAM_SAMPLE
    elif not beam_samples(name):
        raise JobInputError(f"generation.strategy=beam_sample: decoder.name={name!r} cannot beam-sample; set "
                            f"decoder.name to one of {beam_sampling_decoders()} or leave it unset ({BEAM_SAMPLE})")
    if params.get("W", width) != width:
        raise JobInputError(f"decoder.params.W={params['W']} conflicts with generation.beam_width={width} under "
                            "generation.strategy=beam_sample; set the width once, in generation.beam_width")
    return KnowledgeDecoder(name, {**params, "W": width})


def check_job_decoder(cfg: Any) -> None:
    """:func:`~pipelines.knowledge.validation.check_decoder` for a job config's new-knowledge decoder (after
    ``generation.strategy``), its draft and sampling settings."""
    dec = new_knowledge_decoder(cfg)
    check_decoder(dec.name, dec.params, sampling=cfg.generation.sampling(), model=cfg.model.name)


def beam_samples(name: str) -> bool:
    """Whether the registered decoder ``name`` beam-samples with a width ``W``."""
    import laser

    cls = laser.available_decoders().get(name)
    return bool(getattr(cls, "beam_sampling", False))


def beam_sampling_decoders() -> list[str]:
    import laser

    return sorted(n for n in laser.available_decoders() if beam_samples(n))
