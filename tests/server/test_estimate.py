"""The compute job's progress and time-left estimate (server.compute.estimate)."""

from __future__ import annotations

import doctest

import pytest

from headgraph.server.compute import estimate
from headgraph.server.compute.estimate import JobEstimate, Shape, format_eta, pk_cost, stage_cost

LLAMA7B = {"n_layers": 32, "n_heads": 32, "n_kv_heads": 32, "d_model": 4096, "d_head": 128,
           "d_vocab": 32000}
LLAMA1B = {"n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "d_model": 2048, "d_head": 64,
           "d_vocab": 128256}
PLAN = (["pk", "pk OQ", "pk OK", "pk OV", "cs Q", "cs K", "cs V", "patterns", "z OQ", "z OK",
         "z OV", "graph", "scatter OQ", "scatter OK", "scatter OV", "reference", "null", "null OQ",
         "null OK", "null OV", "tokens O", "tokens V", "tokens Q", "tokens K", "datapk text",
         "datapk random", "pairs"])


def test_module_examples():
    assert doctest.testmod(estimate).failed == 0


def test_at_a_steady_speed_the_estimate_is_the_time_left():
    """A job whose every stage runs at the same seconds per unit of cost: once enough has run,
    the estimate equals the true time left, and the fraction rises to 1."""
    est = JobEstimate(PLAN, LLAMA7B)
    speed = 3.7e-11  # seconds per unit
    truth = [est.costs[s] * speed for s in PLAN]
    fractions = []
    for i, stage in enumerate(PLAN):
        left = est.remaining_s()
        if est.fraction() >= estimate.MIN_BASIS:
            assert left == pytest.approx(sum(truth[i:]), rel=1e-9)
        else:
            assert left is None
        est.finished(stage, truth[i])
        fractions.append(est.fraction())
    assert fractions == sorted(fractions) and fractions[-1] == pytest.approx(1.0)
    assert est.remaining_s() == pytest.approx(0.0, abs=1e-9)


def test_a_stage_that_did_no_work_leaves_the_total():
    """A model that cannot run: its patterns and data-weighted PK take no time; counting their
    cost as done would make the job look faster than it is."""
    est = JobEstimate(["pk", "patterns", "null"], LLAMA7B)
    est.finished("pk", 100.0)
    est.finished("patterns", 0.01, worked=False)
    rate = 100.0 / est.costs["pk"]
    assert est.remaining_s() == pytest.approx(rate * est.costs["null"], rel=1e-3)
    assert est.fraction() == pytest.approx(est.costs["pk"] / (est.costs["pk"] + est.costs["null"]))


def test_costs_grow_with_the_shapes_as_the_products_do():
    """PK's pair products grow with pairs x d^2 and its pieces with heads x d^2 r: the 7B shape
    (4x the query heads at 2x d_model, 4x the KV heads) costs the two formulas' sum; CS per pair
    r^2 d; the costs of the 7B shape exceed the 1B's for every stage."""
    big, small = Shape.of(LLAMA7B), Shape.of(LLAMA1B)
    n, d, r = 1024, 4096, 128
    share = 31 / 64
    pairs = 3 * n * n * share
    assert pk_cost(big, ["OQ", "OK", "OV"]) == pytest.approx(4 * n * d * d * r / 2 + pairs * d * d / 2)
    for stage in PLAN:
        assert stage_cost(stage, big)[1] >= stage_cost(stage, small)[1], stage
    assert stage_cost("cs K", big)[1] > stage_cost("cs K", small)[1] * 8


def test_eta_text():
    assert format_eta(None) == ""
    assert format_eta(42) == "about 40 s left"
    assert format_eta(12.4 * 60) == "about 12 min left"
    assert format_eta(3 * 3600) == "about 3.0 h left"



def test_a_streamed_model_plans_no_data_weighted_pk():
    """Data-weighted PK needs the whole model in memory: for a streamed checkpoint it will be
    refused, so its forward passes are not counted in the time left."""
    streamed = {**LLAMA7B, "source": "safetensors"}
    assert stage_cost("datapk text", Shape.of(streamed))[1] == 0
    assert stage_cost("datapk text", Shape.of(LLAMA7B))[1] > 0
    assert stage_cost("patterns", Shape.of(streamed))[1] > 0  # it runs a block at a time


def test_a_prior_rate_gives_a_time_left_from_the_first_stage():
    """Before the finished stages hold MIN_BASIS of the cost, a job with a prior rate (this
    machine's measured speed) says the remaining cost at that rate; from then on its own."""
    rate = 2.5e9
    est = JobEstimate(PLAN, LLAMA7B, prior_rate=rate)
    assert est.basis == "machine"
    assert est.remaining_s() == pytest.approx(est.total / rate, rel=1e-12)
    speed = 1e-10
    for stage in PLAN:
        if est.fraction() >= estimate.MIN_BASIS:
            break
        est.finished(stage, est.costs[stage] * speed)
    assert est.basis == "measured"
    assert est.remaining_s() == pytest.approx((est.total - sum(est.costs[s] for s in est.seconds)) * speed,
                                              rel=1e-9)
    assert JobEstimate(PLAN, LLAMA7B).basis is None


def test_the_machine_rate_is_a_measured_matrix_product_speed():
    """machine_rate: PK_SHARE_OF_GEMM of a float32 product's multiply-adds per second, within
    a plausible range for any CPU or GPU (10 M to 100 T per second), measured once."""
    rate = estimate.machine_rate()
    assert 1e7 < rate < 1e14
    assert estimate.machine_rate() == rate  # cached for the process


def test_a_stage_already_cached_is_no_speed_measurement(tmp_path):
    """A job over a model whose results are all cached (the same job run twice) finds every
    stage cached: none counts as work, so none pulls the measured speed up or the share done
    forward before the work it stands for (the share stays 0 until the end)."""
    from headgraph.server.services.jobs import run_compute
    from headgraph.server.services.wiring import build_services
    from headgraph.server.settings import Settings

    services = build_services(Settings(cache_dir=tmp_path / "cache", device="cpu"), inline=True)
    try:
        ref = services.catalog.resolve("demo")
        seen: list[tuple[str, float]] = []
        timings: list[object] = []

        def progress(stage: str, fraction: float, message: str) -> None:
            seen.append((stage, fraction))

        def finished(done, planned, unavailable, timing) -> None:
            timings.append(timing)

        run_compute(services.scores, services.catalog, ref, ["OQ", "OK", "OV"], progress)
        first = [f for s, f in seen if s not in ("load", "done")]
        assert first[-1] > 0  # the first run worked
        seen.clear()
        run_compute(services.scores, services.catalog, ref, ["OQ", "OK", "OV"], progress, finished)
        again = [f for s, f in seen if s not in ("load", "done")]
        assert again and all(f == 0.0 for f in again), again
        assert seen[-1] == ("done", 1.0)
    finally:
        services.close()
