"""Every causal-LM type the installed transformers knows, as a tiny random model: each stage
either runs and matches the Hugging Face model's own forward, or is refused with
UnsupportedModel naming why (tests/conformance_support.py). Named cases: Granite's residual
multiplier (its scaled write equals the patched forward), GPT-BigCode with multi_query=False,
a BERT config built as a causal LM, Falcon's new decoder with 2 KV heads, Gemma 2's
post-attention norm. The support table of docs/models.md must be what the suite says."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path

import pytest
import torch
from conformance_support import (
    STAGES,
    TABLE_END,
    all_cases,
    render_table,
    run_all,
    save_tiny_config,
    table_in,
)

from headgraph.core.activations.conformance import write_conformance
from headgraph.core.activations.data_pk import data_pk, data_weighted_pk
from headgraph.core.activations.runners import ablation_runner
from headgraph.core.errors import UnsupportedModel
from headgraph.core.models.loading import load_model
from headgraph.core.scores.subspaces import role_bases

DOC = Path(__file__).resolve().parents[2] / "docs" / "models.md"


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> dict[str, dict[str, str]]:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    try:
        return run_all(tmp_path_factory.mktemp("conformance"))
    finally:
        logging.disable(logging.NOTSET)


def test_every_type_is_supported_and_checked_or_refused_with_a_reason(results):
    """run_all raises on any other exception and on any mismatch with the HF forward; here:
    every type is present and every stage says supported or gives a reason."""
    assert set(results) == set(all_cases())
    for name, row in results.items():
        for stage in STAGES:
            value = row[stage]
            assert value == "supported" or (value.startswith(("refused: ", "not built: "))
                                            and len(value) > 20), (name, stage, value)
    supported = [n for n, r in results.items() if r["path ablation"] == "supported"]
    checked = [n for n in supported if "V effect" in results[n].get("reference", "")]
    assert len(supported) >= 40 and len(checked) >= 20  # the suite really checks models
    for family in ("gpt2", "llama", "qwen2", "gptj", "gpt_neox", "falcon", "phi", "opt"):
        assert results[family]["path ablation"] == "supported", family
        assert results[family]["reference"].startswith("write"), family


def test_named_cases(results):
    granite = results["granite (residual_multiplier 0.22)"]
    assert granite["path ablation"] == granite["data-weighted PK"] == "supported"
    assert granite["reference"] == "write, V effect"  # scaled effect == HF patched forward
    assert "residual multiplier 0.22" in granite["circuits"]
    assert "multi_query=False" in results["gpt_bigcode (multi_query=False)"]["weights"]
    assert "encoder-only model" in results["bert"]["weights"]
    assert "2 KV heads" in results["falcon (new decoder, 2 KV heads)"]["weights"]
    assert "post-attention norm" in results["gemma2"]["path ablation"]
    assert results["gemma2"]["weights"] == "supported"  # weight-level stages stay


def test_granite_write_scale_and_data_pk_in_share(tmp_path):
    """The conformance fit finds 0.22 on every layer; data-weighted PK's in_share is the
    unscaled one times 0.22^2 (C_S scales by the square), out_share unchanged."""
    model_type, overrides = all_cases()["granite (residual_multiplier 0.22)"]
    lm = load_model(f"random:{save_tiny_config(tmp_path / 'g', model_type, overrides)}",
                    device="cpu")
    check = write_conformance(lm.bridge, lm.info.layer_indices, lm.heads.W_O)
    torch.testing.assert_close(check.scale, torch.full((2,), 0.22, dtype=torch.float64),
                               rtol=1e-4, atol=0)
    assert check.features == ("residual multiplier 0.22",)
    prompts = ["one two three four five", "six seven eight nine ten"]
    scaled = data_pk(lm, ["OV"], prompts=prompts)["OV"]
    runner = ablation_runner(lm)
    from headgraph.core.activations.data_pk import activation_covariances

    cov = activation_covariances(runner, prompts=prompts)
    plain = data_weighted_pk(cov, runner.W_O, role_bases(lm.heads, "V"), "OV")
    factor = float(check.scale[0]) ** 2
    torch.testing.assert_close(scaled.in_share, plain.in_share * factor, rtol=1e-6, atol=1e-12)
    torch.testing.assert_close(scaled.out_share, plain.out_share, rtol=1e-6, atol=1e-12)


def test_refusals_are_unsupported_model_not_tracebacks(tmp_path):
    for case, match in (("gpt_bigcode (multi_query=False)", "multi_query=False"),
                        ("bert", "encoder-only model; headgraph analyses decoder-only"),
                        ("falcon (new decoder, 2 KV heads)", "2 KV heads")):
        model_type, overrides = all_cases()[case]
        folder = save_tiny_config(tmp_path / model_type, model_type, overrides)
        with pytest.raises(UnsupportedModel, match=match):
            load_model(f"random:{folder}", device="cpu")


def test_docs_support_table_is_what_the_suite_says(results):
    """docs/models.md's table is regenerated by scripts/conformance_table.py."""
    doc = table_in(DOC.read_text(encoding="utf-8"))
    assert doc is not None and doc.endswith(TABLE_END)
    assert doc == render_table(results), ("docs/models.md's support table is stale: run "
                                          ".venv/bin/python scripts/conformance_table.py")
