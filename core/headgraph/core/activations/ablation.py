"""Activation-level verification of head-graph edges: path ablation.

An edge runs from a source head S (layer a) to a target T (layer b > a) through one of T's
inputs P in {Q, K, V}. Its **path-ablation effect** mean-ablates S's output on T's P-input
only: T's layer sees the residual x for its other two inputs and x + delta for input P, where

    delta = (mean_z_S - z_S) @ W_O[S]   (times the layer's residual multiplier, if any)

is the change of S's contribution to the residual stream (core.activations.conformance checks
on the model's own forward that this is what its attention adds) (mean_z_S: S's output z averaged
over every real position of every prompt of the set). **Resample ablation**
(``ablation="resample"``) replaces mean_z_S by S's output on a different prompt at the same
position (a corrupted input): prompt i takes prompt i + 1's z_S (the last takes the first's),
and where that prompt has no real token at the position (it is shorter), the set's mean z_S. delta goes through T's layer norm with
the scale frozen at the clean run's value (LayerNorm: centred, divided by the clean scale,
times the weight; RMSNorm: divided by the clean scale, times the weight; the bias cancels),
then through T's W_P (the projection's bias cancels too), and is added to T's P
*before* rotary embeddings (the TransformerLens bridge's ``hook_q`` / ``hook_k`` / ``hook_v``;
the demo model's ``q`` / ``k`` / ``v`` hook points). Nothing else changes: one forward per
(source, target layer, path) patches only that layer, stops there, and measures every
target of that layer at once (heads of a layer are independent given their inputs).

Effect measures (position 0, which can only attend to itself, and padding excluded):

- Q and K paths: total-variation distance between T's clean and ablated attention rows, mean
  over query positions and prompts, per query head; a K target on a grouped-query model is a
  KV group, whose effect is the mean over the query heads it serves;
- V path: relative change of T's output, sum over positions of ||delta(z_T W_O[T])|| divided
  by the sum of ||z_T W_O[T]|| (a norm-weighted mean of the per-position relative change,
  robust where an output is near zero); a KV-group target pools its query heads.

Two prompt sets: the bundled natural-text prompts (``core.activations.prompts.default_prompts``) and
repeated random tokens (``core.activations.patterns.induction_tokens``: BOS when the model uses one,
then r r). **Split-half reliability**: prompts of a set split into even and odd halves, every
edge's effect computed on each, Spearman between the halves over the measured edges and its
Spearman-Brown correction 2r / (1 + r) (clipped to [-1, 1]); None with fewer than three edges
or a constant half. The mean z of S is taken over the whole set (not per half).

Runs on the demo model (``core.models.demo``), on TransformerBridge models and on GGUF models
through ``core.models.gguf_runnable`` (anything with a ``bridge``); computation follows the model's
device.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.activations.runners import Runner, ablation_runner
from headgraph.core.errors import InvalidInput
from headgraph.core.names import head_label

PATHS: tuple[str, ...] = ("Q", "K", "V")
PROMPT_SETS: tuple[str, ...] = ("text", "random")
ABLATIONS: tuple[str, ...] = ("mean", "resample")  # what replaces the source's output
PAIRING_PATHS: dict[str, str] = {"OQ": "Q", "OK": "K", "OV": "V"}
MEASURES: dict[str, str] = {"Q": "tvd", "K": "tvd", "V": "relative_output"}

Progress = Callable[[float, str], None]


# -- results ---------------------------------------------------------------------------------

@dataclass(frozen=True)
class Edge:
    """One edge: layers are positions 0..L-1 of the attention layers; ``source_head`` is a
    query head (its output); ``target_head`` a query head for path Q, a KV head (a group on
    grouped-query models) for K and V."""

    source_layer: int
    source_head: int
    target_layer: int
    target_head: int
    path: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class SplitHalf:
    """Split-half reliability over the measured edges of one prompt set."""

    r_half: float | None  # Spearman between the even-prompt and odd-prompt effects
    reliability: float | None  # Spearman-Brown 2r / (1 + r), clipped to [-1, 1]
    n_edges: int
    n_prompts: tuple[int, int]  # prompts in each half

    def to_dict(self) -> dict[str, Any]:
        return {"r_half": self.r_half, "reliability": self.reliability,
                "n_edges": self.n_edges, "n_prompts": list(self.n_prompts)}


@dataclass(frozen=True)
class EdgeEffect:
    """The path-ablation effect of one edge on each prompt set (and on each half)."""

    edge: Edge
    source: str  # "L0H0" (block numbers)
    target: str  # "L1H3", or "L6KV1" for a KV group
    measure: str  # "tvd" (Q, K) or "relative_output" (V)
    effects: dict[str, float]  # prompt set -> effect
    halves: dict[str, tuple[float, float]]  # prompt set -> (even half, odd half)

    def to_dict(self) -> dict[str, Any]:
        return {"source": self.source, "target": self.target, "path": self.edge.path,
                "measure": self.measure, "edge": self.edge.to_dict(),
                **{f"effect_{k}": v for k, v in self.effects.items()},
                "halves": {k: list(v) for k, v in self.halves.items()}}


@dataclass(frozen=True)
class AblationResult:
    """Effects of a set of edges on the text and random-token prompt sets, with reliability."""

    effects: tuple[EdgeEffect, ...]
    reliability: dict[str, SplitHalf]
    n_prompts: dict[str, int]
    layer_indices: tuple[int, ...]
    induction_length: int
    seed: int
    ablation: str = "mean"

    def effect(self, prompt_set: str) -> torch.Tensor:
        """Effects of every edge on one prompt set, in edge order (float64)."""
        return torch.tensor([e.effects[prompt_set] for e in self.effects], dtype=torch.float64)

    def to_dict(self) -> dict[str, Any]:
        return {"edges": [e.to_dict() for e in self.effects],
                "reliability": {k: v.to_dict() for k, v in self.reliability.items()},
                "n_prompts": dict(self.n_prompts), "layer_indices": list(self.layer_indices),
                "induction_length": self.induction_length, "seed": self.seed,
                "ablation": self.ablation,
                "method": f"path ablation: source output {ABLATION_WORDS[self.ablation]} on the "
                          "target's input only, norm scale frozen; Q/K: TVD of attention rows, V: "
                          "relative change of the target's output"}


ABLATION_WORDS = {"mean": "mean-ablated (its mean over the prompt set)",
                  "resample": "resample-ablated (its value on the next prompt of the set at the "
                              "same position; the set's mean where that prompt is shorter)"}


def check_ablation(ablation: str) -> str:
    """``ablation`` if it is "mean" or "resample", else InvalidInput listing them."""
    if ablation not in ABLATIONS:
        raise InvalidInput(f"unknown ablation {ablation!r}; allowed: {list(ABLATIONS)}",
                           allowed=list(ABLATIONS))
    return ablation


# -- inputs -------------------------------------------------------------------------------------

def path_of_pairing(pairing: str) -> str:
    """The ablated path of an O -> Q/K/V pairing ("OK" -> "K")."""
    path = PAIRING_PATHS.get(pairing)
    if path is None:
        raise InvalidInput(f"path ablation measures O->Q/K/V edges; pairing {pairing!r} is not "
                           f"one of {list(PAIRING_PATHS)}", allowed=list(PAIRING_PATHS))
    return path


def check_edges(edges: Sequence[Edge], *, n_layers: int, n_heads: int, n_kv: int
                ) -> tuple[Edge, ...]:
    """``edges`` if each is valid for this shape, else InvalidInput naming the first bad one."""
    out = []
    for e in edges:
        if not isinstance(e, Edge):
            raise InvalidInput(f"expected an Edge, got {type(e).__name__}")
        if e.path not in PATHS:
            raise InvalidInput(f"unknown path {e.path!r}; allowed: {list(PATHS)}",
                               allowed=list(PATHS))
        for name, value, size in (("source_layer", e.source_layer, n_layers),
                                  ("target_layer", e.target_layer, n_layers),
                                  ("source_head", e.source_head, n_heads),
                                  ("target_head", e.target_head,
                                   n_heads if e.path == "Q" else n_kv)):
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < size:
                raise InvalidInput(f"unknown {name} {value!r} in {e}: allowed 0..{size - 1}")
        if e.source_layer >= e.target_layer:
            raise InvalidInput(f"an ablated edge's source must be in an earlier layer than its "
                               f"target (source layer {e.source_layer}, target layer "
                               f"{e.target_layer})")
        out.append(e)
    if not out:
        raise InvalidInput("no edges to ablate")
    return tuple(out)


def top_edges(pk: Any, k: int) -> tuple[Edge, ...]:
    """The ``k`` highest-PK edges of an OQ / OK / OV PairScores (core.scores.ranking.top_pairs)."""
    from headgraph.core.scores.ranking import top_pairs

    path = path_of_pairing(pk.pairing)
    top = top_pairs(pk, k, metric="pk")
    return tuple(Edge(int(a), int(b), int(c), int(d), path) for a, b, c, d in zip(
        top.source_layer.tolist(), top.source_head.tolist(), top.target_layer.tolist(),
        top.target_head.tolist(), strict=True))


# -- the computation ---------------------------------------------------------------------------

def _through_norm(runner: Runner, delta: torch.Tensor, scale: torch.Tensor, layer: int
                  ) -> torch.Tensor:
    if runner.ln_kind == "LN":
        delta = delta - delta.mean(-1, keepdim=True)
    if runner.ln_kind is not None:
        delta = delta / scale
    if runner.ln_w is not None:
        delta = delta * runner.ln_w[layer]
    return delta


def _group_mean(values: torch.Tensor, n_kv: int) -> torch.Tensor:
    """[..., H] -> [..., n_kv]: mean over the query heads each KV head serves."""
    H = values.shape[-1]
    return values.reshape(*values.shape[:-1], n_kv, H // n_kv).mean(-1)


def edge_statistics(runner: Runner, edges: Sequence[Edge], ids: torch.Tensor,
                    mask: torch.Tensor, *, batch_size: int = 32, ablation: str = "mean",
                    progress: Progress | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-prompt sums (num, den), each [n_edges, batch] float64, whose ratio Σnum / Σden over
    any set of prompts is the edge's effect on that set (see the module docstring);
    ``ablation``: "mean" or "resample" (what replaces the source's output)."""
    check_ablation(ablation)
    ids = ids.to(runner.device)
    mask = mask.to(runner.device).bool()
    B, T = ids.shape
    groups: dict[tuple[int, int, int, str], list[int]] = {}
    for i, e in enumerate(edges):
        groups.setdefault((e.source_layer, e.source_head, e.target_layer, e.path), []).append(i)
    z_layers = {e.source_layer for e in edges}
    target_layers = {e.target_layer for e in edges}
    chunks = [(s, min(s + batch_size, B)) for s in range(0, B, batch_size)]
    steps = len(chunks) * (1 + len(groups))
    done = 0

    def tick(message: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / steps, message)

    cleans = []
    sources = sorted({(e.source_layer, e.source_head) for e in edges})
    sums = {key: torch.zeros(runner.W_O.shape[2], dtype=torch.float64, device=runner.device)
            for key in sources}
    count = torch.zeros((), dtype=torch.float64, device=runner.device)
    for s, t in chunks:
        clean = runner.clean(ids[s:t], mask[s:t], z_layers, target_layers)
        cleans.append(clean)
        m = mask[s:t].to(torch.float64)[..., None]
        count = count + m.sum()
        for sl, sh in sources:  # S's mean output over every real position of the set
            sums[(sl, sh)] += (clean.z[sl][..., sh, :].double() * m).sum(dim=(0, 1))
        tick("clean forward")
    means = {key: (v / count.clamp_min(1)).to(runner.W_O.dtype) for key, v in sums.items()}
    resampled: dict[tuple[int, int], torch.Tensor] = {}  # source -> its z's replacement [B, T, dh]
    if ablation == "resample":
        partner_real = mask.roll(-1, dims=0)[..., None]  # prompt i takes prompt i + 1's z
        for sl, sh in sources:
            z_all = torch.cat([c.z[sl][..., sh, :] for c in cleans], dim=0)
            resampled[(sl, sh)] = torch.where(partner_real, z_all.roll(-1, dims=0),
                                              means[(sl, sh)].to(z_all.dtype))

    num = torch.zeros(len(edges), B, dtype=torch.float64, device=runner.device)
    den = torch.zeros_like(num)
    pos = torch.arange(T, device=runner.device)
    for (s, t), clean in zip(chunks, cleans, strict=True):
        m = mask[s:t]
        valid = m & (pos >= 1)[None, :]  # [b, T]
        for (sl, sh, tl, path), members in groups.items():
            z = clean.z[sl][..., sh, :]
            new = resampled[(sl, sh)][s:t] if resampled else means[(sl, sh)]
            # S's write as the model adds it: times the layer's residual multiplier, if any
            delta = (new - z) @ runner.W_O[sl, sh] * float(runner.write_scale[sl])  # [b, T, d]
            delta = delta * m[..., None].to(delta.dtype)
            if runner.ln_kind is not None:
                delta = _through_norm(runner, delta, clean.scale[tl], tl)
            add = torch.einsum("btd,hde->bthe", delta, runner.W_in(path)[tl])
            out = runner.patched(ids[s:t], m, tl, path, add)
            vf = valid.to(torch.float64)
            if path == "V":
                W_O = runner.W_O[tl]  # [H, dh, d]
                o0 = torch.einsum("bthe,hed->bthd", clean.z[tl], W_O)
                o1 = torch.einsum("bthe,hed->bthd", out, W_O)
                n_num = ((o1 - o0).double().norm(dim=-1) * vf[..., None]).sum(1)  # [b, H]
                n_den = (o0.double().norm(dim=-1) * vf[..., None]).sum(1)
                if runner.n_kv != runner.n_heads:
                    n_num = _group_mean(n_num, runner.n_kv)
                    n_den = _group_mean(n_den, runner.n_kv)
            else:
                p0 = clean.pattern[tl].double()
                tvd = 0.5 * (out.double() - p0).abs().sum(-1)  # [b, H, T]
                n_num = (tvd * vf[:, None, :]).sum(-1)  # [b, H]
                if path == "K" and runner.n_kv != runner.n_heads:
                    n_num = _group_mean(n_num, runner.n_kv)
                n_den = vf.sum(-1)[:, None].expand_as(n_num)
            for i in members:
                th = edges[i].target_head
                num[i, s:t] = n_num[:, th]
                den[i, s:t] = n_den[:, th]
            tick(f"ablated L{runner.layer_indices[sl]}H{sh} on layer "
                 f"{runner.layer_indices[tl]}'s {path}")
    return num, den


def _ratio(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    d = den.sum(-1)
    return torch.where(d > 0, num.sum(-1) / d.clamp_min(1e-300), torch.zeros_like(d))


def split_half(num: torch.Tensor, den: torch.Tensor) -> tuple[SplitHalf, torch.Tensor,
                                                              torch.Tensor]:
    """Split-half reliability of per-prompt sums [n_edges, B]: even vs odd prompts; also the
    two halves' effects."""
    from scipy.stats import spearmanr

    a, b = _ratio(num[:, 0::2], den[:, 0::2]), _ratio(num[:, 1::2], den[:, 1::2])
    sizes = (int(num[:, 0::2].shape[1]), int(num[:, 1::2].shape[1]))
    r = None
    if num.shape[0] >= 3 and min(sizes) >= 1 and float(a.std()) > 0 and float(b.std()) > 0:
        rho = float(spearmanr(a.cpu().numpy(), b.cpu().numpy()).statistic)  # type: ignore[union-attr]
        r = rho if rho == rho else None  # NaN -> None
    sb = None if r is None else max(-1.0, min(1.0, 2 * r / (1 + r))) if r > -1 else -1.0
    return SplitHalf(r_half=r, reliability=sb, n_edges=int(num.shape[0]), n_prompts=sizes), a, b


def prompt_sets(source: Any, *, prompts: list[str] | None = None, induction_length: int = 20,
                induction_batch: int = 20, seed: int = 0
                ) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], int]:
    """(ids, mask) of the text set and of the random-token set [(bos) r r]; the length used."""
    from headgraph.core.activations.patterns import repeated_random_tokens
    from headgraph.core.activations.prompts import default_prompts
    from headgraph.core.models.runnable import tokenize_prompts

    texts = default_prompts() if prompts is None else list(prompts)
    if len(texts) < 2:
        raise InvalidInput("path ablation needs at least two prompts (split-half reliability)")
    if induction_batch < 2:
        raise InvalidInput("path ablation needs at least two random-token sequences")
    ids, mask = tokenize_prompts(source, texts)
    rr, length, _ = repeated_random_tokens(source, length=induction_length, batch=induction_batch,
                                           seed=seed, device=ids.device)
    return {"text": (ids, mask.bool()), "random": (rr, torch.ones_like(rr, dtype=torch.bool))}, \
        length


def path_ablation(model: Any, edges: Sequence[Edge], *, prompts: list[str] | None = None,
                  induction_length: int = 20, induction_batch: int = 20, seed: int = 0,
                  batch_size: int = 32, ablation: str = "mean",
                  progress: Progress | None = None) -> AblationResult:
    """Path-ablation effects of ``edges`` on the text and random-token prompt sets.

    model: the demo model, a TransformerBridge, a pattern source with a ``bridge`` or a
    LoadedModel; prompts: the text set (default: the bundled prompts); induction_length /
    induction_batch / seed: the random-token set; batch_size: prompts per forward; ablation:
    "mean" or "resample" (see the module docstring); progress(fraction, message). InvalidInput for a bad edge (unknown head or path, source
    not earlier than target); UnsupportedModel when the model cannot be run or ablated.
    """
    check_ablation(ablation)
    runner = ablation_runner(model)
    edges = check_edges(edges, n_layers=len(runner.layer_indices), n_heads=runner.n_heads,
                        n_kv=runner.n_kv)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    sets, length = prompt_sets(runner.source, prompts=prompts, induction_length=induction_length,
                               induction_batch=induction_batch, seed=seed)
    results: dict[str, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
    reliability: dict[str, SplitHalf] = {}
    for n, name in enumerate(PROMPT_SETS):
        ids, mask = sets[name]

        def report(fraction: float, message: str, n: int = n, name: str = name) -> None:
            if progress is not None:
                progress((n + fraction) / len(PROMPT_SETS), f"{name} prompts: {message}")

        num, den = edge_statistics(runner, edges, ids, mask, batch_size=batch_size,
                                   ablation=ablation, progress=report)
        half, a, b = split_half(num, den)
        reliability[name] = half
        results[name] = (_ratio(num, den).cpu(), a.cpu(), b.cpu())
    kv = runner.n_kv != runner.n_heads
    blocks = runner.layer_indices
    effects = tuple(
        EdgeEffect(edge=e, source=head_label(blocks[e.source_layer], e.source_head),
                   target=head_label(blocks[e.target_layer], e.target_head,
                                     kv=kv and e.path != "Q"),
                   measure=MEASURES[e.path],
                   effects={k: float(v[0][i]) for k, v in results.items()},
                   halves={k: (float(v[1][i]), float(v[2][i])) for k, v in results.items()})
        for i, e in enumerate(edges))
    return AblationResult(effects=effects, reliability=reliability,
                          n_prompts={k: int(v[0].shape[0]) for k, v in sets.items()},
                          layer_indices=blocks, induction_length=length, seed=seed,
                          ablation=ablation)


__all__ = ["ABLATIONS", "MEASURES", "PAIRING_PATHS", "PATHS", "PROMPT_SETS", "AblationResult", "Edge",
           "EdgeEffect", "SplitHalf", "ablation_runner", "check_ablation", "check_edges", "edge_statistics",
           "path_ablation", "path_of_pairing", "prompt_sets", "split_half", "top_edges"]
