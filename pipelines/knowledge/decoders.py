"""The job's decoders, resolved in one place: a config's decoder names a registered class whose own
``check_params`` checks its parameters (:func:`laser.decoders.resolve_decoder`).

- new knowledge: ``decoder.name`` / ``decoder.params``. Under ``generation.strategy: beam_sample`` the
  decoder must be one that beam-samples (its class sets ``beam_sampling``: ``beam_sample``, ``dsbd``),
  run with ``W = generation.beam_width``; any other decoder is a configuration error naming both keys;
- old knowledge: ``old_knowledge.decoder`` with the parameters under which it writes the target's
  greedy text (old knowledge is lossless).
"""
from __future__ import annotations

from typing import Any

from laser.decoders import DecoderChoice, available_decoders, resolve_decoder
from pipelines.config import JobConfig
from pipelines.knowledge.validation import JobInputError


def new_knowledge_decoder(cfg: JobConfig) -> DecoderChoice:
    """The decoder and checked parameters that write new knowledge, and the sampling they must honour."""
    name, params = cfg.decoder.name, dict(cfg.decoder.params)
    if cfg.generation.strategy == "beam_sample":
        params = _beam_sample_params(cfg, name, params)
    choice = resolve_job_decoder(name, params, "decoder", cfg.model.name)
    _check_sampling(choice, cfg.generation.sampling())
    return choice


def old_knowledge_decoder(cfg: JobConfig) -> DecoderChoice:
    """``old_knowledge.decoder`` with the parameters under which it writes the target's greedy text."""
    name = cfg.old_knowledge.decoder
    cls = available_decoders().get(name)
    params = cls.greedy_params() if cls is not None else {}
    if params is None:
        raise JobInputError(f"old_knowledge.decoder: decoder {name!r} cannot write greedy text; choose one whose "
                            "greedy_params() is not None (e.g. autoregressive)")
    return resolve_job_decoder(name, params, "old_knowledge.decoder", cfg.model.name)


def check_job_decoders(cfg: JobConfig) -> DecoderChoice:
    """Every decoder the job will build, checked before any work (and before hours of old knowledge);
    returns the new-knowledge one."""
    if cfg.old_knowledge.generate_missing:
        check_engine(cfg, old_knowledge_decoder(cfg), "old_knowledge.decoder")
    return check_engine(cfg, new_knowledge_decoder(cfg), "decoder.name")


def check_engine(cfg: JobConfig, choice: DecoderChoice, key: str) -> DecoderChoice:
    """Refuse a decoder the job's ``execution.engine`` cannot run (its class lists its ``engines``)."""
    engine = cfg.execution.engine
    if engine not in choice.cls.engines:
        able = sorted(n for n, c in available_decoders().items() if engine in c.engines and c.produces == "text")
        raise JobInputError(f"execution.engine={engine}: {key}={choice.name!r} has no {engine} form (it runs on "
                            f"{list(choice.cls.engines)}); set {key} to one of {able} or execution.engine: hf")
    return choice


def resolve_job_decoder(name: str, params: dict[str, Any], key: str = "decoder", model: str | None = None,
                        produces: str = "text") -> DecoderChoice:
    """:func:`laser.decoders.resolve_decoder` with its errors as :class:`JobInputError` (exit code 2)."""
    try:
        return resolve_decoder(name, params, key=key, model=model, produces=produces)
    except ValueError as exc:
        raise JobInputError(str(exc)) from None


def _beam_sample_params(cfg: JobConfig, name: str, params: dict[str, Any]) -> dict[str, Any]:
    width = cfg.generation.beam_width
    cls = available_decoders().get(name)
    if cls is None or not cls.beam_sampling:
        samplers = sorted(n for n, c in available_decoders().items() if c.beam_sampling)
        raise JobInputError(f"generation.strategy=beam_sample: decoder.name={name!r} cannot beam-sample; set "
                            f"decoder.name to one of {samplers}")
    if params.get("W", width) != width:
        raise JobInputError(f"decoder.params.W={params['W']} conflicts with generation.beam_width={width} under "
                            "generation.strategy=beam_sample; set the width once, in generation.beam_width")
    return {**params, "W": width}


def _check_sampling(choice: DecoderChoice, sampling: dict[str, Any] | None) -> None:
    """Refuse sampling settings (``generation.temperature`` etc.) the decoder cannot honour."""
    if not sampling:
        return
    from laser.sampling import SamplingParams

    try:
        choice.cls.refuse_sampling(SamplingParams(float(sampling["temperature"]), float(sampling["top_p"]),
                                                  int(sampling["top_k"])), choice.params)
    except ValueError as exc:
        raise JobInputError(f"generation.temperature={sampling['temperature']}: decoder {choice.name!r} refuses "
                            f"it: {exc}") from None
