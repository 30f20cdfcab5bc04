"""The Hugging Face hub as seen offline-first: switches, reachability, the local cache, errors.

``load_model`` boots a hub name from its cached snapshot when the whole snapshot (config,
weights, tokenizer) is on disk; otherwise it downloads, unless the hub is switched off
(HF_HUB_OFFLINE / TRANSFORMERS_OFFLINE) or cannot be reached, in which case the user gets a
``ModelUnavailable`` saying how to get the model, never a raw traceback. Nothing here downloads.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import socket
from pathlib import Path
from urllib.parse import urlparse

from headgraph.core.errors import InvalidInput, ModelUnavailable
from headgraph.core.models.tokenizer import has_tokenizer

# A cached snapshot counts as complete only with one of these (and a tokenizer).
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")


def hub_offline_flag() -> bool:
    """True when HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE switches the hub off."""
    flags = (os.environ.get("HF_HUB_OFFLINE", ""), os.environ.get("TRANSFORMERS_OFFLINE", ""))
    return any(f.strip().lower() in ("1", "true", "yes", "on") for f in flags)


def hub_reachable(timeout: float = 2.0) -> bool:
    """Quick TCP check of the hub endpoint (HF_ENDPOINT); DNS included, bounded by ``timeout``."""
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    host, port = url.hostname or "huggingface.co", url.port or (443 if url.scheme != "http" else 80)

    def connect() -> bool:
        with socket.create_connection((host, port), timeout=timeout):
            return True

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        return bool(pool.submit(connect).result(timeout=timeout + 0.5))
    except (OSError, concurrent.futures.TimeoutError):
        return False
    finally:
        pool.shutdown(wait=False)


def hub_cache_dir() -> str | None:
    """HF hub cache folder from HF_HUB_CACHE / HF_HOME as set now (None: the library default)."""
    if os.environ.get("HF_HUB_CACHE"):
        return os.environ["HF_HUB_CACHE"]
    if os.environ.get("HF_HOME"):
        return os.path.join(os.environ["HF_HOME"], "hub")
    return None


def cached_snapshot(repo_id: str) -> Path | None:
    """Folder of the locally cached snapshot of ``repo_id`` if it holds config, weights and
    tokenizer (no network); else None."""
    try:
        from huggingface_hub import try_to_load_from_cache

        found = try_to_load_from_cache(repo_id, "config.json", cache_dir=hub_cache_dir())
    except Exception:
        return None
    if not isinstance(found, str):
        return None
    folder = Path(found).parent
    has_weights = any((folder / f).is_file() for f in WEIGHT_FILES)
    return folder if has_weights and has_tokenizer(folder) else None


def how_to_get(name: str) -> str:
    """Instructions appended to every ModelUnavailable for ``name``."""
    return (f"to use {name!r}, run headgraph once where the Hugging Face hub is reachable "
            f"(with HF_HUB_OFFLINE unset or 0) so it is cached, or download it "
            f"(huggingface-cli download {name} --local-dir <folder>) and pass that folder, "
            "or point HF_HOME at a cache that already holds it")


def check_hub_name(name: str) -> None:
    """InvalidInput unless ``name`` looks like a hub repo id (``owner/model`` or ``model``)."""
    if not re.fullmatch(r"[A-Za-z0-9][\w.\-]*(/[\w.\-]+)?", name):
        raise InvalidInput(f"{name!r} is not 'demo', 'random:<preset>', an existing folder "
                           "or a Hugging Face model name")


def hub_unavailable(name: str) -> ModelUnavailable | None:
    """Why ``name`` (not cached) cannot be downloaded now: hub switched off or unreachable; None
    when a download may be tried."""
    if hub_offline_flag():
        return ModelUnavailable(f"{name!r} is not in the local Hugging Face cache and the hub is "
                                f"switched off (HF_HUB_OFFLINE=1); {how_to_get(name)}")
    if not hub_reachable():
        return ModelUnavailable(f"{name!r} is not in the local Hugging Face cache and the hub "
                                f"cannot be reached from this machine; {how_to_get(name)}")
    return None


def fetch_failed(name: str, err: BaseException) -> ModelUnavailable:
    """The error for a download of ``name`` that failed with ``err`` (HTTP, network, bad id)."""
    return ModelUnavailable(f"could not fetch {name!r} from the Hugging Face hub "
                            f"({type(err).__name__}: {err}); {how_to_get(name)}")


def is_network_error(err: BaseException) -> bool:
    """True for network client errors that are not OSError (httpx, requests, urllib3)."""
    return type(err).__module__.split(".")[0].startswith(("httpx", "requests", "urllib3"))
