"""The API's vocabulary (GET /api/vocabulary): roles, pairings, metrics, limits, head names.

The dashboard defines none of these itself, nor the bounds of the requests it sends: each app
process reads them from its server once, lazily and thread-safely (:class:`VocabularyCache`),
and passes a :class:`Vocabulary` to the pure state functions (``parse_query`` and friends), so
those stay testable without a server.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from headgraph.frontend.api import answers

# The paper's O -> Q / K / V pairings (the API's ``graph_pairings``), for the pure functions that
# hold no Vocabulary: the graph's verdicts, the pair panel's data-weighted PK, the report.
O_PAIRINGS: tuple[str, ...] = ("OQ", "OK", "OV")


def head_label(layer: int, head: int, *, kv: bool = False) -> str:
    """A head's name as the API writes it (its ``head_pattern``): ``"L{layer}H{head}"``, or
    ``"L{layer}KV{group}"`` for a grouped-query KV head."""
    return f"L{int(layer)}{'KV' if kv else 'H'}{int(head)}"


@dataclass(frozen=True)
class Limits:
    """The API's bounds on one request that the page keeps to (the vocabulary's ``limits``,
    each the server's limit of that name): its inputs offer no more, its requests ask no more."""

    recovery_k_max: int  # k of GET /api/recovery
    ablation_top_max: int  # edges one GET /api/ablation measures
    timeline_edges_max: int  # k of GET /api/timeline
    circuit_steps_max: int  # EAP-IG's steps of GET /api/circuit
    circuit_pairs_min: int  # a bundled task's prompt pairs (GET /api/circuit pairs): the fewest
    circuit_pairs_max: int  # ... and the most
    threshold_magnitude_max: float  # |threshold| of GET /api/graph

    @classmethod
    def from_json(cls, data: answers.Limits) -> Limits:
        """The page's limits from the vocabulary's ``limits`` object (which holds more)."""
        ints = {name: int(data[name]) for name in ("recovery_k_max", "ablation_top_max", "timeline_edges_max",
                                                   "circuit_steps_max", "circuit_pairs_min", "circuit_pairs_max")}
        return cls(**ints, threshold_magnitude_max=float(data["threshold_magnitude_max"]))


@dataclass(frozen=True)
class Vocabulary:
    """Names the API understands, as served by GET /api/vocabulary."""

    roles: tuple[str, ...]
    pairings: tuple[str, ...]
    graph_pairings: tuple[str, ...]
    cs_modes: tuple[str, ...]
    grid_metrics: tuple[str, ...]
    rank_metrics: tuple[str, ...]
    orders: tuple[str, ...]
    k_max: int  # the k of a top-k graph or ranking (the server's graph_k_max)
    default_k: int
    head_pattern: str
    limits: Limits
    head_re: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "head_re", re.compile(self.head_pattern))

    @classmethod
    def from_json(cls, data: answers.VocabularyOut) -> Vocabulary:
        """A Vocabulary from the endpoint's JSON body."""
        return cls(roles=tuple(data["roles"]), pairings=tuple(data["pairings"]),
                   graph_pairings=tuple(data["graph_pairings"]), cs_modes=tuple(data["cs_modes"]),
                   grid_metrics=tuple(data["grid_metrics"]), rank_metrics=tuple(data["rank_metrics"]),
                   orders=tuple(data.get("orders", ())), k_max=int(data["k_max"]),
                   default_k=int(data["default_k"]), head_pattern=str(data["head_pattern"]),
                   limits=Limits.from_json(data["limits"]))

    def is_head(self, text: Any) -> bool:
        """True for a head name the API accepts ("L9H6", or "L6KV1" for a grouped KV head)."""
        return isinstance(text, str) and self.head_re.match(text) is not None

    @property
    def metrics(self) -> tuple[str, ...]:
        """The dashboard's metric switch: the API's grid metrics (PK raw / normalized / z, CKA,
        Procrustes), then "cs" (Composition Score)."""
        return (*self.grid_metrics, "cs")

    @property
    def cs_pairings(self) -> tuple[str, ...]:
        """Pairings that have a Composition Score (O -> one of the CS modes), e.g. OQ, OK, OV."""
        return tuple(p for p in self.pairings if p[0] == "O" and p[1] in self.cs_modes)


class VocabularyCache:
    """Fetches the vocabulary on first use, once per app process (thread-safe)."""

    def __init__(self) -> None:
        self._value: Vocabulary | None = None
        self._lock = threading.Lock()

    def get(self, fetch: Callable[[], answers.VocabularyOut]) -> Vocabulary:
        """The vocabulary; ``fetch()`` (the GET) runs only while none is held yet."""
        value = self._value
        if value is not None:
            return value
        with self._lock:
            if self._value is None:
                self._value = Vocabulary.from_json(fetch())
            return self._value
