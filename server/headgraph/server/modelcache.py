"""Model resolution, loading and the result cache every computation goes through.

ModelCache resolves a model name (Registry), loads it at most once per process (LRU), knows
its identity (weight fingerprint + ModelInfo) and keeps computed results in the store under
one key per (fingerprint, computation, parameters, COMPUTE_VERSION); a cold key is computed
once (single flight), here or in a compute process.

Model identity: ``(spec, processing, stamp)`` -> (fingerprint, ModelInfo) is remembered in the
store's meta cache, where ``stamp`` is a cheap file-level identity (core package files for the
demo, snapshot commit for hub models, file sizes/mtimes for local folders). Warm reads
therefore never load a model, even after a restart.
"""

from __future__ import annotations

import threading
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, TypeVar
from collections.abc import Callable

from headgraph.core.types import HeadWeights, ModelInfo
from headgraph.server.registry import ModelRef, Registry
from headgraph.server.settings import Settings
from headgraph.server.store import KeyedLocks, ModelLRU, Store, make_key

T = TypeVar("T")
_NO = object()  # "not in the store" sentinel (immutable)
# True while a call runs on the event loop: it may read the cache, never load or compute.
CACHE_ONLY: ContextVar[bool] = ContextVar("headgraph_cache_only", default=False)
PROCESSING = "bridge"


class ColdMiss(Exception):
    """Raised in cache-only mode when a result (or a model identity) is not cached yet."""


@dataclass(frozen=True)
class Identity:
    """What a model is without loading it: weight fingerprint and shape info."""

    fingerprint: str
    info: ModelInfo


def info_from_dict(d: dict[str, Any]) -> ModelInfo:
    fields = dict(d)
    fields["layer_indices"] = tuple(fields["layer_indices"])
    return ModelInfo(**fields)


class ModelCache:
    """Models (per-process LRU), their identities and the cached-result primitive.

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
