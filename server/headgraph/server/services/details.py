"""Detail of one head pair or one head: scores, p-values, classes, tokens and partners.

Assembled from the cached results (PK, CS, z, nulls, tokens, patterns) and a label set; only
the per-pair principal angles (core.scores.pk.pair_detail) are cached here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, TypeVar

import torch

from headgraph.core.activations.flags import SINK_RULE, SINK_THRESHOLD, head_flags, pattern_scores_from_dict
from headgraph.core.graphs.labels import LabelSet
from headgraph.core.names import (
    GRAPH_PAIRINGS,
    ROLES,
    SIMILARITY_KINDS,
    HeadRef,
    check_pairing,
    head_label,
)
from headgraph.core.scores.ranking import kv_level_cs
from headgraph.core.types import ModelInfo
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.computations.convert import axis_labels, jsonable, parse_node, role_is_grouped
from headgraph.server.computations.data_pk import pair_data_pk
from headgraph.server.compute.results import ResultCache
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.labels import LabelService
from headgraph.server.services.scores import ScoresService

T = TypeVar("T")


class Pending:
    """The results a panel read while its model's job runs: the optional ones (tokens, pattern
    scores, z, nulls) only when cached, each missing one named (``names``) instead of being
    computed here, so a panel opens as soon as the job has PK and CS and says what it waits
    for; ``partial`` False reads (and computes) everything."""

    def __init__(self, partial: bool) -> None:
        self.partial = partial
        self.names: list[str] = []

    def read(self, name: str, fn: Callable[[], T]) -> T | None:
        """``fn()``; when partial and it needs a result not cached yet, None (``name`` noted)."""
        if not self.partial:
            return fn()
        token = CACHE_ONLY.set(True)
        try:
            return fn()
        except ColdMiss:
            if name not in self.names:
                self.names.append(name)
            return None
        finally:
            CACHE_ONLY.reset(token)


class DetailService:
    """What the pair and head detail panels show."""
    def __init__(self, catalog: ModelCatalog, scores: ScoresService, labels: LabelService,
                 cache: ResultCache) -> None:
        self.catalog = catalog
        self.scores = scores
        self.labels = labels
        self.cache = cache

    def pair_detail(self, ref: ModelRef, pairing: str, sl: int, sh: int, tl: int, th: int
                    ) -> dict[str, Any]:
        """PK, normalized PK and principal angles of one pair (core.scores.pk.pair_detail), cached."""
        return self.cache.get(ref, "pair", pairing=pairing, sl=sl, sh=sh, tl=tl, th=th)

    def pair(self, ref: ModelRef, pairing: str, source: str, target: str,
             labels: str | None, k: int = 5, data_pk_sets: tuple[str, ...] = (),
             data_pk_unavailable: dict[str, str] | None = None,
             similarity_kinds: tuple[str, ...] = (), partial: bool = False) -> dict[str, Any]:
        """Everything about one head pair: PK with principal angles, CS, z, p-values, classes,
        tokens, the data-weighted PK of the prompt sets ``data_pk_sets`` (cached ones:
        server.computations.data_pk.cached_data_pk_sets), or why a set cannot be computed
        (``data_pk_unavailable``: data_pk_failures), and CKA / Procrustes of the kinds
        ``similarity_kinds`` (cached forward grids: ScoresService.cached_similarity_kinds).
        ``partial``: z, p-values and tokens only when cached (:class:`Pending`), the missing
        ones listed in "pending"."""
        pending = Pending(partial)
        check_pairing(pairing)
        info = self.catalog.model_info(ref)
        s_role, t_role = pairing[0], pairing[1]
        sl, sh = parse_node(source, s_role, info)
        tl, th = parse_node(target, t_role, info)
        label_set = self.labels.label_set(labels, ref)
        forward = bool(info.layer_indices[sl] < info.layer_indices[tl])
        # A forward pair reads the job's forward grids; a pair against the layer order (or in
        # one layer) has its z and CS computed for it alone ("pair"), never all-pairs grids
        # (twice a 7B's PK stage).
        detail = dict(self.pair_detail(ref, pairing, sl, sh, tl, th))
        alone = {k: detail.pop(k, None) for k in ("pair_z", "pair_cs", "pair_cs_of")}
        detail.update(model=ref.id, forward=forward, cs=None)
        if not forward:
            detail.update(valid=False, cs=alone["pair_cs"], z=jsonable(alone["pair_z"]))
            if alone["pair_cs_of"] is not None:
                detail["cs_of"] = alone["pair_cs_of"]
        ps = self.scores.pk(ref, pairing) if forward else None
        cs = self.scores.cs_for(ref, pairing) if forward else None
        if ps is not None:
            detail["valid"] = bool(ps.valid[sl, sh, tl, th])
            z = pending.read(f"z {pairing}", lambda: self.scores.zscores(ref, pairing))
            detail["z"] = None if z is None else jsonable(float(z[sl, sh, tl, th]))
        if cs is not None and ps is not None:
            # CS grids index query heads; a KV-group target (however the target was named)
            # gets the mean over its valid query heads, named in "cs_of" (core.scores.ranking.
            # kv_level_cs, as the scatter, top tables and graph edges show it); only the
            # source head's row of the grid is reduced.
            row = replace(cs, scores=cs.scores[sl: sl + 1, sh: sh + 1],
                          valid=cs.valid[sl: sl + 1, sh: sh + 1])
            kv = kv_level_cs(row, ps.scores.shape[3])
            if bool(kv.valid[0, 0, tl, th]):
                detail["cs"] = float(kv.scores[0, 0, tl, th])
                cs_of = kv.cs_of(0, 0, tl, th)
                if cs_of is not None:
                    detail["cs_of"] = cs_of
        detail.update(self._similarities(ref, pairing, (sl, sh, tl, th), forward, similarity_kinds))
        detail["p_haar"] = None
        detail["p_anisotropic"] = None
        null = pending.read(f"null {pairing}", lambda: self.scores.null(ref, pairing)) \
            if forward and detail["valid"] else None
        if null is not None:
            detail["p_haar"] = jsonable(float(null["p_haar"][sl, sh, tl, th]))
            detail["p_anisotropic"] = jsonable(float(null["p"][sl, sh, tl, th]))
            detail["significant"] = bool(null["significant"][sl, sh, tl, th])
            detail["fdr_alpha"] = null["alpha"]
            # Monte-Carlo p-values are (k + 1) / (n + 1): none is below this floor.
            detail["null_samples"] = int(null["samples"])
            detail["p_floor"] = 1.0 / (int(null["samples"]) + 1)
        names = {"source": axis_labels(info, s_role)[sl * info.heads_of(s_role) + sh],
                 "target": axis_labels(info, t_role)[tl * info.heads_of(t_role) + th]}
        detail.update(names)
        for side, name, role in (("source", names["source"], s_role),
                                 ("target", names["target"], t_role)):
            detail[f"{side}_class"] = _class_of(label_set, info, name)
            detail[f"{side}_tokens"] = self._head_tokens(ref, info, role, name, k, pending)
        detail["labels"] = None if label_set is None else label_set.name
        detail["pending"] = pending.names
        detail["data_pk"] = pair_data_pk(self.cache, ref, pairing, sl, sh, tl, th, data_pk_sets)
        detail["data_pk_unavailable"] = data_pk_unavailable or None
        return detail

    def _similarities(self, ref: ModelRef, pairing: str, cell: tuple[int, int, int, int],
                      forward: bool, kinds: tuple[str, ...]) -> dict[str, Any]:
        """{"cka", "procrustes": the pair's value or None, "similarity_cached": kinds read}:
        read from the forward grids of ``kinds`` only (never computed here), None for a kind
        not cached, a pair that is not forward, or a cell outside the grid's valid ones. A K /
        V target is its native KV head, as PK's."""
        out: dict[str, Any] = {kind: None for kind in SIMILARITY_KINDS}
        read = [kind for kind in SIMILARITY_KINDS if kind in kinds]
        for kind in read if forward else ():
            sim = self.scores.similarity(ref, kind, pairing, "forward")
            if bool(sim.valid[cell]):
                out[kind] = float(sim.scores[cell])
        out["similarity_cached"] = read
        return out

    def _head_tokens(self, ref: ModelRef, info: ModelInfo, role: str, name: str, k: int,
                     pending: Pending) -> list[dict[str, Any]] | None:
        if info.d_vocab is None:
            return None
        table = pending.read(f"tokens {role}", lambda: self.scores.tokens(ref, role))
        for h in (table or {}).get("heads", ()):
            if h["name"] == name:
                return h["tokens"][:k]
        return None

    def head(self, ref: ModelRef, name: str, labels: str | None, k: int, partial: bool = False
             ) -> dict[str, Any]:
        """One head: class, ranks, top tokens per role, pattern scores and strongest partners
        (``partial``: tokens and pattern scores only when cached, see :class:`Pending`)."""
        info = self.catalog.model_info(ref)
        pending = Pending(partial)
        if HeadRef.parse(name).kv:
            return self.kv_head(ref, info, name, labels, k, pending)
        layer_pos, head = parse_node(name, "O", info)
        label = head_label(info.layer_indices[layer_pos], head)
        label_set = self.labels.label_set(labels, ref)
        out: dict[str, Any] = {"model": ref.id, "head": label,
                               "layer": info.layer_indices[layer_pos], "index": head,
                               "class": None if label_set is None else label_set.class_of(label),
                               "labels": None if label_set is None else label_set.name}
        tokens: dict[str, Any] = {}
        if info.d_vocab is not None:
            for role in ROLES:
                pos, idx = parse_node(label, role, info)
                node = axis_labels(info, role)[pos * info.heads_of(role) + idx]
                tokens[role] = self._head_tokens(ref, info, role, node, k, pending)
        out["tokens"] = tokens
        patterns = pending.read("patterns", lambda: self.scores.patterns_or_none(ref))
        out["patterns"] = None if patterns is None else {
            kind: grid[layer_pos][head] for kind, grid in patterns["scores"].items()}
        out["flags"] = _flags(patterns, label, None)
        partners: dict[str, Any] = {}
        for pairing in GRAPH_PAIRINGS:
            ps = self.scores.pk(ref, pairing, "forward")
            out_scores = ps.scores[layer_pos, head]  # as source (O side): [L, Ht]
            tgt_pos, tgt_idx = parse_node(label, pairing[1], info)
            in_scores = ps.scores[:, :, tgt_pos, tgt_idx]  # as target: [L, Hs]
            partners[pairing] = {
                "out": self._best(out_scores, ps.valid[layer_pos, head], info, pairing[1], k),
                "in": self._best(in_scores, ps.valid[:, :, tgt_pos, tgt_idx], info, "O", k)}
        out["partners"] = partners
        out["pending"] = pending.names
        return out

    def kv_head(self, ref: ModelRef, info: ModelInfo, name: str, labels: str | None, k: int,
                pending: Pending) -> dict[str, Any]:
        """One KV group of a grouped-query model ("L6KV1"): the query heads it serves, their
        classes, the KV head's top tokens as K and V, and its strongest OK / OV sources.

        ``index`` is the group number; pattern scores are per query head (see ``heads``).
        """
        layer_pos, group = parse_node(name, "K", info)  # NotFound unless the model groups K/V
        block = info.layer_indices[layer_pos]
        label = head_label(block, group, kv=True)
        label_set = self.labels.label_set(labels, ref)
        members = [head_label(block, h) for h in _members(info, layer_pos, group)]
        out: dict[str, Any] = {"model": ref.id, "head": label, "kind": "kv_group",
                               "layer": block, "index": group, "heads": members,
                               "class": _class_of(label_set, info, label),
                               "head_classes": None if label_set is None else
                               {h: label_set.class_of(h) for h in members},
                               "labels": None if label_set is None else label_set.name,
                               "patterns": None}
        out["flags"] = _flags(pending.read("patterns", lambda: self.scores.patterns_or_none(ref)),
                              label, members)
        out["tokens"] = ({role: self._head_tokens(ref, info, role, label, k, pending)
                          for role in ("K", "V")} if info.d_vocab is not None else {})
        partners: dict[str, Any] = {}
        for pairing in GRAPH_PAIRINGS:
            if not role_is_grouped(info, pairing[1]):
                continue
            ps = self.scores.pk(ref, pairing, "forward")
            partners[pairing] = {"out": [], "in": self._best(
                ps.scores[:, :, layer_pos, group], ps.valid[:, :, layer_pos, group], info, "O", k)}
        out["partners"] = partners
        out["pending"] = pending.names
        return out

    @staticmethod
    def _best(scores: torch.Tensor, valid: torch.Tensor, info: ModelInfo, role: str, k: int
              ) -> list[dict[str, Any]]:
        names = axis_labels(info, role)
        flat = torch.where(valid, scores, torch.full_like(scores, -torch.inf)).reshape(-1)
        n = int(valid.sum())
        if n == 0:
            return []
        vals, idx = torch.topk(flat, min(k, n))
        return [{"head": names[i], "pk": float(v)} for v, i in zip(vals.tolist(), idx.tolist())]


def _flags(patterns: dict[str, Any] | None, name: str, members: list[str] | None
           ) -> dict[str, Any]:
    """A head's (or KV group's) behaviour flags from pattern scores (core.activations.flags): sink (a KV
    group: every query head it serves), sink_heads, first_token (a group: the mean), description;
    all null when the model has no pattern scores ("not measured")."""
    out: dict[str, Any] = {"threshold": SINK_THRESHOLD, "rule": SINK_RULE.format(SINK_THRESHOLD),
                           "sink": None, "sink_heads": None, "first_token": None,
                           "description": None}
    if patterns is None:
        return out
    flags = head_flags(pattern_scores_from_dict(patterns))
    out.update(sink=flags.is_sink(name, members), sink_heads=flags.sink_heads(name, members),
               first_token=flags.first_token_of(name, members),
               description=flags.describe(name, members))
    return out


def _members(info: ModelInfo, layer_pos: int, group: int) -> list[int]:
    """Query-head indices a KV group serves (consecutive: query h reads group h // size)."""
    size = info.n_heads // info.n_kv_heads
    return list(range(group * size, (group + 1) * size))


def _class_of(label_set: LabelSet | None, info: ModelInfo, name: str) -> str | None:
    """A head's class; for a KV group the distinct classes of its query heads (" / ")."""
    if label_set is None:
        return None
    ref = HeadRef.parse(name)
    if not ref.kv:
        return label_set.class_of(name)
    pos = info.layer_indices.index(ref.layer)
    classes = [label_set.class_of(head_label(ref.layer, h)) for h in _members(info, pos, ref.head)]
    named = list(dict.fromkeys(c for c in classes if c))
    return " / ".join(named) if named else None
