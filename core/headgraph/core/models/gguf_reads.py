"""One parse of a GGUF file for everything that reads it during one load.

``gguf.GGUFReader`` parses every metadata field when it is built (SmolLM2-135M's 49k-token
vocabulary and merges: about 7 s of one core), and loading a runnable GGUF builds it about six
times: headgraph's own reads (attention tensors, metadata, parameter count, norm gains) and
transformers' (config, weights, tokenizer); transformers' weight-name map also rebuilds gguf's
tensor-name table once per module of the model (about 10 s more). Inside ``shared_reads(file)``
every reader of that file, headgraph's and (through ``gguf.GGUFReader``) transformers', is one
parse, and the name table is built once per (architecture, blocks). A reader is a read-only
memory map and the table a constant, so sharing them changes no value. Outside every scope
nothing is kept: a large vocabulary's parsed fields take hundreds of MB.

The reader is ``NamingReader``: a ``GGUFReader`` whose tensor errors name the tensor and which
refuses a tensor that appears twice.
"""

from __future__ import annotations

import functools
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any


class GGUFTensorError(ValueError):
    """A GGUF tensor whose data cannot be mapped (past the file's end, an unknown type)."""

    def __init__(self, name: str, cause: BaseException) -> None:
        super().__init__(f"tensor {name[:80]!r} cannot be read ({type(cause).__name__}: "
                         f"{' '.join(str(cause).split())[:160]}): the file is truncated or the "
                         "tensor's declared shape is larger than its data")


@functools.lru_cache(maxsize=1)
def _classes() -> tuple[type, Callable[..., Any]]:
    """(NamingReader, gguf's own get_tensor_name_map), made once from gguf's originals."""
    import gguf

    class NamingReader(gguf.GGUFReader):
        """GGUFReader whose tensor errors name the tensor (its own say "cannot reshape")."""

        def _build_tensors(self, start_offs: int, fields: list[Any]) -> None:
            built: list[Any] = []
            for field in fields:
                name = bytes(field.parts[1]).decode("utf-8", "replace")
                try:
                    super()._build_tensors(start_offs, [field])
                except (ValueError, OverflowError, TypeError, IndexError, KeyError) as err:
                    raise GGUFTensorError(name, err) from err
                built.extend(self.tensors)
            names = Counter(t.name for t in built)
            twice = [n for n, c in names.items() if c > 1]
            if twice:
                raise ValueError(f"tensor {twice[0][:80]!r} appears twice")
            self.tensors = built

    return NamingReader, gguf.get_tensor_name_map


_lock = threading.RLock()
_open: dict[str, list[Any]] = {}  # real path -> [its reader or None, open scopes]
_scopes = 0


def parse(path: str | os.PathLike[str]) -> Any:
    """A NamingReader of ``path``: the scope's one parse inside ``shared_reads`` of that file,
    else a new one. Errors as GGUFReader's (GGUFTensorError for a tensor's data)."""
    key = os.path.realpath(path)
    with _lock:
        slot = _open.get(key)
        if slot is not None:
            if slot[0] is None:
                slot[0] = _classes()[0](str(path), "r")
            return slot[0]
    return _classes()[0](str(path), "r")


def _reader_for_others(path: Any, mode: str = "r") -> Any:
    """What ``gguf.GGUFReader(path, mode)`` gives while a scope is open (transformers' reads)."""
    if mode == "r":
        return parse(path)
    return _classes()[0](path, mode)


@functools.lru_cache(maxsize=16)
def _name_map(arch: Any, n_blocks: int) -> Any:
    return _classes()[1](arch, n_blocks)


@contextmanager
def shared_reads(path: str | os.PathLike[str]) -> Iterator[None]:
    """Within: one parse of ``path`` for every reader of it in this process (``parse`` and
    ``gguf.GGUFReader``), one tensor-name table per (architecture, blocks). Nestable,
    thread-safe; readers of other files are built as usual."""
    import gguf

    global _scopes
    key = os.path.realpath(path)
    with _lock:
        if _scopes == 0:
            _classes()
            gguf.GGUFReader = _reader_for_others  # type: ignore[misc,assignment]
            gguf.get_tensor_name_map = _name_map  # type: ignore[assignment]
        _scopes += 1
        slot = _open.setdefault(key, [None, 0])
        slot[1] += 1
    try:
        yield
    finally:
        with _lock:
            slot[1] -= 1
            if slot[1] == 0:
                _open.pop(key, None)
            _scopes -= 1
            if _scopes == 0:
                reader_class, name_map = _classes()
                gguf.GGUFReader = reader_class.__mro__[1]  # type: ignore[misc]
                gguf.get_tensor_name_map = name_map
                _name_map.cache_clear()


__all__ = ["GGUFTensorError", "parse", "shared_reads"]
