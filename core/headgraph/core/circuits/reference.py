"""A circuit's head -> head edges as the reference of a recovery table (core.stats.recovery).

A circuit (core.circuits.attribution, or a MIB file read by core.circuits.mib) ranks the
writer -> reader edges of the residual-stream graph, named with block numbers: writers
``embed``, heads ``L0H1``, MLPs ``L0MLP``; readers a query head's Q input ``L1H3.Q``, a KV
head's K or V input (``L1KV0.K`` on a grouped-query model, ``L1H0.K`` otherwise), MLPs and
``logits``. On an O -> Q / K / V pairing the reference is the circuit's edges from a head's
write into that input of a later head: ``L0H1 -> L1H3.Q`` is the OQ cell (L0H1, L1H3),
``L0H1 -> L1KV0.K`` the OK cell (L0H1, L1KV0). The PK grid's K and V targets are KV heads on
a grouped-query model, as the circuit's K and V readers are, so an edge maps onto exactly one
cell and nothing is ungrouped. Edges from the embeddings or an MLP, into an MLP, the logits
or another input are not in that pairing's reference.

**Size.** A ranked circuit's reference is its top n edges (every kind counted, as the
faithfulness curve counts them): by default the smallest n on the faithfulness curve
reaching the circuit's share of the metric gap (0.8), or a given n (:func:`circuit_size`).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import HeadRef, head_label
from headgraph.core.stats.recovery import reference_from_edges

TARGET_PATHS: dict[str, str] = {"OQ": "Q", "OK": "K", "OV": "V"}  # pairing -> reader input
_MLP = re.compile(r"^L\d+MLP$")
_READER = re.compile(r"^(?P<head>L\d+(?:H|KV)\d+)\.(?P<path>[QKV])$")


@dataclass(frozen=True)
class CircuitReference:
    """The reference edges of one pairing: grid cells [L, H, L, Ht] (Ht: KV heads for OK /
    OV on a grouped-query model) in the circuit's order, and their circuit names."""

    pairing: str
    shape: tuple[int, int, int, int]
    positions: tuple[tuple[int, int, int, int], ...]
    names: tuple[str, ...]  # "L0H1>L1KV0.K", as the circuit names the same edges
    n_given: int  # edges given (every kind)
    n_head_edges: int  # of them head -> head edges into any of Q, K, V

    def mask(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(edge mask, source-head mask, target-head mask) (core.stats.recovery.reference_from_edges)."""
        return reference_from_edges(self.positions, self.shape)


def _writer_head(name: str) -> HeadRef | None:
    """The head writing an edge, None for the embeddings or an MLP; InvalidInput otherwise."""
    if name == "embed" or _MLP.match(name):
        return None
    if HeadRef.is_label(name) and not HeadRef.parse(name).kv:
        return HeadRef.parse(name)
    raise InvalidInput(f"unknown writer {name[:40]!r} (embed, L0H1 or L0MLP)")


def _reader_head(name: str) -> tuple[HeadRef, str] | None:
    """(head, input) reading an edge, None for an MLP or the logits; InvalidInput otherwise."""
    if name == "logits" or _MLP.match(name):
        return None
    m = _READER.match(name)
    if m is None:
        raise InvalidInput(f"unknown reader {name[:40]!r} (L1H3.Q, L1KV0.K, L1MLP or logits)")
    return HeadRef.parse(m.group("head")), m.group("path")


def circuit_reference(edges: Iterable[tuple[str, str]], pairing: str, layer_indices: Sequence[int],
                      n_heads: int, n_kv_heads: int) -> CircuitReference:
    """The reference of ``pairing`` (OQ, OK or OV) among ``edges`` ((writer, reader) names, see
    the module docstring) on a model of ``layer_indices`` (block numbers), ``n_heads`` query
    and ``n_kv_heads`` KV heads a layer. InvalidInput names an edge that is no edge of this
    model's graph (an unknown name, a head or block it lacks, a reader not after its writer, a
    K / V reader named per query head on a grouped-query model)."""
    if pairing not in TARGET_PATHS:
        raise InvalidInput(f"a circuit is a reference on an O -> Q / K / V pairing, not {pairing!r}",
                           allowed=list(TARGET_PATHS))
    if n_heads < 1 or n_kv_heads < 1 or n_heads % n_kv_heads:
        raise InvalidInput(f"{n_heads} query heads do not group into {n_kv_heads} KV heads")
    want = TARGET_PATHS[pairing]
    grouped = n_kv_heads < n_heads
    pos = {int(b): i for i, b in enumerate(layer_indices)}
    n_target = n_heads if want == "Q" else n_kv_heads
    shape = (len(pos), n_heads, len(pos), n_target)
    cells: dict[tuple[int, int, int, int], str] = {}
    n_given = n_head_edges = 0
    for writer, reader in edges:
        n_given += 1
        w, r = _writer_head(str(writer)), _reader_head(str(reader))
        if w is None or r is None:
            continue
        (t, path) = r
        edge = f"{writer}>{reader}"
        if w.layer not in pos or w.head >= n_heads:
            raise InvalidInput(f"edge {edge!r}: {w.label} is not a head of this model")
        limit = n_heads if path == "Q" else n_kv_heads
        if t.layer not in pos or t.head >= limit:
            raise InvalidInput(f"edge {edge!r}: {t.label} is not a {path} reader of this model")
        if (path == "Q" and t.kv) or (path != "Q" and grouped and not t.kv):
            example = head_label(t.layer, 0, kv=path != "Q" and grouped)
            raise InvalidInput(f"edge {edge!r}: this model's {path} readers are named like "
                               f"{example}.{path}")
        if pos[w.layer] >= pos[t.layer]:
            raise InvalidInput(f"edge {edge!r} does not run forward")
        n_head_edges += 1
        if path == want:
            cells.setdefault((pos[w.layer], w.head, pos[t.layer], t.head), edge)
    return CircuitReference(pairing=pairing, shape=shape, positions=tuple(cells),
                            names=tuple(cells.values()), n_given=n_given, n_head_edges=n_head_edges)


def circuit_size(n_edges: int, *, curve_size: int | None, share: float, edges: int | None = None
                 ) -> tuple[int, str]:
    """(n, the rule in words) of a ranked circuit of ``n_edges`` edges: ``edges`` when given
    (1..n_edges), else ``curve_size``, the smallest n on its faithfulness curve reaching
    ``share`` of the metric gap. InvalidInput for an n out of range, or no n given when no
    point of the curve reaches the share."""
    if edges is not None:
        if isinstance(edges, bool) or not isinstance(edges, int) or not 1 <= edges <= n_edges:
            raise InvalidInput(f"edges must be an integer in 1..{n_edges} (the circuit's edges), "
                               f"got {edges!r}")
        return edges, f"the top {edges} of {n_edges} edges by attribution (a given size)"
    if curve_size is None or curve_size < 1:
        raise InvalidInput(f"no circuit on the faithfulness curve reaches {share:.0%} of the metric "
                           f"gap; give a size (edges=N, 1..{n_edges})")
    return curve_size, (f"the top {curve_size} of {n_edges} edges: the smallest circuit on the "
                        f"faithfulness curve reaching {share:.0%} of the metric gap")


def describe(ref: CircuitReference, layer_indices: Sequence[int]) -> dict[str, Any]:
    """Plain-JSON form: the edges as grid names ("L0H1 -> L1KV0") and the counts."""
    kv = ref.pairing != "OQ" and ref.shape[3] < ref.shape[1]
    return {"pairing": ref.pairing, "n_given": ref.n_given, "n_head_edges": ref.n_head_edges,
            "edges": list(ref.names),
            "cells": [f"{head_label(layer_indices[a], b)} -> {head_label(layer_indices[c], d, kv=kv)}"
                      for a, b, c, d in ref.positions]}


__all__ = ["TARGET_PATHS", "CircuitReference", "circuit_reference", "circuit_size", "describe"]
