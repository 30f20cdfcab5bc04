"""Confining local model folders to a model root, after resolving every link and index entry.

A folder inside the root may still read files from anywhere: a file symlink (``model.safetensors
-> /elsewhere/x``), a symlinked folder, or a ``*.index.json`` whose ``weight_map`` names an
absolute path or ``../x`` (transformers joins it to the folder as given). ``check_model_folder``
refuses all three before anything is loaded. Messages name only what the caller gave (or paths
relative to the folder), never the root, a link target or whether something outside exists:
``check_root`` confines a spec, ``quoted`` bounds a caller's value in a message, and
``scrub`` / ``scrubbed`` replace server paths (a folder, the root, the HF cache) in the messages
of errors raised while loading.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from headgraph.core.errors import HeadgraphError, InvalidInput, PathNotAllowed, UnsupportedModel
from headgraph.core.models.hub import hub_cache_dir

# Entries looked at per folder (a model folder holds a few dozen files; bounded against abuse).
MAX_FOLDER_ENTRIES = 10_000
MAX_INDEX_BYTES = 64 << 20


def real(path: str | os.PathLike[str]) -> str:
    """``os.path.realpath`` that never raises (over-long names, NUL bytes: the path as given,
    made absolute and normalised, which then fails the containment checks)."""
    try:
        return os.path.realpath(os.fspath(path))
    except (OSError, ValueError):
        return os.path.normpath(os.path.abspath(os.fspath(path)))


def is_within(path: str | os.PathLike[str], root: str | os.PathLike[str]) -> bool:
    """True when ``path`` (already real) equals ``root`` (already real) or lies under it."""
    p, r = os.fspath(path), os.fspath(root)
    return p == r or p.startswith(r.rstrip(os.sep) + os.sep)


def plain_file_name(name: object) -> bool:
    """A weight-map entry that can only name a file directly in its folder."""
    return (isinstance(name, str) and bool(name) and name not in (".", "..")
            and not any(c in name for c in ("/", "\\", "\x00")) and not os.path.isabs(name)
            and len(name.encode("utf-8", "surrogatepass")) <= 255)


def index_files(folder: Path) -> list[str]:
    """Plain file names a checkpoint index (``*.index.json``) in ``folder`` points to.

    UnsupportedModel for an index that is not JSON or has no ``weight_map`` object;
    PathNotAllowed for an entry that is not a plain file name in the folder (an absolute
    path, ``../x``, ``sub/x``)."""
    names: set[str] = set()
    for entry in sorted(os.listdir(folder)):
        if entry.endswith(".index.json"):
            names.update(weight_map_files(folder / entry))
    return sorted(names)


def weight_map_files(index: Path) -> list[str]:
    """The distinct file names one index's ``weight_map`` names, each checked to be a plain
    file name (PathNotAllowed otherwise)."""
    names: set[str] = set()
    for value in read_weight_map(index, index.name).values():
        if not plain_file_name(value):
            raise PathNotAllowed(f"{index.name}: weight_map entries must be plain file names in "
                                 "the model folder (no absolute paths, no '..', no '/')")
        names.add(value)
    return sorted(names)


def read_weight_map(path: Path, shown: str) -> dict[str, Any]:
    """The ``weight_map`` object of a checkpoint index file; UnsupportedModel when unreadable."""
    try:
        if path.stat().st_size > MAX_INDEX_BYTES:
            raise UnsupportedModel(f"{shown}: checkpoint index larger than {MAX_INDEX_BYTES} bytes")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        raise UnsupportedModel(f"{shown}: checkpoint index is not readable JSON") from None
    weight_map = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(weight_map, dict):
        raise UnsupportedModel(f"{shown}: checkpoint index has no weight_map object")
    return weight_map


def check_model_folder(folder: str | os.PathLike[str], root: str | os.PathLike[str], *,
                       shown: str) -> Path:
    """The real path of ``folder`` once every readable file in it is confined to ``root``.

    ``folder`` itself, every file and sub-folder under it (links followed) and every
    ``weight_map`` entry of its index files must resolve inside ``root`` (both compared as real
    paths); PathNotAllowed otherwise, whose message names ``shown`` (what the caller gave) and
    the offending entry relative to the folder, never where it points.
    """
    root_real = real(root)
    folder_real = real(folder)
    outside = f"{shown} is outside the model root"
    if not is_within(folder_real, root_real):
        raise PathNotAllowed(outside)
    if not os.path.isdir(folder_real):
        return Path(folder_real)
    seen = 0
    for dirpath, dirnames, filenames in os.walk(folder_real, followlinks=False):
        for entry in dirnames + filenames:
            seen += 1
            if seen > MAX_FOLDER_ENTRIES:
                raise UnsupportedModel(f"{shown}: more than {MAX_FOLDER_ENTRIES} files in the "
                                       "model folder")
            full = os.path.join(dirpath, entry)
            if not is_within(real(full), root_real):
                rel = os.path.relpath(full, folder_real)
                raise PathNotAllowed(f"{shown}: {rel!r} in the model folder links outside the "
                                     "model root; model files must lie inside it")
    for name in index_files(Path(folder_real)):
        if not is_within(real(os.path.join(folder_real, name)), root_real):
            raise PathNotAllowed(f"{shown}: weight file {name!r} links outside the model root; "
                                 "model files must lie inside it")
    return Path(folder_real)


# -- what messages show ------------------------------------------------------------------

def quoted(text: object, limit: int = 120) -> str:
    """``repr`` of a caller's value, bounded (it goes into messages)."""
    s = repr(str(text))
    return s if len(s) <= limit else s[: limit - 4] + "...'"


def check_root(path: str | Path, model_root: str | None, *, shown: str | None = None) -> Path:
    """Real path of ``path``; PathNotAllowed unless inside ``model_root`` (when one is given;
    ``~`` is then taken literally). The message names only ``shown`` or ``path`` as given:
    neither where it resolves, nor the root, nor whether it exists."""
    text = str(path)
    if model_root is None:
        try:
            text = os.path.expanduser(text)
        except (RuntimeError, KeyError, ValueError):
            pass
        return Path(real(text))
    resolved = real(text)
    if "\x00" in text or not is_within(resolved, real(model_root)):
        raise PathNotAllowed(f"{shown or quoted(path)} is outside the allowed model root")
    return Path(resolved)


def scrub(text: str, name: str, folder: Path | None, model_root: str | None) -> str:
    """``text`` with server paths (the folder, the model root, the HF cache) replaced by
    ``name`` / a placeholder, so messages about a model never show where it lives."""
    for path, shown in ((folder, name), (model_root, "<model root>"),
                        (_hf_cache(), "<HF cache>")):
        if path:
            for form in sorted({str(path), real(path)}, key=len, reverse=True):
                if len(form) > 1:
                    text = text.replace(form, shown)
    return text


def scrubbed(err: HeadgraphError, name: str, folder: Path | None, model_root: str | None
              ) -> HeadgraphError:
    """``err`` itself, or the same kind of error with its message scrubbed (``scrub``)."""
    message = scrub(str(err), name, folder, model_root)
    if message == str(err):
        return err
    if isinstance(err, InvalidInput):
        return type(err)(message, allowed=err.allowed) if type(err) is InvalidInput \
            else InvalidInput(message, allowed=err.allowed)
    return type(err)(message)


def _hf_cache() -> str | None:
    found = hub_cache_dir()
    if found is None:
        try:
            from huggingface_hub import constants

            found = str(constants.HF_HUB_CACHE)
        except Exception:  # pragma: no cover - huggingface_hub ships with transformers
            return None
    return found
