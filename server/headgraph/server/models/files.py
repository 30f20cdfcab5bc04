"""Cheap file-level facts the model registry reads: whether a path is a folder, a file or a
model folder (never raising on a bad path), and stamps of files and folders (names, sizes,
mtimes, inodes, ctimes) that change when the weights under a model id change."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from headgraph.core.models.gguf_file import is_gguf_spec


def stat_stamp(st: os.stat_result) -> str:
    """Size, mtime, inode and ctime of a file: a same-size file swapped in with its old mtime
    restored still changes its inode (a rename) or its ctime (a write, or the mtime reset)."""
    return f"{st.st_size}|{st.st_mtime_ns}|{st.st_ino}|{st.st_ctime_ns}"


def tree_stamp(folder: Path, *, recursive: bool) -> str:
    """Digest of names and stat stamps of the files in a folder (cheap change detector)."""
    h = hashlib.sha256(str(folder).encode())
    files = folder.rglob("*") if recursive else folder.iterdir()
    for p in sorted(files):
        if p.is_file() and "__pycache__" not in p.parts:
            h.update(f"{p.relative_to(folder)}|{stat_stamp(p.stat())}\n".encode())
    return h.hexdigest()[:16]


def file_stamp(path: Path) -> str:
    """Digest of one file's path and stat stamp (cheap change detector)."""
    return hashlib.sha256(f"{path}|{stat_stamp(path.stat())}".encode()).hexdigest()[:16]


def is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except (OSError, ValueError):
        return False


def is_file(path: Path) -> bool:
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def is_model_folder(path: Path) -> bool:
    """A folder holding a config.json, or a .gguf file and no config.json."""
    return is_dir(path) and (is_file(path / "config.json") or is_gguf_spec(path))
