"""Compute lanes (server.compute.lanes): a lane's queue hands a freed process the cheapest
waiting task, survives a process that died, and a page's request is answered by the
interactive lane while a job's long stage holds the background lane."""

from __future__ import annotations

import multiprocessing
import os
import threading
import time
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool

import pytest

from headgraph.server.compute.lanes import LaneQueue


def _spawned() -> ProcessPoolExecutor:
    return ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn"))


def hold(path: str) -> str:
    """Wait (in the child) until ``path`` exists: the parent decides when the slot frees."""
    while not os.path.exists(path):
        time.sleep(0.01)
    return "held"


def name(value: str) -> str:
    return value


def die() -> None:
    os._exit(3)


def test_a_freed_process_takes_the_cheapest_waiting_task(tmp_path):
    lane = LaneQueue(_spawned, slots=1)
    gate = tmp_path / "open"
    try:
        first = lane.submit(hold, str(gate), priority=0.0)
        finished: list[str] = []
        lock = threading.Lock()

        def note(f):
            with lock:
                finished.append(f.result())

        waiting = [lane.submit(name, label, priority=cost)
                   for label, cost in (("big stage", 9e12), ("page", 0.0), ("small stage", 2e6))]
        for f in waiting:
            f.add_done_callback(note)
        time.sleep(0.2)
        assert not any(f.done() for f in waiting)  # all wait for the one process
        gate.touch()
        assert first.result(timeout=120) == "held"
        for f in waiting:
            f.result(timeout=120)
        assert finished == ["page", "small stage", "big stage"]
    finally:
        lane.shutdown()


def test_a_dead_process_fails_its_task_and_the_next_one_gets_a_new_process():
    lane = LaneQueue(_spawned, slots=1)
    try:
        with pytest.raises(BrokenProcessPool):
            lane.submit(die).result(timeout=120)
        assert lane.submit(name, "after").result(timeout=120) == "after"
    finally:
        lane.shutdown()



WIDE = {"n_layers": 16, "n_heads": 32, "d_model": 256, "d_head": 8, "d_vocab": 64, "n_ctx": 64}


@pytest.mark.slow  # three compute processes, a wide model's long reference, the demo's job
def test_a_page_and_a_small_job_run_while_a_job_stage_holds_the_background_lane(tmp_path, monkeypatch):
    """A job's stage (the wide model's KL reference of 100x its usual samples: minutes) runs in
    the background lane; meanwhile a page's cold demo results are computed and answered by the
    interactive lane, and then the demo's whole compute job runs in the small lane, the stage
    still running afterwards (its single-flight lock still held). One shared process would have
    made the page wait for the whole stage; one job lane, the demo's job."""
    import json

    from headgraph.core.models.demo import ARCHITECTURE
    from headgraph.server.compute.lanes import background
    from headgraph.server.services.jobs import run_compute
    from headgraph.server.services.wiring import build_services
    from headgraph.server.settings import Settings

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (tmp_path / "config.json").write_text(json.dumps({"architecture": ARCHITECTURE, **WIDE}))
    big = f"random:{tmp_path / 'config.json'}"
    services = build_services(Settings(cache_dir=tmp_path / "cache", device="cpu", models=(big,)))
    try:
        wide = services.catalog.resolve(big)
        outcome: list[BaseException | None] = []

        def stage() -> None:
            try:
                with background(cost=1e15):
                    services.cache.get(wide, "reference", samples=2_000_000)
                outcome.append(None)
            except BaseException as err:  # the pool shut down under it at the end
                outcome.append(err)

        with background():
            services.catalog.identity(wide)  # loaded in the background lane
        key = services.cache.key(wide, "reference", samples=2_000_000)
        job = threading.Thread(target=stage, daemon=True)
        job.start()
        deadline = time.monotonic() + 300
        while "lock:" + key not in services.store.meta:  # the stage is running over there
            assert not outcome and time.monotonic() < deadline, outcome
            time.sleep(0.01)
        demo = services.catalog.resolve("demo")
        pk = services.scores.pk(demo, "OK")  # a page's request: demo loaded and computed
        assert pk.scores.shape == (2, 8, 2, 8)
        assert "lock:" + key in services.store.meta and not outcome  # the stage still runs
        assert len(services.pool.processes()) == 2  # the interactive and background lanes'

        # The demo's whole job (the views of its page wait for it) is small: its stages run in
        # the small lane while the big model's stage still holds the background lane.
        stages: list[str] = []
        with background():  # as JobManager runs a job
            done, unavailable = run_compute(services.scores, services.catalog, demo,
                                            ["OQ", "OK", "OV"],
                                            lambda stage, fraction, message: stages.append(stage))
        assert stages[-1] == "done" and not unavailable, unavailable
        assert {"pk", "cs K", "reference", "null", "patterns"} <= set(done)
        assert "lock:" + key in services.store.meta and not outcome  # the stage still runs
        assert len(services.pool.processes()) == 3  # one per lane
    finally:
        children = services.pool.processes() if services.pool is not None else []
        for proc in children:  # the stage would run on for minutes
            proc.kill()
        services.close()
