"""The per-client queue of cold computations (http.access.ColdLimiter), driven on a real event
loop: distinct work past the cap waits in order instead of being refused, the same work joins
what runs or waits, a full queue refuses, and a waiter whose client went away leaves."""

from __future__ import annotations

import asyncio

import pytest

from headgraph.server.errors import TooManyRequests
from headgraph.server.http.access import ClientGone, ColdLimiter


def run(coro):
    return asyncio.run(coro)


def test_work_past_the_cap_waits_in_order_and_gets_the_freed_slot():
    async def scenario() -> list[str]:
        limiter = ColdLimiter(per_client=1, queue_per_client=4)
        order: list[str] = []
        await limiter.enter("a", "w1")

        async def later(work: str) -> None:
            await limiter.enter("a", work, poll_s=0.01)
            order.append(work)
            limiter.leave("a", work)

        waiting = [asyncio.create_task(later(w)) for w in ("w2", "w3")]
        await asyncio.sleep(0.05)
        assert limiter.queued("a") == ["w2", "w3"] and limiter.position("a", "w3") == 2
        assert limiter.position("a", "w1") == 0 and limiter.running("a") == 1
        await limiter.enter("b", "w1")  # another client has its own slots
        limiter.leave("b", "w1")
        limiter.leave("a", "w1")
        await asyncio.gather(*waiting)
        assert limiter.running("a") == 0 and limiter.queued("a") == []
        return order

    assert run(scenario()) == ["w2", "w3"]


def test_the_same_work_joins_and_counts_once():
    async def scenario() -> None:
        limiter = ColdLimiter(per_client=1, queue_per_client=1)
        await limiter.enter("a", "w1")
        await limiter.enter("a", "w1")  # joins the running work: no wait, no new slot
        assert limiter.running("a") == 1
        second = asyncio.create_task(limiter.enter("a", "w2", poll_s=0.01))
        third = asyncio.create_task(limiter.enter("a", "w2", poll_s=0.01))  # joins the waiter
        await asyncio.sleep(0.05)
        assert limiter.queued("a") == ["w2"]
        with pytest.raises(TooManyRequests, match="waiting"):
            await limiter.enter("a", "w3")  # the queue (1) is full
        limiter.leave("a", "w1")
        assert not second.done()  # w1 still has its joined request
        limiter.leave("a", "w1")
        await asyncio.gather(second, third)
        assert limiter.position("a", "w2") == 0
        limiter.leave("a", "w2")
        assert limiter.running("a") == 1  # the joined request still holds w2
        limiter.leave("a", "w2")
        assert limiter.running("a") == 0

    run(scenario())


def test_a_waiter_whose_client_went_away_leaves_the_queue():
    async def scenario() -> None:
        limiter = ColdLimiter(per_client=1, queue_per_client=2)
        await limiter.enter("a", "w1")
        gone = asyncio.Event()

        async def is_gone() -> bool:
            return gone.is_set()

        waiter = asyncio.create_task(limiter.enter("a", "w2", gone=is_gone, poll_s=0.01))
        await asyncio.sleep(0.03)
        assert limiter.queued("a") == ["w2"]
        gone.set()
        with pytest.raises(ClientGone):
            await waiter
        assert limiter.queued("a") == []
        limiter.leave("a", "w1")
        assert limiter.running("a") == 0  # nothing was granted to the one that left

    run(scenario())


def test_the_listing_names_each_clients_work_as_a_person_reads_it():
    async def scenario() -> None:
        limiter = ColdLimiter(per_client=1, queue_per_client=4)
        await limiter.enter("a", "GET /api/graph?x", label="graph · demo")
        waiting = asyncio.create_task(limiter.enter("a", "GET /api/scatter?y", poll_s=0.01,
                                                    label="scatter · demo · OK"))
        unnamed = asyncio.create_task(limiter.enter("a", "GET /api/pk?z", poll_s=0.01))
        await asyncio.sleep(0.05)
        assert limiter.listing("a") == (["graph · demo"], ["scatter · demo · OK", "GET /api/pk?z"])
        assert limiter.listing("b") == ([], [])
        limiter.leave("a", "GET /api/graph?x")
        await waiting
        assert limiter.listing("a") == (["scatter · demo · OK"], ["GET /api/pk?z"])
        limiter.leave("a", "GET /api/scatter?y")
        await unnamed
        limiter.leave("a", "GET /api/pk?z")
        assert limiter.listing("a") == ([], [])

    run(scenario())


@pytest.mark.parametrize(("inherited", "expected"), [(0, 10), (3, 10), (12, 12)])
def test_compute_processes_run_at_an_absolute_nice_level(inherited, expected):
    """A compute process asks for nice 10: under a server started at nice 0 or 3 it runs at 10,
    under one at 12 it stays at 12 (the levels are never stacked: 22 would be 19)."""
    import subprocess
    import sys

    code = "from headgraph.server.compute.nice import run_at_nice; print(run_at_nice(10))"
    out = subprocess.run(["nice", "-n", str(inherited), sys.executable, "-c", code],  # a hang guard:
                         capture_output=True, text=True, check=True, timeout=600)  # no torch import
    base = int(subprocess.run(["nice"], capture_output=True, text=True, check=True).stdout)
    assert int(out.stdout) == max(expected, min(19, base + inherited))
