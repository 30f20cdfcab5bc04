"""Do headgraph's per-head writes reproduce what a model's attention adds to its residual?

Path ablation, data-weighted PK and task circuits take a head's write to the residual stream
to be ``z_h @ W_O[h]`` (plus the layer's output bias). Some blocks add something else:
Granite multiplies the attention output by ``residual_multiplier`` before the residual add,
Gemma 2/3 and OLMo 2 pass it through a norm, parallel blocks (GPT-J, Pythia, Falcon, Phi,
Cohere) add attention and MLP outputs to the same residual. :func:`write_conformance` runs
the model on a few tokens and fits, per attention layer, the real contribution ``r``
(residual after the attention minus residual before it, read at the bridge's
``blocks.{i}.hook_in`` and ``blocks.{i}.ln2.hook_in``; for a parallel block ``hook_out``
minus ``hook_in`` minus ``mlp.hook_out``) against the summed head writes ``p`` as
``r = alpha p + c`` (least squares over positions, in float64; c a constant vector: the
biases). A layer conforms when the worst residual of that fit is within 1e-3 of the largest
|r - mean r|; its ``alpha`` (1 when within 1e-3 of it) is the factor the activation stages
apply to every head write of the layer. Anything else (a norm between the heads and the
residual, an encoder's post-norm) is refused with the block feature named.

The check is one forward of 2 sequences x 8 random tokens, cached per bridge and weights.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel

TOLERANCE = 1e-3  # worst fit residual / largest centred contribution
N_SEQUENCES, N_TOKENS = 2, 8


@dataclass(frozen=True)
class WriteConformance:
    """The per-layer fit of a model's attention contributions to headgraph's head writes.

    scale: [L] float64, the factor the model applies to the attention output of each
    attention layer (1 where none); max_error: the worst relative fit residual over layers;
    features: block features found ("residual multiplier 0.22", "parallel attention and
    MLP"); refusal: why the activation-level stages are refused, or None."""

    scale: torch.Tensor
    max_error: float
    features: tuple[str, ...]
    refusal: str | None

    @property
    def ok(self) -> bool:
        return self.refusal is None


class StopForward(Exception):
    """Raised by a hook to end a forward once what is measured has fired."""


_CACHE: weakref.WeakKeyDictionary[Any, tuple[Any, WriteConformance]] = weakref.WeakKeyDictionary()


def write_conformance(bridge: Any, layer_indices: tuple[int, ...], W_O: torch.Tensor
                      ) -> WriteConformance:
    """Fit each attention layer's real residual contribution to its summed head writes
    (module docstring); ``layer_indices`` the blocks with attention, ``W_O`` [L, H, dh, d]
    the bridge's per-head output weights. Cached per bridge and weights."""
    # which tensor, and whether it was written since (no float64 copy of a big model's W_O)
    key = (tuple(layer_indices), tuple(W_O.shape), W_O.data_ptr(), W_O._version)
    hit = _CACHE.get(bridge)
    if hit is not None and hit[0] == key:
        return hit[1]
    result = _measure(bridge, tuple(layer_indices), W_O)
    _CACHE[bridge] = (key, result)
    return result


def head_write_scale(bridge: Any, layer_indices: tuple[int, ...], W_O: torch.Tensor,
                     stage: str = "path ablation and data-weighted PK") -> torch.Tensor:
    """The per-layer write scale [L] (float64) of a conforming model; UnsupportedModel naming
    the block feature otherwise."""
    result = write_conformance(bridge, layer_indices, W_O)
    if result.refusal is not None:
        raise UnsupportedModel(f"{stage}: {result.refusal}; refused rather than a wrong number")
    return result.scale


def _refused(L: int, reason: str, features: tuple[str, ...] = (), error: float = float("nan")
             ) -> WriteConformance:
    return WriteConformance(torch.ones(L, dtype=torch.float64), error, features, reason)


def _measure(bridge: Any, layer_indices: tuple[int, ...], W_O: torch.Tensor) -> WriteConformance:
    from headgraph.core.models.model_kind import kind_refusal

    L = len(layer_indices)
    config: Any = getattr(getattr(bridge, "original_model", None), "config", None)
    kind = kind_refusal(config.to_dict()) if callable(getattr(config, "to_dict", None)) else None
    if kind is not None:
        return _refused(L, kind, ("encoder",))
    post = post_attention_norm(bridge)
    if post is not None:
        return _refused(L, f"post-attention norm (Gemma 2/3, OLMo 2, GLM-4): {post}, so a "
                           "head's write is not z W_O", ("post-attention norm",))
    names = set(getattr(bridge, "hook_dict", {}) or {})
    want: list[str] = []
    for block in layer_indices:
        for point in ("hook_in", "attn.hook_z", "ln2.hook_in", "hook_out", "mlp.hook_out"):
            name = f"blocks.{block}.{point}"
            if name in names:
                want.append(name)
    last = f"blocks.{layer_indices[-1]}.hook_out" if layer_indices else ""
    cache: dict[str, torch.Tensor] = {}

    def keeper(name: str) -> Any:
        def keep(t: torch.Tensor, hook: Any) -> None:
            cache[name] = t.detach().double()
            if name == last:
                raise StopForward
        return keep

    vocab = int(getattr(bridge.cfg, "d_vocab", 0) or 0)
    if vocab < 2:
        return _refused(L, "the model reports no vocabulary to run tokens through")
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(1, vocab, (N_SEQUENCES, N_TOKENS), generator=g).to(W_O.device)
    try:
        with torch.no_grad(), bridge.hooks(fwd_hooks=[(n, keeper(n)) for n in want]):
            bridge(ids)
    except StopForward:
        pass
    except Exception as err:  # a forward the bridge cannot run: nothing to measure
        return _refused(L, f"the model's forward failed on {N_SEQUENCES}x{N_TOKENS} tokens "
                           f"({type(err).__name__}: {' '.join(str(err).split())[:160]})")
    scales, worst, parallel = [], 0.0, False
    for layer, block in enumerate(layer_indices):
        n = f"blocks.{block}"
        if f"{n}.attn.hook_z" not in cache or f"{n}.hook_in" not in cache:
            return _refused(L, f"the bridge did not report {n}.attn.hook_z / hook_in, so "
                               "the attention output cannot be checked against per-head writes")
        z = cache[f"{n}.attn.hook_z"]
        pred = torch.einsum("bthe,hed->btd", z, W_O[layer].double()).reshape(-1, W_O.shape[-1])
        x = cache[f"{n}.hook_in"]
        candidates = []
        if f"{n}.ln2.hook_in" in cache:  # sequential: the residual the MLP's norm reads
            candidates.append((cache[f"{n}.ln2.hook_in"] - x, False))
        if f"{n}.hook_out" in cache:  # parallel: block output less input less the MLP's
            mlp = cache.get(f"{n}.mlp.hook_out")
            rest = cache[f"{n}.hook_out"] - x
            candidates.append((rest if mlp is None else rest - mlp, True))
        fits = [(*_fit(real.reshape(-1, real.shape[-1]), pred), par) for real, par in candidates]
        good = [f for f in fits if f[1] <= TOLERANCE]
        if not good:
            err = min((f[1] for f in fits), default=float("inf"))
            return _refused(L, f"attention output not reproduced by per-head writes "
                               f"(blocks.{block}: max error {err:.2g} of the contribution)",
                            error=err)
        alpha, err, par = good[0]
        parallel |= par
        worst = max(worst, err)
        scales.append(1.0 if abs(alpha - 1) <= TOLERANCE else alpha)
    scale = torch.tensor(scales, dtype=torch.float64)
    features = []
    if bool((scale != 1).any()):
        shown = sorted({round(float(s), 4) for s in scale})
        features.append(f"residual multiplier {', '.join(f'{s:g}' for s in shown)}")
    if parallel:
        features.append("parallel attention and MLP")
    return WriteConformance(scale, worst, tuple(features), None)


def post_attention_norm(bridge: Any) -> str | None:
    """Where a bridge's attention output passes a norm before the residual add ("blocks.3 has
    a post-attention norm (ln1_post)"), else None: a block declaring ``ln1_post``, or whose
    ``hook_attn_out`` is read after a submodule other than ``attn``."""
    for i, block in enumerate(getattr(bridge, "blocks", ())):
        submodules = getattr(block, "submodules", None)
        if not isinstance(submodules, dict) or "attn" not in submodules:
            continue
        if "ln1_post" in submodules:
            return f"blocks.{i} has a post-attention norm (ln1_post)"
        aliases = getattr(block, "hook_aliases", None)
        target = aliases.get("hook_attn_out") if isinstance(aliases, dict) else None
        for candidate in [target] if isinstance(target, str) else list(target or []):
            owner = candidate.split(".", 1)[0]
            if owner in submodules and owner != "attn":
                return f"blocks.{i} writes its attention output through {owner}"
            if owner in submodules:
                break
    return None


def _fit(real: torch.Tensor, pred: torch.Tensor) -> tuple[float, float]:
    """(alpha, relative error) of real ~ alpha * pred + c over rows [N, d] (float64)."""
    rc, pc = real - real.mean(0), pred - pred.mean(0)
    size = float(rc.abs().max())
    denom = float((pc * pc).sum())
    if size == 0 or denom == 0:
        return 0.0, float("inf")
    alpha = float((rc * pc).sum()) / denom
    return alpha, float((rc - alpha * pc).abs().max()) / size


__all__ = ["TOLERANCE", "StopForward", "WriteConformance", "head_write_scale",
           "post_attention_norm", "write_conformance"]
