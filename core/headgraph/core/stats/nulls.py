"""Null distributions for PK, per-pair p-values and Benjamini-Hochberg FDR control.

Two nulls answer two questions:

* Haar (``haar_null``): "is this overlap larger than between random planes in isotropic R^d?"
  Trained weights are anisotropic (most heads write to and read from a few shared
  directions), so almost every pair looks significant against it.
* anisotropic (``anisotropic_null``): "is it larger than expected given where this model's
  weights live at all?" Random source planes are spanned by Gaussian columns with covariance
  Sigma_s = mean over source-role heads of W W^T / d_head, target planes likewise with the
  target role's Sigma_t; a pair beats this null only if it overlaps more than two random
  planes drawn from those roles' overall weight distributions.

Both draw planes of the roles' common basis width (d_head); a pair with a rank-deficient head
is compared with that full-width null too.

A third null, **random initialization** (``random_init_null``), answers "is it larger than
the same architecture gives before any training?": the PKs of every valid pair (same pairing,
same layer order) of models of the same shapes at random initialization, pooled over seeds
until RANDOM_INIT_TARGET samples or RANDOM_INIT_MAX_MODELS models. ``random_init_heads``
builds them: the demo architecture with its own initializer (``DemoModel(cfg, seed)``), any
other model with i.i.d. Gaussian attention projections of its shapes, which is what
transformers initializes GPT-2, Llama (SmolLM2), Qwen2 and BLOOM attention weights with
(normal(0, initializer_range); PK does not see the scale). For an exact from_config model
pass ``load_heads("random:<config.json>@seed")`` results to ``random_init_null`` instead
(tests check both give the same law). Cost: a few forward PK grids, no model is run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.scores.layer_order import check_order
from headgraph.core.scores.pk import parse_pairing, projection_kernel
from headgraph.core.scores.subspaces import compute_dtype, release_bases
from headgraph.core.stats.reference import haar_pk_samples
from headgraph.core.types import HeadWeights, ModelInfo, PairScores

# Gaussian entries drawn per batch of null planes.
_BATCH_ELEMS = 1 << 23
# Relative ridge added to Sigma so planes stay full rank when weights span fewer than d dims.
_JITTER = 1e-7
# Random-initialization null: pool models (seeds 0, 1, ...) until this many pair samples, at most
# RANDOM_INIT_MAX_MODELS models (one model of a large architecture already has enough pairs).
RANDOM_INIT_TARGET = 2000
RANDOM_INIT_MAX_MODELS = 4


@dataclass(frozen=True)
class NullResult:
    """Samples of PK under a null for one pairing (``pairing`` "" = any pairing of these ranks).

    samples: [N] float64, sorted ascending.
    """

    kind: str  # "anisotropic" | "haar" | "random_init"
    pairing: str
    samples: torch.Tensor
    mean: float
    std: float
    source_rank: int
    target_rank: int
    d_model: int
    seed: int
    order: str

    def to_dict(self) -> dict[str, Any]:
        """Plain-JSON summary (no samples: mean, std, quantiles)."""
        q = torch.tensor([0.5, 0.9, 0.95, 0.99], dtype=torch.float64, device=self.samples.device)
        quant = torch.quantile(self.samples, q).tolist()
        return {
            "kind": self.kind, "pairing": self.pairing, "n_samples": int(self.samples.numel()),
            "mean": self.mean, "std": self.std, "source_rank": self.source_rank,
            "target_rank": self.target_rank, "d_model": self.d_model, "seed": self.seed,
            "order": self.order, "quantiles": dict(zip(["0.5", "0.9", "0.95", "0.99"], quant)),
        }


def _summary(kind: str, pairing: str, samples: torch.Tensor, r_s: int, r_t: int, d: int,
             seed: int, order: str) -> NullResult:
    samples = torch.sort(samples.to(torch.float64)).values
    std = float(samples.std()) if samples.numel() > 1 else 0.0
    return NullResult(kind=kind, pairing=pairing, samples=samples, mean=float(samples.mean()),
                      std=std, source_rank=r_s, target_rank=r_t, d_model=d, seed=seed, order=order)


def role_covariance(heads: HeadWeights, role: str) -> torch.Tensor:
    """Sigma_role = mean over the role's heads of W W^T / d_head: [d_model, d_model] float64.

    Accumulated one layer at a time (a layer's product in the compute dtype, summed in
    float64), so no upcast copy of the whole role exists. Not cached: the nulls keep only its
    eigen-factors (a 7B model's covariance is 128 MiB per role).
    """
    w = heads.role(role).detach()
    L, H, d, dh = w.shape
    sigma = torch.zeros(d, d, dtype=torch.float64, device=w.device)
    for layer in w:
        m = layer.to(compute_dtype(w.dtype)).permute(1, 0, 2).reshape(d, H * dh)
        sigma += (m @ m.transpose(0, 1)).to(torch.float64)
    sigma /= L * H * dh
    return 0.5 * (sigma + sigma.transpose(0, 1))


def _eig_factor(sigma: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(eigenvectors V, sqrt eigenvalues) of Sigma + ridge I, ridge = jitter * tr(Sigma) / d."""
    d = sigma.shape[0]
    ridge = _JITTER * float(torch.trace(sigma)) / d
    evals, evecs = torch.linalg.eigh(sigma + ridge * torch.eye(d, dtype=sigma.dtype, device=sigma.device))
    return evecs, evals.clamp(min=ridge).sqrt()


def _role_eig(heads: HeadWeights, role: str) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`_eig_factor` of a role's covariance, cached per role until
    :func:`release_null_factors` (the eigensolver of a d x d matrix is the null's largest fixed
    cost, shared by every pairing reading the role)."""
    key = ("role_eig", role)
    hit = heads._cache.get(key)
    if hit is None:
        hit = _eig_factor(role_covariance(heads, role))
        heads._cache[key] = hit
    return hit


def anisotropic_pk_samples(
    sigma_s: torch.Tensor, sigma_t: torch.Tensor, r_s: int, r_t: int, count: int, *, seed: int
) -> torch.Tensor:
    """PK [count] (float64) between span(F_s Z_s) and span(F_t Z_t), Z Gaussian [d, r], F F^T = Sigma.

    Computed in Sigma_s's eigenbasis (PK is invariant to a common rotation): G_s = sqrt(Lambda_s)
    Z_s, G_t = V_s^T F_t Z_t. Planes are orthonormalized implicitly: with G^T G = L L^T,
    PK = ||L_s^-1 G_s^T G_t L_t^-T||_F^2 (Gram matrices in float64). Gaussian draws on the CPU
    (seeded), arithmetic on Sigma's device.
    """
    return _anisotropic_samples(_eig_factor(sigma_s), _eig_factor(sigma_t), r_s, r_t, count,
                                seed=seed)


def _anisotropic_samples(eig_s: tuple[torch.Tensor, torch.Tensor],
                         eig_t: tuple[torch.Tensor, torch.Tensor], r_s: int, r_t: int,
                         count: int, *, seed: int) -> torch.Tensor:
    """:func:`anisotropic_pk_samples` from the two covariances' eigen-factors."""
    (v_s, root_s), (v_t, root_t) = eig_s, eig_t
    d = v_s.shape[0]
    device = v_s.device
    scale_s = root_s.to(torch.float32)[:, None]
    f_t = (v_s.transpose(0, 1) @ (v_t * root_t[None, :])).to(torch.float32)
    gen = torch.Generator().manual_seed(int(seed))
    batch = max(1, _BATCH_ELEMS // (d * (r_s + r_t)))
    out = []
    for start in range(0, count, batch):
        k = min(batch, count - start)
        z = torch.randn(d, k * (r_s + r_t), generator=gen).to(device)
        g_s = (scale_s * z[:, : k * r_s]).reshape(d, k, r_s).permute(1, 0, 2).to(torch.float64)
        g_t = (f_t @ z[:, k * r_s:]).reshape(d, k, r_t).permute(1, 0, 2).to(torch.float64)
        l_s = torch.linalg.cholesky(g_s.transpose(1, 2) @ g_s)
        l_t = torch.linalg.cholesky(g_t.transpose(1, 2) @ g_t)
        c = g_s.transpose(1, 2) @ g_t
        x = torch.linalg.solve_triangular(l_s, c, upper=False)
        y = torch.linalg.solve_triangular(l_t, x.transpose(1, 2), upper=False)
        out.append(y.square().sum(dim=(1, 2)))
    return torch.cat(out)


def anisotropic_null(
    heads: HeadWeights, pairing: str, *, samples: int = 2000, seed: int = 0, order: str = "forward"
) -> NullResult:
    """Anisotropic null for ``pairing``: PK between random planes shaped like the source and
    target roles' weights (see module docstring). ``order`` is recorded for matching results."""
    s_role, t_role = parse_pairing(pairing)
    check_order(order)
    if isinstance(samples, bool) or not isinstance(samples, int) or samples < 2:
        raise InvalidInput(f"samples must be an integer >= 2, got {samples!r}")
    key = ("null", "anisotropic", pairing, samples, seed, order)
    hit = heads._cache.get(key)
    if hit is not None:
        return hit
    # The roles' common basis width (role_bases(...).rank), without factorizing the bases.
    r_s, r_t = (min(heads.role(r).shape[-2:]) for r in (s_role, t_role))
    vals = _anisotropic_samples(_role_eig(heads, s_role), _role_eig(heads, t_role), r_s, r_t,
                                samples, seed=seed)
    result = _summary("anisotropic", pairing, vals, r_s, r_t, heads.info.d_model, seed, order)
    heads._cache[key] = result
    return result


def haar_null(
    d_model: int, source_rank: int, target_rank: int | None = None, *, samples: int = 2000,
    seed: int = 0, pairing: str = "", order: str = "forward",
) -> NullResult:
    """Isotropic (Haar) null: Monte-Carlo PK between random planes of R^d_model."""
    target_rank = source_rank if target_rank is None else target_rank
    vals = haar_pk_samples(d_model, source_rank, target_rank, samples, seed=seed, method="wishart")
    return _summary("haar", pairing, vals, source_rank, target_rank, d_model, seed, order)


def random_init_layers(info: ModelInfo, pairing: str, target: int) -> int:
    """How many layers a random-init model needs for about ``target`` forward pairs of
    ``pairing`` (at least 2, at most the model's). Random-init layers are exchangeable (every
    layer drawn alike), so fewer of them give the same PK distribution at a fraction of the
    cost: SmolLM2 needs 14 of its 30 layers for 2000 OK pairs."""
    s_role, t_role = parse_pairing(pairing)
    per = {r: info.n_kv_heads if r in ("K", "V") else info.n_heads for r in (s_role, t_role)}
    layers = 2
    while layers < info.n_layers and per[s_role] * per[t_role] * layers * (layers - 1) // 2 < target:
        layers += 1
    return min(info.n_layers, layers + 1)


def random_init_heads(info: ModelInfo, *, seed: int, n_layers: int | None = None,
                      dtype: torch.dtype = torch.float32) -> HeadWeights:
    """Head weights of ``info``'s shapes at random initialization (seeded; module docstring);
    ``n_layers``: only that many (the first of ``info.layer_indices``; default all); ``dtype``
    of the Gaussian weights (drawn in float32, then rounded: bf16 halves a 7B's 0.8 GB).

    Demo architecture: ``DemoModel(DemoConfig(shape of info), seed=seed)``'s own init; else
    i.i.d. standard normal W_Q [L, H, d, dh], W_K / W_V [L, H_kv, d, dh], W_O [L, H, dh, d]
    (transformers' normal init without its scale, which PK ignores). No W_U, no tokenizer;
    layer_indices as in ``info``.
    """
    from headgraph.core.models.demo import ARCHITECTURE, DemoConfig, DemoModel
    from headgraph.core.models.fingerprint import weights_fingerprint

    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise InvalidInput(f"seed must be an integer >= 0, got {seed!r}")
    L = info.n_layers if n_layers is None else max(1, min(int(n_layers), info.n_layers))
    H, Hkv, d, dh = info.n_heads, info.n_kv_heads, info.d_model, info.d_head
    if info.architecture == ARCHITECTURE:
        cfg = DemoConfig(n_layers=L, n_heads=H, d_model=d, d_head=dh, d_vocab=info.d_vocab or 64)
        w = DemoModel(cfg, seed=seed).head_weights(name=f"{info.name} (random init {seed})")
        W_Q, W_K, W_V, W_O = w.W_Q, w.W_K, w.W_V, w.W_O
    else:
        gen = torch.Generator().manual_seed(int(seed))
        W_Q = torch.randn(L, H, d, dh, generator=gen).to(dtype)
        W_K = torch.randn(L, Hkv, d, dh, generator=gen).to(dtype)
        W_V = torch.randn(L, Hkv, d, dh, generator=gen).to(dtype)
        W_O = torch.randn(L, H, dh, d, generator=gen).to(dtype)
    init_info = ModelInfo(name=f"{info.name} (random init {seed})", architecture=info.architecture,
                          n_layers=L, n_heads=H, n_kv_heads=Hkv, d_model=d, d_head=dh,
                          d_vocab=None, dtype=str(W_Q.dtype).replace("torch.", ""),
                          layer_indices=tuple(info.layer_indices)[:L],
                          processing="raw", source="config")
    fp = weights_fingerprint([W_Q, W_K, W_V, W_O], processing="raw", extra=f"init{seed}")
    return HeadWeights(info=init_info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=None,
                       fingerprint=fp)


def random_init_null(
    heads: HeadWeights | Sequence[HeadWeights], pairing: str, *, order: str = "forward",
    target: int = RANDOM_INIT_TARGET, max_models: int = RANDOM_INIT_MAX_MODELS,
) -> NullResult:
    """Random-initialization null for ``pairing``: the PKs of every valid ``order`` pair of
    models of the same architecture at random init (module docstring).

    heads: the trained model (its shapes; random-init models ``random_init_heads(info,
    seed=0, 1, ...)`` are built until ``target`` samples or ``max_models`` models), or a
    sequence of random-init models given by the caller (e.g. ``load_heads("random:...@s")``),
    all pooled. ``seed`` of the result = number of models pooled (seeds 0..n-1 when built).
    """
    parse_pairing(pairing)
    check_order(order)
    for name, value in (("target", target), ("max_models", max_models)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InvalidInput(f"{name} must be an integer >= 1, got {value!r}")
    given = None if isinstance(heads, HeadWeights) else list(heads)
    if given is not None and not given:
        raise InvalidInput("random_init_null needs at least one model")
    result_key = ("null", "random_init", pairing, order, target, max_models)
    if given is None and (hit := heads._cache.get(result_key)) is not None:  # type: ignore[union-attr]
        return hit
    first = heads if isinstance(heads, HeadWeights) else given[0]  # type: ignore[index]
    info = first.info
    parts: list[torch.Tensor] = []
    models: list[HeadWeights] = []
    ranks = (0, 0)
    n = 0
    while True:
        if given is not None:
            if len(models) == len(given):
                break
            model = given[len(models)]
            if (model.info.d_model, model.info.d_head) != (info.d_model, info.d_head):
                raise InvalidInput("random-init models must share d_model and d_head")
        else:
            if len(models) >= max_models or (models and n >= target):
                break
            layers = random_init_layers(info, pairing, target)
            key = ("random_init_heads", len(models), layers)  # kept with the trained model, so
            model = first._cache.get(key)  # each role's bases are built once per init
            if model is None:
                # in the trained weights' precision when narrower (a 7B's bf16: half the memory)
                narrow = first.W_Q.dtype in (torch.bfloat16, torch.float16)
                model = random_init_heads(info, seed=len(models), n_layers=layers,
                                          dtype=first.W_Q.dtype if narrow else torch.float32)
                first._cache[key] = model
        models.append(model)
        ps = projection_kernel(model, pairing, order=order)
        release_bases(model)  # its PK stays cached; the next pairing rebuilds a role's bases
        if not parts:
            ranks = (ps.source_rank, ps.target_rank)
        vals = ps.scores[ps.valid].to("cpu", torch.float64)
        parts.append(vals)
        n += int(vals.numel())
    if n < 2:
        raise InvalidInput(f"{info.name}: fewer than 2 valid {pairing} pairs in {order} order; "
                           "no random-init null")
    r_s, r_t = ranks  # the roles' common basis widths (role_bases(...).rank) of the first model
    result = _summary("random_init", pairing, torch.cat(parts), r_s, r_t, info.d_model,
                      len(models), order)
    if given is None:
        first._cache[result_key] = result
    return result


def release_null_factors(heads: HeadWeights) -> int:
    """Drop what the nulls keep to share between pairings (each role's covariance eigen-factors,
    the random-init models and their bases; the null results stay); returns how many entries.
    A server calls it once its nulls are stored: 0.5 GiB of factors and 1.6 GiB of random-init
    weights and bases at 7B."""
    keys = [k for k in heads._cache
            if isinstance(k, tuple) and k and k[0] in ("role_eig", "random_init_heads")]
    for key in keys:
        del heads._cache[key]
    return len(keys)


def pair_pvalues(pk: PairScores, null: NullResult) -> torch.Tensor:
    """Empirical one-sided p-values p = (1 + #{null >= observed}) / (1 + N), same shape as
    ``pk.scores`` (float64); invalid pairs get 1."""
    if pk.kind != "pk":
        raise InvalidInput(f"p-values need Projection Kernel scores, got kind {pk.kind!r}")
    if null.pairing and null.pairing != pk.pairing:
        raise InvalidInput(f"null is for pairing {null.pairing!r}, scores are {pk.pairing!r}")
    ordered = null.samples.to(device=pk.scores.device, dtype=torch.float64)
    obs = pk.scores.to(torch.float64).contiguous()
    n = ordered.numel()
    at_least = n - torch.searchsorted(ordered, obs.flatten(), right=False).reshape(obs.shape)
    p = (1.0 + at_least.to(torch.float64)) / (1.0 + n)
    return torch.where(pk.valid, p, 1.0)


def bh_qvalues(pvalues: torch.Tensor, valid: torch.Tensor) -> torch.Tensor:
    """Benjamini-Hochberg adjusted p-values (q-values) over the valid cells, NaN elsewhere.

    q_(i) = min over j >= i of m p_(j) / j, capped at 1; a cell is BH-significant at level
    alpha exactly when its q-value is <= alpha (so one grid serves every FDR level).
    """
    if pvalues.shape != valid.shape:
        raise InvalidInput(f"pvalues {tuple(pvalues.shape)} and valid {tuple(valid.shape)} differ in shape")
    p = pvalues[valid].to(torch.float64)
    out = torch.full(valid.shape, torch.nan, dtype=torch.float64, device=pvalues.device)
    m = p.numel()
    if m == 0:
        return out
    ordered, order = torch.sort(p)
    ks = torch.arange(1, m + 1, dtype=torch.float64, device=p.device)
    scaled = ordered * m / ks
    q_sorted = torch.flip(torch.cummin(torch.flip(scaled, [0]), 0).values, [0]).clamp(max=1.0)
    q = torch.empty_like(p)
    q[order] = q_sorted
    out[valid] = q
    return out


def benjamini_hochberg(pvalues: torch.Tensor, valid: torch.Tensor, alpha: float = 0.05) -> torch.Tensor:
    """Benjamini-Hochberg step-up at FDR level ``alpha`` over the valid cells: bool, same shape.

    With m valid p-values sorted p_(1) <= ... <= p_(m), rejects every p <= p_(k) for the
    largest k with p_(k) <= k alpha / m (nothing when there is no such k).
    """
    if not 0.0 <= alpha <= 1.0:
        raise InvalidInput(f"alpha must lie in [0, 1], got {alpha!r}")
    if pvalues.shape != valid.shape:
        raise InvalidInput(f"pvalues {tuple(pvalues.shape)} and valid {tuple(valid.shape)} differ in shape")
    p = pvalues[valid].to(torch.float64)
    m = p.numel()
    out = torch.zeros_like(valid, dtype=torch.bool)
    if m == 0:
        return out
    ordered = torch.sort(p).values
    ks = torch.arange(1, m + 1, dtype=torch.float64, device=p.device)
    passing = torch.nonzero(ordered <= ks * alpha / m).flatten()
    if passing.numel() == 0:
        return out
    cutoff = ordered[passing[-1]]
    out[valid] = p <= cutoff
    return out
