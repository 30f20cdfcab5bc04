"""The composition root: the one place that builds the server's services and wires them.

``build_services(settings)`` is what the app (server/http/app.py), the CLI (server/cli/main.py) and
every compute process (through ``compute_worker``, the factory handed to the ComputePool)
use. Nothing else constructs a service; routers get theirs through server/http/deps.py.

    Store ─┬─ ModelCatalog (registry, model LRU, identities) ─┐
           └─ ResultCache (Computations registry, single flight, ComputePool) ─┬─ ScoresService
                                         LabelService (store, scores) ─────────┤
               ViewService, GraphService, DetailService, JobManager ───────────┤
               AblationService, DataPKService, ValidationService ─────────────┘
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from headgraph.server.cache.store import Store
from headgraph.server.computations.ablation import ablation_computations
from headgraph.server.computations.data_pk import data_pk_computations
from headgraph.server.computations.graphs import graph_computations
from headgraph.server.computations.circuits import circuit_computations
from headgraph.server.computations.recovery import recovery_computations
from headgraph.server.computations.scores import score_computations
from headgraph.server.computations.validation import validation_computations
from headgraph.server.compute.pool import ComputePool
from headgraph.server.compute.registry import Computations
from headgraph.server.compute.results import ResultCache
from headgraph.server.models.catalog import ModelCatalog
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.ablation import AblationService
from headgraph.server.services.data_pk import DataPKService
from headgraph.server.services.details import DetailService
from headgraph.server.services.graphs import GraphService
from headgraph.server.services.jobs import JobManager, Shown
from headgraph.server.services.labels import LabelService
from headgraph.server.services.circuits import CircuitService
from headgraph.server.services.recovery import RecoveryService
from headgraph.server.services.scores import ScoresService
from headgraph.server.services.subgraphs import SubgraphService
from headgraph.server.services.validation import ValidationService
from headgraph.server.services.views import ViewService
from headgraph.server.settings import Settings


def build_computations() -> Computations:
    """Every named computation the cache can hold (the same in every process)."""
    return Computations([*score_computations(), *graph_computations(), *ablation_computations(),
                         *data_pk_computations(), *validation_computations(),
                         *recovery_computations(), *circuit_computations()])


@dataclass
class Services:
    """Everything one process serves with; also what a compute process runs tasks on."""

    settings: Settings
    store: Store
    computations: Computations
    pool: ComputePool | None
    catalog: ModelCatalog
    cache: ResultCache
    scores: ScoresService
    labels: LabelService
    views: ViewService
    graphs: GraphService
    details: DetailService
    ablation: AblationService
    data_pk: DataPKService
    validation: ValidationService
    jobs: JobManager
    recovery: RecoveryService
    circuits: CircuitService
    subgraphs: SubgraphService

    def close(self) -> None:
        self.jobs.shutdown()
        if self.pool is not None:
            self.pool.shutdown()
        self.store.close()

    # -- compute-process side (server.compute.pool.ComputeWorker) ------------------------------
    def identify(self, ref: ModelRef) -> Any:
        return self.catalog.identity(ref)

    def compute(self, name: str, ref: ModelRef, params: dict[str, Any]) -> None:
        self.cache.get(ref, name, **params)

    def compute_many(self, name: str, ref: ModelRef, params: list[dict[str, Any]]) -> None:
        self.cache.warm(ref, name, params)


def build_services(settings: Settings, *, inline: bool = False, store: Store | None = None
                   ) -> Services:
    """All services of one process.

    inline=False (the API): cold results are computed in spawned compute processes
    (``settings.compute_processes`` > 0), each building its own inline services with
    ``compute_worker``; inline=True (compute processes, CLI): computed in this process.
    """
    store = store or Store(settings.cache_dir, size_limit=settings.cache_size_bytes,
                           lock_expire_s=settings.lock_expire_s)
    pool = None if inline or settings.compute_processes == 0 else ComputePool(settings, compute_worker)
    computations = build_computations()
    catalog = ModelCatalog(settings, store, pool)
    cache = ResultCache(store, catalog, computations, pool)
    scores = ScoresService(catalog, cache)
    labels = LabelService(store, scores)
    views = ViewService(catalog, scores, cache)
    graphs = GraphService(cache, labels)
    details = DetailService(catalog, scores, labels, cache)
    shown = Shown(graphs=graphs, details=details, views=views)
    circuits = CircuitService(store, cache, catalog)
    return Services(
        settings=settings, store=store, computations=computations, pool=pool, catalog=catalog,
        cache=cache, scores=scores, labels=labels, views=views, graphs=graphs, details=details,
        ablation=AblationService(scores, views, catalog), data_pk=DataPKService(scores, catalog),
        validation=ValidationService(scores),
        jobs=JobManager(scores, catalog, store, settings.workers, shown),
        recovery=RecoveryService(scores, labels, circuits), circuits=circuits,
        subgraphs=SubgraphService(scores, catalog))


def compute_worker(settings: Settings) -> Services:
    """What a compute process runs tasks on: its own inline services (the pool's factory)."""
    return build_services(settings, inline=True)
