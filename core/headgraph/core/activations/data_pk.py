"""Data-weighted Projection Kernel (beyond the paper).

PK asks how much of what a source head S *can* write a target head T *can* read. Its
data-weighted version asks how much of what S *actually* writes on real inputs lands in what
T reads, from the covariances of one batched forward pass over a prompt set. For a source
head S (layer a, output o_S = z_S W_O[S] in the residual stream, per position) and a target T
(layer b > a) reading through P in {Q, K, V} with orthonormal read basis U_T [d_model, r]:

    out_share[S, T] = tr(U_T^T C_S U_T) / tr(C_S)
    in_share[S, T]  = tr(U_T^T C_S U_T) / tr(U_T^T C_X(b) U_T)

C_S: covariance of o_S over the set's positions (o_S times the layer's residual multiplier
where the model applies one: core.activations.conformance); C_X(b): covariance of the residual stream
entering layer b (what T's norm reads). out_share is in [0, 1]: the share of S's output
variance inside T's read subspace; a Haar-random rank-r plane gets r / d_model in
expectation (``out_share_baseline``). in_share is the share of the variance T reads that S's
output alone accounts for. It is **not bounded by 1**: C_X(b) holds the cross-covariances of S
with every other writer, and where those are negative (another head cancelling S inside U_T)
S's own variance there can exceed the total. Its random-plane reference is the ratio of
expectations tr(C_S) / tr(C_X(b)) (``in_share_baseline``: S's share of all the variance
entering layer b).

**Which subspaces.** U_T is exactly PK's read basis (core.scores.subspaces.role_bases of the
heads' W_Q / W_K / W_V, the same processing as the PK grids), so the data weighting is the
only change from PK. With ``processing="bridge"`` or ``"raw"`` PK compares span(W_O^T) with
span(W_P) directly in the residual stream, ignoring the norm between them; data-weighted PK
therefore measures in the **raw residual stream** too, with no frozen norm scale (unlike
core.activations.ablation's ``_through_norm``): with ``processing="processed"`` the norm weight and the
centring are folded into W_P, hence into U_T, as they are for PK. The per-position 1 / sigma
of the norm is a scalar that PK does not see either. Grouped-query models: K and V targets are
KV groups, as in PK ([L, H, L, H_kv] grids).

**Low rank.** C_S = W_O^T Sigma_z W_O with Sigma_z [d_head, d_head] the covariance of z_S, so
with Sigma_z = F F^T (eigen-factor, negative rounding clipped) and X_S = W_O^T F [d_model,
d_head], tr(U_T^T C_S U_T) = ||X_S^T U_T||_F^2 and tr(C_S) = ||X_S||_F^2: every pair at once is
the batched sum of squared overlaps PK and CS use (core.scores.overlaps.pairwise_sq_overlap), in
float64, forward pairs only.

**Positions.** Covariances are over real positions: padding is excluded (as in
core.activations.ablation), and so is each sequence's first real position (BOS where the model uses one,
whose residual on many LLMs is a constant "massive activation"; otherwise a token that can
only attend to itself), so one outlier point does not dominate C_X. Prompt sets are
core.activations.ablation's: the bundled text prompts ("text") or repeated random tokens ("random").
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.names import GRAPH_PAIRINGS
from headgraph.core.scores.layer_order import layer_mask
from headgraph.core.scores.overlaps import pairwise_sq_overlap
from headgraph.core.scores.subspaces import effective_ranks, role_bases
from headgraph.core.types import HeadWeights, RoleBases

DATA_PK_PAIRINGS: tuple[str, ...] = GRAPH_PAIRINGS
DATA_PK_PROMPT_SETS: tuple[str, ...] = ("text", "random")
METHOD = ("data-weighted PK: out_share = tr(U^T C_S U) / tr(C_S), in_share = tr(U^T C_S U) / "
          "tr(U^T C_X U); C_S covariance of the source head's output z W_O, C_X of the residual "
          "entering the target's layer, over real positions (padding and each sequence's first "
          "position excluded); U the target's PK read basis, raw residual stream (no norm)")

Progress = Callable[[float, str], None]


@dataclass(frozen=True)
class ActivationCovariances:
    """Covariances of one forward pass over a prompt set (float64, population: divided by N).

    z: [L, H, d_head, d_head] of each query head's z; resid: [L, d_model, d_model] of the
    residual entering each attention layer's norm; over ``n_positions`` positions of
    ``n_prompts`` sequences.
    """

    z: torch.Tensor
    resid: torch.Tensor
    n_positions: int
    n_prompts: int
    layer_indices: tuple[int, ...]
    prompt_set: str


@dataclass(frozen=True)
class DataPK:
    """Data-weighted PK of one O -> Q/K/V pairing; grids [L, H, L, H_t] (H_t: KV groups for
    K / V on grouped-query models), layers are positions (``layer_indices``: block numbers).

    out_share, in_share: float64, 0 where not ``valid`` (valid: forward pairs whose source
    output varies, whose target has rank > 0 and reads some variance);
    source_variance [L, H] = tr(C_S); input_variance [L] = tr(C_X(b));
    target_input_variance [L, H_t] = tr(U_T^T C_X(b) U_T); out_share_baseline [L, H_t] =
    r_T / d_model; in_share_baseline [L, H, L] = tr(C_S) / tr(C_X(b)) (0 for non-forward).
    """

    pairing: str
    out_share: torch.Tensor
    in_share: torch.Tensor
    valid: torch.Tensor
    source_variance: torch.Tensor
    input_variance: torch.Tensor
    target_input_variance: torch.Tensor
    out_share_baseline: torch.Tensor
    in_share_baseline: torch.Tensor
    target_ranks: torch.Tensor
    layer_indices: tuple[int, ...]
    n_positions: int
    n_prompts: int
    prompt_set: str

    def to_dict(self) -> dict[str, Any]:
        """Plain form (tensors as nested lists)."""
        out: dict[str, Any] = {k: v.tolist() if isinstance(v, torch.Tensor) else v
                               for k, v in self.__dict__.items()}
        out["layer_indices"] = list(self.layer_indices)
        out["method"] = METHOD
        return out


# -- inputs ------------------------------------------------------------------------------------

def check_pairing(pairing: str) -> str:
    """``pairing`` if it is OQ, OK or OV, else InvalidInput listing those."""
    if pairing not in DATA_PK_PAIRINGS:
        raise InvalidInput(f"data-weighted PK measures O->Q/K/V pairings; {pairing!r} is not one "
                           f"of {list(DATA_PK_PAIRINGS)}", allowed=list(DATA_PK_PAIRINGS))
    return pairing


def check_prompt_set(prompt_set: str) -> str:
    if prompt_set not in DATA_PK_PROMPT_SETS:
        raise InvalidInput(f"unknown prompt set {prompt_set!r}; allowed: "
                           f"{list(DATA_PK_PROMPT_SETS)}", allowed=list(DATA_PK_PROMPT_SETS))
    return prompt_set


def counted_positions(mask: torch.Tensor) -> torch.Tensor:
    """bool [B, T]: real positions (``mask``) other than each sequence's first real one."""
    mask = mask.bool()
    return mask & (mask.long().cumsum(-1) > 1)


# -- covariances -------------------------------------------------------------------------------

def covariances(runner: Any, ids: torch.Tensor, mask: torch.Tensor, *, batch_size: int = 32,
                prompt_set: str = "text", progress: Progress | None = None
                ) -> ActivationCovariances:
    """z and residual covariances of a core.activations.ablation runner over (ids, mask) [B, T], in
    forwards of ``batch_size`` sequences (sums of x and x x^T in float64)."""
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    layers = set(range(len(runner.layer_indices)))
    device = runner.device
    ids, mask = ids.to(device), mask.to(device).bool()
    L, H, dh, d = (int(s) for s in runner.W_O.shape)

    def zeros(*shape: int) -> torch.Tensor:
        return torch.zeros(*shape, dtype=torch.float64, device=device)

    z_sum, z_sq, x_sum, x_sq = zeros(L, H, dh), zeros(L, H, dh, dh), zeros(L, d), zeros(L, d, d)
    n = 0
    chunks = list(range(0, int(ids.shape[0]), batch_size))
    for i, s in enumerate(chunks):
        t = s + batch_size
        keep = counted_positions(mask[s:t])
        clean = runner.clean(ids[s:t], mask[s:t], layers, set(), resid_layers=layers)
        for layer in range(L):  # one layer's float64 copy at a time, summed in place
            z = clean.z.pop(layer)[keep].double().transpose(0, 1)  # [H, N, dh]
            z_sum[layer] += z.sum(1)
            z_sq[layer].baddbmm_(z.transpose(1, 2), z)
            x = clean.resid.pop(layer)[keep].double()  # [N, d]
            x_sum[layer] += x.sum(0)
            x_sq[layer].addmm_(x.T, x)
            del z, x
        n += int(keep.sum())
        if progress is not None:
            progress((i + 1) / len(chunks), f"forward {i + 1}/{len(chunks)}")
    if n < 2:
        raise InvalidInput(f"data-weighted PK needs at least 2 counted positions, got {n}")
    # In place, a layer at a time: [L, d, d] float64 is 0.5 GB at d_model 2048.
    for sq, total in ((z_sq, z_sum), (x_sq, x_sum)):
        for layer in range(L):
            mean = total[layer] / n
            c = sq[layer].div_(n).sub_(mean[..., :, None] * mean[..., None, :])
            c.copy_(_symmetric(c))
    return ActivationCovariances(z=z_sq, resid=x_sq, n_positions=n,
                                 n_prompts=int(ids.shape[0]),
                                 layer_indices=tuple(runner.layer_indices), prompt_set=prompt_set)


def _symmetric(c: torch.Tensor) -> torch.Tensor:
    return (c + c.transpose(-2, -1)) / 2


HALVES = ("even", "odd")  # the split halves of a prompt set (core.activations.ablation's)


def activation_covariances(model: Any, *, prompt_set: str = "text",
                           prompts: list[str] | None = None, induction_length: int = 20,
                           induction_batch: int = 20, seed: int = 0, batch_size: int = 32,
                           half: str | None = None,
                           progress: Progress | None = None) -> ActivationCovariances:
    """Covariances of a runnable model (what core.activations.ablation.ablation_runner takes) over one of
    core.activations.ablation's prompt sets: "text" (``prompts``, default the bundled ones) or "random"
    (``induction_batch`` sequences [(bos) r r], |r| = ``induction_length``, ``seed``); ``half``
    "even" / "odd": only those prompts of the set (the split halves path ablation reports), so
    data-weighted PK fit on one half can be tested against effects on the other."""
    from headgraph.core.activations.ablation import prompt_sets
    from headgraph.core.activations.runners import ablation_runner

    check_prompt_set(prompt_set)
    runner = ablation_runner(model)
    sets, _ = prompt_sets(runner.source, prompts=prompts, induction_length=induction_length,
                          induction_batch=induction_batch, seed=seed)
    ids, mask = sets[prompt_set]
    if half is not None:
        if half not in HALVES:
            raise InvalidInput(f"unknown half {half!r}; allowed: {list(HALVES)}", allowed=list(HALVES))
        start = HALVES.index(half)
        ids, mask = ids[start::2], mask[start::2]
    return covariances(runner, ids, mask, batch_size=batch_size, prompt_set=prompt_set,
                       progress=progress)


# -- the scores --------------------------------------------------------------------------------

def output_factors(cov_z: torch.Tensor, W_O: torch.Tensor,
                   write_scale: torch.Tensor | None = None) -> torch.Tensor:
    """X = s W_O^T F [L, H, d_model, d_head] (float64) with Sigma_z = F F^T [L, H, dh, dh], so
    X X^T = C_S, the covariance of the head's output s z W_O (eigen-factor, negative
    eigenvalues from rounding clipped to 0); ``write_scale`` s [L]: the factor the model
    applies to each layer's attention output (core.activations.conformance; default 1)."""
    evals, evecs = torch.linalg.eigh(cov_z.double())
    factor = evecs * evals.clamp(min=0).sqrt()[..., None, :]
    out = factor.new_empty(*W_O.shape[:2], W_O.shape[3], W_O.shape[2])
    for layer in range(W_O.shape[0]):  # a layer's float64 copy of W_O at a time
        torch.matmul(W_O[layer].double().transpose(-2, -1), factor[layer], out=out[layer])
        if write_scale is not None and float(write_scale[layer]) != 1:
            out[layer].mul_(float(write_scale[layer]))
    return out


def data_weighted_pk(cov: ActivationCovariances, W_O: torch.Tensor, bases: RoleBases,
                     pairing: str, write_scale: torch.Tensor | None = None) -> DataPK:
    """Data-weighted PK of one pairing from covariances, the source heads' W_O [L, H, dh, d]
    (the weights that produced the outputs) and the targets' PK read bases (U [L, H_t, d, r],
    zero columns past each measured rank); ``write_scale`` [L]: the model's factor on each
    layer's attention output (a residual multiplier; default 1). See the module docstring."""
    check_pairing(pairing)
    if bases.role != pairing[1]:
        raise InvalidInput(f"pairing {pairing} reads through {pairing[1]}, got bases of role "
                           f"{bases.role}")
    L, H, dh, d = W_O.shape
    if cov.z.shape != (L, H, dh, dh) or cov.resid.shape != (L, d, d):
        raise InvalidInput(f"covariances {tuple(cov.z.shape)}, {tuple(cov.resid.shape)} do not "
                           f"match W_O {tuple(W_O.shape)}")
    U = bases.U.to(device=cov.z.device, dtype=torch.float64)
    if U.shape[0] != L or U.shape[2] != d:
        raise InvalidInput(f"bases {tuple(U.shape)} do not match W_O {tuple(W_O.shape)}")
    X = output_factors(cov.z, W_O.to(cov.z.device), write_scale)
    num = pairwise_sq_overlap(X, U, order="forward")  # [L, H, L, Ht] tr(U^T C_S U)
    src_var = X.square().sum((-2, -1))  # [L, H] tr(C_S)
    in_var = cov.resid.diagonal(dim1=-2, dim2=-1).sum(-1)  # [L] tr(C_X)
    Ht, r = U.shape[1], U.shape[3]
    tgt_var = U.new_zeros(L, Ht)  # tr(U^T C_X U), a layer's product C_X [U_1 ...] at a time
    for b in range(L):
        flat = U[b].permute(1, 0, 2).reshape(d, Ht * r)
        tgt_var[b] = (cov.resid[b] @ flat * flat).reshape(d, Ht, r).sum((0, 2))
    ranks = effective_ranks(bases).to(cov.z.device)
    forward = layer_mask(cov.layer_indices, "forward", cov.z.device)  # [L, L]
    tiny = torch.finfo(torch.float64).tiny
    valid = (forward[:, None, :, None] & (src_var > 0)[:, :, None, None]
             & ((ranks > 0) & (tgt_var > 0))[None, None])
    out_share = num / src_var.clamp(min=tiny)[:, :, None, None]
    in_share = num / tgt_var.clamp(min=tiny)[None, None]
    in_base = src_var[:, :, None] / in_var.clamp(min=tiny)[None, None]
    zero = torch.zeros((), dtype=torch.float64, device=cov.z.device)
    return DataPK(
        pairing=pairing,
        out_share=torch.where(valid, out_share.clamp(0.0, 1.0), zero),
        in_share=torch.where(valid, in_share.clamp(min=0.0), zero),
        valid=valid, source_variance=src_var, input_variance=in_var,
        target_input_variance=tgt_var, out_share_baseline=ranks.to(torch.float64) / d,
        in_share_baseline=torch.where(forward[:, None, :], in_base, zero),
        target_ranks=ranks, layer_indices=cov.layer_indices, n_positions=cov.n_positions,
        n_prompts=cov.n_prompts, prompt_set=cov.prompt_set)


def data_pk(model: Any, pairings: Sequence[str] = DATA_PK_PAIRINGS, *,
            heads: HeadWeights | None = None, prompt_set: str = "text",
            prompts: list[str] | None = None, induction_length: int = 20,
            induction_batch: int = 20, seed: int = 0, batch_size: int = 32,
            half: str | None = None, progress: Progress | None = None) -> dict[str, DataPK]:
    """Data-weighted PK of several O -> Q/K/V pairings from one set of covariances.

    model: the demo model, a TransformerBridge, a pattern source with a ``bridge`` or a
    LoadedModel (its ``heads`` used unless ``heads`` is given: the read bases come from there,
    as PK's); the rest as :func:`activation_covariances`. UnsupportedModel when the model
    cannot be run or its runnable weights do not match ``heads``.
    """
    from headgraph.core.activations.runners import ablation_runner
    from headgraph.core.models.demo import DemoModel

    for p in pairings:
        check_pairing(p)
    if heads is None:
        heads = model.head_weights() if isinstance(model, DemoModel) else getattr(model, "heads",
                                                                                   None)
    if not isinstance(heads, HeadWeights):
        raise InvalidInput("data-weighted PK needs the model's HeadWeights (pass heads=)")
    runner = ablation_runner(model)
    if tuple(runner.W_O.shape) != tuple(heads.W_O.shape) \
            or tuple(runner.layer_indices) != tuple(heads.info.layer_indices):
        raise UnsupportedModel(f"the runnable model's W_O {tuple(runner.W_O.shape)} (layers "
                               f"{list(runner.layer_indices)[:6]}...) does not match the weights "
                               f"read for PK {tuple(heads.W_O.shape)}")
    cov = activation_covariances(runner, prompt_set=prompt_set, prompts=prompts,
                                 induction_length=induction_length,
                                 induction_batch=induction_batch, seed=seed,
                                 batch_size=batch_size, half=half, progress=progress)
    return {p: data_weighted_pk(cov, runner.W_O, role_bases(heads, p[1]), p, runner.write_scale)
            for p in pairings}


__all__ = ["DATA_PK_PAIRINGS", "DATA_PK_PROMPT_SETS", "HALVES", "METHOD", "ActivationCovariances",
           "DataPK", "activation_covariances", "check_pairing", "check_prompt_set",
           "counted_positions", "covariances", "data_pk", "data_weighted_pk", "output_factors"]
