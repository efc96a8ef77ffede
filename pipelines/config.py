"""The knowledge job's configuration schema (pydantic): every block forbids unknown keys, so a typo
fails with the dotted key named. Reading YAML and ``--set`` overrides live in ``jobs/config.py``.
"""

from __future__ import annotations

import difflib
import functools
import hashlib
import json
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PlainValidator,
    ValidationInfo,
    field_validator,
    model_validator,
)

from pipelines.data.config import DatasetConfig


class ConfigError(ValueError):
    """A job config that cannot be read or validated; the message names the file and the key."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class SplitConfig(_Strict):
    """What knowledge is written from (see pipelines/data/split.py)."""

    mode: Literal["latest", "paper"] = Field(
        default="latest",
        description="latest: each user's knowledge from their latest max_hist interactions, each item's "
        "from its attributes, pools from earlier runs' knowledge (production); paper: the paper's simulated "
        "old/new split with an old-knowledge pass (benchmarks and the paper's studies)",
    )
    max_hist: int = Field(
        default=30,
        ge=1,
        description="latest: interactions a user's prompt shows (the newest); paper: "
        "old history = first min((n+1)//2, max_hist) interactions",
    )
    new_count: int | None = Field(
        default=None, ge=1, description="paper: interactions after the cut that form the new history (default max_hist)"
    )
    new_item_fraction: float = Field(
        default=0.5, ge=0.0, le=1.0, description="paper: the chance an item is new (a seeded hash of its id decides)"
    )


def _engine_arg(name: str) -> str:
    """A key of ``model.engine_args``: one of vLLM's ``EngineArgs`` names the job does not set itself."""
    problem = engine_arg_problem(name)
    if problem is not None:
        raise ValueError(problem)
    return name


EngineArgName = Annotated[str, AfterValidator(_engine_arg)]


class ModelConfig(_Strict):
    """The target LLM, as transformers and vLLM load it."""

    name: str = Field(default="smollm2-135m", description="bundled name, local path or cached hub id")
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    revision: str | None = Field(
        default=None,
        description="hub revision (branch, tag or commit) of the model and its tokenizer; null: the repo's default",
    )
    trust_remote_code: bool = Field(
        default=False, description="run the model repo's own code (transformers and vLLM); only for repos you trust"
    )
    max_model_len: int | None = Field(
        default=None,
        ge=16,
        description="vLLM: prompt + output tokens per request; null: the model's own context length, cut to what "
        "the KV cache holds",
    )
    engine_args: dict[EngineArgName, Any] = Field(
        default_factory=dict,
        description="vLLM's own engine arguments (its EngineArgs names), passed to the engine as they are; "
        "those the job sets itself are refused, naming the key that sets them",
    )

    def loading(self) -> dict[str, Any]:
        """The keywords transformers' ``from_pretrained`` takes for this model (``laser.load_model``)."""
        return {"revision": self.revision, "trust_remote_code": self.trust_remote_code}


class DecoderConfig(_Strict):
    """The decoder that writes new knowledge, by registry name, with its keyword parameters."""

    name: str = "laser"
    params: dict[str, Any] = Field(default_factory=dict, description="e.g. verification, k, p, K, n_max")


class GenerationConfig(_Strict):
    """Per-request generation limits."""

    max_new_tokens: int = Field(default=256, ge=1, description="tokens generated per entity at most")
    max_prompt_tokens: int | None = Field(
        default=1024, ge=16, description="user histories are cut (oldest first) to fit"
    )
    degenerate: Literal["retry", "keep", "retry_greedy", "fail"] = Field(
        default="retry",
        description="a degenerate, cut or fragment text (pipelines/quality/; docs/knowledge-quality.md): "
        "retry: regenerate it once, greedily with the retry_* rules, and keep the retry flagged; keep: keep it flagged; "
        "retry_greedy: regenerate a degenerate one with the greedy autoregressive decoder; fail: record it in "
        "failures.jsonl",
    )
    give_up_after: int = Field(
        default=3,
        ge=0,
        description="a run stops decoding an entity after this many identical "
        "failures in a row (same reason, inputs and generation config) and records it as given "
        "up in failures.jsonl; new inputs or another config try it again; 0 = never give up",
    )
    repetition_penalty: float = Field(
        default=1.0,
        gt=0.0,
        description="as generate's: logits of tokens already in the "
        "sequence are divided (positive) or multiplied (negative) by it; 1 = off",
    )
    no_repeat_ngram_size: int = Field(
        default=0, ge=0, description="as generate's: no token n-gram of this size twice; 0 = off"
    )
    min_new_tokens: int = Field(
        default=0, ge=0, description="as generate's: no end-of-sequence before this many new tokens"
    )
    stop_strings: list[str] = Field(
        default_factory=list,
        description="as generate's: stop after the token that completes one of these strings (it stays in the text)",
    )
    retry_repetition_penalty: float = Field(
        default=1.1,
        gt=0.0,
        description="degenerate retry: repetition penalty of the retry (the larger of this and repetition_penalty)",
    )
    retry_no_repeat_ngram_size: int = Field(
        default=3,
        ge=0,
        description="degenerate retry: no-repeat n-gram size of the retry "
        "(the smaller non-zero of this and no_repeat_ngram_size)",
    )
    ban_unsupported_genres: bool = Field(
        default=False,
        description="first texts, as retries: every form of a genre the "
        "entity's input does not have is banned (bad words), and every year but an item's own, so no text names one",
    )
    temperature: float = Field(default=0.0, ge=0.0, description="0 = greedy (the default); > 0 samples new knowledge")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="nucleus filter when sampling (1 = off)")
    top_k: int = Field(default=0, ge=0, description="top-k filter when sampling (0 = off)")
    seed: int = Field(
        default=0,
        ge=0,
        description="sampling seed; each entity draws from its own generator seeded by "
        "this seed and its type and id, so a re-run writes the same text",
    )
    strategy: Literal["default", "beam_sample"] = Field(
        default="default",
        description="default: the decoder writes one sampled (or greedy) text; beam_sample: beam sampling "
        "of width beam_width at temperature 1, the text is the beam of highest target log-probability (decoder "
        "decoder.name must be beam_sample or dsbd; see pipelines/knowledge/decoders.py)",
    )
    beam_width: int = Field(default=4, ge=1, description="W, the beams of strategy beam_sample")

    @model_validator(mode="after")
    def _beam_sampling_is_unwarped(self) -> "GenerationConfig":
        if self.strategy == "beam_sample" and (self.temperature not in (0.0, 1.0) or self.top_p < 1 or self.top_k):
            raise ValueError(
                "strategy beam_sample samples beams at temperature 1 without filters: generation."
                "temperature must be 0 or 1, top_p 1 and top_k 0; got temperature="
                f"{self.temperature}, top_p={self.top_p}, top_k={self.top_k}"
            )
        return self

    def rules(self) -> dict[str, Any]:
        """The generation rules handed to the actors (laser.GenerationRules keywords)."""
        return {
            "repetition_penalty": self.repetition_penalty,
            "no_repeat_ngram_size": self.no_repeat_ngram_size,
            "min_new_tokens": self.min_new_tokens,
            "stop_strings": tuple(self.stop_strings),
        }

    def retry_rules(self) -> dict[str, Any]:
        """The stronger rules of the ``retry`` policy's second attempt."""
        sizes = [n for n in (self.no_repeat_ngram_size, self.retry_no_repeat_ngram_size) if n > 0]
        return {
            **self.rules(),
            "repetition_penalty": max(self.repetition_penalty, self.retry_repetition_penalty),
            "no_repeat_ngram_size": min(sizes) if sizes else 0,
        }

    def sampling(self) -> dict[str, float | int]:
        """The sampling settings handed to the actors (see pipelines/knowledge/sampling.py); strategy beam_sample
        samples at temperature 1 (each entity's beams are seeded from ``seed``)."""
        temperature = 1.0 if self.strategy == "beam_sample" else self.temperature
        return {"temperature": temperature, "top_p": self.top_p, "top_k": self.top_k, "seed": self.seed}


class PromptsConfig(_Strict):
    """The prompt template and system prompt (pipelines/knowledge/prompts.py, docs/prompts.md)."""

    template: str | None = Field(
        default=None,
        description="a shipped template (movie, book, ecommerce, news) or the path of a team's own .j2 file; "
        "null: the shipped template named by dataset.domain (prompts.template wins when both are set)",
    )
    system: str | None = Field(default=None, description="the chat template's system message; null: none")

    @field_validator("template")
    @classmethod
    def _template_parses(cls, v: str | None) -> str | None:
        if v is not None:  # a missing file or a syntax error fails at config load, naming the file and line
            from pipelines.prompts.template import load_template

            load_template(v)
        return v


class OldKnowledgeConfig(_Strict):
    """Step 1: the old-knowledge store that pools are built from (generated where missing)."""

    path: str | None = Field(default=None, description="store directory; default <output.path>/old_knowledge")
    decoder: str = Field(
        default="autoregressive",
        description="decoder for missing old knowledge, run with its greedy_params() and without "
        "a pool (none exists yet), so it writes the model's greedy text",
    )
    max_new_tokens: int | None = Field(default=None, ge=1, description="default: generation.max_new_tokens")
    generate_missing: bool = Field(default=True, description="generate old knowledge the store lacks")


class EmbeddingsConfig(_Strict):
    """A team's own user/item vectors (Parquet), clustered instead of LightGCN's (routing.embeddings)."""

    users: str | None = Field(
        default=None, description="users' vectors: a Parquet file, folder, glob or URI (as dataset.path)"
    )
    items: str | None = Field(default=None, description="items' vectors, read as users")
    id_column: str = Field(default="id", min_length=1, description="the entity id column of both files")
    vector_column: str = Field(
        default="embedding", min_length=1, description="the vector column (list or fixed-size list of floats)"
    )

    @model_validator(mode="after")
    def _one_file(self) -> "EmbeddingsConfig":
        if self.users is None and self.items is None:
            raise ValueError("routing.embeddings: give users, items or both (a Parquet path each)")
        return self


class RoutingConfig(_Strict):
    """Steps 2 and 3: the binary router, the groups and the pools (see router/ and pools/)."""

    user_policy: Literal["warm_cold", "collaborative", "attribute"] = Field(
        default="warm_cold", description="warm_cold: warm users -> collaborative pool, cold -> attribute pool"
    )
    item_policy: Literal["warm_cold", "collaborative", "attribute"] = "attribute"
    warm_threshold: int = Field(default=5, ge=0, description="warm_cold: at least this many old interactions = warm")
    n_clusters: int = Field(default=8, ge=1, description="K-means groups over LightGCN embeddings, at least")
    target_group_size: int | None = Field(  # the pool cap: a pool holds its group (docs/results/README.md)
        default=2000,
        ge=1,
        description="groups follow the catalogue: max(n_clusters, ceil(entities / this)); null: n_clusters alone",
    )
    max_group_size: int = Field(
        default=200, ge=1, description="attribute groups larger than this split by sub-category"
    )
    max_pool_size: int = Field(default=2000, ge=1, description="most old-knowledge texts per pool (seeded sample)")
    global_pool_size: int = Field(
        default=20000,
        ge=1,
        description=(
            "most texts in a type's global pool (seeded sample), built only for a decoder that drafts from it (resd)"
        ),
    )
    retrain_share: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description=(
            "an incremental run keeps the last routing (no LightGCN, no K-means) while at most this share of the "
            "interactions is newer than the ones it was learned from; new entities go to their attribute group. "
            "0: route afresh every run"
        ),
    )
    pool_refresh_share: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description=(
            "a pool is rebuilt when more than this share of its texts changed since it was built (0: any change); "
            "otherwise it is kept as it was (its drafts come from texts at most this share out of date)"
        ),
    )
    pool_snapshots: bool = Field(
        default=False,
        description=(
            "also build each pool's trie in the pools step and save it (workers then load it instead of building "
            "it at first use)"
        ),
    )
    online_pools: bool = Field(
        default=True,
        description=(
            "groups with no earlier knowledge (a first run) draft from a pool that grows in each worker as it "
            "writes their texts (no wave waits for another); false: in waves (routing.first_wave)"
        ),
    )
    first_wave: float = Field(
        default=0.1,
        ge=0.0,
        le=1.0,
        description=(
            "with routing.online_pools false, groups with no earlier knowledge: this share of their entities (at "
            "least one a group) decodes first, drafting from its own prompt; the pools are then rebuilt from "
            "their texts for the rest; 0 = one wave"
        ),
    )
    lightgcn: dict[str, Any] = Field(default_factory=dict, description="LightGCN overrides: dim, layers, epochs, lr")
    embeddings: EmbeddingsConfig | None = Field(
        default=None, description="the team's own vectors for the collaborative groups; null: LightGCN's"
    )
    seed: int = 0

    @model_validator(mode="after")
    def _own_vectors_for_collaborative(self) -> "RoutingConfig":
        emb = self.embeddings
        for etype, policy in (("user", self.user_policy), ("item", self.item_policy)):
            if emb is not None and policy != "attribute" and getattr(emb, f"{etype}s") is None:
                raise ValueError(
                    f"routing.{etype}_policy {policy!r} needs {etype} vectors: set routing.embeddings.{etype}s "
                    f"or routing.{etype}_policy: attribute (LightGCN does not run when routing.embeddings is set)"
                )
        return self


def _auto_or_count(value: Any) -> int | str:
    """``auto`` or a whole number >= 1 (one message for both, naming what was given)."""
    if value == "auto" or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    raise ValueError(f"must be auto or a whole number greater than or equal to 1, got {value!r}")


AutoOrCount = Annotated[int | Literal["auto"], PlainValidator(_auto_or_count)]


class ExecutionConfig(_Strict):
    """Where and how wide the generation runs."""

    num_workers: AutoOrCount = Field(
        default="auto",
        description=(
            "generation actors; auto: one per node on CPU, one per gpus_per_worker share of the GPUs "
            "(measured: pipelines/workers/layout.py)"
        ),
    )
    threads_per_worker: AutoOrCount = Field(
        default="auto",
        description=("torch threads and Ray CPUs per actor; auto: the node's CPUs shared by the actors it holds"),
    )
    gpus_per_worker: float = Field(
        default=0.0,
        ge=0.0,
        description="Ray GPUs per actor (fractions share a GPU); > 0: the "
        "model loads on the GPU (dtype auto = bfloat16), 0: on the CPU",
    )
    address: str | None = Field(default=None, description="Ray address; null = local Ray started in-process")
    batch_size: int = Field(
        default=16, ge=1, description="requests decoding at once per worker (continuous-batching slots)"
    )
    pool_cache_size: int = Field(default=8, ge=1, description="pools an actor keeps loaded (LRU)")
    progress_timeout_s: float = Field(
        default=600.0,
        gt=0,
        description="a worker that holds requests and finishes none of them for this long has stalled: "
        "the run stops with one line naming it (exit 1) and releases the output",
    )
    engine: Literal["auto", "vllm", "hf"] = Field(
        default="auto",
        description=(
            "what runs the decoders in each actor: vllm (vLLM with LASER as its drafter; decoders with a vLLM form: "
            "autoregressive, laser, resd), hf (this package's tree-attention engine over transformers; every decoder) "
            "or auto: vllm where vLLM is installed for the actors' device and every decoder of the job has a vLLM "
            "form, else hf (the LASER_ENGINE environment variable, hf or vllm, overrides auto). docs/engines.md"
        ),
    )
    compile: bool | Literal["auto"] = Field(
        default="auto",
        description=(
            "vLLM only: torch.compile of the model at engine start (true: faster steps, a start of about 3 minutes "
            "the first time on a machine and 40 s later; false: a 12 s start); auto: true for runs of at least "
            "500 users and items, and for incremental runs (pipelines/workers/layout.py)"
        ),
    )

    gpu_memory_utilization: float | None = Field(
        default=None,
        gt=0.0,
        le=1.0,
        description=(
            "vLLM on GPUs: the fraction of each of an actor's GPUs its engine may fill (weights, activations, KV "
            "cache); null: 0.9 of the actor's share (0.9 x gpus_per_worker when actors share a GPU). An actor with "
            "several GPUs runs its engine tensor-parallel over them; the actor itself holds only the tokenizer"
        ),
    )

    @field_validator("gpus_per_worker")
    @classmethod
    def _whole_above_one(cls, v: float) -> float:
        if v > 1 and v != int(v):
            raise ValueError("above 1, gpus_per_worker must be a whole number of GPUs (Ray shares only fractions < 1)")
        return v

    @model_validator(mode="after")
    def _memory_within_share(self) -> "ExecutionConfig":
        share, want = self.gpus_per_worker, self.gpu_memory_utilization
        if want is not None and 0 < share < 1 and want > share:
            raise ValueError(
                f"gpu_memory_utilization {want:g} is more than an actor's share of its GPU "
                f"(gpus_per_worker {share:g}): the actors sharing that GPU would not fit"
            )
        return self


class OutputConfig(_Strict):
    """Where the job writes. ``path`` is the job directory (see README, "Running a job")."""

    path: str = Field(
        default="runs/job", description="job directory: a local path or an fsspec URI (s3://, gs://, ...)"
    )
    work_dir: str | None = Field(
        default=None,
        description=(
            "local directory for the derived files (routing, memberships, pools; rebuilt every run) when path is "
            "a URI; default $LASER_CACHE_DIR/work/<hash of path>; on a cluster, storage every node sees"
        ),
    )
    shard_rows: int = Field(default=256, ge=1, description="rows per knowledge Parquet shard")
    run_id: str | None = Field(default=None, description="default: a hash of the config, stable across resumes")


class MetricsConfig(_Strict):
    """Where the run's figures go besides summary.json (pipelines/ops/pushgateway.py)."""

    pushgateway: str | None = Field(
        default=None,
        description=(
            "a Prometheus Pushgateway (host:port or URL) the run's figures are pushed to when it ends; "
            "default $LASER_PUSHGATEWAY; none: no push"
        ),
    )
    job: str = Field(default="laser_knowledge", min_length=1, description="the job name on the Pushgateway")


class JobConfig(_Strict):
    """A whole knowledge-generation job."""

    dataset: DatasetConfig = Field(default_factory=DatasetConfig)
    split: SplitConfig = Field(default_factory=SplitConfig)
    model: ModelConfig = Field(default_factory=ModelConfig)
    decoder: DecoderConfig = Field(default_factory=DecoderConfig)
    generation: GenerationConfig = Field(
        default_factory=GenerationConfig, validate_default=True
    )  # checked against model
    old_knowledge: OldKnowledgeConfig = Field(default_factory=OldKnowledgeConfig)
    routing: RoutingConfig = Field(default_factory=RoutingConfig)
    execution: ExecutionConfig = Field(default_factory=ExecutionConfig, validate_default=True)  # checked against model
    output: OutputConfig = Field(default_factory=OutputConfig)
    prompts: PromptsConfig = Field(default_factory=PromptsConfig)
    metrics: MetricsConfig = Field(default_factory=MetricsConfig)

    @field_validator("decoder")
    @classmethod
    def _params_are_keywords(cls, v: DecoderConfig) -> DecoderConfig:
        bad = [k for k in v.params if not str(k).isidentifier()]
        if bad:
            raise ValueError(f"decoder.params keys must be keyword names, got {bad}")
        return v

    @field_validator("generation")
    @classmethod
    def _fits_max_model_len(cls, v: GenerationConfig, info: ValidationInfo) -> GenerationConfig:
        model, prompt = info.data.get("model"), v.max_prompt_tokens or 0
        if model is not None and model.max_model_len is not None and prompt + v.max_new_tokens > model.max_model_len:
            raise ValueError(
                f"generation.max_prompt_tokens {prompt} + max_new_tokens {v.max_new_tokens} exceed model.max_model_len "
                f"{model.max_model_len}: raise model.max_model_len or lower these"
            )
        return v

    @field_validator("execution")
    @classmethod
    def _engine_args_need_vllm(cls, v: ExecutionConfig, info: ValidationInfo) -> ExecutionConfig:
        model = info.data.get("model")
        if v.engine == "hf" and model is not None and model.engine_args:
            keys = ", ".join(f"model.engine_args.{k}" for k in model.engine_args)
            raise ValueError(f"engine hf takes no vLLM engine arguments ({keys}): remove them or set engine: vllm")
        return v

    def resolved_run_id(self) -> str:
        """``output.run_id`` or a short hash of everything that shapes the output (stable on resume)."""
        if self.output.run_id:
            return self.output.run_id
        # work_dir only says where derived files go: the same output under another work_dir is the same job;
        # the default strategy hashes as configs written before the strategy keys existed
        default = {"strategy", "beam_width"} if self.generation.strategy == "default" else set()
        # input rules added later hash only when set, so configs written before them keep their hash
        data_rules: dict[str, Any] = {
            k: True
            for k, v in (
                ("timestamp_format", "epoch"),
                ("rating_scale", None),
                ("feedback", "explicit"),
                ("event_weights", None),
                ("min_positive_weight", None),
            )
            if getattr(self.dataset, k) == v
        }
        data_rules["columns"] = {k for k in ("weight", "event") if getattr(self.dataset.columns, k) is None}
        model_rules = {  # so are the model's loading keys
            k
            for k, v in (("revision", None), ("trust_remote_code", False), ("max_model_len", None), ("engine_args", {}))
            if getattr(self.model, k) == v
        }
        unset = {k for k in ("template", "system") if getattr(self.prompts, k) is None}
        payload = self.model_dump(
            mode="json",
            exclude={
                "execution": True,
                "metrics": True,  # where figures go, not what the job writes
                "output": {"run_id", "work_dir"},
                "generation": default | {"give_up_after"},
                "dataset": data_rules,
                "model": model_rules,
                # prompt keys hash only when set, so configs written before them keep their run id
                "prompts": True if len(unset) == 2 else unset,
            },
        )  # give_up_after: a retry policy
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:12]


# ---- vLLM's own engine arguments (model.engine_args): the fields of the installed vLLM's EngineArgs, read
# from its source (never imported) when a config names one. JOB_SETS: what the job sets itself (refused either
# way) -> the config key or the engine's reason that sets it.
JOB_SETS: dict[str, str] = {
    "model": "model.name",
    "tokenizer": "model.name",
    "revision": "model.revision",
    "tokenizer_revision": "model.revision",
    "trust_remote_code": "model.trust_remote_code",
    "max_model_len": "model.max_model_len",
    "dtype": "model.dtype",
    "seed": "dataset.seed",
    "max_num_seqs": "execution.batch_size",
    "enforce_eager": "execution.compile",
    "tensor_parallel_size": "execution.gpus_per_worker",
    "gpu_memory_utilization": "execution.gpu_memory_utilization",
    "speculative_config": "decoder.name and decoder.params (LASER is the job's drafter)",
    "enable_prefix_caching": "the job's engine (drafts and prompts share cached KV blocks)",
    "max_num_batched_tokens": "the job's engine (from execution.batch_size and the longest draft)",
    "block_size": "the job's engine (the prefix cache's unit)",
}


@functools.cache
def vllm_engine_arg_names() -> frozenset[str] | None:
    """The fields of the installed vLLM's ``EngineArgs``, parsed from its source (None: no vLLM, or no such class)."""
    from laser.vllm.requirements import class_fields, installed_source

    source = installed_source()
    return None if source is None else class_fields(source, "vllm.engine.arg_utils", "EngineArgs")


def engine_arg_problem(name: str) -> str | None:
    """Why ``name`` cannot be one of ``model.engine_args`` (None: it can)."""
    if name in JOB_SETS:
        return f"the job sets vLLM's {name} itself, from {JOB_SETS[name]}: set it there"
    known = vllm_engine_arg_names()
    if known is None or name in known:
        return None
    close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.7)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    if close and close[0] in JOB_SETS:
        hint += f" (the job sets that one itself, from {JOB_SETS[close[0]]})"
    return f"not one of vLLM's engine arguments (the fields of its EngineArgs){hint}"
