"""Server configuration, read once from ``HEADGRAPH_*`` environment variables.

pydantic-settings is not a dependency, so this is a frozen dataclass with a
``from_env`` constructor; ``create_app(Settings(...))`` takes one directly in tests.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TypeVar

DEFAULT_MODELS: tuple[str, ...] = ("demo", "gpt2", "bigscience/bloom-560m", "Qwen/Qwen2-0.5B-Instruct")
DEVICES: tuple[str, ...] = ("auto", "cpu", "cuda")
N = TypeVar("N", int, float)
MIN_TOKEN_LENGTH = 16
SERVE_CONNECTIONS = 512  # open connections one ``headgraph serve`` process keeps (503 beyond)


def check_token(token: str) -> None:
    """Refuse a token that would silently weaken auth: blank, padded or short."""
    if not token.strip() or token != token.strip():
        raise ValueError("the API token must not be blank or padded with whitespace")
    if len(token) < MIN_TOKEN_LENGTH:
        raise ValueError(f"the API token must have at least {MIN_TOKEN_LENGTH} characters "
                         f"(got {len(token)}); e.g. python -c 'import secrets; "
                         "print(secrets.token_urlsafe(24))'")


def _number(env: Mapping[str, str], name: str, default: N, lo: N, hi: N, kind: type[N]) -> N:
    """``env[name]`` parsed as ``kind`` (int or float) and bounded to [lo, hi]; unset -> default."""
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        value = kind(raw)
    except ValueError as err:
        noun = "an integer" if kind is int else "a number"
        raise ValueError(f"{name}={raw!r} is not {noun}") from err
    if not lo <= value <= hi:
        raise ValueError(f"{name}={value} must be in [{lo}, {hi}]")
    return value


@dataclass(frozen=True)
class Settings:
    """Everything the API service needs to know about its deployment.

    cache_dir: diskcache folder (results, job states, counters; survives restarts).
    models: registry names offered by GET /api/models ("demo" is always available).
    model_root: folder whose sub-folders (with config.json, or a .gguf) are local checkpoints;
        None allows no local paths in the server.
    allow_any_path: let any local folder and any ``random:`` spec be a model (the CLI sets it;
        the server never does: it offers the random specs named in ``models``).
    device: "auto" (cuda when present) | "cpu" | "cuda".
    api_token: when set, write/compute endpoints need ``Authorization: Bearer <token>``.
    workers: uvicorn worker processes for ``serve`` and compute threads per process.
    cache_size_gb: size bound of the result cache (least-recently-stored eviction).
    model_lru: loaded models kept in memory per process.
    lock_expire_s: a single-flight lock not refreshed for this long is abandoned
        (its holder died); live holders refresh it every third of that.
    torch_threads: intra-op threads per process (None: CPU count / worker processes, so
        several workers do not oversubscribe the CPUs).
    compute_nice: the nice level compute processes run at (an absolute level: a server
        started under `nice` keeps its own level for them, never adds this to it).
    compute_processes: spawned compute processes per lane of each API process, where models
        are loaded and cold results computed (0: compute in the API process's own threads).
    compute_lanes: 3: a page's requests, compute jobs' stages and the stages of small jobs
        (a whole plan estimated at seconds: a small model's) have their own compute processes
        (a model used by several is loaded in each), so neither a view nor a small model's job
        waits for a big model's stage; 2: small jobs share the jobs' processes; 1: all share
        them, a page's requests first (for a model too big to load twice).
    cold_per_client: cold computations one client (an address, or the token holders) may
        have running at once in one API process; more wait in the client's queue.
    cold_queue_per_client: distinct cold computations one client may have waiting (429 beyond).
    body_timeout_s: seconds a client has to send a whole request body (408 after).
    forwarded_allow_ips: addresses of proxies whose X-Forwarded-For / -Proto headers are
        trusted (uvicorn's forwarded_allow_ips); empty (the default): none, so a client's
        address is the connection's and no client can name itself another.
    header_timeout_s: seconds a connection has to send a request's headers (closed after),
        so half-open connections cannot hold the server's connection slots.
    connections_per_client: connections one address may hold open at once in one API process
        (refused with 429 beyond; a trusted proxy is not capped), below SERVE_CONNECTIONS so
        one client cannot take every slot and turn health into a 503.
    response_cache_mb: rendered warm responses kept in memory per process (0: none).
    """

    cache_dir: Path = field(default_factory=lambda: Path("~/.cache/headgraph").expanduser())
    models: tuple[str, ...] = DEFAULT_MODELS
    model_root: Path | None = None
    allow_any_path: bool = False
    device: str = "auto"
    api_token: str | None = None
    workers: int = 1
    cache_size_gb: float = 20.0
    model_lru: int = 2
    lock_expire_s: float = 30.0
    torch_threads: int | None = None
    compute_nice: int = 10
    compute_processes: int = 1
    compute_lanes: int = 3
    cold_per_client: int = 2
    cold_queue_per_client: int = 32
    body_timeout_s: float = 20.0
    header_timeout_s: float = 10.0
    connections_per_client: int = 64
    forwarded_allow_ips: str = ""
    response_cache_mb: float = 256.0

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"device {self.device!r} must be one of {list(DEVICES)}")
        if self.workers < 1:
            raise ValueError("workers must be >= 1")
        if self.cache_size_gb <= 0:
            raise ValueError("cache_size_gb must be > 0")
        if self.api_token is not None:
            check_token(self.api_token)
        object.__setattr__(self, "cache_dir", Path(self.cache_dir).expanduser())
        if self.model_root is not None:
            object.__setattr__(self, "model_root", Path(self.model_root).expanduser().resolve())
        names = tuple(dict.fromkeys(m.strip() for m in self.models if m.strip()))
        if "demo" not in names:
            names = ("demo",) + names
        object.__setattr__(self, "models", names)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: object) -> Settings:
        """Read HEADGRAPH_* variables (``env`` defaults to os.environ); ``overrides`` win."""
        env = os.environ if env is None else env
        models_raw = env.get("HEADGRAPH_MODELS", "").strip()
        root_raw = env.get("HEADGRAPH_MODEL_ROOT", "").strip()
        raw_token = env.get("HEADGRAPH_API_TOKEN", "")
        token = raw_token.strip() if raw_token else None
        if raw_token and not token:
            raise ValueError("HEADGRAPH_API_TOKEN is set but blank: give a real token "
                             f"({MIN_TOKEN_LENGTH}+ characters) or unset it")
        base = cls(
            cache_dir=Path(env.get("HEADGRAPH_CACHE_DIR", "").strip() or "~/.cache/headgraph"),
            models=tuple(models_raw.split(",")) if models_raw else DEFAULT_MODELS,
            model_root=Path(root_raw) if root_raw else None,
            device=(env.get("HEADGRAPH_DEVICE", "").strip() or "auto").lower(),
            api_token=token,
            workers=_number(env, "HEADGRAPH_WORKERS", 1, 1, 64, int),
            cache_size_gb=_number(env, "HEADGRAPH_CACHE_SIZE_GB", 20.0, 0.001, 100000.0, float),
            torch_threads=_number(env, "HEADGRAPH_TORCH_THREADS", 0, 0, 1024, int) or None,
            compute_nice=_number(env, "HEADGRAPH_COMPUTE_NICE", 10, 0, 19, int),
            compute_processes=_number(env, "HEADGRAPH_COMPUTE_PROCESSES", 1, 0, 64, int),
            compute_lanes=_number(env, "HEADGRAPH_COMPUTE_LANES", 3, 1, 3, int),
            cold_per_client=_number(env, "HEADGRAPH_COLD_PER_CLIENT", 2, 1, 64, int),
            cold_queue_per_client=_number(env, "HEADGRAPH_COLD_QUEUE_PER_CLIENT", 32, 0, 4096, int),
            body_timeout_s=_number(env, "HEADGRAPH_BODY_TIMEOUT_S", 20.0, 0.1, 3600.0, float),
            header_timeout_s=_number(env, "HEADGRAPH_HEADER_TIMEOUT_S", 10.0, 0.1, 3600.0, float),
            connections_per_client=_number(env, "HEADGRAPH_CONNECTIONS_PER_CLIENT", 64, 1,
                                           SERVE_CONNECTIONS // 2, int),
            forwarded_allow_ips=env.get("HEADGRAPH_FORWARDED_ALLOW_IPS", "").strip(),
            response_cache_mb=_number(env, "HEADGRAPH_RESPONSE_CACHE_MB", 256.0, 0.0, 1e6, float),
        )
        return replace(base, **overrides) if overrides else base

    @property
    def torch_device(self) -> str:
        """Concrete torch device: "auto" becomes cuda when present, else cpu."""
        if self.device != "auto":
            return self.device
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"

    @property
    def intra_op_threads(self) -> int:
        """Torch threads per worker process."""
        if self.torch_threads:
            return self.torch_threads
        return max(1, (os.cpu_count() or 1) // self.workers)

    @property
    def cache_size_bytes(self) -> int:
        return int(self.cache_size_gb * (1 << 30))
