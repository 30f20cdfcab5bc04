"""headgraph's one vocabulary: roles, pairings, layer orders, metrics, limits and head names.

Everything that names a thing across core, server and frontend is defined here once; the
server derives its query types from it and serves it at ``GET /api/vocabulary``, where the
frontend reads it. Bad names raise :class:`~headgraph.core.errors.InvalidInput` (a 4xx for
the server), never a bare ValueError.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any, Literal, get_args

from headgraph.core.errors import InvalidInput

Role = Literal["Q", "K", "V", "O"]
ROLES: tuple[Role, ...] = get_args(Role)
# Source role then target role. The paper's three O -> Q/K/V pairings lead the list.
Pairing = Literal["OQ", "OK", "OV", "QQ", "QK", "QV", "QO", "KQ", "KK", "KV", "KO",
                  "VQ", "VK", "VV", "VO", "OO"]
PAIRINGS: tuple[Pairing, ...] = get_args(Pairing)
GraphPairing = Literal["OQ", "OK", "OV"]
GRAPH_PAIRINGS: tuple[GraphPairing, ...] = get_args(GraphPairing)
LayerOrder = Literal["forward", "all", "same-layer"]
LAYER_ORDERS: tuple[LayerOrder, ...] = get_args(LayerOrder)
CSMode = Literal["Q", "K", "V"]
CS_MODES: tuple[CSMode, ...] = get_args(CSMode)
# What a grid of pair scores can show, and what a ranking of pairs can be ordered by: PK (raw,
# normalized, z), CS, and the PK paper's baselines linear CKA and orthogonal Procrustes
# (core.scores.similarity, on PK's pairs).
GridMetric = Literal["raw", "normalized", "z", "cka", "procrustes"]
GRID_METRICS: tuple[GridMetric, ...] = get_args(GridMetric)
RankMetric = Literal["pk", "normalized", "cs", "z", "cka", "procrustes"]
RANK_METRICS: tuple[RankMetric, ...] = get_args(RankMetric)
SimilarityKind = Literal["cka", "procrustes"]
SIMILARITY_KINDS: tuple[SimilarityKind, ...] = get_args(SimilarityKind)
# How a ranking's rows get CKA / Procrustes besides a ranked one: from grids already cached
# (never computing one; each costs about as much as PK's), or computing both.
SimilarityMode = Literal["cached", "compute"]
SIMILARITY_MODES: tuple[SimilarityMode, ...] = get_args(SimilarityMode)
# Limits core enforces itself (the server's other request limits: headgraph.server.limits, which
# re-exports these; GET /api/vocabulary ``limits`` serves them all by their names lower-cased).
# The k of one top-k graph (edges per pairing) or ranking (pairs): past a few hundred a list is
# no longer read, and 1000 keeps an answer (and a cached result) small on any model.
GRAPH_K_MAX = 1000
DEFAULT_K = 20  # the paper's top-20 edges per pairing
# The (best) edges per pairing a thresholded graph keeps: a threshold near zero passes every
# pair of a large model (millions), which neither a browser nor a cache entry should hold.
THRESHOLD_EDGES_MAX = 2000
THRESHOLD_DIGITS = 3  # thresholds are rounded to this many significant digits (a finite key grid)
THRESHOLD_FLOOR = 1e-6  # thresholds nearer zero than this are zero
PERCENT_STEP = 0.1  # top-percent parameters are multiples of this
# Subgraph queries (core.graphs.subgraph): what they rank by, and their bounds.
SUBGRAPH_RANK_ON: tuple[str, ...] = ("pk", "normalized", "cs", "z")
SUBGRAPH_QUERIES: tuple[str, ...] = ("heads", "neighbourhood", "layers")
SUBGRAPH_CAP = 300  # edges one subgraph answer keeps unless asked for more
SUBGRAPH_CAP_MAX = THRESHOLD_EDGES_MAX  # edges one subgraph answer keeps: as many as a thresholded graph
SUBGRAPH_DEPTH_MAX = 4  # steps out from one head: a neighbourhood, not the whole graph
SUBGRAPH_HEADS_MAX = 512  # names in one head set: every head of a mid-sized model (GPT-2 medium: 384)
# Circuit discovery (core.circuits): the bundled tasks, EAP-IG's steps and an uploaded task's size.
BUNDLED_TASKS: tuple[str, ...] = ("ioi", "induction", "successor", "ioi-mib", "addition",
                                  "subtraction", "mcqa")  # core.circuits.bundled builds them
CIRCUIT_STEPS_MAX = 64  # EAP-IG's integration steps: each is one more forward and backward pass per batch
TASK_ROWS_MAX = 512  # prompt pairs in one task: the work grows with them (a forward and backward pass each, per step)
TASK_TOKENS_MAX = 256  # tokens in one prompt: a task's prompts are short sentences, not documents


def quantize_threshold(value: float) -> float:
    """``value`` rounded to THRESHOLD_DIGITS significant digits, 0 below THRESHOLD_FLOOR (what
    a graph applies), so the floats clients send map onto a finite grid of distinct results."""
    value = float(value)
    if not math.isfinite(value):
        raise InvalidInput(f"threshold must be a finite number (got {value})")
    if abs(value) < THRESHOLD_FLOOR:
        return 0.0
    return float(f"{value:.{THRESHOLD_DIGITS}g}")


def quantize_percent(value: float) -> float:
    """A percentage in (0, 100] rounded to a multiple of PERCENT_STEP (at least one step)."""
    value = float(value)
    if not (math.isfinite(value) and 0 < value <= 100):
        raise InvalidInput(f"a percentage must be in (0, 100] (got {value})")
    steps = max(1, round(value / PERCENT_STEP))
    return round(steps * PERCENT_STEP, 6)

HEAD_PATTERN = r"^L(\d+)(H|KV)(\d+)$"
_HEAD_RE = re.compile(HEAD_PATTERN)
HEAD_INPUT_PATTERN = r"^\s*[Ll](\d+)([Hh]|[Kk][Vv])(\d+)\s*$"  # what HeadRef.parse accepts
_HEAD_INPUT_RE = re.compile(HEAD_INPUT_PATTERN)


def _check(kind: str, value: str, allowed: tuple[str, ...]) -> str:
    if value not in allowed:
        raise InvalidInput(f"unknown {kind} {value!r}; allowed: {list(allowed)}",
                           allowed=list(allowed))
    return value


def check_role(role: str) -> Role:
    """``role`` if it is one of ROLES, else InvalidInput listing them."""
    return _check("role", role, ROLES)  # type: ignore[return-value]


def check_pairing(pairing: str) -> Pairing:
    """``pairing`` (source role then target role) if known, else InvalidInput."""
    return _check("pairing", pairing, PAIRINGS)  # type: ignore[return-value]


def check_order(order: str) -> LayerOrder:
    return _check("order", order, LAYER_ORDERS)  # type: ignore[return-value]


def check_mode(mode: str) -> CSMode:
    return _check("CS mode", mode, CS_MODES)  # type: ignore[return-value]


def parse_pairings(text: str) -> list[Pairing]:
    """``"OQ,ok, OV"`` -> ``["OQ", "OK", "OV"]`` (validated, de-duplicated, order kept)."""
    items = [p.strip().upper() for p in (text or "").split(",") if p.strip()]
    if not items:
        raise InvalidInput(f"no pairings given; allowed: {list(PAIRINGS)}", allowed=list(PAIRINGS))
    return [check_pairing(p) for p in dict.fromkeys(items)]


def cs_mode_of(pairing: str) -> CSMode | None:
    """The Composition Score mode comparable to a pairing: O -> Q/K/V gives Q/K/V, else None."""
    return pairing[1] if pairing[0] == "O" and pairing[1] in CS_MODES else None  # type: ignore[return-value]


@dataclass(frozen=True, order=True)
class HeadRef:
    """One head by ORIGINAL block number: a query head ``L9H6`` or a grouped KV head ``L6KV1``.

    ``kv`` marks a key/value head of a grouped-query model (shared by several query heads).
    """

    layer: int
    head: int
    kv: bool = False

    @classmethod
    def parse(cls, text: str) -> HeadRef:
        """``"L9H6"`` -> HeadRef(9, 6); ``"L6KV1"`` -> HeadRef(6, 1, kv=True); else InvalidInput.

        Case and surrounding blanks are forgiven (``" l9h6 "``); ``label`` is always canonical.
        """
        m = _HEAD_INPUT_RE.match(str(text))
        if not m:
            raise InvalidInput(f"{str(text)[:40]!r} is not a head name (expected like 'L9H6', "
                               "or 'L6KV1' for a grouped key/value head)")
        return cls(int(m.group(1)), int(m.group(3)), m.group(2).upper() == "KV")

    @classmethod
    def is_label(cls, text: Any) -> bool:
        return isinstance(text, str) and _HEAD_RE.match(text) is not None

    @property
    def label(self) -> str:
        return f"L{self.layer}{'KV' if self.kv else 'H'}{self.head}"

    def __str__(self) -> str:
        return self.label


def head_label(layer: int, head: int, *, kv: bool = False) -> str:
    """Canonical name of a head: ``"L{layer}H{head}"``, or ``"L{layer}KV{group}"`` for KV heads."""
    return HeadRef(int(layer), int(head), kv).label


def vocabulary() -> dict[str, Any]:
    """The whole vocabulary as plain JSON (what ``GET /api/vocabulary`` serves)."""
    return {"roles": list(ROLES), "pairings": list(PAIRINGS), "graph_pairings": list(GRAPH_PAIRINGS),
            "orders": list(LAYER_ORDERS), "cs_modes": list(CS_MODES),
            "grid_metrics": list(GRID_METRICS), "rank_metrics": list(RANK_METRICS),
            "k_max": GRAPH_K_MAX, "default_k": DEFAULT_K, "max_edges": THRESHOLD_EDGES_MAX,
            "threshold_digits": THRESHOLD_DIGITS, "percent_step": PERCENT_STEP,
            "head_pattern": HEAD_PATTERN}
