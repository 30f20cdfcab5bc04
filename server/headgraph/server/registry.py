"""Which models the server offers and how a ``model=`` parameter resolves to a core spec.

Model ids (always passed as the ``model`` query parameter, never a path segment):

- ``demo``: the built-in trained demo model (always available offline);
- hub names from HEADGRAPH_MODELS such as ``gpt2`` or ``Qwen/Qwen2-0.5B-Instruct`` (status
  read from the local Hugging Face cache without touching the network);
- ``local:<folder>``: a sub-folder of HEADGRAPH_MODEL_ROOT holding a config.json;
- an absolute path: allowed only inside the model root (or anywhere for the CLI).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

from headgraph.core.errors import PathNotAllowed
from headgraph.core.hf_hub import cached_snapshot, hub_offline_flag
from headgraph.core.random_models import RANDOM_PREFIX
from headgraph.server.errors import NotFound
from headgraph.server.settings import Settings

BUILTIN_MODELS: tuple[str, ...] = ("demo",)
LOCAL_PREFIX = "local:"


def _core_dir() -> Path:
    """Where the installed headgraph.core lives (its code and the demo weights stamp builtins)."""
    import headgraph.core

    return Path(headgraph.core.__file__).resolve().parent


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: its API id, the spec core.loading gets, and where it comes from."""

    id: str
    spec: str
    kind: str  # "builtin" | "random" | "hub" | "local"
    path: Path | None = None


@dataclass(frozen=True)
class ModelEntry:
    """A listed model and whether it can be loaded right now."""

    ref: ModelRef
    status: str  # "available" | "not cached" | "not available offline"
    message: str


def hub_snapshot(repo_id: str) -> str | None:
    """Commit hash of a complete local snapshot of ``repo_id`` (config, weights, tokenizer) in the
    Hugging Face cache, as core.loading would boot it; None when not cached. No network."""
    folder = cached_snapshot(repo_id)
    return None if folder is None else folder.name


def _tree_stamp(folder: Path, *, recursive: bool) -> str:
    """Digest of names, sizes and mtimes of the files in a folder (cheap change detector)."""
    h = hashlib.sha256(str(folder).encode())
    files = folder.rglob("*") if recursive else folder.iterdir()
    for p in sorted(files):
        if p.is_file() and "__pycache__" not in p.parts:
            st = p.stat()
            h.update(f"{p.relative_to(folder)}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def listed_ref(name: str) -> ModelRef:
    """A model named in HEADGRAPH_MODELS: ``random:<preset|config>[@seed]`` builds random
    weights here (core.random_models), any other name is a Hugging Face hub id."""
    return ModelRef(name, name, "random" if name.startswith(RANDOM_PREFIX) else "hub")


class Registry:
    """Resolve model ids and list the models a deployment offers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._builtin_stamp: str | None = None  # core files do not change under a running process

    # -- listing ------------------------------------------------------------------------
    def local_folders(self) -> list[Path]:
        """Sub-folders of the model root that hold a config.json."""
        root = self.settings.model_root
        if root is None or not root.is_dir():
            return []
        return sorted(p for p in root.iterdir() if p.is_dir() and (p / "config.json").is_file())

    def entries(self) -> list[ModelEntry]:
        """Built-in, hub (from settings) and local models with their availability."""
        out = [ModelEntry(ModelRef(n, n, "builtin"), "available", "built-in, always available")
               for n in BUILTIN_MODELS]
        for name in self.settings.models:
            if name in BUILTIN_MODELS:
                continue
            ref = listed_ref(name)
            out.append(ModelEntry(ref, "available", "random weights built from a config (no download)")
                       if ref.kind == "random" else self._hub_entry(name))
        for folder in self.local_folders():
            ref = ModelRef(LOCAL_PREFIX + folder.name, str(folder), "local", folder)
            out.append(ModelEntry(ref, "available", f"local checkpoint {folder}"))
        return out

    def _hub_entry(self, name: str) -> ModelEntry:
        ref = ModelRef(name, name, "hub")
        if hub_snapshot(name) is not None:
            return ModelEntry(ref, "available", "in the local Hugging Face cache")
        how = (f"download it where the hub is reachable (huggingface-cli download {name}) "
               "into this machine's HF cache (HF_HOME)")
        if hub_offline_flag():
            return ModelEntry(ref, "not available offline", f"not in the local cache; {how}")
        return ModelEntry(ref, "not cached", f"not in the local cache; first use downloads it, or {how}")

    def allowed_ids(self) -> list[str]:
        return [e.ref.id for e in self.entries()]

    # -- resolving ----------------------------------------------------------------------
    def resolve(self, model: str) -> ModelRef:
        """ModelRef for an id; NotFound lists the allowed ids, PathNotAllowed refuses paths."""
        model = (model or "").strip()
        if model in BUILTIN_MODELS:
            return ModelRef(model, model, "builtin")
        if model in self.settings.models:
            return listed_ref(model)
        if model.startswith(LOCAL_PREFIX):
            name = model[len(LOCAL_PREFIX):]
            for folder in self.local_folders():
                if folder.name == name:
                    return ModelRef(model, str(folder), "local", folder)
            raise NotFound(f"unknown local model {model!r}; allowed: {self.allowed_ids()}",
                           allowed=self.allowed_ids())
        if model.startswith(("/", "./", "../", "~")) or (os.sep in model and Path(model).exists()):
            return self.resolve_path(Path(model))
        raise NotFound(f"unknown model {model!r}; allowed: {self.allowed_ids()}",
                       allowed=self.allowed_ids())

    def resolve_path(self, path: Path) -> ModelRef:
        """A local folder as a model; inside the model root unless ``allow_any_path``."""
        folder = path.expanduser().resolve()
        root = self.settings.model_root
        if not self.settings.allow_any_path:
            if root is None:
                raise PathNotAllowed(f"local paths are not allowed: no model root is configured "
                                     f"(set HEADGRAPH_MODEL_ROOT); got {str(path)!r}")
            if not folder.is_relative_to(root):
                raise PathNotAllowed(f"{str(path)!r} is outside the model root {str(root)!r}")
        if not (folder / "config.json").is_file():
            raise NotFound(f"{str(path)!r} is not a model folder (no config.json)")
        mid = (LOCAL_PREFIX + folder.name if root is not None and folder.parent == root
               else str(folder))
        return ModelRef(mid, str(folder), "local", folder)

    # -- identity -----------------------------------------------------------------------
    def stamp(self, ref: ModelRef) -> str | None:
        """Cheap identity of the weights ``ref`` loads (None: unknown until loaded).

        Built-in: the core package files (demo weights and code); hub: the cached snapshot
        commit; local: names, sizes and mtimes of the folder's files; random: None (its
        weights are fingerprinted once built).
        """
        if ref.kind == "builtin":
            if self._builtin_stamp is None:
                self._builtin_stamp = "builtin:" + _tree_stamp(_core_dir(), recursive=True)
            return self._builtin_stamp
        if ref.kind == "hub":
            snap = hub_snapshot(ref.spec)
            return None if snap is None else "hub:" + snap
        if ref.path is not None and ref.path.is_dir():
            return "local:" + _tree_stamp(ref.path, recursive=False)
        return None
