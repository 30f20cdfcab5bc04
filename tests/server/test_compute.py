"""Compute processes: results land in the shared store, a task names a registered
computation, errors keep their kind, a dead child is replaced, and the caller's thread never
runs model math."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from headgraph.core.errors import InvalidInput, ModelUnavailable
from headgraph.core.models.loading import load_model
from headgraph.server.cache.cold_miss import CACHE_ONLY, ColdMiss
from headgraph.server.services.wiring import build_services, compute_worker
from headgraph.server.compute.pool import Compute, ComputeFailed, ComputePool
from headgraph.server.models.catalog import Identify
from headgraph.server.errors import ApiError
from headgraph.server.settings import Settings

torch.set_num_threads(1)


@pytest.fixture()
def services(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # inherited by the spawned compute process
    svc = build_services(Settings(cache_dir=tmp_path / "cache", device="cpu", compute_processes=1))
    yield svc
    svc.close()


def test_identity_and_results_come_from_the_compute_process(services):
    catalog, scores = services.catalog, services.scores
    ref = catalog.resolve("demo")
    ident = catalog.identity(ref)
    assert ident.fingerprint == load_model("demo", device="cpu").heads.fingerprint
    assert catalog.models.keys() == []  # this process never loaded the model
    ps = scores.pk(ref, "OK")
    assert ps.scores.shape == (2, 8, 2, 8) and bool(ps.valid[0, :, 1, :].all())
    key = services.cache.key(ref, "pk", pairing="OK", order="forward")
    assert services.store.compute_count(key) == 1
    assert scores.pk(ref, "OK").scores.equal(ps.scores)
    assert services.store.compute_count(key) == 1
    assert catalog.models.keys() == []


def test_a_task_runs_the_computation_registered_under_its_name(services):
    ref = services.catalog.resolve("demo")
    assert {"pk", "cs", "z", "null", "reference", "tokens", "patterns"} <= set(services.computations.names())
    key = services.cache.key(ref, "cs", mode="V", order="all")
    assert services.pool.run(Compute("cs", ref, {"mode": "V", "order": "all"})) is None
    assert services.store.has(key) and services.store.compute_count(key) == 1
    heads = load_model("demo", device="cpu").heads
    from headgraph.core.scores.composition_score import composition_score

    want = composition_score(heads, "V", order="all")
    got = services.scores.cs(ref, "V", "all")
    assert torch.allclose(got.scores, want.scores.cpu(), atol=1e-6)
    with pytest.raises(ComputeFailed, match="LookupError"):
        services.pool.run(Compute("no_such_computation", ref, {}))


def test_errors_keep_their_kind_across_the_process_boundary(services):
    pool = services.pool
    with pytest.raises(InvalidInput) as bad:
        pool.run(Compute("pk", services.catalog.resolve("demo"), {"pairing": "XY", "order": "forward"}))
    assert "XY" in str(bad.value) and "OK" in (bad.value.allowed or [])
    with pytest.raises(ApiError) as api_error:
        pool.run(Compute("scatter", services.catalog.resolve("demo"),
                         {"pairing": "QQ", "top_percent": 5.0}))
    assert api_error.value.status == 422 and "QQ" in api_error.value.message
    with pytest.raises(ModelUnavailable) as offline:
        pool.run(Identify(services.catalog.resolve("gpt2")))
    assert "HF_HUB_OFFLINE" in str(offline.value)


@pytest.mark.slow  # a compute process killed and replaced: ~5 s, more on a loaded machine
def test_a_killed_compute_process_fails_the_call_and_is_replaced(services):
    service = services.scores
    ref = services.catalog.resolve("demo")
    services.catalog.identity(ref)  # starts the child
    children = services.pool.processes()
    assert len(children) == 1  # the interactive lane's only
    outcome: list[BaseException | None] = []

    def slow():
        try:
            service.reference(ref)  # seconds of work in the child
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    key = services.cache.key(ref, "reference", samples=20000)
    t = threading.Thread(target=slow)
    t.start()
    while "lock:" + key not in services.store.meta:  # the child is inside the computation
        assert not outcome, outcome  # (it must not have finished before we saw it start)
        time.sleep(0.005)
    os.kill(children[0].pid, signal.SIGKILL)
    t.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], ComputeFailed)
    assert not services.store.has(key)
    assert service.pk(ref, "OV").scores.shape == (2, 8, 2, 8)  # a fresh child took over


def test_pool_starts_lazily_and_inline_services_have_none(tmp_path):
    pool = ComputePool(Settings(cache_dir=tmp_path), compute_worker)
    assert pool.processes() == []
    inline = build_services(Settings(cache_dir=tmp_path), inline=True)
    assert inline.pool is None and inline.cache.pool is None and inline.catalog.pool is None
    inline.close()
    in_threads = build_services(Settings(cache_dir=tmp_path, compute_processes=0))
    assert in_threads.pool is None
    in_threads.close()


def test_cache_only_mode_reads_warm_results_and_refuses_cold_ones(services):
    catalog, scores = services.catalog, services.scores
    ref = catalog.resolve("demo")
    token = CACHE_ONLY.set(True)
    try:
        with pytest.raises(ColdMiss):
            catalog.identity(ref)  # unknown model: would need loading
    finally:
        CACHE_ONLY.reset(token)
    warm = scores.pk(ref, "OQ")  # computed in the compute process
    token = CACHE_ONLY.set(True)
    try:
        assert scores.pk(ref, "OQ").scores.equal(warm.scores)
        with pytest.raises(ColdMiss):
            scores.pk(ref, "QQ")
        with pytest.raises(ColdMiss):
            catalog.loaded(ref)
    finally:
        CACHE_ONLY.reset(token)
    assert not services.store.has(services.cache.key(ref, "pk", pairing="QQ", order="forward"))


def test_pk_of_several_pairings_is_computed_together_once_each(services):
    from headgraph.core.scores.pk import projection_kernel

    scores = services.scores
    ref = services.catalog.resolve("demo")
    scores.pk(ref, "OK")  # warm before: pk_together leaves it alone
    scores.pk_together(ref, ["OQ", "OK", "OV"])
    scores.pk_together(ref, ["OQ", "OK", "OV"])  # all warm now: nothing runs
    heads = load_model("demo", device="cpu").heads
    for p in ("OQ", "OK", "OV"):
        key = services.cache.key(ref, "pk", pairing=p, order="forward")
        assert services.store.compute_count(key) == 1, p
        got = scores.pk(ref, p)
        assert torch.allclose(got.scores, projection_kernel(heads, p).scores, atol=1e-6)
        assert torch.equal(got.valid, projection_kernel(heads, p).valid)
    assert services.catalog.models.keys() == []  # computed in the compute process, not here
    with pytest.raises(InvalidInput):
        scores.pk_together(ref, ["OK", "XY"])
