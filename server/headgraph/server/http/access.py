"""Who may do what, and how much cold work one client may start at once.

The auth model (docs: operations, "Access"): with no ``HEADGRAPH_API_TOKEN`` the server is a single
user's (open mode): every read may compute. With a token (lab mode) a request without
``Authorization: Bearer <token>`` reads only what is already cached; a cold result, a compute
job, an upload or an overwrite needs the token (401 otherwise). Either way a client (one
token holder or one address) runs at most ``cold_per_client`` distinct cold computations at
once; its further ones wait in its own queue, in order (429 only when that queue is full), so
nobody fills the compute processes by themselves while a page's own requests are never refused.
"""

from __future__ import annotations

import asyncio
import hmac
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

from fastapi import Request

from headgraph.server.errors import ApiError, TooManyRequests, Unauthorized

COLD_NEEDS_TOKEN = ("this result is not cached yet, and computing it needs the lab's API token "
                    "('Authorization: Bearer <token>'; in the dashboard: Sign in)")


@dataclass(frozen=True)
class Caller:
    """The client of one request: whether it holds the token, and the key its limits use."""

    authorized: bool
    client: str


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (None when absent or another scheme)."""
    scheme, _, given = (header or "").strip().partition(" ")
    if scheme.lower() != "bearer" or not given.strip():
        return None
    return given.strip()


def token_matches(given: str | None, token: str | None) -> bool:
    """Constant-time comparison; no server token means everyone is authorized (open mode)."""
    if not token:
        return True
    return given is not None and hmac.compare_digest(given.encode(), token.encode())


def caller_of(request: Request) -> Caller:
    """Caller of ``request`` under the app's settings (open mode: always authorized)."""
    token = request.app.state.settings.api_token
    given = bearer(request.headers.get("authorization"))
    authorized = token_matches(given, token)
    if token and authorized:
        client = "token"  # the lab's token holders share one budget, wherever they connect from
    else:
        client = request.client.host if request.client else "unknown"
    return Caller(authorized=authorized, client=client)


class ColdLimiter:
    """Each client's cold computations, at most ``per_client`` distinct ones running at once,
    the rest queued in order (at most ``queue_per_client`` distinct ones; 429 beyond).

    A piece of work is named by the request (its path and query), so a page asking again for
    what it already waits for counts once: a request whose work is already running or queued
    for its client joins it instead of taking a slot (distinct requests never share one, so
    the cap holds however the requests are split). A queued
    request whose client went away leaves the queue (``gone``), so nobody's slot waits on work
    nobody waits for. Lives on the event loop (not thread-safe, needs no lock)."""

    def __init__(self, per_client: int, queue_per_client: int = 32) -> None:
        self.per_client = max(1, per_client)
        self.queue_per_client = max(0, queue_per_client)
        self._running: dict[str, dict[str, int]] = {}  # client -> work -> requests holding it
        self._queued: dict[str, list[_Waiter]] = {}  # client -> waiters, first come first
        self._labels: dict[str, str] = {}  # work -> what a person reads of it ("scatter · demo · OK")

    def running(self, client: str) -> int:
        """Distinct pieces of work ``client`` has running."""
        return len(self._running.get(client, {}))

    def queued(self, client: str) -> list[str]:
        """``client``'s queued work, first in line first."""
        return [w.work for w in self._queued.get(client, [])]

    def position(self, client: str, work: str) -> int | None:
        """0 when ``work`` runs for ``client``, its place in the queue (1 = next), else None."""
        if work in self._running.get(client, {}):
            return 0
        for i, waiter in enumerate(self._queued.get(client, []), 1):
            if waiter.work == work:
                return i
        return None

    def listing(self, client: str) -> tuple[list[str], list[str]]:
        """(running, queued) of ``client``: each piece of work as a person reads it, the queue
        first in line first."""
        def label(work: str) -> str:
            return self._labels.get(work, work)

        return ([label(w) for w in self._running.get(client, {})],
                [label(w.work) for w in self._queued.get(client, [])])

    def _join_running(self, client: str, work: str) -> bool:
        held = self._running.get(client)
        if held is not None and work in held:
            held[work] += 1
            return True
        return False

    async def enter(self, client: str, work: str,
                    gone: Callable[[], Awaitable[bool]] | None = None, poll_s: float = 1.0,
                    label: str = "") -> None:
        """Take (or join) a slot for ``work``; wait in the client's queue when all are taken.
        TooManyRequests when the queue is full; ``gone()`` is asked every ``poll_s`` while
        waiting and, once true, the request leaves the queue (ClientGone). ``label``: what
        ``listing`` shows of the work."""
        if label:
            self._labels[work] = label
        if self._join_running(client, work):
            return
        queue = self._queued.setdefault(client, [])
        held = self._running.setdefault(client, {})
        if len(held) < self.per_client and not queue:
            held[work] = 1
            return
        waiter = next((w for w in queue if w.work == work), None)
        if waiter is None:
            if len(queue) >= self.queue_per_client:
                self._forget(client)
                raise TooManyRequests(
                    f"this client has {len(held)} cold computations running (the cap is "
                    f"{self.per_client}) and {len(queue)} waiting (the queue holds "
                    f"{self.queue_per_client}); retry when one is done")
            waiter = _Waiter(work, asyncio.get_running_loop().create_future())
            queue.append(waiter)
        waiter.count += 1
        try:
            while True:
                done, _ = await asyncio.wait({waiter.granted}, timeout=poll_s)
                if done:
                    return  # the slot was taken for this waiter's every request
                if gone is not None and await gone():
                    raise ClientGone(work)
        except BaseException:
            self._withdraw(client, waiter)
            raise

    def _withdraw(self, client: str, waiter: _Waiter) -> None:
        """One request of ``waiter`` stops waiting (or gives back its share once granted)."""
        if waiter.granted.done():
            self.leave(client, waiter.work)
            return
        waiter.count -= 1
        if waiter.count <= 0:
            queue = self._queued.get(client, [])
            if waiter in queue:
                queue.remove(waiter)
            self._forget(client)

    def leave(self, client: str, work: str) -> None:
        """One request holding ``work`` is done; a freed slot goes to the next in line."""
        held = self._running.get(client, {})
        n = held.get(work, 1) - 1
        if n > 0:
            held[work] = n
            return
        held.pop(work, None)
        queue = self._queued.get(client, [])
        while queue and len(held) < self.per_client:
            nxt = queue.pop(0)
            held[nxt.work] = nxt.count
            nxt.granted.set_result(None)
        self._forget(client)

    def _forget(self, client: str) -> None:
        if not self._running.get(client):
            self._running.pop(client, None)
        if not self._queued.get(client):
            self._queued.pop(client, None)
        if len(self._labels) > 4 * (sum(map(len, self._running.values()))
                                    + sum(map(len, self._queued.values())) + 64):
            live = {w for held in self._running.values() for w in held}
            live |= {w.work for queue in self._queued.values() for w in queue}
            self._labels = {w: t for w, t in self._labels.items() if w in live}


@dataclass(eq=False)
class _Waiter:
    """Requests of one client waiting for the same work, and the future that grants it."""

    work: str
    granted: asyncio.Future[None]
    count: int = 0


class ClientGone(ApiError):
    """The client of a queued request disconnected: its request stops waiting (499, which
    nobody reads: nginx's "client closed request")."""

    status = 499


LABEL_PARAMS = ("model", "a", "b", "series", "pairing", "pairings", "kind", "task", "method", "head", "pair",
                "edge")


def work_label(request: Request) -> str:
    """What a person reads of a cold request: the resource and its main parameters
    ("scatter · smollm2 · OK"), at most 120 characters."""
    params = request.query_params
    parts = [request.url.path.removeprefix("/api/") or request.url.path]
    parts += [params[k] for k in LABEL_PARAMS if params.get(k)]
    return " · ".join(parts)[:120]


@asynccontextmanager
async def cold_work(request: Request, work: str = "") -> AsyncIterator[Caller]:
    """Around a cold computation started by ``request``: 401 in lab mode without the token;
    otherwise hold (or join) one of the client's slots for ``work`` while it runs, waiting in
    the client's queue when they are all taken (429 only when that queue is full too)."""
    caller = caller_of(request)
    if not caller.authorized:
        raise Unauthorized(COLD_NEEDS_TOKEN)
    limiter: ColdLimiter = request.app.state.cold_limiter
    if not work:
        query = sorted(request.query_params.multi_items())
        work = f"{request.method} {request.url.path}?{query}"
        if request.method != "GET":  # a body may differ: never joined with another request
            work += f"#{id(request)}"
    await limiter.enter(caller.client, work, gone=request.is_disconnected, label=work_label(request))
    try:
        yield caller
    finally:
        limiter.leave(caller.client, work)
