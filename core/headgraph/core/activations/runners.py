"""Runners: what path ablation and data-weighted PK need from a runnable model.

A ``Runner`` gives, in layer positions, a model's attention weights, its layer norms and two
kinds of forward over token ids: a clean one recording each layer's head outputs z
[B, T, H, dh], norm scales [B, T, 1], attention patterns [B, H, T, T] and norm inputs
[B, T, d]; and a patched one that adds a change to one layer's Q, K or V input (before rotary)
and stops once that layer is measured (``StopForward``). ``ablation_runner`` picks the runner
of the demo model (its own hook points) or of a TransformerBridge (``hook_q`` / ``hook_k`` /
``hook_v``), GGUF models included through their lazy bridge (core.models.gguf_runnable).
"""

from __future__ import annotations

import functools
from collections.abc import Collection
from dataclasses import dataclass, field
from typing import Any

import torch

from headgraph.core.activations.conformance import StopForward, head_write_scale, post_attention_norm
from headgraph.core.errors import UnsupportedModel


@dataclass
class CleanRun:
    z: dict[int, torch.Tensor]  # layer position -> [B, T, H, dh]
    scale: dict[int, torch.Tensor]  # layer position -> [B, T, 1]
    pattern: dict[int, torch.Tensor]  # layer position -> [B, H, T, T]
    resid: dict[int, torch.Tensor] = field(default_factory=dict)  # layer -> its norm's input [B, T, d]


class Runner:
    """Weights, layer norm and forwards of one model, in layer positions."""

    layer_indices: tuple[int, ...]
    W_Q: torch.Tensor  # [L, H, d, dh]
    W_K: torch.Tensor  # [L, Hkv, d, dh]
    W_V: torch.Tensor
    W_O: torch.Tensor  # [L, H, dh, d]
    write_scale: torch.Tensor  # [L] float64: what the model multiplies each head's z W_O by
    ln_kind: str | None  # "LN" | "RMS" | None
    ln_w: torch.Tensor | None  # [L, d]
    source: Any  # what tokenizes and draws random tokens (core.activations.patterns helpers)

    @property
    def n_heads(self) -> int:
        return int(self.W_O.shape[1])

    @property
    def n_kv(self) -> int:
        return int(self.W_K.shape[1])

    @property
    def device(self) -> torch.device:
        return self.W_O.device

    def W_in(self, path: str) -> torch.Tensor:
        return {"Q": self.W_Q, "K": self.W_K, "V": self.W_V}[path]

    def clean(self, ids: torch.Tensor, mask: torch.Tensor, z_layers: set[int],
              target_layers: set[int], resid_layers: Collection[int] = ()) -> CleanRun:
        """z of z_layers | target_layers, norm scale and pattern of target_layers, the
        residual entering each of resid_layers (core.activations.data_pk)."""
        raise NotImplementedError

    def patched(self, ids: torch.Tensor, mask: torch.Tensor, layer: int, path: str,
                add: torch.Tensor) -> torch.Tensor:
        """T's pattern [B, H, T, T] (Q/K) or z [B, T, H, dh] (V) with ``add`` [B, T, Hp, dh]
        added to the layer's pre-rotary P."""
        raise NotImplementedError


class DemoRunner(Runner):
    def __init__(self, model: Any) -> None:
        self.model = model
        self.source = model
        self.layer_indices = tuple(model.layer_indices)
        self.W_Q, self.W_K, self.W_V, self.W_O = (t.detach() for t in (
            model.W_Q, model.W_K, model.W_V, model.W_O))
        self.write_scale = torch.ones(len(self.layer_indices), dtype=torch.float64)
        self.ln_kind = "LN" if model.cfg.layer_norm else None
        self.ln_w = model.ln_w.detach() if model.cfg.layer_norm else None

    def clean(self, ids: torch.Tensor, mask: torch.Tensor, z_layers: set[int],
              target_layers: set[int], resid_layers: Collection[int] = ()) -> CleanRun:
        out = CleanRun({}, {}, {})

        def hook(name: str, layer: int, t: torch.Tensor) -> None:
            if name == "resid_pre" and layer in resid_layers:
                out.resid[layer] = t.detach()
            elif name == "z" and layer in z_layers | target_layers:
                out.z[layer] = t.detach().transpose(1, 2)
            elif name == "ln_scale" and layer in target_layers:
                out.scale[layer] = t.detach()
            elif name == "pattern" and layer in target_layers:
                out.pattern[layer] = t.detach()

        with torch.no_grad():
            self.model(ids, hook=hook)
        return out

    def patched(self, ids: torch.Tensor, mask: torch.Tensor, layer: int, path: str,
                add: torch.Tensor) -> torch.Tensor:
        got: dict[str, torch.Tensor] = {}
        point, measured = path.lower(), "z" if path == "V" else "pattern"

        def hook(name: str, at: int, t: torch.Tensor) -> torch.Tensor | None:
            if at != layer:
                return None
            if name == point:
                return t + add.transpose(1, 2).to(t.dtype)
            if name == measured:
                got[name] = t.detach()
                raise StopForward
            return None

        try:
            with torch.no_grad():
                self.model(ids, hook=hook)
        except StopForward:
            pass
        out = got[measured]
        return out.transpose(1, 2) if path == "V" else out


class BridgeRunner(Runner):
    def __init__(self, bridge: Any, source: Any) -> None:
        self.bridge = bridge
        self.source = source
        self._blocks = list(bridge.blocks_with("attn"))
        self.layer_indices = tuple(int(i) for i, _ in self._blocks)
        self.W_O = self._stacked("W_O")  # what every run needs; W_Q / W_K / W_V on first use
        post = post_attention_norm(bridge)
        if post is not None:
            raise UnsupportedModel(
                f"path ablation and data-weighted PK: {post} (a norm between the heads and the "
                "residual stream, as in Gemma 2/3, GLM-4 and OLMo 2), so a head's write is not "
                "(mean z - z) W_O; refused rather than a wrong number")
        # The model's own forward must add what the head writes say (times a layer's scale).
        self.write_scale = head_write_scale(bridge, self.layer_indices, self.W_O)
        kind = str(getattr(bridge.cfg, "normalization_type", None) or "")
        self.ln_kind = "LN" if kind.startswith("LN") else "RMS" if kind.startswith("RMS") else None
        if self.ln_kind is None:
            raise UnsupportedModel(f"path ablation needs a LayerNorm or RMSNorm before each "
                                   f"attention layer (normalization {kind or 'none'!r})")
        weights = []
        for _, b in self._blocks:
            ln = getattr(b, "ln1", None)
            module = getattr(ln, "original_component", None)
            weight = getattr(module, "weight", None)
            weights.append(None if weight is None or kind.endswith("Pre") else weight.detach())
        if all(w is None for w in weights):
            self.ln_w = None
        elif any(w is None for w in weights):
            raise UnsupportedModel("path ablation: some attention layers have no ln1 weight")
        else:
            self.ln_w = torch.stack([w for w in weights if w is not None])

    def _stacked(self, name: str) -> torch.Tensor:
        """The bridge's per-head ``name`` of every attention layer [L, H, ...] (a copy: only
        path ablation reads W_Q / W_K / W_V, so data-weighted PK never holds them)."""
        try:
            with torch.no_grad():
                return torch.stack([getattr(b.attn, name).detach() for _, b in self._blocks])
        except (AttributeError, NotImplementedError, RuntimeError, ValueError) as err:
            raise UnsupportedModel(f"this bridge does not expose per-head attention weights "
                                   f"({type(err).__name__}: {err})") from err

    @functools.cached_property
    def W_Q(self) -> torch.Tensor:
        return self._stacked("W_Q")

    @functools.cached_property
    def W_K(self) -> torch.Tensor:
        return self._stacked("W_K")

    @functools.cached_property
    def W_V(self) -> torch.Tensor:
        return self._stacked("W_V")

    def _name(self, layer: int, point: str) -> str:
        return f"blocks.{self.layer_indices[layer]}.{point}"

    def _kwargs(self, mask: torch.Tensor) -> dict[str, Any]:
        return {"attention_mask": mask.long()}

    def clean(self, ids: torch.Tensor, mask: torch.Tensor, z_layers: set[int],
              target_layers: set[int], resid_layers: Collection[int] = ()) -> CleanRun:
        want: dict[str, tuple[str, int]] = {}
        for layer in resid_layers:  # what the layer's norm reads
            want[self._name(layer, "ln1.hook_in")] = ("resid", layer)
        for layer in z_layers | target_layers:
            want[self._name(layer, "attn.hook_z")] = ("z", layer)
        for layer in target_layers:
            want[self._name(layer, "ln1.hook_scale")] = ("scale", layer)
            want[self._name(layer, "attn.hook_pattern")] = ("pattern", layer)
            want[self._name(layer, "ln1.hook_normalized")] = ("normalized", layer)
            want[self._name(layer, "ln1.hook_out")] = ("ln_out", layer)
        cache: dict[str, torch.Tensor] = {}

        def keeper(name: str) -> Any:
            def keep(t: torch.Tensor, hook: Any) -> None:
                cache[name] = t.detach()
                if len(cache) == len(want):  # the rest (MLPs, the logits) is not needed
                    raise StopForward
            return keep

        try:
            with torch.no_grad(), self.bridge.hooks(fwd_hooks=[(n, keeper(n)) for n in want]):
                self.bridge(ids, **self._kwargs(mask))
        except StopForward:
            pass
        out = CleanRun({}, {}, {})
        for name, (kind, _layer) in want.items():
            if name not in cache and kind not in ("normalized", "ln_out"):
                raise UnsupportedModel(f"the bridge did not report {name}; runs need hook_z, "
                                       "ln1.hook_scale / hook_in and hook_pattern (eager attention)")
        for name, (kind, layer) in want.items():
            if kind == "z":
                out.z[layer] = cache[name].detach()
            elif kind == "scale":
                out.scale[layer] = cache[name].detach()
            elif kind == "pattern":
                out.pattern[layer] = cache[name].detach()
            elif kind == "resid":
                out.resid[layer] = cache[name].detach()
        for layer in target_layers:  # the norm is the affine map ablation assumes
            self._check_norm(cache, layer)
        return out

    def _check_norm(self, cache: Any, layer: int) -> None:
        """ln1's output must be normalized * gain + a constant bias (what ablation assumes),
        the gain being the norm's weight or, as Gemma's RMSNorm applies it, 1 + weight (then
        kept as this layer's gain)."""
        n, o = self._name(layer, "ln1.hook_normalized"), self._name(layer, "ln1.hook_out")
        if n not in cache or o not in cache:
            return
        ln_out = cache[o]
        tol = 1e-4 * (1 + float(ln_out.abs().max()))

        def affine(rebuilt: torch.Tensor) -> bool:  # ln_out = rebuilt + a constant bias
            bias = ln_out - rebuilt
            return float((bias - bias[:1, :1]).abs().max()) <= tol

        if self.ln_w is None:
            if affine(cache[n]):
                return
        else:
            weight = self.ln_w[layer]
            if affine(cache[n] * weight):
                return
            if affine(cache[n] * (1 + weight)):  # Gemma's RMSNorm
                self.ln_w[layer] = 1 + weight
                return
        raise UnsupportedModel("path ablation: ln1 is not normalized * weight (or * (1 + weight)) "
                               "+ bias for this architecture")

    def patched(self, ids: torch.Tensor, mask: torch.Tensor, layer: int, path: str,
                add: torch.Tensor) -> torch.Tensor:
        got: dict[str, torch.Tensor] = {}
        point = self._name(layer, f"attn.hook_{path.lower()}")
        measured = self._name(layer, "attn.hook_z" if path == "V" else "attn.hook_pattern")

        def patch(t: torch.Tensor, hook: Any) -> torch.Tensor:
            return t + add.to(t.dtype)

        def measure(t: torch.Tensor, hook: Any) -> None:
            got["out"] = t.detach().clone()
            raise StopForward

        try:
            with torch.no_grad(), self.bridge.hooks(fwd_hooks=[(point, patch),
                                                                (measured, measure)]):
                self.bridge(ids, **self._kwargs(mask))
        except StopForward:
            pass
        if "out" not in got:
            raise UnsupportedModel(f"the bridge did not fire {measured}")
        return got["out"]


def ablation_runner(model: Any) -> Runner:
    """The runner of a DemoModel, a TransformerBridge, a pattern source with a ``bridge``
    (core.models.runnable.BridgePatternSource, core.models.gguf_runnable.LazyGGUFSource) or a
    core.models.loading.LoadedModel. UnsupportedModel when the model cannot be run here."""
    from headgraph.core.models.demo import DemoModel

    if isinstance(model, Runner):
        return model
    if isinstance(model, DemoModel):
        return DemoRunner(model)
    if hasattr(model, "heads") and hasattr(model, "patterns") and hasattr(model, "info"):
        if model.patterns is None:  # a LoadedModel read without a runnable model
            raise UnsupportedModel(f"{model.info.name} cannot be run here (weights read "
                                   "without a runnable model), so it cannot be ablated")
        return ablation_runner(model.patterns)
    if callable(getattr(model, "blocks_with", None)):
        from headgraph.core.models.runnable import BridgePatternSource

        return BridgeRunner(model, BridgePatternSource(model))
    if hasattr(type(model), "bridge") or hasattr(model, "bridge"):
        return BridgeRunner(model.bridge, model)
    raise UnsupportedModel(f"cannot ablate a {type(model).__name__}: expected the demo model, "
                           "a TransformerBridge or a pattern source with a bridge")
