"""All-edge attribution of a task: EAP and EAP-IG over the residual-stream graph.

**Graph.** Writers put a vector into the residual stream: ``embed`` (what enters the first
layer: token embeddings, plus position embeddings where the model adds them to the stream),
every head (its write ``z_h @ W_O[h]``) and every MLP (its output). Readers take the stream:
every query head's Q input, every KV head's K and V inputs (on grouped-query models one KV
group is one reader), every MLP's input and the logits (the final residual). A writer feeds
every reader after it (an MLP reads its own layer's heads; attention reads earlier layers).

**Post-attention norms** (Gemma 2/3, OLMo 2): a head's residual write is defined through the
norm with its scale frozen at the run being read: ``z_h @ W_O[h] / s * g`` with ``s`` the
norm's scale of the attention output in the forward on that prompt and ``g`` its gain; the
corrupt write of a head on a clean forward is ``z_corrupt @ W_O[h] / s_clean * g``. The
writes of a forward then sum exactly to what the norm wrote.

**EAP** (edge attribution patching, denoising convention as TransformerLens'
``attribution_patch``): for a writer w and a reader r,

    score(w -> r) = sum over prompts and positions of (a_w(clean) - a_w(corrupt)) . dM/dx_r

with ``M`` the task metric (mean logit difference, core.circuits.tasks) and ``x_r`` the
reader's own copy of the residual it reads, the gradient taken on the corrupt run and
through the reader's norm as the model computes it (scale included: TransformerLens' split
``hook_q_input`` / ``hook_k_input`` / ``hook_v_input``). Two forwards and one backward per
batch. **EAP-IG** with ``steps`` m averages the gradient over m runs whose first-layer input
is ``x_corrupt + (k / m) (x_clean - x_corrupt)``, k = 0..m-1 (a left Riemann sum from the
corrupt end), so m = 1 is EAP exactly. A positive score: moving that edge from corrupt to
clean raises the metric.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.circuits.ability import Ability, decide, units
from headgraph.core.circuits.model import PATHS, CircuitModel, Probe, circuit_model
from headgraph.core.circuits.tasks import Task, batches, logit_diff
from headgraph.core.errors import InvalidInput
from headgraph.core.names import CIRCUIT_STEPS_MAX

METHODS: tuple[str, ...] = ("eap", "eap-ig")
DEFAULT_METHOD = "eap-ig"  # plain EAP misranks saturated attention (the demo's induction K edges)
DEFAULT_STEPS = 5
Progress = Callable[[float, str], None]


# -- the graph -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class Node:
    """A writer (kind "embed" | "head" | "mlp") or a reader (kind "Q" | "K" | "V" | "MLP" |
    "logits"); ``layer`` is an attention-layer position, ``head`` a query head (Q, head) or a
    KV head (K, V); ``name`` the shown name with block numbers ("L0H0", "L5KV1.K", "logits")."""

    kind: str
    layer: int | None
    head: int | None
    name: str

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass(frozen=True)
class Graph:
    """Writers and readers of one model, and which writer feeds which reader."""

    writers: tuple[Node, ...]
    readers: tuple[Node, ...]
    valid: torch.Tensor  # [W, R] bool: the writer comes before the reader

    def reader_columns(self, layer: int, kind: str) -> list[int]:
        return [i for i, r in enumerate(self.readers) if r.layer == layer and r.kind == kind]

    def writer_rows(self, layer: int, kind: str) -> list[int]:
        return [i for i, w in enumerate(self.writers) if w.layer == layer and w.kind == kind]


def build_graph(cm: CircuitModel) -> Graph:
    """The residual-stream graph of ``cm`` (module docstring)."""
    L, H, K = cm.n_layers, cm.n_heads, cm.n_kv
    writers = [Node("embed", None, None, "embed")]
    w_stage = [0]
    readers: list[Node] = []
    r_stage: list[int] = []
    for layer in range(L):
        block = cm.layer_indices[layer]
        for path in PATHS:
            for h in range(H if path == "Q" else K):
                name = cm.label(layer, h, kv=path != "Q")
                readers.append(Node(path, layer, h, f"{name}.{path}"))
                r_stage.append(2 * layer + 1)
        for h in range(H):
            writers.append(Node("head", layer, h, cm.label(layer, h)))
            w_stage.append(2 * layer + 1)
        if cm.has_mlp:
            readers.append(Node("MLP", layer, None, f"L{block}MLP"))
            r_stage.append(2 * layer + 2)
            writers.append(Node("mlp", layer, None, f"L{block}MLP"))
            w_stage.append(2 * layer + 2)
    readers.append(Node("logits", None, None, "logits"))
    r_stage.append(2 * L + 1)
    valid = torch.tensor(w_stage)[:, None] < torch.tensor(r_stage)[None, :]
    return Graph(tuple(writers), tuple(readers), valid)


# -- results ----------------------------------------------------------------------------------------

@dataclass(frozen=True)
class TaskMetrics:
    """The task metric (mean logit difference answer - distractor at the last position) on
    clean and corrupt prompts, and accuracy (share of prompts whose answer beats the
    distractor); ``ability``: whether the model does the task (core.circuits.ability's rule),
    possibly on more pairs than these."""

    clean: float
    corrupt: float
    clean_accuracy: float
    corrupt_accuracy: float
    n_pairs: int
    ability: Ability | None = None

    @property
    def able(self) -> bool | None:
        """The model does the task (ability's paired sign tests); None: too few pairs to tell."""
        return None if self.ability is None else self.ability.able

    def to_dict(self) -> dict[str, Any]:
        out = {k: v for k, v in self.__dict__.items() if k != "ability"}
        return {**out, "gap": self.clean - self.corrupt, "able": self.able,
                "ability": None if self.ability is None else self.ability.to_dict()}


@dataclass(frozen=True)
class CircuitAttribution:
    """Every edge's attribution: ``writer[e]`` -> ``reader[e]`` (indices into the graph's
    writers / readers) with ``scores[e]`` (float64, in metric units)."""

    graph: Graph
    writer: torch.Tensor  # [E] long
    reader: torch.Tensor  # [E] long
    scores: torch.Tensor  # [E] float64
    metrics: TaskMetrics
    method: str
    steps: int
    task: str
    task_hash: str
    layer_indices: tuple[int, ...]

    @property
    def n_edges(self) -> int:
        return int(self.scores.numel())

    def order(self) -> torch.Tensor:
        """Edge indices by |score|, strongest first (ties: graph order)."""
        return torch.sort(self.scores.abs(), descending=True, stable=True).indices

    def edge(self, e: int) -> tuple[Node, Node]:
        return self.graph.writers[int(self.writer[e])], self.graph.readers[int(self.reader[e])]

    def score_of(self, writer: str, reader: str) -> float:
        """The score of the edge named ``writer`` -> ``reader`` ("L0H0", "L1H7.K")."""
        w = [i for i, n in enumerate(self.graph.writers) if n.name == writer]
        r = [i for i, n in enumerate(self.graph.readers) if n.name == reader]
        if not w or not r:
            raise InvalidInput(f"no edge {writer} -> {reader}")
        hit = ((self.writer == w[0]) & (self.reader == r[0])).nonzero().flatten()
        if not hit.numel():
            raise InvalidInput(f"no edge {writer} -> {reader} ({writer} does not feed it)")
        return float(self.scores[int(hit[0])])

    def edge_dicts(self, indices: torch.Tensor | list[int]) -> list[dict[str, Any]]:
        out = []
        for rank, e in enumerate(torch.as_tensor(indices).tolist()):
            w, r = self.edge(e)
            out.append({"rank": rank + 1, "writer": w.name, "reader": r.name, "path": r.kind,
                        "writer_kind": w.kind, "writer_layer": w.layer, "writer_head": w.head,
                        "reader_layer": r.layer, "reader_head": r.head,
                        "score": float(self.scores[e])})
        return out

    def to_dict(self, top: int | None = None) -> dict[str, Any]:
        """The metrics, method and the ``top`` strongest edges (all with None)."""
        order = self.order()
        if top is not None:
            order = order[:top]
        return {"task": self.task, "task_hash": self.task_hash, "method": self.method,
                "steps": self.steps, "metrics": self.metrics.to_dict(), "n_edges": self.n_edges,
                "n_writers": len(self.graph.writers), "n_readers": len(self.graph.readers),
                "layer_indices": list(self.layer_indices),
                "total_abs_score": float(self.scores.abs().sum()),
                "edges": self.edge_dicts(order)}


# -- the computation ------------------------------------------------------------------------------

class Capture(Probe):
    """Records a forward's writes and reader inputs; with ``leaves``, adds a zero tensor that
    requires grad at each reader point (Q / K / V projections, MLP inputs, the final
    residual) so one backward gives every reader's gradient; ``x0`` replaces the first
    layer's input."""

    def __init__(self, *, leaves: bool = False, x0: torch.Tensor | None = None) -> None:
        self.leaves = leaves
        self.replace_x0 = x0
        self.x0: torch.Tensor | None = None
        self.attn_in_: dict[int, torch.Tensor] = {}
        self.z_: dict[int, torch.Tensor] = {}
        self.scale: dict[int, torch.Tensor] = {}
        self.mlp: dict[int, torch.Tensor] = {}
        self.leaf: dict[tuple[str, int | None], torch.Tensor] = {}

    def _leaf(self, key: tuple[str, int | None], t: torch.Tensor) -> torch.Tensor:
        if not self.leaves:
            return t
        e = torch.zeros_like(t, requires_grad=True)
        self.leaf[key] = e
        return t + e

    def resid0(self, x: torch.Tensor) -> torch.Tensor:
        if self.replace_x0 is not None:
            x = self.replace_x0.to(x.dtype)
        self.x0 = x.detach()
        return x

    def attn_in(self, layer: int, x: torch.Tensor) -> None:
        self.attn_in_[layer] = x.detach()

    def proj(self, layer: int, path: str, t: torch.Tensor) -> torch.Tensor:
        return self._leaf((path, layer), t)

    def z(self, layer: int, t: torch.Tensor) -> None:
        self.z_[layer] = t.detach()

    def post_scale(self, layer: int, s: torch.Tensor) -> None:
        self.scale[layer] = s.detach()

    def mlp_in(self, layer: int, x: torch.Tensor) -> torch.Tensor:
        return self._leaf(("MLP", layer), x)

    def mlp_out(self, layer: int, t: torch.Tensor) -> None:
        self.mlp[layer] = t.detach()

    def final(self, x: torch.Tensor) -> torch.Tensor:
        return self._leaf(("logits", None), x)


def writes(cm: CircuitModel, graph: Graph, run: Capture, scale_from: Capture) -> torch.Tensor:
    """Every writer's write [W, B, T, d] in ``run``, head writes through a post-attention
    norm with ``scale_from``'s scale (module docstring)."""
    assert run.x0 is not None
    out = torch.empty(len(graph.writers), *run.x0.shape, dtype=run.x0.dtype,
                      device=run.x0.device)
    out[0] = run.x0
    for layer in range(cm.n_layers):
        rows = graph.writer_rows(layer, "head")
        w = cm.head_writes(layer, run.z_[layer], scale_from.scale.get(layer))
        out[rows[0]: rows[-1] + 1] = w.permute(2, 0, 1, 3)
        if cm.has_mlp:
            out[graph.writer_rows(layer, "mlp")[0]] = run.mlp[layer]
    return out


def reader_gradients(cm: CircuitModel, graph: Graph, run: Capture) -> torch.Tensor:
    """dM/dx_r [R, B, T, d] for every reader of a backward-driven ``run`` (its leaves have
    ``.grad``): attention readers through their layer's norm at the run's residual."""
    x0 = run.x0
    assert x0 is not None
    out = torch.zeros(len(graph.readers), *x0.shape, dtype=torch.float32, device=x0.device)
    for layer in range(cm.n_layers):
        us, cols = [], []
        for path in PATHS:
            g = run.leaf[(path, layer)].grad
            assert g is not None
            us.append(torch.einsum("bthe,hde->bthd", g, cm.W_in(path)[layer]))
            cols += graph.reader_columns(layer, path)
        u = torch.cat(us, dim=2)  # [B, T, R_l, d]
        x = run.attn_in_[layer]
        xr = x[:, :, None, :].expand(-1, -1, u.shape[2], -1).clone().requires_grad_(True)
        with torch.enable_grad():
            y = cm.norm(layer, xr)
            (grad,) = torch.autograd.grad(y, xr, grad_outputs=u.to(y.dtype))
        out[cols[0]: cols[-1] + 1] = grad.permute(2, 0, 1, 3).float()
        if cm.has_mlp:
            g = run.leaf[("MLP", layer)].grad
            assert g is not None
            out[graph.reader_columns(layer, "MLP")[0]] = g.float()
    g = run.leaf[("logits", None)].grad
    assert g is not None
    out[-1] = g.float()
    return out


def _forward_metric(cm: CircuitModel, ids: torch.Tensor, probe: Probe, answer: torch.Tensor,
                    distractor: torch.Tensor) -> torch.Tensor:
    return logit_diff(cm.forward(ids, probe), answer, distractor)


def check_method(method: str, steps: int) -> tuple[str, int]:
    if method not in METHODS:
        raise InvalidInput(f"unknown method {method!r}; allowed: {list(METHODS)}",
                           allowed=list(METHODS))
    if isinstance(steps, bool) or not isinstance(steps, int) or not 1 <= steps <= CIRCUIT_STEPS_MAX:
        raise InvalidInput(f"steps must be an integer in 1..{CIRCUIT_STEPS_MAX}, got {steps!r}")
    return method, (1 if method == "eap" else steps)


def attribute(model: Any, task: Task, *, method: str = DEFAULT_METHOD,
              steps: int = DEFAULT_STEPS,
              batch_size: int = 8, progress: Progress | None = None) -> CircuitAttribution:
    """Every edge's EAP (``method="eap"``) or EAP-IG (``"eap-ig"``, ``steps`` m) score on
    ``task`` (module docstring), and the task's metrics.

    model: the demo model, a TransformerBridge, a pattern source with a ``bridge`` or a
    LoadedModel; batch_size: prompt pairs per forward (grouped by length, no padding);
    progress(fraction, message). UnsupportedModel when the model cannot be traced."""
    method, steps = check_method(method, steps)
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise InvalidInput(f"batch_size must be a positive integer, got {batch_size!r}")
    cm = circuit_model(model)
    graph = build_graph(cm)
    groups = batches(task, batch_size)
    N = task.n_pairs
    S = torch.zeros(len(graph.writers), len(graph.readers), dtype=torch.float64)
    clean_m = torch.zeros(N, dtype=torch.float64)
    corrupt_m = torch.zeros(N, dtype=torch.float64)
    total = len(groups) * (1 + steps)
    done = 0

    def tick(message: str) -> None:
        nonlocal done
        done += 1
        if progress is not None:
            progress(done / total, message)

    dev = cm.device
    for g, rows in enumerate(groups):
        clean = torch.tensor([task.clean[i] for i in rows], device=dev)
        corrupt = torch.tensor([task.corrupt[i] for i in rows], device=dev)
        ans = torch.tensor([task.answer[i] for i in rows], device=dev)
        dis = torch.tensor([task.distractor[i] for i in rows], device=dev)
        where = f"batch {g + 1}/{len(groups)}"
        c_run = Capture()
        with torch.no_grad():
            clean_m[rows] = _forward_metric(cm, clean, c_run, ans, dis).double().cpu()
        tick(f"{where}: clean forward")
        D: torch.Tensor | None = None
        x0_corrupt: torch.Tensor | None = None
        for k in range(steps):
            assert c_run.x0 is not None
            x0 = None
            if k:
                assert x0_corrupt is not None
                x0 = x0_corrupt + (k / steps) * (c_run.x0 - x0_corrupt)
            run = Capture(leaves=True, x0=x0)
            with torch.enable_grad():
                m = _forward_metric(cm, corrupt, run, ans, dis)
                leaves = list(run.leaf.values())
                grads = torch.autograd.grad(m.sum() / N, leaves)
            for leaf, grad in zip(leaves, grads, strict=True):
                leaf.grad = grad
            if k == 0:
                x0_corrupt = run.x0
                corrupt_m[rows] = m.detach().double().cpu()
                with torch.no_grad():
                    D = (writes(cm, graph, c_run, c_run) - writes(cm, graph, run, c_run))
                    D = D.reshape(D.shape[0], -1).double()
            assert D is not None
            with torch.no_grad():
                G = reader_gradients(cm, graph, run)
                S += (D @ G.reshape(G.shape[0], -1).double().T).cpu() / steps
            for leaf in leaves:
                leaf.grad = None
            tick(f"{where}: " + ("corrupt forward and backward" if steps == 1 else
                                 f"gradient step {k + 1}/{steps}"))
        del D
    w_idx, r_idx = graph.valid.nonzero(as_tuple=True)
    metrics = TaskMetrics(clean=float(clean_m.mean()), corrupt=float(corrupt_m.mean()),
                          clean_accuracy=float((clean_m > 0).double().mean()),
                          corrupt_accuracy=float((corrupt_m > 0).double().mean()), n_pairs=N,
                          ability=decide(clean_m, corrupt_m, units(task)))
    return CircuitAttribution(graph=graph, writer=w_idx, reader=r_idx, scores=S[w_idx, r_idx],
                              metrics=metrics, method=method, steps=steps, task=task.name,
                              task_hash=task.content_hash(), layer_indices=cm.layer_indices)


__all__ = ["DEFAULT_METHOD", "DEFAULT_STEPS", "METHODS", "Capture", "CircuitAttribution", "Graph", "Node",
           "TaskMetrics", "attribute", "build_graph", "check_method", "reader_gradients",
           "writes"]
