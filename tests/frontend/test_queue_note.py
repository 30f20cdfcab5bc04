"""The model bar's queue line (callbacks/queue.py) for GET /api/queue answers."""

from __future__ import annotations

from headgraph.frontend.callbacks.queue import NAMED, queue_note


def test_nothing_waiting_hides_the_line():
    assert queue_note({"running": ["graph · demo"], "queued": [], "per_client": 2})[1] == {"display": "none"}
    assert queue_note({})[1] == {"display": "none"}


def test_the_queue_is_named_next_first_and_the_rest_counted():
    queued = [f"pk · smollm2 · {p}" for p in ("OQ", "OK", "OV", "QK", "VO")]
    text, style = queue_note({"running": ["reference · smollm2", "scatter · smollm2 · OK"],
                              "queued": queued, "per_client": 2, "queue_per_client": 32})
    assert style == {"display": "block"}
    assert text.startswith("5 of this page's computations wait for a slot (2 running, 2 at a time): ")
    assert "1. pk · smollm2 · OQ; 2. pk · smollm2 · OK; 3. pk · smollm2 · OV" in text
    assert text.endswith(f"and {len(queued) - NAMED} more") and "QK" not in text
