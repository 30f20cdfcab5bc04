"""The model catalog: which models exist (Registry), the loaded ones (per-process LRU) and
what each one is (weights fingerprint, model fingerprint + ModelInfo) without loading it again.

Model identity: ``(spec, processing, stamp)`` -> (fingerprint, model fingerprint, ModelInfo)
is remembered in the store's meta cache, where ``stamp`` is a cheap file-level identity (core
package files for the demo, snapshot commit for hub models, file sizes/mtimes for local
folders); an entry without the model fingerprint (written before there was one) counts as
unknown and is learnt again. Warm reads
therefore never load a model, even after a restart. In the API process (``pool`` given) an
unknown identity is learnt by a compute process, which loads the model there.

A norm-aware ref (``MODEL@norm``, ModelRef.subspaces "norm") is its raw model, loaded once,
with the norm gains folded in (core.models.loading.norm_aware): its own LRU slot, identity key
and fingerprint (fold_norm_gains), so no result of one mode is read for the other.
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from headgraph.core.types import HeadWeights, ModelInfo
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.cache.locks import KeyedLocks
from headgraph.server.cache.store import ModelLRU, Store
from headgraph.server.models.offered import ModelRef, Registry
from headgraph.server.settings import Settings

PROCESSING = "bridge"


@dataclass(frozen=True)
class Identify:
    """Load ``ref`` and send back its Identity (the only task that returns a value)."""

    ref: ModelRef


class TaskRunner(Protocol):
    """Where an unknown identity is learnt: the API process's compute pool
    (``compute.pool.ComputePool``), which runs an :class:`Identify` task in a child process."""

    def run(self, task: Identify) -> Any: ...


@dataclass(frozen=True)
class Identity:
    """What a model is without loading it: its weights fingerprint (the head weights,
    W_U and tokenizer: keys of weight-level results), its model fingerprint (the whole
    runnable model: keys of activation-level results; core.models.fingerprint) and shape info."""

    fingerprint: str
    info: ModelInfo
    model_fingerprint: str

    @staticmethod
    def of(lm: Any) -> Identity:
        """The identity of a core.models.loading.LoadedModel."""
        return Identity(lm.heads.fingerprint, lm.heads.info, lm.model_fingerprint)


def info_from_dict(d: dict[str, Any]) -> ModelInfo:
    fields = dict(d)
    fields["layer_indices"] = tuple(fields["layer_indices"])
    return ModelInfo(**fields)


def public_identity(ref: ModelRef, ident: Identity) -> Identity:
    """``ident`` as clients may see it: a local model is named by its (raw) id (an identity
    learnt before models were named so, or elsewhere, may carry the folder's server path)."""
    name = ref.with_subspaces("raw").id
    if ref.kind != "local" or ident.info.name == name:
        return ident
    return dataclasses.replace(ident, info=dataclasses.replace(ident.info, name=name))


def _mode(ref: ModelRef) -> str:
    """The weights' processing and subspaces as identity keys spell them (raw: as before)."""
    return PROCESSING if ref.subspaces == "raw" else f"{PROCESSING}|{ref.subspaces}"


def _norm_aware(raw: Any) -> Any:
    """A LoadedModel's norm-aware twin, fingerprinted as ``load_model(subspaces="norm")`` does
    (UnsupportedModel when its norms cannot be measured: a streamed checkpoint)."""
    from headgraph.core.models.fingerprint import with_tokenizer
    from headgraph.core.models.loading import norm_aware

    lm = norm_aware(raw)
    lm.heads.fingerprint = with_tokenizer(lm.heads.fingerprint, lm.tokenizer)
    return lm


class ModelCatalog:
    """Resolve model names, load models at most once per process, know their identities."""

    def __init__(self, settings: Settings, store: Store, pool: TaskRunner | None) -> None:
        self.settings = settings
        self.store = store
        self.pool = pool
        self.registry = Registry(settings)
        self.models: ModelLRU[Any] = ModelLRU(settings.model_lru)
        self._ids: dict[tuple[str, str], Identity] = {}
        self._ids_guard = threading.Lock()
        self._local = KeyedLocks()
        self._device: str | None = None

    @property
    def device(self) -> str:
        if self._device is None:
            self._device = self.settings.torch_device
        return self._device

    def resolve(self, model: str) -> ModelRef:
        return self.registry.resolve(model)

    # -- loading --------------------------------------------------------------------------
    def loaded(self, ref: ModelRef) -> Any:
        """core.models.loading.LoadedModel of ``ref``, loaded at most once per process (LRU)."""
        from headgraph.core.models.loading import load_model

        if CACHE_ONLY.get():
            raise ColdMiss(ref.id)
        root = None if self.settings.allow_any_path or self.settings.model_root is None \
            else str(self.settings.model_root)

        def load() -> Any:
            if ref.subspaces == "norm":
                lm = _norm_aware(self.loaded(ref.with_subspaces("raw")))
                self._remember(ref, Identity.of(lm))
                return lm
            local = ref.kind == "local"
            # name=ref.id: ModelInfo.name and messages of a local folder (or a packaged GGUF
            # file) say its model id, never the server path it lives at.
            lm = load_model(ref.spec, device=self.device, processing=PROCESSING,
                            model_root=root if local else None,
                            name=ref.id if local or ref.path is not None else None)
            self._remember(ref, Identity.of(lm))
            return lm

        # keyed by the files' stamp too: weights swapped under the same name are loaded anew
        return self.models.get((ref.spec, _mode(ref), self.device, self.registry.stamp(ref)), load)

    def heads(self, ref: ModelRef) -> HeadWeights:
        return self.loaded(ref).heads

    # -- identity -------------------------------------------------------------------------
    def _id_key(self, ref: ModelRef) -> tuple[str, str] | None:
        stamp = self.registry.stamp(ref)
        return None if stamp is None else (f"{ref.spec}|{_mode(ref)}", stamp)

    def _memo(self, key: tuple[str, str] | None, ident: Identity) -> None:
        if key is not None:
            with self._ids_guard:
                self._ids[key] = ident

    def _remember(self, ref: ModelRef, ident: Identity) -> None:
        key = self._id_key(ref)
        if key is None:
            return
        ident = public_identity(ref, ident)
        self._memo(key, ident)
        self.store.meta.set(f"model:{key[0]}|{key[1]}",
                            {"fingerprint": ident.fingerprint,
                             "model_fingerprint": ident.model_fingerprint,
                             "info": ident.info.to_dict()},
                            retry=True)

    def known_identity(self, ref: ModelRef) -> Identity | None:
        """Fingerprints and info of ``ref`` from the memo or the meta cache; None if unknown
        (an entry without a model fingerprint counts as unknown)."""
        key = self._id_key(ref)
        if key is None:
            return None
        with self._ids_guard:
            hit = self._ids.get(key)
        if hit is not None:
            return hit
        raw = self.store.meta.get(f"model:{key[0]}|{key[1]}", retry=True)
        if not isinstance(raw, dict) or not isinstance(raw.get("model_fingerprint"), str):
            return None
        ident = public_identity(ref, Identity(raw["fingerprint"], info_from_dict(raw["info"]),
                                              raw["model_fingerprint"]))
        self._memo(key, ident)
        return ident

    def identity(self, ref: ModelRef) -> Identity:
        """Fingerprints and info of ``ref``: memo, meta cache, else loading it (in a compute
        process when this process has a pool; ColdMiss in cache-only mode)."""
        known = self.known_identity(ref)
        if known is not None:
            return known
        if CACHE_ONLY.get():
            raise ColdMiss(ref.id)
        if self.pool is None:
            ident = Identity.of(self.loaded(ref))
            self._remember(ref, ident)  # loaded before its identity was learnt (an older entry)
            return public_identity(ref, ident)
        with self._local.hold(("identity", ref.spec, ref.subspaces)):  # one request per process asks
            known = self.known_identity(ref)
            if known is not None:
                return known
            ident = public_identity(ref, self.pool.run(Identify(ref)))  # loaded over there
        self._memo(self._id_key(ref), ident)
        return ident

    def info(self, ref: ModelRef) -> dict[str, Any]:
        return self.identity(ref).info.to_dict()

    def model_info(self, ref: ModelRef) -> ModelInfo:
        return self.identity(ref).info
