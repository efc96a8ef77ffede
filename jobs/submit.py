"""Running a job config on a Ray cluster through Ray Jobs submission.

Before anything is sent, the whole config and the decoders' parameters are validated locally, and a
relative ``output.path`` is refused (on the cluster it would land in the job's temporary working
directory); an ``output.path`` URI (``s3://...``) needs its fsspec filesystem installed and an absolute
``output.work_dir`` on shared storage for the pools the actors read.

The job ships its own code as one **wheel** of the project in ``runtime_env.py_modules``: Ray pip-installs a
``.whl`` there into the runtime env's folder on every node (``pip install --target``, the ``pip`` on the node's
``PATH``) and puts that folder on ``PYTHONPATH``, so the wheel's ``dist-info`` registers the project's entry
points (vLLM's ``vllm.general_plugins: laser``, ``laser.pool_stores: pools``) in the driver, every actor and the
processes they start (vLLM's engine core). Shipped package folders registered none, so a node without the
project installed had no vLLM plug-in: the folder shipping is gone, there is no reason left for it. The wheel is
built from the source tree (``pip wheel --no-deps --no-build-isolation``, offline) or taken from ``--wheel``; it
is shipped with its ``Requires-Dist`` removed (``pip install --target`` ignores what is installed, so declared
dependencies would be installed again, torch included, into every job's folder) and with a build tag made of a
hash of its contents, since Ray names an uploaded wheel by its file name alone and would reuse a stale
``laser_knowledge-0.1.0`` otherwise.

``working_dir`` is a fresh folder holding only the config file (every path a config names is absolute, so the job
needs nothing else beside it), or an explicit ``--working-dir`` from which dotfiles and secret-looking files
(``*token*``, ``*secret*``, keys) are excluded; what is uploaded is logged before the submission, and the
entrypoint is ``python -m jobs run CONFIG ...``, so a cluster with the dependencies (torch, transformers, ray,
...; or ``--pip``) and ``pip`` but without this project installed runs it. With token authentication on the
cluster (``RAY_AUTH_MODE=token``), the token comes from ``--token-file``, ``RAY_AUTH_TOKEN`` or
``RAY_AUTH_TOKEN_PATH`` and is sent as a bearer header.
"""

from __future__ import annotations

import asyncio
import base64
import fnmatch
import hashlib
import logging
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path
from typing import Any, Callable

from jobs.config import JobConfig, load_config
from pipelines.store.location import is_uri

log = logging.getLogger(__name__)

PROJECT = "laser-knowledge"
# the source tree's packages (pyproject.toml's [tool.setuptools.packages.find] include), copied to build the wheel
PACKAGES = ("laser", "pools", "router", "pipelines", "jobs", "benchmarks", "training")
EXCLUDES = ["__pycache__", "*.pyc", "*.png", "results/"]
# never uploaded from an explicit --working-dir: dotfiles (.env, .git, ...; ".?*", since Ray matches ".*" against
# the folder itself, "."), and files that look like secrets
SECRET_EXCLUDES = [
    ".?*",
    "*token*",
    "*secret*",
    "*credential*",
    "*password*",
    "*.pem",
    "*.key",
    "id_rsa*",
    "id_dsa*",
    "id_ecdsa*",
    "id_ed25519*",
    "*.p12",
    "*.pfx",
    "*.jks",
    "*.keystore",
    "*.env",
    "kubeconfig*",
    "*.tfstate*",
    "*.tfvars",
]
# what a file holding a secret says, whatever its name (read in the first MiB of each file)
SECRET_CONTENT = re.compile(
    rb"-----BEGIN [A-Z ]*PRIVATE KEY-----|aws_secret_access_key|\bAKIA[0-9A-Z]{16}\b|\"private_key\"\s*:"
    rb"|\"type\"\s*:\s*\"service_account\"|\bgh[pousr]_[A-Za-z0-9]{36}\b|\bxox[baprs]-[A-Za-z0-9-]{10,}"
)
AGENT_WAIT_S = 120  # how long a submission retries while the cluster's job agent is not up yet


class SubmitError(ValueError):
    """The job cannot be submitted as configured (message names the key)."""


class AuthError(RuntimeError):
    """The cluster refused the submission's credentials."""


def entrypoint(config_name: str, overrides: list[str] | None = None, extra: list[str] | None = None) -> str:
    """The shell command the cluster runs: ``python -m jobs run CONFIG --set k=v ...`` (each argument quoted)."""
    args = ["python", "-m", "jobs", "run", config_name, *(extra or [])]
    for item in overrides or []:
        args += ["--set", item]
    return shlex.join(args)


def source_root() -> Path:
    """The project's source tree (the folder holding ``pyproject.toml`` beside ``jobs/``); SubmitError if none."""
    root = Path(__file__).resolve().parents[1]
    pyproject = root / "pyproject.toml"
    if not pyproject.is_file() or f'name = "{PROJECT}"' not in pyproject.read_text():
        raise SubmitError(
            f"{root}: no source tree of {PROJECT} to build the job's wheel from (the project is installed, not "
            "checked out); pass a built wheel with --wheel FILE"
        )
    return root


def build_wheel(into: Path) -> Path:
    """A wheel of the source tree, built offline in a copy under ``into`` (the tree itself gets no build files)."""
    root, src, out = source_root(), into / "src", into / "dist"
    src.mkdir(parents=True)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(root / name, src / name)
    for name in PACKAGES:
        shutil.copytree(root / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q"]
    env = {**os.environ, "SOURCE_DATE_EPOCH": "315532800"}  # fixed zip times: same code, same wheel
    res = subprocess.run([*cmd, "-w", str(out), str(src)], env=env, capture_output=True, text=True)
    wheels = sorted(out.glob("*.whl"))
    if res.returncode != 0 or len(wheels) != 1:
        last = (res.stderr.strip().splitlines() or ["no wheel written"])[-1]
        raise SubmitError(f"building the job's wheel from {root} failed: {last}")
    return wheels[0]


def cluster_wheel(wheel: Path, into: Path) -> Path:
    """``wheel`` as shipped: no ``Requires-Dist`` (the nodes provide the dependencies) and a content-hash build
    tag in its file name (``laser_knowledge-0.1.0-1<hash>-py3-none-any.whl``); written into ``into``."""
    parts = wheel.name[: -len(".whl")].split("-")
    if len(parts) not in (5, 6) or parts[0] != PROJECT.replace("-", "_"):
        raise SubmitError(f"--wheel {wheel}: not a wheel of {PROJECT} (laser_knowledge-VERSION-...-py3-none-any.whl)")
    try:
        with zipfile.ZipFile(wheel) as zf:
            files = {name: zf.read(name) for name in zf.namelist()}
    except (OSError, zipfile.BadZipFile) as exc:
        raise SubmitError(f"--wheel {wheel}: {exc}") from None
    info = f"{parts[0]}-{parts[1]}.dist-info"
    if f"{info}/METADATA" not in files:
        raise SubmitError(f"--wheel {wheel}: no {info}/METADATA inside")
    _replace(files, info, "METADATA", _without_requirements(files[f"{info}/METADATA"]))
    digest = hashlib.sha256(b"".join(n.encode() + b"\0" + files[n] for n in sorted(files))).hexdigest()[:16]
    out = into / ("-".join([parts[0], parts[1], f"1{digest}", *parts[-3:]]) + ".whl")
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as zf:
        for name in sorted(files):
            zf.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), files[name], zipfile.ZIP_DEFLATED)
    return out


def _without_requirements(metadata: bytes) -> bytes:
    lines = metadata.decode().split("\n")
    return "\n".join(line for line in lines if not line.startswith("Requires-Dist:")).encode()


def _replace(files: dict[str, bytes], info: str, name: str, data: bytes) -> None:
    """Set ``info/name`` to ``data`` and its line in ``info/RECORD`` (path,sha256=...,size) to match."""
    path = f"{info}/{name}"
    files[path] = data
    sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    record = files[f"{info}/RECORD"].decode().splitlines()
    lines = [f"{path},sha256={sha},{len(data)}" if r.split(",", 1)[0] == path else r for r in record]
    files[f"{info}/RECORD"] = ("\n".join(lines) + "\n").encode()


def project_wheel(into: Path, wheel: str | Path | None = None) -> Path:
    """The wheel the job ships (``runtime_env.py_modules``): ``wheel`` or one built from the source tree."""
    built = Path(wheel) if wheel is not None else build_wheel(into / "build")
    if not built.is_file():
        raise SubmitError(f"--wheel {built}: no such file")
    into.mkdir(parents=True, exist_ok=True)
    return cluster_wheel(built, into)


def runtime_env(
    working_dir: Path, wheel: Path, pip: list[str] | None = None, env: dict[str, str] | None = None
) -> dict[str, Any]:
    """Ray runtime env: ``working_dir`` (see :func:`stage`), the project's ``wheel``, optional pip packages and env vars."""
    out: dict[str, Any] = {
        "working_dir": str(working_dir.resolve()),
        "py_modules": [str(wheel.resolve())],
        "excludes": EXCLUDES + SECRET_EXCLUDES + content_excludes(working_dir),
    }
    if pip:
        out["pip"] = list(pip)
    if env:
        out["env_vars"] = dict(env)
    return out


def stage(config: Path, into: Path) -> Path:
    """A working dir holding only ``config`` (copied into ``into``); returns it."""
    shutil.copy2(config, into / config.name)
    return into


def uploaded_files(working_dir: Path) -> list[str]:
    """The files of ``working_dir`` that the submission uploads (after the excludes, by name and by
    content: :func:`content_excludes`), relative paths."""
    secret = set(content_excludes(working_dir))
    out = []
    for rel in _named_uploads(working_dir):
        if "/" + rel.as_posix() in secret:
            log.warning("not uploading %s: it holds what looks like a private key or a cloud credential", rel)
        else:
            out.append(str(rel))
    return out


def _named_uploads(working_dir: Path) -> list[Path]:
    """The files of ``working_dir`` that no name pattern excludes, relative paths."""
    patterns = [e.rstrip("/") for e in EXCLUDES + SECRET_EXCLUDES]
    out = []
    for path in sorted(working_dir.rglob("*")):
        rel = path.relative_to(working_dir)
        if path.is_file() and not any(fnmatch.fnmatch(part, pat) for part in rel.parts for pat in patterns):
            out.append(rel)
    return out


def holds_secret(path: Path) -> bool:
    """Whether the file's first MiB holds a private key, a cloud credential or an access token."""
    try:
        with open(path, "rb") as fh:
            return SECRET_CONTENT.search(fh.read(2**20)) is not None
    except OSError:
        return False


def content_excludes(working_dir: Path) -> list[str]:
    """Ray exclude patterns (anchored at the working dir) for the files no name pattern excludes that
    :func:`holds_secret` finds."""
    return ["/" + rel.as_posix() for rel in _named_uploads(working_dir) if holds_secret(working_dir / rel)]


def _config_in(working_dir: Path, config: Path) -> str:
    """The config's path inside an explicit working dir (the entrypoint runs there)."""
    try:
        rel = config.resolve().relative_to(working_dir.resolve())
    except ValueError:
        raise SubmitError(f"--working-dir {working_dir}: the config {config} is not inside it") from None
    if rel.as_posix() not in uploaded_files(working_dir):
        raise SubmitError(
            f"--working-dir {working_dir}: the config {rel} is excluded from the upload (a dotfile or "
            "a secret-looking name); rename it"
        )
    return rel.as_posix()


def validate(config: Path, overrides: list[str]) -> JobConfig:
    """The config as the cluster will read it; raises ConfigError / SubmitError / ValueError naming the key."""
    from pipelines.knowledge.job import check_job

    cfg = load_config(config, overrides)
    for key, value in (
        ("output.path", cfg.output.path),
        ("old_knowledge.path", cfg.old_knowledge.path),
        ("dataset.path", cfg.dataset.path),
    ):
        if value and not is_uri(value) and not Path(value).is_absolute():
            raise SubmitError(
                f"{key}: {value!r} is relative; on the cluster it would resolve inside the job's "
                f"temporary working directory. Pass an absolute path on storage every node shares, "
                f"e.g. --set {key}={Path(value).resolve()}"
            )
    if is_uri(cfg.output.path):
        check_uri_output(cfg)
    check_job(cfg)  # every step's checks, as `laser run` makes them on the cluster
    return cfg


def check_uri_output(cfg: JobConfig) -> None:
    """An output URI needs its filesystem here and a work directory every node sees (actors read the pools)."""
    from pipelines.store.location import Location, StorageError

    try:
        Location.of(cfg.output.path)
    except StorageError as exc:
        raise SubmitError(f"output.path: {exc}") from None
    work = cfg.output.work_dir
    if not work or not Path(work).is_absolute():
        raise SubmitError(
            f"output.path: {cfg.output.path!r} is a URI, so the derived files (routing, pools) need "
            f"output.work_dir: an absolute path on storage every node shares (got {work!r})"
        )


def auth_headers(token_file: str | Path | None = None) -> dict[str, str]:
    """``Authorization: Bearer <token>`` from ``token_file``, ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH``; {} if none."""
    token = None
    if token_file is not None:
        token = Path(token_file).expanduser().read_text().strip()
    elif os.environ.get("RAY_AUTH_TOKEN"):
        token = os.environ["RAY_AUTH_TOKEN"].strip()
    elif os.environ.get("RAY_AUTH_TOKEN_PATH"):
        token = Path(os.environ["RAY_AUTH_TOKEN_PATH"]).expanduser().read_text().strip()
    return {"Authorization": f"Bearer {token}"} if token else {}


def _loopback(address: str) -> bool:
    """Whether ``address`` names this machine (a token sent there crosses no network)."""
    from urllib.parse import urlparse

    host = urlparse(address).hostname or ""
    return host == "localhost" or host.startswith("127.") or host == "::1"


def client(address: str, token_file: str | Path | None = None) -> Any:
    """A JobSubmissionClient for ``address``; AuthError with the fix when the cluster wants a token."""
    from ray.job_submission import JobSubmissionClient

    headers = auth_headers(token_file)
    if headers and address.startswith("http://") and not _loopback(address):
        log.warning(
            "%s: sending the cluster's token over plain http; anyone on the path can read it (use https, "
            "or a tunnel to the head node)",
            address,
        )
    try:
        return JobSubmissionClient(address, headers=headers or None)
    except Exception as exc:  # ray raises its own AuthenticationError (a ConnectionError subclass)
        if "uthenticat" in str(exc) or "Unauthorized" in str(exc) or "Forbidden" in str(exc):
            raise AuthError(
                f"{address}: the cluster requires token authentication and refused this client "
                "(pass --token-file FILE, or set RAY_AUTH_TOKEN / RAY_AUTH_TOKEN_PATH to the cluster's "
                "token; `ray get-auth-token` on the head prints it)"
            ) from exc
        raise


def submit(
    config: str | Path,
    address: str,
    overrides: list[str] | None = None,
    pip: list[str] | None = None,
    env: dict[str, str] | None = None,
    submission_id: str | None = None,
    token_file: str | Path | None = None,
    incremental: bool = False,
    working_dir: str | Path | None = None,
    wheel: str | Path | None = None,
) -> str:
    """Validate the config locally, then submit it as a Ray job at ``address``; returns the job id.

    Uploads the config alone (or ``working_dir`` minus dotfiles and secret-looking files) and the project as a
    wheel (``wheel``, else built from the source tree; see the module docstring), and logs the list. The job inside the cluster connects to it (``execution.address=auto``)
    unless an override says otherwise.
    """
    path = Path(config)
    overrides = list(overrides or [])
    if not any(o.split("=", 1)[0].strip() == "execution.address" for o in overrides):
        overrides.append("execution.address=auto")
    validate(path, overrides)  # fail here, naming the bad key, rather than on the cluster
    extra = ["--incremental"] if incremental else []
    c = client(address, token_file)
    with (
        tempfile.TemporaryDirectory(prefix="laser-submit-") as tmp,
        tempfile.TemporaryDirectory(prefix="laser-wheel-") as build,
    ):
        whl = project_wheel(Path(build), wheel)
        wd = Path(working_dir) if working_dir is not None else stage(path, Path(tmp))
        name = _config_in(wd, path) if working_dir is not None else path.name
        files = uploaded_files(wd)
        log.info(
            "uploading to %s: working_dir %s (%d files: %s%s); code: %s (%d KiB)",
            address,
            wd,
            len(files),
            ", ".join(files[:10]),
            " ..." if len(files) > 10 else "",
            whl.name,
            whl.stat().st_size // 1024,
        )
        kwargs = {
            "entrypoint": entrypoint(name, overrides, extra),
            "runtime_env": runtime_env(wd, whl, pip, env),
            "submission_id": submission_id,
        }
        return _submit_with_retry(c, address, kwargs)


def _submit_with_retry(c: Any, address: str, kwargs: dict[str, Any]) -> str:
    deadline = time.monotonic() + AGENT_WAIT_S
    while True:
        try:
            return c.submit_job(**kwargs)
        except RuntimeError as exc:  # a cluster that just started has no job agent registered yet
            if "try again later" not in str(exc) or time.monotonic() > deadline:
                raise
            log.info("%s: %s; retrying", address, exc)
            time.sleep(2)


def follow(
    address: str, job_id: str, token_file: str | Path | None = None, write: Callable[[str], Any] = sys.stdout.write
) -> int:
    """Stream the job's logs until it ends; its exit status: 0 when it succeeded, else the driver's exit code
    (1 when Ray does not know it, e.g. the job was stopped)."""
    from ray.job_submission import JobStatus

    c = client(address, token_file)

    async def tail() -> None:
        async for lines in c.tail_job_logs(job_id):
            write(lines)

    asyncio.run(tail())
    info = c.get_job_info(job_id)
    while not info.status.is_terminal():  # the log stream can close just before the status is final
        time.sleep(0.5)
        info = c.get_job_info(job_id)
    log.info("job %s: %s", job_id, info.status)
    if info.status == JobStatus.SUCCEEDED:
        return 0
    code = getattr(info, "driver_exit_code", None)
    return int(code) if code else 1
