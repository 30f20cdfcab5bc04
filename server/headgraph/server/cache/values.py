"""The checksummed format of a stored result: ``MAGIC`` (magic + format version) + a blake2b
digest of the payload + the pickled payload.

Kept apart from the cache folders it is stored in (:mod:`headgraph.server.cache.folders`): the store
encodes and checks values itself. Anything that is not such a value (flipped bytes, a truncated
file, an entry of an older format, a class that no longer unpickles) raises :class:`BadValue`.
"""

from __future__ import annotations

import hashlib
import hmac
import pickle
from typing import Any

from headgraph.server.errors import one_line

MAGIC = b"HGV\x01"  # "headgraph value", format version 1
DIGEST_SIZE = 32
HEADER_SIZE = len(MAGIC) + DIGEST_SIZE


class BadValue(Exception):
    """A stored value that is not ours or not intact (the message says which)."""


def _digest(payload: bytes | memoryview) -> bytes:
    return hashlib.blake2b(payload, digest_size=DIGEST_SIZE).digest()


def encode_value(value: Any) -> bytes:
    """``MAGIC`` + blake2b(payload) + payload, payload = ``value`` pickled."""
    payload = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    return MAGIC + _digest(payload) + payload


def check_value(raw: Any) -> memoryview:
    """The payload of a stored value whose header and digest are intact; BadValue otherwise."""
    if not isinstance(raw, (bytes, bytearray, memoryview)):
        raise BadValue(f"of an older format ({type(raw).__name__}, not checksummed bytes)")
    view = memoryview(raw)
    if len(view) < HEADER_SIZE or view[: len(MAGIC)] != MAGIC:
        raise BadValue(f"not a checksummed value (no header; {len(view)} bytes)")
    payload = view[HEADER_SIZE:]
    if not hmac.compare_digest(bytes(view[len(MAGIC):HEADER_SIZE]), _digest(payload)):
        raise BadValue(f"damaged (checksum mismatch; {len(view)} bytes)")
    return payload


def decode_value(raw: Any) -> Any:
    """The value stored as ``raw`` by :func:`encode_value`; BadValue when it is not intact or
    cannot be unpickled."""
    payload = check_value(raw)
    try:
        return pickle.loads(payload)
    except Exception as err:  # intact bytes of a class that moved or changed
        raise BadValue(f"not loadable ({type(err).__name__}: {one_line(err, 200)})") from err
