"""The validation API's cache-only read and the pair panel's data-weighted PK, on the demo through
the real in-process API: ``/api/validation?cached=true`` never computes (``computed`` false
until the validation is computed, then the same numbers as the computing read); the pair
panel shows "not computed" until /api/pair carries data_pk, then the API's own values."""

from __future__ import annotations

from frontend_support import api, computed, find, http  # noqa: F401  (fixtures found by name)
from headgraph.core.vocabulary import vocabulary
from headgraph.frontend.api_client import ApiClient
from headgraph.frontend.callbacks.panels import pair_body
from headgraph.frontend.state import default_state
from headgraph.frontend.vocab import Vocabulary

VOCAB = Vocabulary.from_json(vocabulary())
PARAMS = {"model": "demo", "pairing": "OK", "n": 8, "k": 2, "seed": 1}


def cell_value(body: list, cid: str) -> str:
    cell = find(body, cid)
    assert cell is not None, cid
    return cell.children.to_plotly_json()["props"]["data-value"]


def test_cached_validation_reads_only_then_equals_the_computed_answer(api: ApiClient, computed: list[str]) -> None:
    before = api.get("/api/validation", **PARAMS, cached="true")
    assert before["computed"] is False and before["cached_only"] is True and before["summary"] == {}
    assert not any(c.startswith("validation?") for c in api.model_info("demo")["cached"])  # nothing computed
    # The pair panel before any data-weighted PK is cached: "not computed".
    pair = api.pair("demo", "OK", "L0H0", "L1H3")
    body = pair_body(pair, default_state(VOCAB, pair=("L0H0", "L1H3")))
    assert pair.get("data_pk") is None and cell_value(body, "pair-datapk-out-text") == ""
    assert "not computed" in str(find(body, "pair-datapk-in-text").children.children)

    full = api.get("/api/validation", **PARAMS)  # computes (the demo runs here)
    after = api.get("/api/validation", **PARAMS, cached="true")
    assert full["computed"] is True and after["computed"] is True and after["cached_only"] is True
    assert after["summary"] == full["summary"] and after["edges"] == full["edges"]

    # Validation computed the text prompts' data-weighted PK: the pair panel shows the API's values.
    pair = api.pair("demo", "OK", "L0H0", "L1H3")
    text = pair["data_pk"]["text"]
    body = pair_body(pair, default_state(VOCAB, pair=("L0H0", "L1H3")))
    assert float(cell_value(body, "pair-datapk-out-text")) == text["out_share"]
    assert float(cell_value(body, "pair-datapk-in-text")) == text["in_share"]
    if "random" not in pair["data_pk"]:
        assert cell_value(body, "pair-datapk-out-random") == ""
