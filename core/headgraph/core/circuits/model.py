"""The residual-stream graph of a runnable model, as task circuits read and patch it.

A :class:`CircuitModel` runs token ids [B, T] through a model and, at fixed points of the
forward, calls a :class:`Probe`, which may observe or replace what flows there:

- ``resid0``: the residual stream entering the first layer [B, T, d] (the "embed" writer:
  token plus position embeddings where positions are added to the stream);
- ``attn_in(l)``: the residual entering layer ``l``'s pre-attention norm [B, T, d];
- ``proj(l, path)``: the Q, K or V projection output [B, T, Hp, dh] (before rotary embeddings
  and any Q/K norm; Hp = query heads for Q, KV heads for K and V), which is
  ``norm_l(attn_in) @ W_P[l] + b_P`` (checked on the first forward);
- ``z(l)``: every head's output [B, T, H, dh]; a head's write is ``z_h @ W_O[h]``, on a
  post-attention-norm model divided by that norm's scale ``post_scale(l)`` [B, T, 1] and
  multiplied by its gain (:meth:`CircuitModel.head_writes`);
- ``mlp_in(l)``: the residual entering the MLP's norm [B, T, d]; ``mlp_out(l)``: the MLP's
  write [B, T, d] (after its post-norm, if any);
- ``final``: the residual entering the final norm [B, T, d].

Two implementations: the demo model (its forward re-stated with these points, checked equal
to ``DemoModel.forward``) and TransformerBridge models through their hook points (HF
checkpoints, GGUF models through their lazy bridge).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from headgraph.core.errors import UnsupportedModel
from headgraph.core.names import head_label

PATHS: tuple[str, str, str] = ("Q", "K", "V")


class Probe:
    """Callbacks of one forward; the defaults observe nothing and replace nothing."""

    def resid0(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def attn_in(self, layer: int, x: torch.Tensor) -> None:
        return None

    def proj(self, layer: int, path: str, t: torch.Tensor) -> torch.Tensor:
        return t

    def z(self, layer: int, t: torch.Tensor) -> None:
        return None

    def post_scale(self, layer: int, s: torch.Tensor) -> None:
        return None

    def mlp_in(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return x

    def mlp_out(self, layer: int, t: torch.Tensor) -> None:
        return None

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return x


class CircuitModel:
    """Weights, norms and a probed forward of one model, in attention-layer positions."""

    layer_indices: tuple[int, ...]
    W_Q: torch.Tensor  # [L, H, d, dh]
    W_K: torch.Tensor  # [L, Hkv, d, dh]
    W_V: torch.Tensor  # [L, Hkv, d, dh]
    W_O: torch.Tensor  # [L, H, dh, d]
    has_mlp: bool
    post_norm: bool  # attention outputs pass a norm before the residual add
    post_gain: torch.Tensor | None  # [L, d]: that norm's gain
    source: Any  # what tokenizes (core.models.runnable.tokenize_prompts)

    @property
    def n_layers(self) -> int:
        return int(self.W_Q.shape[0])

    @property
    def n_heads(self) -> int:
        return int(self.W_Q.shape[1])

    @property
    def n_kv(self) -> int:
        return int(self.W_K.shape[1])

    @property
    def device(self) -> torch.device:
        return self.W_Q.device

    def W_in(self, path: str) -> torch.Tensor:
        return {"Q": self.W_Q, "K": self.W_K, "V": self.W_V}[path]

    def norm(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        """Layer ``layer``'s pre-attention norm of ``x`` [..., d] (affine included)."""
        raise NotImplementedError

    def forward(self, ids: torch.Tensor, probe: Probe) -> torch.Tensor:
        """Logits [B, T, V] of ``ids`` [B, T] (rows of equal length, no padding)."""
        raise NotImplementedError

    def head_writes(self, layer: int, z: torch.Tensor, scale: torch.Tensor | None
                    ) -> torch.Tensor:
        """Each head's residual write [B, T, H, d] from z [B, T, H, dh]: ``z_h @ W_O[h]``;
        with a post-attention norm, divided by ``scale`` [B, T, 1] and times the gain."""
        out = torch.einsum("bthe,hed->bthd", z, self.W_O[layer])
        if self.post_norm:
            if scale is None or self.post_gain is None:
                raise UnsupportedModel("a post-attention norm's scale was not recorded")
            out = out / scale[:, :, None, :] * self.post_gain[layer]
        return out

    def label(self, layer: int, head: int | None = None, *, kv: bool = False) -> str:
        block = self.layer_indices[layer]
        if head is None:
            return f"L{block}"
        return head_label(block, head, kv=kv and self.n_kv != self.n_heads)


# -- the demo model ----------------------------------------------------------------------------

class DemoCircuitModel(CircuitModel):
    """The demo (core.models.demo): attention only, shortformer positions (added to Q and K
    inputs after the norm, so the residual stream holds token embeddings and head writes)."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.source = model
        self.layer_indices = tuple(model.layer_indices)
        self.W_Q, self.W_K, self.W_V, self.W_O = (t.detach() for t in (
            model.W_Q, model.W_K, model.W_V, model.W_O))
        self.has_mlp = False
        self.post_norm = False
        self.post_gain = None

    def norm(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        cfg, m = self.model.cfg, self.model
        if not cfg.layer_norm:
            return x
        return torch.nn.functional.layer_norm(x, (cfg.d_model,), m.ln_w[layer].detach(),
                                              m.ln_b[layer].detach(), cfg.ln_eps)

    def forward(self, ids: torch.Tensor, probe: Probe) -> torch.Tensor:
        m, cfg = self.model, self.model.cfg
        ids = ids.to(m.W_E.device)
        T = ids.shape[-1]
        pos = m.W_pos[:T].detach()
        causal = torch.ones(T, T, dtype=torch.bool, device=ids.device).tril()
        x = probe.resid0(m.W_E.detach()[ids])
        for layer in range(cfg.n_layers):
            probe.attn_in(layer, x)
            h = self.norm(layer, x)
            qk_in = h + pos
            q = torch.einsum("bpd,hde->bphe", qk_in, self.W_Q[layer]) + m.b_Q[layer].detach()
            k = torch.einsum("bpd,hde->bphe", qk_in, self.W_K[layer]) + m.b_K[layer].detach()
            v = torch.einsum("bpd,hde->bphe", h, self.W_V[layer]) + m.b_V[layer].detach()
            q, k, v = (probe.proj(layer, p, t) for p, t in zip(PATHS, (q, k, v)))
            scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / cfg.d_head ** 0.5
            pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)
            z = torch.einsum("bhqk,bkhe->bqhe", pattern, v)
            probe.z(layer, z)
            x = x + torch.einsum("bphe,hed->bpd", z, self.W_O[layer]) + m.b_O[layer].detach()
        x = probe.final(x)
        x = torch.nn.functional.layer_norm(x, (cfg.d_model,), m.ln_final_w.detach(),
                                           m.ln_final_b.detach(), cfg.ln_eps)
        return x @ m.W_U.detach() + m.b_U.detach()


# -- TransformerBridge models --------------------------------------------------------------------

def _post_norm_gain(block: Any, cache: dict[str, torch.Tensor], hook_out: str, hook_norm: str
                    ) -> torch.Tensor:
    """The post-attention RMS norm's gain: its weight, or 1 + weight (Gemma), whichever the
    recorded output says (output = normalized * gain, no bias); else UnsupportedModel."""
    module = getattr(block.ln1_post, "original_component", None)
    weight = getattr(module, "weight", None)
    out, normed = cache[hook_out], cache[hook_norm]
    tol = 1e-4 * (1 + float(out.abs().max()))
    candidates = [torch.ones_like(out[0, 0])] if weight is None else [
        weight.detach().to(out.dtype), 1 + weight.detach().to(out.dtype)]
    for gain in candidates:
        if float((normed * gain - out).abs().max()) <= tol:
            return gain
    raise UnsupportedModel("the post-attention norm is not normalized * weight (or * (1 + "
                           "weight)) without a bias, so a head's write through it is not defined")


class BridgeCircuitModel(CircuitModel):
    """A TransformerBridge through its hook points (``blocks.{i}.ln1.hook_in``,
    ``attn.hook_q/k/v/z``, ``ln1_post.hook_scale``, ``ln2.hook_in``, ``hook_mlp_out``,
    ``ln_final.hook_in``). The first forward checks that the projections are the norm's
    output times W_Q/W_K/W_V, that the attention output is the sum of ``z_h @ W_O[h]`` plus
    a constant, and finds the post-attention norm's gain."""

    def __init__(self, bridge: Any, source: Any) -> None:
        self.bridge = bridge
        self.source = source
        blocks = list(getattr(bridge, "blocks", ()))
        with_attn = list(bridge.blocks_with("attn"))
        if len(with_attn) != len(blocks) or not blocks:
            raise UnsupportedModel("task circuits need an attention layer in every block "
                                   f"({len(with_attn)} of {len(blocks)} blocks have one)")
        if bool(getattr(bridge.cfg, "parallel_attn_mlp", False)):
            raise UnsupportedModel("task circuits: parallel attention and MLP blocks (GPT-J, "
                                   "Pythia) are not supported yet")
        self.layer_indices = tuple(int(i) for i, _ in with_attn)
        try:
            with torch.no_grad():
                self.W_Q, self.W_K, self.W_V, self.W_O = (
                    torch.stack([getattr(b.attn, name).detach() for b in blocks])
                    for name in ("W_Q", "W_K", "W_V", "W_O"))
        except (AttributeError, NotImplementedError, RuntimeError, ValueError) as err:
            raise UnsupportedModel(f"this bridge does not expose per-head attention weights "
                                   f"({type(err).__name__}: {err})") from err
        self._blocks = blocks
        self._norms: list[Callable[[torch.Tensor], torch.Tensor]] = []
        for i, b in enumerate(blocks):
            module = getattr(getattr(b, "ln1", None), "original_component", None)
            if module is None:
                raise UnsupportedModel(f"blocks.{i} has no norm before its attention (ln1)")
            self._norms.append(module)
        self.has_mlp = all("mlp" in (getattr(b, "submodules", None) or {}) for b in blocks)
        self.post_norm = all("ln1_post" in (getattr(b, "submodules", None) or {}) for b in blocks)
        if not self.post_norm and any("ln1_post" in (getattr(b, "submodules", None) or {})
                                      for b in blocks):
            raise UnsupportedModel("only some blocks have a post-attention norm")
        self.post_gain = None
        self._checked = False
        if not self.post_norm:  # (post-norm writes are handled here, through their scale)
            self._check_writes()

    def _check_writes(self) -> None:
        """The model's own forward must add the heads' z @ W_O to the residual unchanged
        (core.activations.conformance): a residual multiplier scales MLP writes too, and a
        non-conforming block has no per-head writes; both are refused, naming the feature."""
        from headgraph.core.activations.conformance import write_conformance

        check = write_conformance(self.bridge, self.layer_indices, self.W_O)
        if check.refusal is not None:
            raise UnsupportedModel(f"task circuits: {check.refusal}; refused rather than a "
                                   "wrong number")
        if bool((check.scale != 1).any()):
            raise UnsupportedModel(f"task circuits: {', '.join(check.features)} (the model "
                                   "scales attention and MLP outputs before the residual add; "
                                   "circuit writes are not scaled yet)")

    def norm(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self._norms[layer](x)

    def _check(self, cache: dict[str, torch.Tensor]) -> None:
        """The first forward's checks (see the class docstring)."""
        gains = []
        for layer, block in enumerate(self._blocks):
            name = f"blocks.{layer}"
            x = cache[f"{name}.ln1.hook_in"]
            y = self.norm(layer, x)
            for path in PATHS:
                got = cache[f"{name}.attn.hook_{path.lower()}"]
                want = torch.einsum("btd,hde->bthe", y, self.W_in(path)[layer])
                rest = got - want
                tol = 1e-3 * (1 + float(got.abs().max()))
                if float((rest - rest[:1, :1]).abs().max()) > tol:
                    raise UnsupportedModel(
                        f"{name}: hook_{path.lower()} is not ln1(x) @ W_{path} + bias, so a "
                        "reader's input cannot be patched there")
            o = torch.einsum("bthe,hed->btd", cache[f"{name}.attn.hook_z"], self.W_O[layer])
            written = cache[f"{name}.ln1_post.hook_in" if self.post_norm else
                            f"{name}.attn.hook_out"]
            rest = written - o
            if float((rest - rest[:1, :1]).abs().max()) > 1e-3 * (1 + float(written.abs().max())):
                raise UnsupportedModel(f"{name}: the attention output is not the sum of the "
                                       "heads' z @ W_O plus a constant")
            if self.post_norm:
                gains.append(_post_norm_gain(block, cache, f"{name}.ln1_post.hook_out",
                                             f"{name}.ln1_post.hook_normalized"))
        if self.post_norm:
            self.post_gain = torch.stack(gains)
        self._checked = True

    def forward(self, ids: torch.Tensor, probe: Probe) -> torch.Tensor:
        hooks: list[tuple[str, Callable[..., Any]]] = []
        record: dict[str, torch.Tensor] = {}
        checking = not self._checked

        def rec(name: str) -> None:  # registered before a point's probe: sees it unpatched
            if checking:
                hooks.append((name, lambda t, hook, name=name: record.__setitem__(
                    name, t.detach().clone())))

        hooks.append(("blocks.0.hook_in", lambda t, hook: probe.resid0(t)))
        for layer in range(self.n_layers):
            n = f"blocks.{layer}"
            rec(f"{n}.ln1.hook_in")
            hooks.append((f"{n}.ln1.hook_in",
                          lambda t, hook, layer=layer: probe.attn_in(layer, t)))
            for path in PATHS:
                rec(f"{n}.attn.hook_{path.lower()}")
                hooks.append((f"{n}.attn.hook_{path.lower()}",
                              lambda t, hook, layer=layer, path=path: probe.proj(layer, path, t)))
            rec(f"{n}.attn.hook_z")
            hooks.append((f"{n}.attn.hook_z", lambda t, hook, layer=layer: probe.z(layer, t)))
            if self.post_norm:
                for point in ("hook_in", "hook_out", "hook_normalized"):
                    rec(f"{n}.ln1_post.{point}")
                hooks.append((f"{n}.ln1_post.hook_scale",
                              lambda t, hook, layer=layer: probe.post_scale(layer, t)))
            else:
                rec(f"{n}.attn.hook_out")
            if self.has_mlp:
                hooks.append((f"{n}.ln2.hook_in",
                              lambda t, hook, layer=layer: probe.mlp_in(layer, t)))
                hooks.append((f"{n}.hook_mlp_out",
                              lambda t, hook, layer=layer: probe.mlp_out(layer, t)))
        hooks.append(("ln_final.hook_in", lambda t, hook: probe.final(t)))
        with self.bridge.hooks(fwd_hooks=hooks):
            logits = self.bridge(ids.to(self.device))
        if checking:
            with torch.no_grad():
                self._check(record)
        return logits


def circuit_model(model: Any) -> CircuitModel:
    """The CircuitModel of a DemoModel, a TransformerBridge, a pattern source with a
    ``bridge`` (core.models.runnable.BridgePatternSource, core.models.gguf_runnable.
    LazyGGUFSource) or a core.models.loading.LoadedModel. UnsupportedModel otherwise."""
    from headgraph.core.models.demo import DemoModel

    if isinstance(model, CircuitModel):
        return model
    if isinstance(model, DemoModel):
        return DemoCircuitModel(model)
    if hasattr(model, "heads") and hasattr(model, "patterns") and hasattr(model, "info"):
        if model.patterns is None:
            raise UnsupportedModel(f"{model.info.name} cannot be run here (weights read "
                                   "without a runnable model), so it has no task circuits")
        return circuit_model(model.patterns)
    if callable(getattr(model, "blocks_with", None)):
        from headgraph.core.models.runnable import BridgePatternSource

        return BridgeCircuitModel(model, BridgePatternSource(model))
    if hasattr(type(model), "bridge") or hasattr(model, "bridge"):
        return BridgeCircuitModel(model.bridge, model)
    raise UnsupportedModel(f"cannot trace circuits of a {type(model).__name__}: expected the "
                           "demo model, a TransformerBridge or a pattern source with a bridge")


__all__ = ["PATHS", "BridgeCircuitModel", "CircuitModel", "DemoCircuitModel", "Probe",
           "circuit_model"]
