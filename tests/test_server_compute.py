"""Compute processes: results land in the shared store, errors keep their kind, a dead child
is replaced, and the caller's thread never runs model math."""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest
import torch

from headgraph.core.errors import ModelUnavailable
from headgraph.core.loading import load_model
from headgraph.server.compute import ComputeFailed, ComputePool
from headgraph.server.errors import ApiError
from headgraph.server.service import Service
from headgraph.server.settings import Settings

torch.set_num_threads(1)


@pytest.fixture()
def service(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # inherited by the spawned compute process
    svc = Service(Settings(cache_dir=tmp_path / "cache", device="cpu", compute_processes=1))
    yield svc
    svc.close()


def test_identity_and_results_come_from_the_compute_process(service):
    ref = service.resolve("demo")
    ident = service.identity(ref)
    assert ident.fingerprint == load_model("demo", device="cpu").heads.fingerprint
    assert service.models.keys() == []  # this process never loaded the model
    ps = service.pk(ref, "OK")
    assert ps.scores.shape == (2, 8, 2, 8) and bool(ps.valid[0, :, 1, :].all())
    key = service.key(ref, "pk", pairing="OK", order="forward")
    assert service.store.compute_count(key) == 1
    assert service.pk(ref, "OK").scores.equal(ps.scores)
    assert service.store.compute_count(key) == 1
    assert service.models.keys() == []


def test_errors_keep_their_kind_across_the_process_boundary(service):
    pool = service.pool
    with pytest.raises(ApiError) as bad:
        pool.run("pk", service.resolve("demo"), "XY", "forward")
    assert bad.value.status == 422 and "XY" in bad.value.message
    with pytest.raises(ModelUnavailable) as offline:
        pool.run("identity", service.resolve("gpt2"))
    assert "HF_HUB_OFFLINE" in str(offline.value)


def test_a_killed_compute_process_fails_the_call_and_is_replaced(service):
    ref = service.resolve("demo")
    service.identity(ref)  # starts the child
    children = list(service.pool._pool._processes.values())
    assert len(children) == 1
    outcome: list[BaseException | None] = []

    def slow():
        try:
            service.reference(ref)  # seconds of work in the child
            outcome.append(None)
        except BaseException as err:
            outcome.append(err)

    key = service.key(ref, "reference", samples=20000)
    t = threading.Thread(target=slow)
    t.start()
    deadline = time.monotonic() + 30
    while "lock:" + key not in service.store.meta:  # the child is inside the computation
        assert time.monotonic() < deadline and not outcome, outcome
        time.sleep(0.005)
    os.kill(children[0].pid, signal.SIGKILL)
    t.join(60)
    assert len(outcome) == 1 and isinstance(outcome[0], ComputeFailed)
    assert not service.store.has(key)
    assert service.pk(ref, "OV").scores.shape == (2, 8, 2, 8)  # a fresh child took over


def test_pool_starts_lazily_and_inline_service_has_none(tmp_path):
    pool = ComputePool(Settings(cache_dir=tmp_path))
    assert pool._pool is None
    inline = Service(Settings(cache_dir=tmp_path), inline=True)
    assert inline.pool is None
    assert Service(Settings(cache_dir=tmp_path, compute_processes=0)).pool is None


def test_cache_only_mode_reads_warm_results_and_refuses_cold_ones(service):
    from headgraph.server.service import CACHE_ONLY, ColdMiss

    ref = service.resolve("demo")
    token = CACHE_ONLY.set(True)
    try:
        with pytest.raises(ColdMiss):
            service.identity(ref)  # unknown model: would need loading
    finally:
        CACHE_ONLY.reset(token)
    warm = service.pk(ref, "OQ")  # computed in the compute process
    token = CACHE_ONLY.set(True)
    try:
        assert service.pk(ref, "OQ").scores.equal(warm.scores)
        with pytest.raises(ColdMiss):
            service.pk(ref, "QQ")
        with pytest.raises(ColdMiss):
            service.loaded(ref)
    finally:
        CACHE_ONLY.reset(token)
    assert not service.store.has(service.key(ref, "pk", pairing="QQ", order="forward"))


def test_pk_of_several_pairings_is_computed_together_once_each(service):
    from headgraph.core.pk import projection_kernel
    from headgraph.server.errors import Invalid

    ref = service.resolve("demo")
    service.pk(ref, "OK")  # warm before: pk_together leaves it alone
    service.pk_together(ref, ["OQ", "OK", "OV"])
    service.pk_together(ref, ["OQ", "OK", "OV"])  # all warm now: nothing runs
    heads = load_model("demo", device="cpu").heads
    for p in ("OQ", "OK", "OV"):
        key = service.key(ref, "pk", pairing=p, order="forward")
        assert service.store.compute_count(key) == 1, p
        got = service.pk(ref, p)
        assert torch.allclose(got.scores, projection_kernel(heads, p).scores, atol=1e-6)
        assert torch.equal(got.valid, projection_kernel(heads, p).valid)
    assert service.models.keys() == []  # computed in the compute process, not here
    with pytest.raises(Invalid):
        service.pk_together(ref, ["OK", "XY"])
