"""Browser: a Gemma-3-shaped checkpoint (random weights, a local folder: grouped-query attention
with 4 query heads and 2 KV groups, RMSNorm gains applied as 1 + w, a post-attention norm on
every head's write) opens in every view.

Its job ends "done with 2 stages unavailable": data-weighted PK routes a head's write into the
residual stream, which a post-attention norm changes, so that stage is refused with a message
naming the norm. Every other view renders from its own results (graph, heatmap, head grid,
scatter, reference, tokens, the pair panel), and the pair panel says why its data-weighted PK
is missing where those numbers would appear. Numbers are compared with the API's answers.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest
from playwright.sync_api import Page

from browser import Server, query_of, wait_figure, wait_until
from model_support import save_random_model

pytestmark = pytest.mark.timeout(300)
MODEL = "local:gemma3"


@pytest.fixture(scope="module")
def server_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    root = tmp_path_factory.mktemp("post-norm-models")
    cfg = Gemma3TextConfig(num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, sliding_window=16)
    save_random_model(root / "gemma3", cfg, Gemma3ForCausalLM, seed=7)
    return {"HEADGRAPH_MODEL_ROOT": str(root), "HEADGRAPH_DEVICE": "cpu"}


@pytest.fixture(scope="module")
def warm_models() -> tuple[str, ...]:
    return (MODEL,)  # its job runs through the API first


def api(server: Server, path: str, **params: Any) -> Any:
    r = httpx.get(server.url + path, params={"model": MODEL, **params}, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()


def chip(page: Page, key: str) -> str | None:
    loc = page.locator(f"#stat-{key}")
    return loc.get_attribute("data-value") if loc.count() else None


def edges_of(fig: dict[str, Any]) -> list[list[Any]]:
    return [cd for tr in fig["data"] for cd in (tr.get("customdata") or [])
            if isinstance(cd, list) and cd and cd[0] == "edge"]


def test_a_post_norm_gqa_checkpoint_opens_in_every_view(server: Server, page: Page) -> None:
    job = httpx.get(server.url + "/api/jobs", params={"model": MODEL}, timeout=30).json()
    assert job["state"] == "done" and set(job["unavailable"]) == {"datapk text", "datapk random"}
    assert all("post-attention norm" in why for why in job["unavailable"].values()), job
    info = httpx.get(server.url + "/api/models/info", params={"model": MODEL}, timeout=30).json()
    assert info["info"]["n_heads"] == 4 and info["info"]["n_kv_heads"] == 2

    # graph: drawn from PK and CS (every result the views wait for is cached: ready at once)
    page.goto(server.url + f"/?model={MODEL}&view=graph&pairings=OQ,OK,OV&k=4&overlay=")
    wait_until(lambda: "cached ✓" in page.locator("#model-info").inner_text(), 60,
               message="model ready", page=page)
    graph = api(server, "/api/graph", pairings="OQ,OK,OV", k=4)["graph"]
    fig = wait_figure(page, "graph", lambda f: len(edges_of(f)) == len(graph["edges"]), timeout=120)
    assert sorted(tuple(cd[1:4]) for cd in edges_of(fig)) == sorted(
        (e["source"], e["target"], e["pairing"]) for e in graph["edges"])

    # heatmap
    page.click("#tab-heatmap")
    wait_figure(page, "heatmap", lambda f: f["data"] and f["data"][0]["type"] == "heatmap")

    # scatter: every valid pair once
    page.click("#tab-scatter")
    scatter = api(server, "/api/scatter", pairing="OK", top_percent=5)
    wait_until(lambda: chip(page, "points"), 60, message="scatter drawn", page=page)
    assert int(chip(page, "points") or 0) == len(scatter["points"]["pk"])

    # reference and tokens
    page.click("#tab-reference")
    kl = page.locator("#reference-summary")
    wait_until(lambda: kl.get_attribute("data-kl"), 60, message="reference drawn", page=page)
    assert json.loads(kl.get_attribute("data-kl") or "null") == api(server, "/api/reference")["kl"]["kl"]
    page.click("#tab-tokens")
    wait_until(lambda: chip(page, "token-heads"), 60, message="tokens drawn", page=page)
    assert int(chip(page, "token-heads") or 0) == len(api(server, "/api/tokens", role="O", k=5)["heads"])

    # the pair panel of the strongest OK edge: PK as the API gives it, and the reason where
    # its data-weighted PK would be
    edge = api(server, "/api/top", pairing="OK", k=1)["pairs"][0]
    src, tgt = edge["source"], edge["target"]
    page.goto(server.url + f"/?model={MODEL}&view=graph&pairings=OK&k=4&overlay=&pairing=OK&pair={src},{tgt}")
    title = page.locator(f"#pair-panel-title[data-pair='{src},{tgt}']")
    title.wait_for(timeout=60_000)
    pair = api(server, "/api/pair", pairing="OK", source=src, target=tgt)
    assert float(title.get_attribute("data-pk") or "nan") == pytest.approx(pair["pk"], rel=1e-12)
    assert set(pair["data_pk_unavailable"]) == {"text", "random"} and pair["data_pk"] is None
    note = page.locator("#pair-datapk-out-text .error-note, #pair-panel-body .error-note",
                        has_text="post-attention norm").first
    note.wait_for(timeout=30_000)
    assert query_of(page.url).get("pair") == f"{src},{tgt}"
