"""Tiny random configs of every causal-LM model type the installed transformers knows, for
the conformance suite (tests/core/test_conformance.py) and the support table it generates
(scripts/conformance_table.py). A type whose tiny config cannot be made offline is recorded
with its reason, never skipped."""

from __future__ import annotations

from pathlib import Path
from typing import Any

N_LAYERS = 2
D_MODEL = 64
N_HEADS = 4
N_KV = 2  # grouped-query wherever the type has a KV-head setting
D_HEAD = D_MODEL // N_HEADS
VOCAB = 300  # >= 257: headgraph's offline byte-level tokenizer fits

# Explicit cases the issue names, on top of each type's defaults.
EXTRA_CASES: dict[str, tuple[str, dict[str, Any]]] = {
    "granite (residual_multiplier 0.22)": ("granite", {"residual_multiplier": 0.22}),
    "gpt_bigcode (multi_query=False)": ("gpt_bigcode", {"multi_query": False}),
    "falcon (new decoder, 2 KV heads)": ("falcon", {"new_decoder_architecture": True,
                                                      "num_kv_heads": 2}),
}

# (attribute names, value): set on a config wherever the attribute exists (attribute_map
# aliases included), so one table shrinks every family.
_SIZES: list[tuple[tuple[str, ...], Any]] = [
    (("num_hidden_layers", "n_layer", "n_layers", "num_layers"), N_LAYERS),
    (("hidden_size", "n_embd", "d_model", "dim"), D_MODEL),
    (("num_attention_heads", "n_head", "n_heads", "num_heads"), N_HEADS),
    (("num_key_value_heads", "num_kv_heads", "n_kv_heads", "multi_query_group_num"), N_KV),
    (("head_dim", "kv_channels", "attention_head_dim"), D_HEAD),
    (("intermediate_size", "n_inner", "ffn_dim", "ffn_hidden_size"), 2 * D_MODEL),
    (("moe_intermediate_size", "shared_expert_intermediate_size", "expert_intermediate_size"),
     D_MODEL),
    (("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts"), 4),
    (("num_experts_per_tok", "moe_topk", "top_k"), 2),
    (("n_shared_experts", "num_shared_experts"), 1),
    (("first_k_dense_replace",), 1),
    (("rotary_dim",), D_HEAD // 2),
    (("partial_rotary_factor",), 0.5),
    (("vocab_size",), VOCAB),
    (("max_position_embeddings", "n_positions", "n_ctx", "seq_length"), 128),
    (("sliding_window",), 16),
    (("bos_token_id",), 256), (("eos_token_id",), 256), (("pad_token_id",), None),
]


def causal_lm_types() -> dict[str, str]:
    """model_type -> causal-LM class name, as the installed transformers maps them."""
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return dict(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def all_cases() -> dict[str, tuple[str, dict[str, Any]]]:
    """case name -> (model_type, config overrides): every causal-LM type, then EXTRA_CASES."""
    cases: dict[str, tuple[str, dict[str, Any]]] = {t: (t, {}) for t in causal_lm_types()}
    cases.update(EXTRA_CASES)
    return cases


def tiny_config(model_type: str, overrides: dict[str, Any]) -> Any:
    """The type's default config shrunk to 2 layers, d_model 64, 4 query / 2 KV heads (where
    the type has KV heads), per-layer type lists cut to 2 layers; built in one call so the
    config's own validation sees consistent sizes. Raises what transformers raises when the
    type has no such config."""
    from transformers import AutoConfig

    default = AutoConfig.for_model(model_type)
    kwargs: dict[str, Any] = {}
    for names, value in _SIZES:
        for name in names:
            if _has(default, name):
                kwargs[name] = value
    for name in ("layer_types", "block_types", "layers_block_type", "attn_type_list",
                 "mlp_only_layers", "hybrid_override_pattern", "layer_group_types"):
        value = default.__dict__.get(name)  # (a read-only property follows the layer count)
        if isinstance(value, (list, tuple)) and len(value) > N_LAYERS:
            kwargs[name] = list(value)[:N_LAYERS]
        elif isinstance(value, str) and len(value) > N_LAYERS:
            kwargs[name] = value[:N_LAYERS]
    kwargs.update(overrides)
    config = AutoConfig.for_model(model_type, **kwargs)
    config.architectures = [causal_lm_types()[model_type]]
    return config


MAX_PARAMS = 5_000_000  # a "tiny" model; some types keep huge parts no size setting reaches


def size_problem(config: Any) -> str | None:
    """Why ``config`` does not make a tiny model (its parameter count, counted on the meta
    device without allocating), or None."""
    import torch
    from transformers import AutoModelForCausalLM

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=False)
    except Exception:  # building fails for real too: the loader reports it
        return None
    n = sum(p.numel() for p in model.parameters())
    if n > MAX_PARAMS:
        return (f"no tiny config offline: the shrunk config still has {n / 1e6:.0f}M "
                "parameters (sizes no common setting reaches)")
    return None


def _has(config: Any, name: str) -> bool:
    return name in config.__dict__ or name in getattr(config, "attribute_map", {})


def save_tiny_config(folder: Path, model_type: str, overrides: dict[str, Any]) -> Path:
    """``tiny_config`` saved as ``folder``/config.json (what ``random:<folder>`` loads);
    ValueError when it is not tiny (``size_problem``)."""
    config = tiny_config(model_type, overrides)
    problem = size_problem(config)
    if problem is not None:
        raise ValueError(problem)
    folder.mkdir(parents=True, exist_ok=True)
    config.save_pretrained(folder)
    return folder


# -- one case through every stage -------------------------------------------------------------

STAGES: tuple[str, ...] = ("weights", "patterns", "path ablation", "data-weighted PK", "circuits")
TOL = 2e-4  # float32 forwards of a 64-wide model, relative to the largest value compared


def evaluate(folder: Path) -> dict[str, str]:
    """stage -> "supported" or "refused: <reason>" for the tiny random model of ``folder``,
    loaded as ``random:<folder>``. Every supported activation stage is checked against the HF
    model's own forward (``check_path_ablation``); an exception other than UnsupportedModel,
    or a mismatch, propagates (a bug, not a refusal)."""
    import torch

    from headgraph.core.activations.ablation import Edge, edge_statistics
    from headgraph.core.activations.data_pk import data_pk
    from headgraph.core.activations.runners import ablation_runner
    from headgraph.core.circuits.model import Probe, circuit_model
    from headgraph.core.errors import UnsupportedModel
    from headgraph.core.models.loading import load_model

    try:
        lm = load_model(f"random:{folder}", device="cpu")
    except UnsupportedModel as err:
        return {s: f"refused: {_short(err)}" for s in STAGES}
    out = {"weights": "supported"}
    ids = _tokens(lm.info.d_vocab or VOCAB)
    try:
        pattern = lm.patterns.attention_patterns(ids) if lm.patterns is not None else None
        out["patterns"] = "supported" if pattern is not None else "refused: no runnable model"
    except UnsupportedModel as err:
        out["patterns"] = f"refused: {_short(err)}"
    try:
        runner = ablation_runner(lm)
    except UnsupportedModel as err:
        out["path ablation"] = out["data-weighted PK"] = f"refused: {_short(err)}"
    else:
        out["reference"] = check_path_ablation(lm, runner, ids)
        out["path ablation"] = "supported"
        sources = [Edge(0, 0, len(runner.layer_indices) - 1, 0, "V")]
        edge_statistics(runner, sources, ids, torch.ones_like(ids, dtype=torch.bool))
        try:
            data_pk(lm, ["OV"], prompts=["one two three four", "five six seven eight"],
                    batch_size=2)
            out["data-weighted PK"] = "supported"
        except UnsupportedModel as err:
            out["data-weighted PK"] = f"refused: {_short(err)}"
    try:
        cm = circuit_model(lm)
        cm.forward(ids, Probe())  # its own first-forward checks
        out["circuits"] = "supported"
    except UnsupportedModel as err:
        out["circuits"] = f"refused: {_short(err)}"
    return out


def _short(err: BaseException) -> str:
    text = " ".join(str(err).split())
    if text.startswith("random:"):  # the spec names a temporary folder
        text = text.split(": ", 1)[-1]
    return text


def _tokens(vocab: int) -> Any:
    import torch

    g = torch.Generator().manual_seed(1)
    return torch.randint(1, min(vocab, 256), (2, 7), generator=g)


def check_path_ablation(lm: Any, runner: Any, ids: Any) -> str:
    """Path ablation of head 0 of the first attention layer against the HF model's own forward:

    1. its write: the residual change entering the next attention layer when that head's
       o_proj input is replaced by its mean (the layer's MLP write frozen at its clean value),
       read from ``output_hidden_states``, equals headgraph's ``(mean z - z) W_O * scale``;
    2. where the target layer is Llama-shaped (``v_proj``, an RMSNorm), the V-path effect on
       KV head 0 equals a forward whose v_proj input gets that HF change through the norm at
       its clean scale, measured at the target's o_proj input.
    What was checked ("write, V effect", "write" or "fit": the conformance fit alone, where
    the layers are not adjacent or the bridge names no o_proj); AssertionError on a mismatch."""
    import torch


    bridge, hf = lm.bridge, lm.bridge.original_model
    a, b = 0, len(runner.layer_indices) - 1
    ba, bb = runner.layer_indices[a], runner.layer_indices[b]
    blocks = bridge.blocks
    o_mod = getattr(getattr(blocks[ba].attn, "o", None), "original_component", None)
    mlp = getattr(blocks[ba], "mlp", None)
    out_mod = getattr(getattr(mlp, "out", None), "original_component", None)  # MLP's last linear
    mlp_mod = getattr(mlp, "original_component", None)
    if mlp_mod is not None and any(m is o_mod for m in mlp_mod.modules()):
        mlp_mod = None  # a bridge whose "mlp" wraps the whole layer: freeze its output linear
    dh = int(runner.W_O.shape[2])
    mask = torch.ones_like(ids, dtype=torch.bool)
    clean = runner.clean(ids, mask, {a, b}, {b})
    z = clean.z[a][..., 0, :].double()
    want = ((z.mean((0, 1)) - z) @ runner.W_O[a, 0].double()) * float(runner.write_scale[a])
    if o_mod is None or bb != ba + 1 or (mlp is not None and out_mod is None and mlp_mod is None):
        return "fit"  # the write is then checked by core.activations.conformance alone
    with torch.no_grad():
        seen: dict[str, Any] = {}
        h1 = o_mod.register_forward_pre_hook(lambda m, args: _keep(seen, "z", args[0]))
        if out_mod is not None:  # the MLP's write, frozen at its clean value
            h2 = out_mod.register_forward_hook(lambda m, args, out: _keep(seen, "mlp", out))
        elif mlp_mod is not None:  # or the MLP's input, where it has no single output linear
            h2 = mlp_mod.register_forward_pre_hook(
                lambda m, args, kwargs: _keep(seen, "mlp", _first(args, kwargs)), with_kwargs=True)
        else:
            h2 = None
        try:
            base = hf(ids, output_hidden_states=True).hidden_states[bb]
        finally:
            h1.remove()
            if h2 is not None:
                h2.remove()
        zin = seen["z"].clone()
        zin[..., :dh] = zin[..., :dh].mean((0, 1))

        def patch(m: Any, args: Any) -> Any:
            return (zin.to(args[0].dtype), *args[1:])

        hooks = [o_mod.register_forward_pre_hook(patch)]
        if out_mod is not None:
            hooks.append(out_mod.register_forward_hook(lambda m, args, out: seen["mlp"]))
        elif mlp_mod is not None:
            hooks.append(mlp_mod.register_forward_pre_hook(
                lambda m, args, kwargs: _with_first(args, kwargs, seen["mlp"]), with_kwargs=True))
        try:
            got = hf(ids, output_hidden_states=True).hidden_states[bb] - base
        finally:
            for h in hooks:
                h.remove()
    got = got.double()
    scale = float(want.abs().max())
    assert scale > 0
    err = float((got - want).abs().max()) / scale
    assert err <= TOL, f"head write differs from the model's forward by {err:.3g} (relative)"
    return "write, V effect" if _check_v_effect(lm, runner, ids, got, base.double(), a, b) \
        else "write"


def _first(args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return args[0] if args else kwargs["hidden_states"]


def _with_first(args: tuple[Any, ...], kwargs: dict[str, Any], value: Any) -> Any:
    """(args, kwargs) with the module's input (first argument or ``hidden_states``) replaced."""
    if args:
        return (value, *args[1:]), kwargs
    return args, {**kwargs, "hidden_states": value}


def _keep(seen: dict[str, Any], key: str, value: Any) -> None:
    """Record ``value`` under ``key`` (first call only); returns None, so a hook changes nothing."""
    seen.setdefault(key, value)


def _check_v_effect(lm: Any, runner: Any, ids: Any, delta: Any, x: Any, a: int, b: int) -> bool:
    import torch

    from headgraph.core.activations.ablation import Edge, edge_statistics

    hf_attn = getattr(lm.bridge.blocks[runner.layer_indices[b]].attn, "original_component", None)
    ln = getattr(lm.bridge.blocks[runner.layer_indices[b]].ln1, "original_component", None)
    v_proj, o_proj = getattr(hf_attn, "v_proj", None), getattr(hf_attn, "o_proj", None)
    weight, eps = getattr(ln, "weight", None), getattr(ln, "variance_epsilon", None)
    if v_proj is None or o_proj is None or weight is None or eps is None or ln is None:
        return False
    rms = (x.pow(2).mean(-1, keepdim=True) + eps).sqrt()
    with torch.no_grad():
        if float((ln(x.float()).double() - x / rms * weight.double()).abs().max()) > 1e-4:
            return False  # not a plain RMSNorm (e.g. a 1 + w gain)
        add = (delta / rms * weight.double()).float()
        seen: dict[str, Any] = {}

        def record(key: str) -> Any:
            return lambda m, args: _keep(seen, key, args[0].detach().double())

        hook = o_proj.register_forward_pre_hook(record("clean"))
        try:
            lm.bridge.original_model(ids)
        finally:
            hook.remove()
        hooks = [v_proj.register_forward_pre_hook(lambda m, args: (args[0] + add, *args[1:])),
                 o_proj.register_forward_pre_hook(record("patched"))]
        try:
            lm.bridge.original_model(ids)
        finally:
            for h in hooks:
                h.remove()
    H, n_kv, dh = runner.n_heads, runner.n_kv, int(runner.W_O.shape[2])
    W = o_proj.weight.detach().double().T.reshape(H, dh, -1)  # [H, dh, d]
    z0 = seen["clean"].reshape(*ids.shape, H, dh)
    z1 = seen["patched"].reshape(*ids.shape, H, dh)
    o0, o1 = torch.einsum("bthe,hed->bthd", z0, W), torch.einsum("bthe,hed->bthd", z1, W)
    num = (o1 - o0).norm(dim=-1)[:, 1:].sum((0, 1))  # [H], positions >= 1
    den = o0.norm(dim=-1)[:, 1:].sum((0, 1))
    group = H // n_kv
    ref = float(num[:group].mean() / den[:group].mean())
    n, d = edge_statistics(runner, [Edge(a, 0, b, 0, "V")], ids,
                           torch.ones_like(ids, dtype=torch.bool))
    got = float(n.sum() / d.sum())
    assert ref > 1e-6
    assert abs(got - ref) <= 1e-3 * ref, f"V-path effect {got:.6g} != HF reference {ref:.6g}"
    return True


# -- the whole suite, and the support table of docs/models.md -----------------------------------

TABLE_START = "<!-- conformance-table:start (scripts/conformance_table.py writes this) -->"
TABLE_END = "<!-- conformance-table:end -->"


def run_all(root: Path) -> dict[str, dict[str, str]]:
    """case -> its stages (``evaluate``), or every stage "refused: <why no tiny model>" for a
    type whose tiny config cannot be made offline; configs are written under ``root``."""
    results: dict[str, dict[str, str]] = {}
    for i, (name, (model_type, overrides)) in enumerate(all_cases().items()):
        try:
            folder = save_tiny_config(root / f"case{i}", model_type, overrides)
        except Exception as err:  # recorded with its reason, never skipped
            reason = " ".join(str(err).split())
            results[name] = {s: f"not built: {reason[:160]}" for s in STAGES}
            continue
        results[name] = evaluate(folder)
    return results


def _cell_reason(value: str) -> str:
    import re

    reason = value.split(": ", 1)[1] if ": " in value else value
    reason = re.sub(r"max error [0-9.e+-]+", "max error above 1e-3", reason)
    reason = re.sub(r"\(it has no adapter for \S+\)", "(no adapter for the architecture)", reason)
    reason = re.sub(r"^\S+ is an (encoder-only|encoder-decoder) model", r"\1 model", reason)
    reason = re.sub(r"still has \d+M parameters", "still has millions of parameters", reason)
    return reason


def render_table(results: dict[str, dict[str, str]]) -> str:
    """The markdown support table: one row per case, "yes" or a footnote number per stage,
    the footnotes listing each distinct reason once."""
    import torch
    import transformer_lens
    import transformers

    notes: dict[str, int] = {}
    lines = [TABLE_START, "",
             f"Generated from the conformance suite (tests/core/test_conformance.py) with "
             f"transformers {transformers.__version__}, TransformerLens "
             f"{transformer_lens.__version__ if hasattr(transformer_lens, '__version__') else '?'}"
             f", torch {torch.__version__.split('+')[0]}: a tiny random model (2 layers, "
             f"d_model {D_MODEL}, {N_HEADS} query / {N_KV} KV heads where the type has them) of "
             "every causal-LM type transformers knows. **yes**: the stage runs, and path "
             "ablation's head write (and, on Llama-shaped layers, its V-path effect) equals a "
             "patched forward of the Hugging Face model itself (*checked*); a number: refused, "
             "for the reason in that note.", "",
             "| architecture | weights | patterns | path ablation | data-weighted PK | circuits "
             "| checked |", "|---|---|---|---|---|---|---|"]
    for name, row in results.items():
        cells = []
        for stage in STAGES:
            value = row[stage]
            if value == "supported":
                cells.append("yes")
                continue
            reason = _cell_reason(value)
            if value.startswith("not built"):
                reason = f"no tiny model: {reason}"
            notes.setdefault(reason, len(notes) + 1)
            cells.append(f"[{notes[reason]}]")
        lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {row.get('reference', '')} |")
    lines += ["", "Reasons:", ""]
    lines += [f"{n}. {reason}" for reason, n in notes.items()]
    lines += ["", TABLE_END]
    return "\n".join(lines)


def table_in(text: str) -> str | None:
    """The table between the markers of a document, markers included, or None."""
    if TABLE_START not in text or TABLE_END not in text:
        return None
    start = text.index(TABLE_START)
    return text[start:text.index(TABLE_END, start) + len(TABLE_END)]
