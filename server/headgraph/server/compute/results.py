"""The result cache every registered computation goes through.

``ResultCache.get(ref, name, **params)`` validates the parameters with the computation's
checks, derives the key (fingerprint + name + canonical parameters + COMPUTE_VERSION; the
weights fingerprint for a computation that reads the head weights only, the model
fingerprint for one that reads the runnable model: ``Computation.reads``) and returns the
stored value (or the refusal remembered under the same key); a cold key is computed exactly
once (single flight across threads and processes). Inline (compute processes, CLI, ``compute_processes=0``) the
registered function runs here; otherwise one thread per process sends a ``Compute`` task
naming it to a compute process, then reads what that process stored.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import parse_qsl

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.types import HeadWeights, ModelInfo
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.cache.locks import KeyedLocks
from headgraph.server.cache.store import Store, make_key
from headgraph.server.compute.memory import trim
from headgraph.server.compute.pool import Compute, ComputeFailed, ComputeMany, ComputePool, rebuild_error
from headgraph.server.compute.progress import progress_key, read_progress, recording
from headgraph.server.compute.registry import Computation, Computations
from headgraph.server.models.catalog import Identity, ModelCatalog
from headgraph.server.errors import one_line
from headgraph.server.models.offered import ModelRef

_NO = object()  # "not in the store" sentinel (immutable)
# Failures that are the model's (it cannot run, its files are malformed): remembered per key.
REMEMBERED = (UnsupportedModel, InvalidInput)


class ModelInputs:
    """:class:`~headgraph.server.compute.registry.Inputs` of one model, read through the catalog
    (heads, info, patterns) and the cache (other results)."""

    def __init__(self, ref: ModelRef, catalog: ModelCatalog, cache: ResultCache) -> None:
        self.ref = ref
        self._catalog = catalog
        self._cache = cache

    @property
    def heads(self) -> HeadWeights:
        return self._catalog.heads(self.ref)

    @property
    def info(self) -> ModelInfo:
        return self._catalog.model_info(self.ref)

    @property
    def patterns(self) -> Any:
        return self._catalog.loaded(self.ref).patterns

    def result(self, name: str, **params: Any) -> Any:
        return self._cache.get(self.ref, name, **params)


class ResultCache:
    """Cached values of registered computations per model."""

    def __init__(self, store: Store, catalog: ModelCatalog, computations: Computations,
                 pool: ComputePool | None) -> None:
        self.store = store
        self.catalog = catalog
        self.computations = computations
        self.pool = pool
        self._local = KeyedLocks()

    @staticmethod
    def _key_of(ident: Identity, comp: Computation, params: dict[str, Any]) -> str:
        """The store key of ``comp`` with checked ``params`` for a model of identity ``ident``:
        under its model fingerprint when the computation reads the runnable model."""
        key_params = comp.key_params(params)
        fp = ident.model_fingerprint if comp.reads_model(key_params) else ident.fingerprint
        return make_key(fp, comp.name, key_params)

    def _key(self, ref: ModelRef, comp: Computation, params: dict[str, Any]) -> str:
        return self._key_of(self.catalog.identity(ref), comp, params)

    def key(self, ref: ModelRef, name: str, **params: Any) -> str:
        """Store key of computation ``name`` of ``ref`` with ``params``."""
        comp = self.computations.get(name)
        return self._key(ref, comp, comp.prepare(params))

    def has(self, ref: ModelRef, name: str, **params: Any) -> bool:
        return self.store.has(self.key(ref, name, **params))

    def get(self, ref: ModelRef, name: str, **params: Any) -> Any:
        """The value of computation ``name`` of ``ref``; a cold one is computed exactly once.
        A computation the model cannot do (UnsupportedModel, InvalidInput of its files) fails
        once: its error is remembered and answered at once until ``forget_failures``."""
        comp = self.computations.get(name)
        checked = comp.prepare(params)
        key = self._key(ref, comp, checked)
        value = self.store.get(key, _NO)
        if value is not _NO:
            return comp.load(value)
        failed = self.store.failure(key)
        if failed is not None:
            raise rebuild_error({"kind": "core", **failed})
        if CACHE_ONLY.get():
            raise ColdMiss(key)
        with self._remembering(key):
            if self.pool is None:
                inputs = ModelInputs(ref, self.catalog, self)
                return comp.load(self.store.get_or_compute(key, lambda: self._run(ref, comp, inputs, checked)))
            with self._local.hold(key):
                value = self.store.get(key, _NO)
                if value is _NO:
                    self.pool.run(Compute(name, ref, checked))
                    value = self.store.get(key, _NO)
        if value is _NO:
            raise ComputeFailed(f"{name} of {ref.id} was computed but not kept: the cache is "
                                "too small for it (raise HEADGRAPH_CACHE_SIZE_GB)")
        return comp.load(value)

    def _run(self, ref: ModelRef, comp: Computation, inputs: ModelInputs, checked: dict[str, Any]) -> Any:
        """Run ``comp`` inline, its progress reports recorded (compute.progress)."""
        try:
            with recording(self.store.meta, progress_key(ref.id, comp.name, comp.key_params(checked))):
                return comp.run(inputs, checked)
        finally:
            trim()  # what the computation freed leaves the resident size before the next one

    def progress(self, ref: ModelRef, name: str, **params: Any) -> dict[str, Any]:
        """Where computation ``name`` of ``ref`` is, never loading the model: {"state":
        "cached"} (ready to read), {"state": "running", "stage", "fraction", "message",
        "elapsed_s"} (a run in some process reports it), else {"state": "idle"} (not started,
        or the model is still loading for it)."""
        comp = self.computations.get(name)
        checked = comp.prepare(params)
        ident = self.catalog.known_identity(ref)
        if ident is not None and self.store.has(self._key_of(ident, comp, checked)):
            return {"state": "cached"}
        running = read_progress(self.store.meta, progress_key(ref.id, comp.name, comp.key_params(checked)))
        return {"state": "idle"} if running is None else {"state": "running", **running}

    @contextmanager
    def _remembering(self, key: str) -> Iterator[None]:
        """Remember a failure of ``key`` that is the model's (see ``get``)."""
        try:
            yield
        except REMEMBERED as err:
            self.store.remember_failure(key, type(err).__name__, one_line(err, 1000))
            raise

    def failure(self, ref: ModelRef, name: str, **params: Any) -> dict[str, str] | None:
        """The remembered failure ({cls, message}) of computation ``name`` of ``ref``; None when
        there is none or the model's identity is not known yet (never loads a model)."""
        if self.catalog.known_identity(ref) is None:
            return None
        return self.store.failure(self.key(ref, name, **params))

    def forget_failures(self, ref: ModelRef) -> int:
        """Forget ``ref``'s remembered failures, weight- and model-level (a user asked to
        compute it again)."""
        ident = self.catalog.known_identity(ref)
        if ident is None:
            return 0
        return (self.store.forget_failures(ident.fingerprint)
                + self.store.forget_failures(ident.model_fingerprint))

    def warm(self, ref: ModelRef, name: str, params: list[dict[str, Any]]) -> None:
        """Make sure ``name`` is cached for every parameter set, the cold ones computed
        together (the computation's ``batch`` does their shared work once)."""
        comp = self.computations.get(name)
        checked = [comp.prepare(p) for p in params]
        cold, seen = [], set()
        for p in checked:
            key = self._key(ref, comp, p)
            if key not in seen and not self.store.has(key):
                seen.add(key)
                cold.append(p)
        if not cold:
            return
        if CACHE_ONLY.get():
            raise ColdMiss(name)
        if self.pool is not None:  # the compute process runs the batch inline, keeping every key
            self.pool.run(ComputeMany(name, ref, tuple(cold)))
            return
        if comp.batch is not None:
            try:
                comp.batch(ModelInputs(ref, self.catalog, self), cold)
            finally:
                trim()
        for p in cold:
            self.get(ref, name, **p)

    def cached_names(self, ref: ModelRef) -> list[str] | None:
        """Computation names cached for ``ref`` (None when its identity is not yet known)."""
        ident = self.catalog.known_identity(ref)
        if ident is None:
            return None
        return cached_names_of(self.store.cached_names(), ident, self.computations)


def cached_names_of(by_fingerprint: dict[str, list[str]], ident: Identity,
                    computations: Computations) -> list[str]:
    """The names (with parameters) of ``Store.cached_names`` that are results of the model of
    ``ident``: weight-level ones under its weights fingerprint (shared with every model of the
    same head weights), model-level ones under its model fingerprint; an activation-level name
    under the weights fingerprint (cached before results were keyed so) is not its."""
    def reads_model(name: str) -> bool | None:
        base, _, query = name.partition("?")
        if base not in computations:
            return None
        return computations.get(base).reads_model(dict(parse_qsl(query)))

    weights = [n for n in by_fingerprint.get(ident.fingerprint, []) if reads_model(n) is False]
    model = [n for n in by_fingerprint.get(ident.model_fingerprint, []) if reads_model(n) is not False]
    return sorted({*weights, *model})
