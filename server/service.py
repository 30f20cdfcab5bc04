"""Cached computations per model: what every endpoint, job and CLI command reads.

Each method resolves the model's weight fingerprint, then asks the store for one key
(fingerprint + computation + parameters + COMPUTE_VERSION); a cold key is computed once
(single flight) by calling core, and kept as device-free data (numpy arrays, JSON dicts).
Nothing here re-implements core math: it only chooses parameters, caches and reshapes.

Model identity: ``(spec, processing, stamp)`` -> (fingerprint, ModelInfo) is remembered in the
store's meta cache, where ``stamp`` is a cheap file-level identity (core package files for the
demo, snapshot commit for hub models, file sizes/mtimes for local folders). Warm reads
therefore never load a model, even after a restart.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from dataclasses import dataclass, replace
from typing import Any, Callable, Literal, TypeVar

import numpy as np
import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.types import CS_MODES, LAYER_ORDERS, ROLES, HeadWeights, ModelInfo, PairScores
from headgraph.server.convert import (axis_labels, jsonable, pair_scores_from_payload,
                                      pair_scores_payload, parse_node, to_numpy)
from headgraph.server.errors import Invalid, NotFound
from headgraph.server.registry import ModelRef, Registry
from headgraph.server.settings import Settings
from headgraph.server.store import KeyedLocks, ModelLRU, Store, make_key

T = TypeVar("T")
_NO = object()  # "not in the store" sentinel (immutable)
# True while a call runs on the event loop: it may read the cache, never load or compute.
CACHE_ONLY: ContextVar[bool] = ContextVar("headgraph_cache_only", default=False)


class ColdMiss(Exception):
    """Raised in cache-only mode when a result (or a model identity) is not cached yet."""
PAIRINGS: tuple[str, ...] = tuple(a + b for a in ROLES for b in ROLES)
# Query-parameter types: OpenAPI lists the allowed values, FastAPI rejects others with 422.
PairingName = Literal["QQ", "QK", "QV", "QO", "KQ", "KK", "KV", "KO",
                      "VQ", "VK", "VV", "VO", "OQ", "OK", "OV", "OO"]
RoleName = Literal["Q", "K", "V", "O"]
ModeName = Literal["Q", "K", "V"]
PAIRINGS_PATTERN = r"^[QKVOqkvo]{2}(,[QKVOqkvo]{2})*$"
GRAPH_PAIRINGS: tuple[str, ...] = ("OQ", "OK", "OV")
PROCESSING = "bridge"
TOKENS_CACHED_K = 50  # token tables are computed once at this depth and sliced per request
NULL_SAMPLES = 2000
KL_SAMPLES = 20000
FDR_ALPHA = 0.05
# The per-model "patterns" label set: head classes discovered from the model's own
# attention-pattern scores (core.patterns.pattern_scores, mean attention probabilities in
# [0, 1]). A head gets the class of its highest score above the threshold among these kinds;
# heads with none stay unlabelled. first_token (the usual attention sink) and identity (what
# heads with nothing to do fall back to) are left out: they are defaults, not functions.
PATTERN_LABELS = "patterns"
PATTERN_LABEL_THRESHOLDS: dict[str, float] = {"previous_token": 0.4, "induction": 0.4,
                                              "duplicate_token": 0.4}
PATTERN_LABEL_CLASSES: tuple[str, ...] = ("Previous Token", "Induction", "Duplicate Token")
PATTERN_LABEL_DESCRIPTION = (
    "Per model, from its attention-pattern scores (GET /api/patterns): each head gets the class "
    "of its highest score above the threshold among " + ", ".join(
        f"{k} > {v:g}" for k, v in PATTERN_LABEL_THRESHOLDS.items()) + "; others unlabelled")


@dataclass(frozen=True)
class Identity:
    """What a model is without loading it: weight fingerprint and shape info."""

    fingerprint: str
    info: ModelInfo


def info_from_dict(d: dict[str, Any]) -> ModelInfo:
    fields = dict(d)
    fields["layer_indices"] = tuple(fields["layer_indices"])
    return ModelInfo(**fields)


def check_pairing(pairing: str) -> str:
    if pairing not in PAIRINGS:
        raise Invalid(f"unknown pairing {pairing!r}; allowed: {list(PAIRINGS)} (source role "
                      "then target role)", allowed=list(PAIRINGS))
    return pairing


def parse_pairings(text: str) -> list[str]:
    """"OQ,OK,OV" -> ["OQ", "OK", "OV"] (validated, de-duplicated, order kept)."""
    items = [p.strip().upper() for p in (text or "").split(",") if p.strip()]
    if not items:
        raise Invalid(f"no pairings given; allowed: {list(PAIRINGS)}", allowed=list(PAIRINGS))
    return [check_pairing(p) for p in dict.fromkeys(items)]


def check_order(order: str) -> str:
    if order not in LAYER_ORDERS:
        raise Invalid(f"unknown order {order!r}; allowed: {list(LAYER_ORDERS)}",
                      allowed=list(LAYER_ORDERS))
    return order


def check_role(role: str) -> str:
    if role not in ROLES:
        raise Invalid(f"unknown role {role!r}; allowed: {list(ROLES)}", allowed=list(ROLES))
    return role


def check_mode(mode: str) -> str:
    if mode not in CS_MODES:
        raise Invalid(f"unknown CS mode {mode!r}; allowed: {list(CS_MODES)}",
                      allowed=list(CS_MODES))
    return mode


def cs_mode_of(pairing: str) -> str | None:
    """The Composition Score mode comparable to a pairing: O->Q/K/V gives Q/K/V, else None."""
    return pairing[1] if pairing[0] == "O" and pairing[1] in CS_MODES else None


class Service:
    """Model resolution, loading (per-process LRU) and every cached computation.

    inline=False (the API): cold results are computed in spawned compute processes
    (``settings.compute_processes`` > 0) by calling the same method there; this process then
    reads them from the shared store. inline=True (compute processes, CLI): computed here.
    """

    def __init__(self, settings: Settings, store: Store | None = None, *, inline: bool = False) -> None:
        from headgraph.server.compute import ComputePool

        self.settings = settings
        self.store = store or Store(settings.cache_dir, size_limit=settings.cache_size_bytes,
                                    lock_expire_s=settings.lock_expire_s)
        self.registry = Registry(settings)
        self.models: ModelLRU[Any] = ModelLRU(settings.model_lru)
        self.pool = None if inline or settings.compute_processes == 0 else ComputePool(settings)
        self._ids: dict[tuple[str, str], Identity] = {}
        self._ids_guard = threading.Lock()
        self._local = KeyedLocks()
        self._device: str | None = None
        self._builtin_labels: dict[str, Any] | None = None

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown()
        self.store.close()

    # -- models -------------------------------------------------------------------------
    @property
    def device(self) -> str:
        if self._device is None:
            self._device = self.settings.torch_device
        return self._device

    def resolve(self, model: str) -> ModelRef:
        return self.registry.resolve(model)

    def loaded(self, ref: ModelRef) -> Any:
        """core.loading.LoadedModel of ``ref``, loaded at most once per process (LRU)."""
        from headgraph.core.loading import load_model

        if CACHE_ONLY.get():
            raise ColdMiss(ref.id)

        root = None if self.settings.allow_any_path or self.settings.model_root is None \
            else str(self.settings.model_root)

        def load() -> Any:
            lm = load_model(ref.spec, device=self.device, processing=PROCESSING,
                            model_root=root if ref.kind == "local" else None)
            self._remember(ref, Identity(lm.heads.fingerprint, lm.heads.info))
            return lm

        return self.models.get((ref.spec, PROCESSING, self.device), load)

    def heads(self, ref: ModelRef) -> HeadWeights:
        return self.loaded(ref).heads

    def _id_key(self, ref: ModelRef) -> tuple[str, str] | None:
        stamp = self.registry.stamp(ref)
        return None if stamp is None else (f"{ref.spec}|{PROCESSING}", stamp)

    def _remember(self, ref: ModelRef, ident: Identity) -> None:
        key = self._id_key(ref)
        if key is None:
            return
        with self._ids_guard:
            self._ids[key] = ident
        self.store.meta.set(f"model:{key[0]}|{key[1]}",
                            {"fingerprint": ident.fingerprint, "info": ident.info.to_dict()},
                            retry=True)

    def identity(self, ref: ModelRef, *, load: bool = True) -> Identity | None:
        """Fingerprint and info of ``ref``: memo, then meta cache, then (if ``load``) loading."""
        key = self._id_key(ref)
        if key is not None:
            with self._ids_guard:
                hit = self._ids.get(key)
            if hit is not None:
                return hit
            raw = self.store.meta.get(f"model:{key[0]}|{key[1]}", retry=True)
            if isinstance(raw, dict):
                ident = Identity(raw["fingerprint"], info_from_dict(raw["info"]))
                with self._ids_guard:
                    self._ids[key] = ident
                return ident
        if not load:
            return None
        if CACHE_ONLY.get():
            raise ColdMiss(ref.id)
        if self.pool is not None:
            with self._local.hold(("identity", ref.spec)):  # one request per process asks
                known = self.identity(ref, load=False)
                if known is not None:
                    return known
                ident = self.pool.run("identity", ref)  # the compute process loads the model
            if key is not None:
                with self._ids_guard:
                    self._ids[key] = ident
            return ident
        heads = self.heads(ref)
        return Identity(heads.fingerprint, heads.info)

    def info(self, ref: ModelRef) -> dict[str, Any]:
        ident = self.identity(ref)
        assert ident is not None
        return ident.info.to_dict()

    def model_info(self, ref: ModelRef) -> ModelInfo:
        ident = self.identity(ref)
        assert ident is not None
        return ident.info

    # -- caching ------------------------------------------------------------------------
    def key(self, ref: ModelRef, name: str, **params: Any) -> str:
        ident = self.identity(ref)
        assert ident is not None
        return make_key(ident.fingerprint, name, params)

    def cached(self, ref: ModelRef, name: str, params: dict[str, Any], compute: Callable[[], T],
               remote: tuple[Any, ...]) -> T:
        """Cached value of (model, name, params); a cold one is computed exactly once.

        Inline: ``compute()`` here under the store's single flight. Otherwise one thread per
        process asks a compute process to run ``remote`` = (method, args[, kwargs]), the public
        method whose inline run stores this very key, then reads the store.
        """
        key = self.key(ref, name, **params)
        value = self.store.get(key, _NO)
        if value is not _NO:
            return value
        if CACHE_ONLY.get():
            raise ColdMiss(key)
        if self.pool is None:
            return self.store.get_or_compute(key, compute)
        method, args, *rest = remote
        with self._local.hold(key):
            value = self.store.get(key, _NO)
            if value is _NO:
                self.pool.run(method, *args, **(rest[0] if rest else {}))
                value = self.store.get(key, _NO)
        if value is _NO:
            from headgraph.server.compute import ComputeFailed

            raise ComputeFailed(f"{name} of {ref.id} was computed but not kept: the cache is "
                                "too small for it (raise HEADGRAPH_CACHE_SIZE_GB)")
        return value

    def cached_names(self, ref: ModelRef) -> list[str] | None:
        """Computation names cached for ``ref`` (None when its fingerprint is not yet known)."""
        ident = self.identity(ref, load=False)
        if ident is None:
            return None
        return self.store.cached_names().get(ident.fingerprint, [])

    # -- scores -------------------------------------------------------------------------
    def pk(self, ref: ModelRef, pairing: str, order: str = "forward") -> PairScores:
        """Projection Kernel of one pairing (core.pk.projection_kernel), cached."""
        check_pairing(pairing)
        check_order(order)

        def compute() -> dict[str, Any]:
            from headgraph.core.pk import projection_kernel

            return pair_scores_payload(projection_kernel(self.heads(ref), pairing, order=order))

        return pair_scores_from_payload(self.cached(ref, "pk", {"pairing": pairing, "order": order},
                                                    compute, ("pk", (ref, pairing, order))))

    def cs(self, ref: ModelRef, mode: str, order: str = "forward") -> PairScores:
        """Composition Score of one mode (core.composition.composition_score), cached."""
        check_mode(mode)
        check_order(order)

        def compute() -> dict[str, Any]:
            from headgraph.core.composition import composition_score

            return pair_scores_payload(composition_score(self.heads(ref), mode, order=order))

        return pair_scores_from_payload(self.cached(ref, "cs", {"mode": mode, "order": order},
                                                    compute, ("cs", (ref, mode, order))))

    def cs_for(self, ref: ModelRef, pairing: str, order: str = "forward") -> PairScores | None:
        mode = cs_mode_of(pairing)
        return None if mode is None else self.cs(ref, mode, order)

    @staticmethod
    def cs_modes_for(pairings: list[str]) -> list[str]:
        modes = {cs_mode_of(p) for p in pairings}
        return [m for m in CS_MODES if m in modes]

    def zscores(self, ref: ModelRef, pairing: str, order: str = "forward") -> np.ndarray:
        """z-scores of raw PK against its Haar (uniform random subspace) moments; NaN invalid."""
        ps = self.pk(ref, pairing, order)
        d_model = self.model_info(ref).d_model

        def compute() -> np.ndarray:
            from headgraph.core.reference import zscores

            z = zscores(ps, d_model)
            z = torch.where(ps.valid, z.to(ps.valid.device), torch.nan)
            return to_numpy(z)

        return self.cached(ref, "z", {"pairing": pairing, "order": order}, compute,
                           ("zscores", (ref, pairing, order)))

    def null(self, ref: ModelRef, pairing: str) -> dict[str, Any]:
        """Per-pair p-values of forward PKs against the anisotropic and the Haar nulls.

        Returns numpy grids "p" / "p_haar" (NaN where invalid), BH-significant masks at
        FDR_ALPHA ("significant" / "significant_haar") and JSON summaries of both nulls.
        """
        check_pairing(pairing)
        ps = self.pk(ref, pairing, "forward")

        def compute() -> dict[str, Any]:
            from headgraph.core.nulls import (anisotropic_null, benjamini_hochberg, haar_null,
                                              pair_pvalues)

            heads = self.heads(ref)
            aniso = anisotropic_null(heads, pairing, samples=NULL_SAMPLES, seed=0)
            haar = haar_null(heads.info.d_model, aniso.source_rank, aniso.target_rank,
                             samples=NULL_SAMPLES, seed=0, pairing=pairing)
            out: dict[str, Any] = {"alpha": FDR_ALPHA, "samples": NULL_SAMPLES}
            for suffix, null in (("", aniso), ("_haar", haar)):
                p = pair_pvalues(ps, null)
                sig = benjamini_hochberg(p, ps.valid, FDR_ALPHA)
                out["p" + suffix] = to_numpy(torch.where(ps.valid, p, torch.nan))
                out["significant" + suffix] = to_numpy(sig & ps.valid).astype(bool)
                out["summary" + suffix] = jsonable(null.to_dict())
            return out

        return self.cached(ref, "null", {"pairing": pairing, "samples": NULL_SAMPLES}, compute,
                           ("null", (ref, pairing)))

    def reference(self, ref: ModelRef) -> dict[str, Any]:
        """KL grid between role-pairing PK distributions and Haar moments (JSON data)."""

        def compute() -> dict[str, Any]:
            from headgraph.core.reference import haar_moments, kl_grid

            heads = self.heads(ref)
            info = heads.info
            grid = kl_grid(heads, samples=KL_SAMPLES, seed=0)
            m = haar_moments(info.d_model, grid.rank, grid.rank)
            moments = {"d": info.d_model, "m": grid.rank, "n": grid.rank, "mean": m.mean,
                       "variance": m.variance, "std": m.std}
            return {"kl": jsonable(grid.to_dict()), "haar_moments": jsonable(moments),
                    "d_model": info.d_model, "d_head": info.d_head, "samples": KL_SAMPLES}

        return self.cached(ref, "reference", {"samples": KL_SAMPLES}, compute, ("reference", (ref,)))

    # -- tokens and patterns ------------------------------------------------------------
    def tokens(self, ref: ModelRef, role: str) -> dict[str, Any]:
        """Top-50 token table of one role for every head (core.tokens.top_tokens)."""
        check_role(role)

        def compute() -> dict[str, Any]:
            from headgraph.core.tokens import top_tokens

            return jsonable(top_tokens(self.heads(ref), role, k=TOKENS_CACHED_K).to_dict())

        return self.cached(ref, "tokens", {"role": role, "k": TOKENS_CACHED_K}, compute,
                           ("tokens", (ref, role)))

    def tokens_view(self, ref: ModelRef, role: str, k: int, layer: int | None = None,
                    head: int | None = None) -> dict[str, Any]:
        """Token table cut to k tokens and optionally one layer (block number) and head."""
        info = self.model_info(ref)
        check_role(role)
        if info.d_vocab is None:
            raise UnsupportedModel(f"{info.name} has no unembedding (W_U): token names need one")
        if layer is not None and layer not in info.layer_indices:
            raise NotFound(f"unknown layer {layer}; attention layers: {list(info.layer_indices)}")
        n = info.heads_of(role)
        if head is not None and not 0 <= head < n:
            raise NotFound(f"unknown head {head} for role {role}; allowed 0..{n - 1}")
        table = self.tokens(ref, role)
        rows = [dict(h, tokens=h["tokens"][:k]) for h in table["heads"]
                if (layer is None or h["layer"] == layer) and (head is None or h["head"] == head)]
        return {"model": ref.id, "role": role, "k": min(k, table["k"]),
                "formula": table.get("formula", ""), "heads": rows}

    def patterns(self, ref: ModelRef) -> dict[str, Any]:
        """Attention-pattern scores per head (core.patterns.pattern_scores), JSON data."""

        def compute() -> dict[str, Any]:
            from headgraph.core.patterns import pattern_scores

            source = self.loaded(ref).patterns
            if source is None:
                return {"available": False}
            return {"available": True, **jsonable(pattern_scores(source).to_dict())}

        out = self.cached(ref, "patterns", {}, compute, ("patterns_or_none", (ref,)))
        if not out.get("available"):
            raise NotFound(f"{ref.id} cannot be run here (weights read without a runnable "
                           "model), so it has no attention-pattern scores")
        return {k: v for k, v in out.items() if k != "available"}

    def patterns_or_none(self, ref: ModelRef) -> dict[str, Any] | None:
        try:
            return self.patterns(ref)
        except NotFound:
            return None

    # -- labels -------------------------------------------------------------------------
    def builtin_label_sets(self) -> dict[str, Any]:
        """core's shipped label sets, parsed once per process."""
        if self._builtin_labels is None:
            from headgraph.core.labels import builtin_label_sets

            self._builtin_labels = builtin_label_sets()
        return self._builtin_labels

    def label_sets(self) -> dict[str, Any]:
        """Built-in label sets plus uploaded ones (uploaded under a built-in name are refused).

        The per-model set PATTERN_LABELS is not here: it exists only for a given model
        (``label_set(PATTERN_LABELS, ref)``)."""
        out: dict[str, Any] = dict(self.builtin_label_sets())
        for key in list(self.store.meta.iterkeys()):
            if isinstance(key, str) and key.startswith("labels:"):
                ls = self._uploaded(key[len("labels:"):])
                if ls is not None and ls.name not in out:
                    out[ls.name] = ls
        return out

    def _uploaded(self, name: str) -> Any:
        from headgraph.core.labels import LabelSet

        raw = self.store.meta.get("labels:" + name, retry=True)
        if not isinstance(raw, dict):
            return None
        return LabelSet(name=raw["name"], description=raw.get("description", ""),
                        classes=dict(raw.get("classes", {})), model=raw.get("model"))

    def label_set(self, name: str | None, ref: ModelRef | None = None) -> Any:
        """A label set by name (None for no name); NotFound lists the available ones.

        PATTERN_LABELS resolves per model: ``ref``'s classes from its attention patterns
        (``pattern_label_set``); without ``ref`` it is an Invalid request.
        """
        if not name:
            return None
        if name == PATTERN_LABELS:
            if ref is None:
                raise Invalid(f"label set {PATTERN_LABELS!r} is computed per model: give model=")
            return self.pattern_label_set(ref)
        found = self.builtin_label_sets().get(name) or self._uploaded(name)
        if found is None:
            sets = sorted([*self.label_sets(), PATTERN_LABELS])
            raise NotFound(f"unknown label set {name!r}; available: {sets}", allowed=sets)
        return found

    def pattern_label_set(self, ref: ModelRef) -> Any:
        """core.labels.LabelSet of ``ref``'s heads classed by attention-pattern scores.

        Built from the cached (single-flight) pattern scores with PATTERN_LABEL_THRESHOLDS;
        heads named L{layer}H{head} (original block numbers). NotFound when the model cannot
        be run here (no attention patterns).
        """
        from headgraph.core.labels import label_set_from_scores

        patterns = self.patterns(ref)
        grids = {kind: torch.tensor(np.asarray(patterns["scores"][kind], dtype=np.float64))
                 for kind in PATTERN_LABEL_THRESHOLDS}  # JSON null (NaN) -> nan
        ls = label_set_from_scores(grids, patterns["layer_indices"], PATTERN_LABEL_THRESHOLDS,
                                   name=PATTERN_LABELS, description=PATTERN_LABEL_DESCRIPTION)
        return replace(ls, model=ref.id)

    def save_label_set(self, label_set: Any) -> None:
        if label_set.name in self.builtin_label_sets() or label_set.name == PATTERN_LABELS:
            raise Invalid(f"label set name {label_set.name!r} is taken by a built-in set")
        self.store.meta.set("labels:" + label_set.name, label_set.to_dict(), retry=True)

    # -- derived views ------------------------------------------------------------------
    def metric_grid(self, ref: ModelRef, pairing: str, metric: str, order: str = "forward"
                    ) -> tuple[PairScores, np.ndarray]:
        """(PK scores, the grid of raw | normalized | z | cs) for one pairing."""
        ps = self.pk(ref, pairing, order)
        if metric in ("raw", "pk"):
            return ps, ps.scores.numpy()
        if metric == "normalized":
            return ps, ps.normalized.numpy()
        if metric == "z":
            return ps, self.zscores(ref, pairing, order)
        if metric == "cs":
            cs = self.cs_for(ref, pairing, order)
            if cs is None:
                raise Invalid(f"no Composition Score for pairing {pairing!r}: CS exists for "
                              "OQ, OK and OV only")
            return ps, np.where(cs.valid.numpy(), cs.scores.numpy(), np.nan)
        raise Invalid(f"unknown metric {metric!r}")

    def top(self, ref: ModelRef, pairing: str, k: int, metric: str, order: str = "forward"
            ) -> list[dict[str, Any]]:
        """The k best valid pairs by pk | normalized | z | cs (core.ranking.top_pairs).

        Records: rank, source, target (L{block}H{head}; L{block}KV{g} for grouped K/V),
        pk, normalized (of PK), z and cs (when the pairing has a CS mode and, for grouped-query
        models, when ranked by CS, whose grid has query heads on both axes).
        """
        from headgraph.core.ranking import expand_heads, top_pairs

        if metric not in ("pk", "normalized", "z", "cs"):
            raise Invalid(f"unknown metric {metric!r}; allowed: ['pk', 'normalized', 'z', 'cs']")
        ps = self.pk(ref, pairing, order)
        cs = self.cs_for(ref, pairing, order)
        z = torch.from_numpy(self.zscores(ref, pairing, order))
        info = self.model_info(ref)
        if metric == "cs":
            if cs is None:
                raise Invalid(f"no Composition Score for pairing {pairing!r}: CS exists for "
                              "OQ, OK and OV only")
            hs, ht = cs.scores.shape[1], cs.scores.shape[3]
            extra = {"pk": expand_heads(ps.scores, hs, ht),
                     "pk_normalized": expand_heads(ps.normalized, hs, ht),
                     "z": expand_heads(z, hs, ht)}
            records = top_pairs(cs, k, metric="pk").to_records(extra)
            for r in records:
                r["normalized"] = r.pop("pk_normalized")
            roles = (ps.source_role, "Q")  # CS axes are query heads
        else:
            extra = {"z": z}
            if cs is not None and cs.scores.shape == ps.scores.shape:
                extra["cs"] = torch.where(cs.valid, cs.scores, torch.nan)
            values = z if metric == "z" else None
            records = top_pairs(ps, k, metric="normalized" if metric == "normalized" else "pk",
                                values=values).to_records(extra)
            roles = (ps.source_role, ps.target_role)
        src_names, tgt_names = axis_labels(info, roles[0]), axis_labels(info, roles[1])
        n_s, n_t = info.heads_of(roles[0]), info.heads_of(roles[1])
        positions = {layer: i for i, layer in enumerate(info.layer_indices)}
        for r in records:
            r.pop("value", None)
            r["source"] = src_names[positions[r["source_layer"]] * n_s + r["source_head"]]
            r["target"] = tgt_names[positions[r["target_layer"]] * n_t + r["target_head"]]
            r.setdefault("cs", None)
        return jsonable(records)

    def graph(self, ref: ModelRef, *, pairings: list[str], granularity: str, k: int | None,
              threshold: float | None, threshold_on: str, labels: str | None) -> dict[str, Any]:
        """Head graph (core.graph.build_graph) as JSON: node-link, hubs, class counts; cached."""
        for p in pairings:
            check_pairing(p)
        label_set = self.label_set(labels, ref)
        params = {"pairings": ",".join(pairings), "granularity": granularity, "k": k,
                  "threshold": threshold, "threshold_on": threshold_on,
                  "labels": "" if label_set is None else
                  f"{label_set.name}:{hash_classes(label_set.classes)}"}
        kwargs = {"pairings": pairings, "granularity": granularity, "k": k,
                  "threshold": threshold, "threshold_on": threshold_on}
        return self.cached(ref, "graph", params,
                           lambda: jsonable(self.head_graph(ref, **kwargs,
                                                            label_set=label_set).to_dict()),
                           ("graph", (ref,), {**kwargs, "labels": labels}))

    def hubs(self, ref: ModelRef, *, pairings: list[str] | tuple[str, ...] = GRAPH_PAIRINGS,
             k: int = 20) -> dict[str, Any]:
        """Hub table of the paper's head graph: PK, forward order, head granularity, top-``k``
        edges per pairing (paper: OQ/OK/OV, k = 20; on GPT-2 small its top hub is L4H7).

        Read from the cached JSON graph (``graph``), so it is the very table GET /api/graph
        returns for the same parameters: model, pairings, k, graph_rule (edge selection),
        edge_counts, and core.hubs.HubTable.to_dict() (rule, threshold, hubs, rows, top),
        plus top_hub.
        """
        names = [check_pairing(p) for p in dict.fromkeys(pairings)]
        if not 1 <= int(k) <= 1000:
            raise Invalid(f"k must be in 1..1000, got {k}")
        g = self.graph(ref, pairings=names, granularity="head", k=int(k), threshold=None,
                       threshold_on="pk", labels=None)
        table = g["hubs"]
        rows = table.get("rows", [])
        return {"model": ref.id, "pairings": names, "k": int(k), "graph_rule": g.get("rule"),
                "edge_counts": g.get("edge_counts"), **table,
                "top_hub": rows[0]["name"] if rows else None}

    def graph_export(self, ref: ModelRef, fmt: str, *, pairings: list[str], granularity: str,
                     k: int | None, threshold: float | None, threshold_on: str,
                     labels: str | None) -> str:
        """The head graph as GraphML or GEXF text, cached like the JSON graph."""
        if fmt not in ("graphml", "gexf"):
            raise Invalid(f"unknown graph format {fmt!r}; allowed: ['graphml', 'gexf']")
        label_set = self.label_set(labels, ref)
        kwargs = {"pairings": pairings, "granularity": granularity, "k": k,
                  "threshold": threshold, "threshold_on": threshold_on}
        params = {"format": fmt, "pairings": ",".join(pairings), "granularity": granularity,
                  "k": k, "threshold": threshold, "threshold_on": threshold_on,
                  "labels": "" if label_set is None else
                  f"{label_set.name}:{hash_classes(label_set.classes)}"}

        def compute() -> str:
            hg = self.head_graph(ref, **kwargs, label_set=label_set)
            return hg.to_graphml() if fmt == "graphml" else hg.to_gexf()

        return self.cached(ref, "graph_export", params, compute,
                           ("graph_export", (ref, fmt), {**kwargs, "labels": labels}))

    def head_graph(self, ref: ModelRef, *, pairings: list[str], granularity: str, k: int | None,
                   threshold: float | None, threshold_on: str, label_set: Any) -> Any:
        """The core HeadGraph object (for exports such as GraphML)."""
        from headgraph.core.graph import build_graph

        results = {p: self.pk(ref, p, "forward") for p in pairings}
        cs = {m: self.cs(ref, m, "forward") for m in self.cs_modes_for(pairings)}
        values = None
        if threshold_on == "z":
            values = {p: torch.from_numpy(self.zscores(ref, p, "forward")) for p in pairings}
        elif threshold_on == "fdr":
            values = {p: torch.from_numpy(self.null(ref, p)["significant"]) for p in pairings}
        return build_graph(results, granularity=granularity, k=k, threshold=threshold,
                           threshold_on=threshold_on, values=values, cs=cs or None,
                           labels=label_set, info=self.model_info(ref))

    def scatter(self, ref: ModelRef, pairing: str, top_percent: float) -> dict[str, Any]:
        """PK vs CS of every valid pair with quadrants and Spearman (core.ranking.compare_metrics).

        Points are on the CS grid (query heads on both axes; grouped K/V PK repeated per query
        head). quadrant: 0 neither top x%, 1 PK only, 2 CS only, 3 both.
        """
        from headgraph.core.ranking import compare_metrics

        check_pairing(pairing)
        mode = cs_mode_of(pairing)
        if mode is None:
            raise Invalid(f"no Composition Score for pairing {pairing!r}; scatter needs OQ, OK or OV")
        ps = self.pk(ref, pairing)
        cs = self.cs(ref, mode)

        def compute() -> dict[str, Any]:
            cmp = compare_metrics(ps, cs, top_percent=top_percent)
            info = self.model_info(ref)
            src, tgt = axis_labels(info, "O"), axis_labels(info, "Q")
            n_src, n_tgt = len(src), len(tgt)
            valid = cmp.valid.reshape(n_src, n_tgt)
            rows, cols = torch.nonzero(valid, as_tuple=True)
            points = {"source": [src[i] for i in rows.tolist()],
                      "target": [tgt[j] for j in cols.tolist()],
                      "pk": cmp.pk_values.reshape(n_src, n_tgt)[rows, cols].tolist(),
                      "cs": cs.scores.reshape(n_src, n_tgt)[rows, cols].tolist(),
                      "quadrant": cmp.quadrant.reshape(n_src, n_tgt)[rows, cols].tolist()}
            return {"pairing": pairing, "mode": mode, "top_percent": top_percent,
                    "points": jsonable(points), "comparison": jsonable(cmp.to_dict())}

        return self.cached(ref, "scatter", {"pairing": pairing, "top_percent": top_percent},
                           compute, ("scatter", (ref, pairing, top_percent)))

    def pair_detail(self, ref: ModelRef, pairing: str, sl: int, sh: int, tl: int, th: int
                    ) -> dict[str, Any]:
        """PK, normalized PK and principal angles of one pair (core.pk.pair_detail), cached."""

        def compute() -> dict[str, Any]:
            from headgraph.core.pk import pair_detail

            return jsonable(pair_detail(self.heads(ref), pairing, sl, sh, tl, th).to_dict())

        return self.cached(ref, "pair", {"pairing": pairing, "s": f"{sl}.{sh}", "t": f"{tl}.{th}"},
                           compute, ("pair_detail", (ref, pairing, sl, sh, tl, th)))

    def pair(self, ref: ModelRef, pairing: str, source: str, target: str,
             labels: str | None, k: int = 5) -> dict[str, Any]:
        """Everything about one head pair: PK with principal angles, CS, z, p-values, classes, tokens."""
        check_pairing(pairing)
        info = self.model_info(ref)
        s_role, t_role = pairing[0], pairing[1]
        sl, sh = parse_node(source, s_role, info)
        tl, th = parse_node(target, t_role, info)
        label_set = self.label_set(labels, ref)
        ps = self.pk(ref, pairing, "all")
        detail = dict(self.pair_detail(ref, pairing, sl, sh, tl, th))
        forward = bool(info.layer_indices[sl] < info.layer_indices[tl])
        detail.update(model=ref.id, forward=forward,
                      valid=forward and bool(ps.valid[sl, sh, tl, th]))
        cs = self.cs_for(ref, pairing, "all")
        detail["cs"] = None
        if cs is not None and "KV" not in target.upper():
            tq = parse_node(target, "Q", info)[1]  # CS grids index query heads
            if bool(cs.valid[sl, sh, tl, tq]):
                detail["cs"] = float(cs.scores[sl, sh, tl, tq])
        z_all = self.zscores(ref, pairing, "all")
        detail["z"] = jsonable(float(z_all[sl, sh, tl, th]))
        detail["p_haar"] = None
        detail["p_anisotropic"] = None
        if forward and detail["valid"]:
            null = self.null(ref, pairing)
            detail["p_haar"] = jsonable(float(null["p_haar"][sl, sh, tl, th]))
            detail["p_anisotropic"] = jsonable(float(null["p"][sl, sh, tl, th]))
            detail["significant"] = bool(null["significant"][sl, sh, tl, th])
            detail["fdr_alpha"] = null["alpha"]
        names = {"source": axis_labels(info, s_role)[sl * info.heads_of(s_role) + sh],
                 "target": axis_labels(info, t_role)[tl * info.heads_of(t_role) + th]}
        detail.update(names)
        for side, name, role in (("source", names["source"], s_role),
                                 ("target", names["target"], t_role)):
            detail[f"{side}_class"] = None if label_set is None else label_set.class_of(name)
            detail[f"{side}_tokens"] = self._head_tokens(ref, info, role, name, k)
        detail["labels"] = None if label_set is None else label_set.name
        return detail

    def _head_tokens(self, ref: ModelRef, info: ModelInfo, role: str, name: str, k: int
                     ) -> list[dict[str, Any]] | None:
        if info.d_vocab is None:
            return None
        for h in self.tokens(ref, role)["heads"]:
            if h["name"] == name:
                return h["tokens"][:k]
        return None

    def head(self, ref: ModelRef, name: str, labels: str | None, k: int) -> dict[str, Any]:
        """One head: class, ranks, top tokens per role, pattern scores and strongest partners."""
        info = self.model_info(ref)
        layer_pos, head = parse_node(name, "O", info)
        label = f"L{info.layer_indices[layer_pos]}H{head}"
        label_set = self.label_set(labels, ref)
        out: dict[str, Any] = {"model": ref.id, "head": label,
                               "layer": info.layer_indices[layer_pos], "index": head,
                               "class": None if label_set is None else label_set.class_of(label),
                               "labels": None if label_set is None else label_set.name}
        tokens: dict[str, Any] = {}
        if info.d_vocab is not None:
            for role in ROLES:
                pos, idx = parse_node(label, role, info)
                node = axis_labels(info, role)[pos * info.heads_of(role) + idx]
                tokens[role] = self._head_tokens(ref, info, role, node, k)
        out["tokens"] = tokens
        patterns = self.patterns_or_none(ref)
        out["patterns"] = None if patterns is None else {
            kind: grid[layer_pos][head] for kind, grid in patterns["scores"].items()}
        partners: dict[str, Any] = {}
        for pairing in GRAPH_PAIRINGS:
            ps = self.pk(ref, pairing, "forward")
            out_scores = ps.scores[layer_pos, head]  # as source (O side): [L, Ht]
            tgt_pos, tgt_idx = parse_node(label, pairing[1], info)
            in_scores = ps.scores[:, :, tgt_pos, tgt_idx]  # as target: [L, Hs]
            partners[pairing] = {
                "out": self._best(out_scores, ps.valid[layer_pos, head], info, pairing[1], k),
                "in": self._best(in_scores, ps.valid[:, :, tgt_pos, tgt_idx], info, "O", k)}
        out["partners"] = partners
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


def hash_classes(classes: dict[str, str]) -> str:
    import hashlib

    return hashlib.sha256(repr(sorted(classes.items())).encode()).hexdigest()[:12]
