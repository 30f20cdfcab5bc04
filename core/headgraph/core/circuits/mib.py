"""MIB (Mechanistic Interpretability Benchmark, circuit track) scores and circuit files.

**CPR / CMD.** MIB scores a ranking of edges by the faithfulness of its top circuits at
fractions ``MIB_FRACTIONS`` of all edges (0.1 % .. 100 %): ``f = (M(circuit) - M(empty)) /
(M(full) - M(empty))``, ``int(fraction * n_edges)`` edges kept. CPR is the area under f,
CMD the area under |1 - f|, both by the trapezoid rule with x the fraction itself (linear,
not log; from 0.001 to 1, nothing added at 0 and no renormalisation), as
``evaluate_area_under_curve`` in hannamw/MIB-circuit-track (``area_under`` and
``area_from_1``). A curve at 1 everywhere has CPR 0.999 and CMD 0.

**Files.** JSON ``{cfg, nodes, edges}`` as EAP-IG's ``Graph.to_json``: nodes ``input``,
``a{L}.h{H}``, ``m{L}``, ``logits`` with ``in_graph``; edges ``a0.h1->a3.h2<q>`` (``<k>``,
``<v>``; edges into ``m{L}`` and ``logits`` carry none) with ``score`` and ``in_graph``. L is
the attention-layer position (0..n_layers-1; headgraph's names carry block numbers, mapped by
``layer_indices``). **Grouped-query models** are written ungrouped, one node per query head:
query head h reads KV head ``h // (n_heads // n_kv_heads)`` (Hugging Face's ``repeat_kv``),
and a KV head's K or V score is divided equally among the query heads sharing it, so sums
are kept; reading back sums them again (in the circuit when any of them is).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from headgraph.core.errors import InvalidInput
from headgraph.core.names import head_label

MIB_FRACTIONS: tuple[float, ...] = (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0)

_WRITER = r"input|a(?P<wa>\d+)\.h(?P<wh>\d+)|m(?P<wm>\d+)"
_READER = r"a(?P<ra>\d+)\.h(?P<rh>\d+)<(?P<p>[qkv])>|m(?P<rm>\d+)|logits"
_EDGE = re.compile(rf"^(?P<w>{_WRITER})->(?P<r>{_READER})$")
_NODE = re.compile(r"^(input|logits|a(\d+)\.h(\d+)|m(\d+))$")


@dataclass(frozen=True)
class AreaScores:
    """CPR (area under the faithfulness curve, higher is better) and CMD (area under
    |1 - f|, lower is better) over ``fractions`` of all edges."""

    cpr: float
    cmd: float
    fractions: tuple[float, ...]
    faithfulness: tuple[float, ...]

    def to_dict(self) -> dict[str, Any]:
        return {"cpr": self.cpr, "cmd": self.cmd, "fractions": list(self.fractions),
                "faithfulness": list(self.faithfulness)}


def cpr_cmd(sizes: Sequence[float], faithfulness: Sequence[float]) -> AreaScores:
    """CPR and CMD (module docstring) of ``faithfulness`` at ``sizes`` (fractions of all
    edges in [0, 1], increasing; MIB's are MIB_FRACTIONS).

    >>> r = cpr_cmd(MIB_FRACTIONS, [1.0] * 10)
    >>> round(r.cpr, 6), round(r.cmd, 6)
    (0.999, 0.0)
    >>> r = cpr_cmd([0.0, 0.5, 1.0], [0.0, 2.0, 1.0])
    >>> r.cpr, r.cmd
    (1.25, 0.75)
    """
    x = [float(s) for s in sizes]
    f = [float(v) for v in faithfulness]
    if len(x) != len(f) or len(x) < 2:
        raise InvalidInput(f"need as many faithfulness values as sizes, at least two; got "
                           f"{len(f)} and {len(x)}")
    if not all(math.isfinite(v) for v in x + f):
        raise InvalidInput("sizes and faithfulness must be finite")
    if x[0] < 0 or x[-1] > 1 or any(b <= a for a, b in zip(x, x[1:])):
        raise InvalidInput("sizes must be increasing fractions of all edges in [0, 1]")
    cpr = cmd = 0.0
    for i in range(len(x) - 1):
        dx = x[i + 1] - x[i]
        cpr += dx * (f[i] + f[i + 1]) / 2
        cmd += dx * (abs(1 - f[i]) + abs(1 - f[i + 1])) / 2
    return AreaScores(cpr=cpr, cmd=cmd, fractions=tuple(x), faithfulness=tuple(f))


def mib_sizes(total: int, fractions: Sequence[float] = MIB_FRACTIONS) -> tuple[int, ...]:
    """Edges kept at each fraction of ``total`` edges, ``int(fraction * total)`` as MIB.

    >>> mib_sizes(257)
    (0, 0, 1, 2, 5, 12, 25, 51, 128, 257)
    """
    return tuple(int(p * total) for p in fractions)


def curve_scores(sizes: Sequence[int], metrics: Sequence[float], clean: float, total: int
                 ) -> AreaScores | None:
    """CPR and CMD on MIB's grid of a measured curve (``metrics[i]``: the mean metric with
    the top ``sizes[i]`` of ``total`` edges kept), normalised as MIB: ``f = (M(n) - M(0)) /
    (clean - M(0))``, M(0) the measured circuit of no edges. None when n = 0 or a grid size
    is not on the curve, or clean equals M(0).

    >>> r = curve_scores([0, 1, 2, 5, 10], [0.0, 1.0, 2.0, 2.0, 2.0], 2.0, 10)
    >>> round(r.cpr, 4), round(r.cmd, 4)
    (0.8875, 0.1115)
    >>> curve_scores([0, 1, 2, 5, 10], [0.0, 1.0, 2.0, 2.0, 2.0], 2.0, 1000) is None
    True
    """
    at = {int(n): float(m) for n, m in zip(sizes, metrics, strict=True)}
    grid = mib_sizes(total)
    if 0 not in at or any(n not in at for n in grid) or clean == at[0]:
        return None
    empty = at[0]
    return cpr_cmd(MIB_FRACTIONS, [(at[n] - empty) / (clean - empty) for n in grid])


# -- names -----------------------------------------------------------------------------------------

def _mib_writer(kind: str, layer: int | None, head: int | None) -> str:
    if kind == "embed":
        return "input"
    if kind == "head":
        return f"a{layer}.h{head}"
    if kind == "mlp":
        return f"m{layer}"
    raise InvalidInput(f"unknown writer kind {kind!r}")


def _groups(n_heads: int, n_kv_heads: int) -> int:
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise InvalidInput(f"n_heads ({n_heads}) must be a positive multiple of n_kv_heads "
                           f"({n_kv_heads})")
    return n_heads // n_kv_heads


def to_mib(edges: Sequence[Mapping[str, Any]], *, n_layers: int, n_heads: int,
           n_kv_heads: int, size: int, d_model: int | None = None) -> dict[str, Any]:
    """The MIB circuit file (module docstring) of ``edges``, strongest first, each a mapping
    with ``writer_kind``, ``writer_layer``, ``writer_head``, ``path`` (Q | K | V | MLP |
    logits), ``reader_layer``, ``reader_head`` and ``score`` (as
    ``CircuitAttribution.edge_dicts(order())`` and the API give them); the first ``size``
    are in the circuit. A node is in the circuit when one of its edges is.

    >>> e = [{"writer_kind": "embed", "writer_layer": None, "writer_head": None, "path": "K",
    ...       "reader_layer": 0, "reader_head": 0, "score": 0.5}]
    >>> d = to_mib(e, n_layers=1, n_heads=2, n_kv_heads=1, size=1)
    >>> d["edges"]
    {'input->a0.h0<k>': {'score': 0.25, 'in_graph': True}, \
'input->a0.h1<k>': {'score': 0.25, 'in_graph': True}}
    """
    g = _groups(n_heads, n_kv_heads)
    if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= len(edges):
        raise InvalidInput(f"size must be in 0..{len(edges)}, got {size!r}")
    has_mlp = any(e["writer_kind"] == "mlp" or e["path"] == "MLP" for e in edges)
    nodes: dict[str, dict[str, bool]] = {"input": {"in_graph": False}}
    for layer in range(n_layers):
        for h in range(n_heads):
            nodes[f"a{layer}.h{h}"] = {"in_graph": False}
        if has_mlp:
            nodes[f"m{layer}"] = {"in_graph": False}
    nodes["logits"] = {"in_graph": False}
    out: dict[str, dict[str, Any]] = {}
    for rank, e in enumerate(edges):
        score = float(e["score"])
        if not math.isfinite(score):
            raise InvalidInput(f"edge {rank + 1} has a non-finite score")
        w = _mib_writer(e["writer_kind"], e["writer_layer"], e["writer_head"])
        path, layer, head = e["path"], e["reader_layer"], e["reader_head"]
        if path == "Q":
            targets, share = [f"a{layer}.h{head}<q>"], score
        elif path in ("K", "V"):
            targets = [f"a{layer}.h{q}<{path.lower()}>" for q in range(head * g, head * g + g)]
            share = score / g
        elif path == "MLP":
            targets, share = [f"m{layer}"], score
        elif path == "logits":
            targets, share = ["logits"], score
        else:
            raise InvalidInput(f"unknown reader path {path!r}")
        kept = rank < size
        for t in targets:
            out[f"{w}->{t}"] = {"score": share, "in_graph": kept}
            if kept:
                nodes[w]["in_graph"] = True
                nodes[t.split("<")[0]]["in_graph"] = True
    cfg: dict[str, Any] = {"n_layers": n_layers, "n_heads": n_heads,
                           "parallel_attn_mlp": False, "n_key_value_heads": n_kv_heads}
    if d_model is not None:
        cfg["d_model"] = d_model
    return {"cfg": cfg, "nodes": nodes, "edges": out}


# -- reading ---------------------------------------------------------------------------------------

@dataclass(frozen=True)
class MibEdge:
    """One edge of a MIB file in headgraph's names ("L0H1" -> "L3H2.Q", "L3KV0.K" on
    grouped-query models, "L3MLP", "logits")."""

    writer: str
    reader: str
    path: str
    score: float
    in_graph: bool


@dataclass(frozen=True)
class MibCircuit:
    """A MIB circuit file read into headgraph's graph (K / V edges regrouped per KV head)."""

    n_layers: int
    n_heads: int
    n_kv_heads: int
    edges: tuple[MibEdge, ...]  # in the file's order, a KV edge at its first query head

    @property
    def circuit(self) -> tuple[MibEdge, ...]:
        return tuple(e for e in self.edges if e.in_graph)


def _int_field(cfg: Mapping[str, Any], key: str) -> int:
    v = cfg.get(key)
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise InvalidInput(f"cfg.{key} must be a positive integer, got {v!r}")
    return v


def from_mib(data: Any, *, n_kv_heads: int | None = None,
             layer_indices: Sequence[int] | None = None) -> MibCircuit:
    """Read a MIB circuit file (the parsed JSON, module docstring). ``n_kv_heads``: the
    model's KV heads (default cfg ``n_key_value_heads``, else n_heads); ``layer_indices``: the
    block number of each attention layer for headgraph's names (default 0..n_layers-1).
    InvalidInput names the first bad part.

    >>> d = {"cfg": {"n_layers": 1, "n_heads": 2}, "nodes": {},
    ...      "edges": {"input->a0.h0<k>": {"score": 0.25, "in_graph": True},
    ...                "input->a0.h1<k>": {"score": 0.5, "in_graph": False}}}
    >>> from_mib(d, n_kv_heads=1).edges
    (MibEdge(writer='embed', reader='L0KV0.K', path='K', score=0.75, in_graph=True),)
    """
    if not isinstance(data, Mapping) or not all(k in data for k in ("cfg", "nodes", "edges")):
        raise InvalidInput("a MIB circuit is a JSON object with cfg, nodes and edges")
    cfg, nodes, edges = data["cfg"], data["nodes"], data["edges"]
    if not isinstance(cfg, Mapping) or not isinstance(nodes, Mapping) or not isinstance(
            edges, Mapping):
        raise InvalidInput("cfg, nodes and edges must be JSON objects")
    L, H = _int_field(cfg, "n_layers"), _int_field(cfg, "n_heads")
    if cfg.get("parallel_attn_mlp"):
        raise InvalidInput("parallel attention + MLP graphs are not read (headgraph's graph "
                           "has the MLP read its own layer's heads)")
    K = n_kv_heads if n_kv_heads is not None else cfg.get("n_key_value_heads", H)
    if isinstance(K, bool) or not isinstance(K, int):
        raise InvalidInput(f"n_key_value_heads must be an integer, got {K!r}")
    g = _groups(H, K)
    blocks = list(range(L)) if layer_indices is None else [int(b) for b in layer_indices]
    if len(blocks) != L:
        raise InvalidInput(f"layer_indices has {len(blocks)} entries for {L} layers")
    for name, v in nodes.items():
        m = _NODE.match(str(name))
        if m is None or (m.group(2) is not None and not (int(m.group(2)) < L
                                                         and int(m.group(3)) < H)) or (
                m.group(4) is not None and int(m.group(4)) >= L):
            raise InvalidInput(f"unknown node {str(name)[:60]!r} for {L} layers x {H} heads")
        if not isinstance(v, Mapping) or not isinstance(v.get("in_graph"), bool):
            raise InvalidInput(f"node {name!r} needs a boolean in_graph")

    def layer(s: str) -> int:
        i = int(s)
        if i >= L:
            raise InvalidInput(f"layer {i} out of range (n_layers {L})")
        return i

    def head(s: str) -> int:
        i = int(s)
        if i >= H:
            raise InvalidInput(f"head {i} out of range (n_heads {H})")
        return i

    merged: dict[tuple[str, str], list[Any]] = {}
    for name, v in edges.items():
        m = _EDGE.match(str(name))
        if m is None:
            raise InvalidInput(f"bad edge name {str(name)[:60]!r} (e.g. 'a0.h1->a3.h2<q>')")
        if not isinstance(v, Mapping):
            raise InvalidInput(f"edge {name!r} must be an object with score and in_graph")
        score, kept = v.get("score"), v.get("in_graph")
        if isinstance(score, bool) or not isinstance(score, (int, float)) or not math.isfinite(
                score):
            raise InvalidInput(f"edge {name!r}: score must be a finite number, got {score!r}")
        if not isinstance(kept, bool):
            raise InvalidInput(f"edge {name!r}: in_graph must be true or false")
        if m.group("wa") is not None:
            wl = layer(m.group("wa"))
            w_stage, writer = 2 * wl + 1, head_label(blocks[wl], head(m.group("wh")))
        elif m.group("wm") is not None:
            wl = layer(m.group("wm"))
            w_stage, writer = 2 * wl + 2, f"L{blocks[wl]}MLP"
        else:
            w_stage, writer = 0, "embed"
        if m.group("ra") is not None:
            rl, rh, p = layer(m.group("ra")), head(m.group("rh")), m.group("p").upper()
            r_stage = 2 * rl + 1
            reader = (f"{head_label(blocks[rl], rh)}.Q" if p == "Q" else
                      f"{head_label(blocks[rl], rh // g, kv=g > 1)}.{p}")
        elif m.group("rm") is not None:
            rl = layer(m.group("rm"))
            r_stage, reader, p = 2 * rl + 2, f"L{blocks[rl]}MLP", "MLP"
        else:
            r_stage, reader, p = 2 * L + 1, "logits", "logits"
        if w_stage >= r_stage:
            raise InvalidInput(f"edge {name!r} does not run forward")
        slot = merged.setdefault((writer, reader), [p, 0.0, False])
        slot[1] += float(score)
        slot[2] = slot[2] or kept
    return MibCircuit(n_layers=L, n_heads=H, n_kv_heads=K, edges=tuple(
        MibEdge(w, r, p, s, k) for (w, r), (p, s, k) in merged.items()))


__all__ = ["MIB_FRACTIONS", "AreaScores", "MibCircuit", "MibEdge", "cpr_cmd", "curve_scores", "from_mib",
           "mib_sizes", "to_mib"]
