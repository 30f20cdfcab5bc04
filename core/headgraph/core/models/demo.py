"""The built-in demo model: a 2-layer attention-only transformer trained to copy (induction).

Plain torch, TransformerLens-like parameters (W_Q/W_K/W_V [L,H,d_model,d_head],
W_O [L,H,d_head,d_model], biases, W_E, W_pos, W_U [d_model,d_vocab]). Positions are
*shortformer* style: W_pos is added to the input of queries and keys only, never to the
residual stream or the values, which is what lets a previous-token head in layer 0 write
"the token before me" into the residual stream for an induction head in layer 1 to key on.
Weights ship in ``core/data/demo`` (trained by ``scripts/train_demo.py``).
"""

from __future__ import annotations

import json
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from headgraph.core.errors import InvalidInput, UnsupportedModel
from headgraph.core.models.fingerprint import weights_fingerprint
from headgraph.core.types import HeadWeights, ModelInfo

ARCHITECTURE = "HeadgraphAttnOnly"
# forward's hook: (point name, layer, tensor) -> a replacement tensor or None (keep it)
DemoHook = Callable[[str, int, torch.Tensor], "torch.Tensor | None"]
DEMO_DIR = Path(__file__).resolve().parents[1] / "data" / "demo"
TOKENIZER_DESCRIPTION = (
    "whitespace-separated token names (vocab.json maps name -> id); any other word maps to "
    "crc32(word) % d_vocab so repeated words share an id; no BOS; right padding with id 0")


@dataclass(frozen=True)
class DemoConfig:
    """Shape and vocabulary of a HeadgraphAttnOnly model (as stored in config.json)."""

    n_layers: int = 2
    n_heads: int = 8
    d_model: int = 128
    d_head: int = 16
    d_vocab: int = 64
    n_ctx: int = 64
    layer_norm: bool = True  # LayerNorm on each attention layer's input
    ln_eps: float = 1e-5
    token_names: tuple[str, ...] = field(default_factory=tuple)

    def __post_init__(self) -> None:
        if not self.token_names:
            object.__setattr__(self, "token_names",
                               tuple(f"t{i:02d}" for i in range(self.d_vocab)))
        if len(self.token_names) != self.d_vocab:
            raise InvalidInput("token_names must have d_vocab entries")

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> DemoConfig:
        """Build from a config.json dict (extra keys such as the training recipe are ignored)."""
        names = {f for f in cls.__dataclass_fields__}
        kw = {k: v for k, v in d.items() if k in names}
        if "token_names" in kw:
            kw["token_names"] = tuple(kw["token_names"])
        return cls(**kw)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["token_names"] = list(self.token_names)
        d["architecture"] = ARCHITECTURE
        return d


class DemoModel(nn.Module):
    """Attention-only transformer with shortformer positions; implements PatternSource."""

    def __init__(self, cfg: DemoConfig, *, seed: int | None = None) -> None:
        super().__init__()
        self.cfg = cfg
        gen = torch.Generator().manual_seed(seed) if seed is not None else None
        L, H, d, dh, V = cfg.n_layers, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_vocab

        def init(*shape: int, std: float) -> nn.Parameter:
            return nn.Parameter(torch.randn(*shape, generator=gen) * std)

        self.W_E = init(V, d, std=1.0)
        self.W_pos = init(cfg.n_ctx, d, std=1.0)
        self.W_Q = init(L, H, d, dh, std=d ** -0.5)
        self.W_K = init(L, H, d, dh, std=d ** -0.5)
        self.W_V = init(L, H, d, dh, std=d ** -0.5)
        self.W_O = init(L, H, dh, d, std=(H * dh) ** -0.5)
        self.b_Q = nn.Parameter(torch.zeros(L, H, dh))
        self.b_K = nn.Parameter(torch.zeros(L, H, dh))
        self.b_V = nn.Parameter(torch.zeros(L, H, dh))
        self.b_O = nn.Parameter(torch.zeros(L, d))
        self.ln_w = nn.Parameter(torch.ones(L, d))
        self.ln_b = nn.Parameter(torch.zeros(L, d))
        self.ln_final_w = nn.Parameter(torch.ones(d))
        self.ln_final_b = nn.Parameter(torch.zeros(d))
        self.W_U = init(d, V, std=d ** -0.5)
        self.b_U = nn.Parameter(torch.zeros(V))
        self._index = {name: i for i, name in enumerate(cfg.token_names)}

    # -- PatternSource extras (read by core.activations.patterns) -------------------------------
    @property
    def d_vocab(self) -> int:
        return self.cfg.d_vocab

    @property
    def n_ctx(self) -> int:
        return self.cfg.n_ctx

    @property
    def bos_token_id(self) -> int | None:
        return None  # trained without a BOS token

    @property
    def layer_indices(self) -> tuple[int, ...]:
        return tuple(range(self.cfg.n_layers))

    # -- forward --------------------------------------------------------------------
    def forward(self, tokens: torch.Tensor, *, return_patterns: bool = False,
                hook: DemoHook | None = None
                ) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Logits [batch, pos, d_vocab] (and patterns [L, batch, H, q, k] if asked).

        ``hook(name, layer, tensor)``, when given, sees each layer's ``"resid_pre"`` (the
        residual stream entering the layer, [b, p, d]), ``"ln_scale"`` (the
        LayerNorm's sqrt(var + eps) of its input, [b, p, 1]; not fired without LayerNorm),
        ``"q"``, ``"k"``, ``"v"`` ([b, h, p, d_head], before the scores), ``"pattern"``
        ([b, h, q, k]) and ``"z"`` ([b, h, p, d_head]); a tensor it returns replaces the one
        it saw (None keeps it), and it may raise to stop the forward early (core.activations.ablation).
        """
        tokens = tokens.to(self.W_E.device)
        T = tokens.shape[-1]
        if self.cfg.n_ctx < T:
            raise InvalidInput(f"sequence of {T} tokens exceeds n_ctx={self.cfg.n_ctx}")
        x = self.W_E[tokens]  # [b, p, d]
        pos = self.W_pos[:T]
        causal = torch.ones(T, T, dtype=torch.bool, device=x.device).tril()
        patterns = []

        def fire(name: str, layer: int, value: torch.Tensor) -> torch.Tensor:
            if hook is None:
                return value
            out = hook(name, layer, value)
            return value if out is None else out

        for layer in range(self.cfg.n_layers):  # layers are sequential by nature
            x = fire("resid_pre", layer, x)
            h = x
            if self.cfg.layer_norm:
                if hook is not None:
                    var = h.var(-1, keepdim=True, unbiased=False)
                    fire("ln_scale", layer, (var + self.cfg.ln_eps).sqrt())
                h = nn.functional.layer_norm(h, (self.cfg.d_model,), self.ln_w[layer],
                                             self.ln_b[layer], self.cfg.ln_eps)
            qk_in = h + pos
            q = torch.einsum("bpd,hde->bhpe", qk_in, self.W_Q[layer]) + self.b_Q[layer][:, None]
            k = torch.einsum("bpd,hde->bhpe", qk_in, self.W_K[layer]) + self.b_K[layer][:, None]
            v = torch.einsum("bpd,hde->bhpe", h, self.W_V[layer]) + self.b_V[layer][:, None]
            q, k, v = fire("q", layer, q), fire("k", layer, k), fire("v", layer, v)
            scores = (q @ k.transpose(-1, -2)) / self.cfg.d_head ** 0.5
            pattern = scores.masked_fill(~causal, float("-inf")).softmax(-1)  # [b,h,q,k]
            pattern = fire("pattern", layer, pattern)
            z = fire("z", layer, pattern @ v)  # [b,h,p,e]
            x = x + torch.einsum("bhpe,hed->bpd", z, self.W_O[layer]) + self.b_O[layer]
            patterns.append(pattern)
        x = nn.functional.layer_norm(x, (self.cfg.d_model,), self.ln_final_w,
                                     self.ln_final_b, self.cfg.ln_eps)
        logits = x @ self.W_U + self.b_U
        if return_patterns:
            return logits, torch.stack(patterns)
        return logits

    # -- PatternSource ----------------------------------------------------------------
    def token_id(self, word: str) -> int:
        """Id of a token name; other words map to a stable crc32 hash (same word, same id)."""
        idx = self._index.get(word)
        if idx is None:
            idx = zlib.crc32(word.encode()) % self.cfg.d_vocab
        return idx

    def tokenize(self, texts: list[str]) -> tuple[torch.Tensor, torch.Tensor]:
        """Whitespace tokenization, right-padded: (ids [batch, pos], mask [batch, pos] bool)."""
        rows = [[self.token_id(w) for w in t.split()][: self.cfg.n_ctx] for t in texts]
        width = max((len(r) for r in rows), default=0)
        ids = torch.zeros(len(rows), max(width, 1), dtype=torch.long)
        mask = torch.zeros_like(ids, dtype=torch.bool)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
            mask[i, : len(r)] = True
        return ids.to(self.W_E.device), mask.to(self.W_E.device)

    def to_tokens(self, texts: list[str]) -> torch.Tensor:
        """Token ids [batch, pos] (right-padded with id 0; no BOS)."""
        return self.tokenize(texts)[0]

    def to_str_tokens(self, tokens: torch.Tensor) -> list[str]:
        """Names of a 1-D sequence of token ids."""
        return [self.cfg.token_names[int(i)] for i in tokens.reshape(-1)]

    @torch.no_grad()
    def attention_patterns(self, tokens: torch.Tensor,
                           attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Attention probabilities [L, batch, H, q, k] (causal, so right padding is harmless)."""
        return self.forward(tokens, return_patterns=True)[1]

    # -- weights ----------------------------------------------------------------------
    def head_weights(self, *, name: str = "demo", device: str | torch.device | None = None
                     ) -> HeadWeights:
        """HeadWeights of the raw (unprocessed) weights, source "builtin"."""
        cfg = self.cfg
        W_Q, W_K, W_V, W_O, W_U = (t.detach() for t in (self.W_Q, self.W_K, self.W_V,
                                                          self.W_O, self.W_U))
        if device is not None:
            W_Q, W_K, W_V, W_O, W_U = (t.to(device) for t in (W_Q, W_K, W_V, W_O, W_U))
        info = ModelInfo(
            name=name, architecture=ARCHITECTURE, n_layers=cfg.n_layers, n_heads=cfg.n_heads,
            n_kv_heads=cfg.n_heads, d_model=cfg.d_model, d_head=cfg.d_head,
            d_vocab=cfg.d_vocab, dtype=str(W_Q.dtype).replace("torch.", ""),
            layer_indices=tuple(range(cfg.n_layers)), processing="raw", source="builtin",
        )
        fp = weights_fingerprint([W_Q, W_K, W_V, W_O, W_U], processing="raw",
                                 extra=",".join(map(str, info.layer_indices)))
        return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=W_U,
                           fingerprint=fp, tokenizer=self)


def is_demo_folder(folder: str | Path) -> bool:
    """True when ``folder/config.json`` describes a HeadgraphAttnOnly model."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        return False
    try:
        return json.loads(path.read_text()).get("architecture") == ARCHITECTURE
    except (OSError, ValueError):
        return False


def save_demo_model(model: DemoModel, folder: str | Path, *, extra: dict[str, Any] | None = None
                    ) -> None:
    """Write config.json (shapes + ``extra`` such as the training recipe) and model.safetensors."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    cfg = model.cfg.to_dict()
    cfg["tokenizer"] = TOKENIZER_DESCRIPTION
    cfg.update(extra or {})
    (folder / "config.json").write_text(json.dumps(cfg, indent=1) + "\n")
    vocab = {name: i for i, name in enumerate(model.cfg.token_names)}
    (folder / "vocab.json").write_text(json.dumps(vocab) + "\n")
    tensors = {k: v.detach().to("cpu", torch.float32).contiguous()
               for k, v in model.state_dict().items()}
    save_file(tensors, str(folder / "model.safetensors"), metadata={"format": "pt"})


def load_demo_model(folder: str | Path = DEMO_DIR, *, device: str | torch.device | None = None
                    ) -> DemoModel:
    """Load a HeadgraphAttnOnly model from ``folder`` (default: the shipped demo), in eval mode."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / "config.json").read_text())
    if meta.get("architecture") != ARCHITECTURE:
        raise UnsupportedModel(f"{folder}: not a {ARCHITECTURE} checkpoint")
    model = DemoModel(DemoConfig.from_dict(meta))
    model.load_state_dict(load_file(str(folder / "model.safetensors")))
    model.meta = meta  # type: ignore[attr-defined]  # training recipe and results
    model.eval().requires_grad_(False)
    return model.to(device) if device is not None else model
