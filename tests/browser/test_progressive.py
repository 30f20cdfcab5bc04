"""Browser: on a cold model each view fills as soon as its own results are cached, while the
job computes the rest behind it (issue 17: the page used to show nothing until the end)."""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from browser import Server, figure, wait_until

# serial (run alone, after the parallel part): a heatmap drawn before the job's later stages
pytestmark = [pytest.mark.timeout(400), pytest.mark.serial]
MODEL = "random:gpt2-small@0"


@pytest.fixture(scope="module")
def server_env() -> dict[str, str]:
    # A 144-head model (random GPT-2 small weights): its reference and nulls take seconds,
    # so "before" is not a race against a job that ends at once (the demo's takes ~4 s).
    return {"HEADGRAPH_MODELS": f"demo,{MODEL}"}


def test_a_cold_heatmap_shows_before_the_reference_is_computed(server: Server, page: Page) -> None:
    page.goto(server.url + f"/?model={MODEL}&view=heatmap&pairing=OK&overlay=")
    seen: dict[str, Any] = {}

    def heatmap_with_job() -> bool:
        fig = figure(page, "heatmap")
        if not (fig and fig["data"] and fig["data"][0].get("type") == "heatmap"):
            return False
        jobs = httpx.post(server.url + "/api/models/compute", params={"model": MODEL},
                          timeout=30).json()  # joins the page's job: its record
        seen["job"] = jobs["job"]
        seen["fig"] = fig
        return True

    wait_until(heatmap_with_job, 240, message="heatmap drawn", page=page)
    job = seen["job"]
    assert job["state"] == "running", job  # drawn while the job still runs ...
    reference_view = {s for s in job["plan"] if s == "reference" or s.startswith("null ")}
    assert "pk" in job["computed"], job
    assert not reference_view <= set(job["computed"]), job["computed"]  # ... before the reference view
    grid = httpx.get(server.url + "/api/pk", params={"model": MODEL, "pairing": "OK"},
                     timeout=60).json()
    flat = [v for sl in grid["grid"] for sh in sl for tl in sh for v in tl]
    ok = [v for sl in grid["valid"] for sh in sl for tl in sh for v in tl]
    z = [v for row in seen["fig"]["data"][0]["z"] for v in row]
    assert [v for v in z if v is not None] == pytest.approx([v for v, o in zip(flat, ok) if o])
    # That a view waiting for the rest fills in when the job ends is the next test's (on the
    # demo, whose job is short); waiting for this model's whole job here took CI ~2 min.


def test_a_pair_panel_opened_while_the_job_runs_fills_in_when_it_ends(launch_server: Any, tmp_path: Any,
                                                                      page: Page) -> None:
    """Side panels wait for the whole job: a pair link opened on a cold demo shows the panel's
    waiting state (titled with the pair) while the job runs (seconds), then the finished panel
    by itself, with the API's numbers."""
    source, target = "L0H0", "L1H3"
    with launch_server(tmp_path / "cache", env={"HEADGRAPH_MODELS": "demo"}) as cold:
        page.goto(cold.url + f"/?model=demo&view=heatmap&pairing=OK&pair={source},{target}")
        title = page.locator(f"#pair-panel-title[data-pair='{source},{target}']")
        body = page.locator("#pair-panel-body")
        states: list[str] = []

        def full() -> bool:
            if title.count():
                return True
            heading = body.locator("h3")
            waiting = (heading.count() and heading.first.inner_text().strip() == f"{source} → {target}"
                       and "waiting for the model's results" in body.inner_text())
            if waiting:
                states.append("waiting")
            return False

        wait_until(full, 120, interval=0.1, message="the pair panel filled in", page=page)
        print(f"the panel waited {len(states)} polls before filling in")
        pair = httpx.get(cold.url + "/api/pair", params={"model": "demo", "pairing": "OK", "source": source,
                                                          "target": target}, timeout=60).json()
        assert float(title.get_attribute("data-pk") or "nan") == pair["pk"]
        assert title.get_attribute("data-pairing") == "OK"
