"""What the model root offers, and what it does not, with why: a GGUF file right in the root
is offered as ``local:<name>.gguf`` and computes; a GGUF linked into the root from elsewhere
is listed as "not offered" with the reason (it was left out without a word) and refused when
asked for; the dashboard's model list disables it with that reason."""

from __future__ import annotations

import httpx
import pytest

from model_support import write_tiny_gguf


@pytest.fixture(scope="module")
def served(launch_server, tmp_path_factory):
    root = tmp_path_factory.mktemp("root")
    elsewhere = tmp_path_factory.mktemp("elsewhere")
    write_tiny_gguf(root / "tiny.gguf", "llama", seed=1)
    (root / "linked.gguf").symlink_to(write_tiny_gguf(elsewhere / "outside.gguf", "qwen2", seed=2))
    env = {"HEADGRAPH_MODEL_ROOT": str(root)}
    with launch_server(tmp_path_factory.mktemp("cache"), env=env, check_errors=True) as srv, \
            httpx.Client(base_url=srv.url, timeout=300) as client:
        yield client


def test_the_root_lists_what_it_offers_and_what_it_refuses_with_why(served):
    models = {m["id"]: m for m in served.get("/api/models").json()["models"]}
    tiny, linked = models["local:tiny.gguf"], models["local:linked.gguf"]
    assert tiny["status"] == "available" and "GGUF file" in tiny["message"]
    assert linked["status"] == "not offered" and "outside the model root" in linked["message"]
    assert "elsewhere" not in linked["message"] and "outside.gguf" not in linked["message"]
    pk = served.get("/api/pk", params={"model": "local:tiny.gguf", "pairing": "OK"})
    assert pk.status_code == 200, pk.text
    refused = served.get("/api/pk", params={"model": "local:linked.gguf", "pairing": "OK"})
    assert refused.status_code == 403


def test_the_model_picker_disables_a_refused_model_with_its_reason(served):
    from headgraph.frontend.layout.controls import model_options

    opts = {o["value"]: o for o in model_options(served.get("/api/models").json()["models"], None)}
    assert opts["local:linked.gguf"]["disabled"] and "outside the model root" in opts["local:linked.gguf"]["title"]
    assert not opts["local:tiny.gguf"]["disabled"]
