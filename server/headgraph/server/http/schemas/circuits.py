"""GET/POST /api/tasks and GET /api/circuit: tasks and their circuits."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, Field


class TaskSummary(BaseModel):
    name: str
    bundled: bool = Field(description="shipped with headgraph (its prompts are built for each "
                                      "model's tokenizer); false: uploaded as JSONL")
    description: str
    n_rows: int | None = Field(description="prompt pairs")
    content: str | None = Field(description="an uploaded task's content hash (sha256-...), "
                                            "part of its circuits' cache keys; null: bundled")


class TaskList(BaseModel):
    tasks: list[TaskSummary]


class SignTestOut(BaseModel):
    wins: int = Field(description="units for (the answer wins / clean minus corrupt is positive)")
    n: int = Field(description="units decided (a split mirrored unit is a tie, left out of the "
                               "answer test)")
    p: float = Field(description="one-sided exact binomial p-value P(X >= wins), X ~ Bin(n, 1/2); "
                                 "1 when n = 0")


class AbilityOut(BaseModel):
    able: bool | None = Field(description="both tests give p <= alpha; null: too few units for "
                                          "any test to reach alpha")
    state: str = Field(description="'able' | 'not_able' | 'too_few_pairs'")
    rule: str = Field(description="the rule in words")
    alpha: float
    min_units: int = Field(description="the fewest units that could reach alpha (5 at 0.05); fewer: "
                                       "too few pairs to tell")
    n_pairs: int = Field(description="prompt pairs read: every pair of a bundled task (32), "
                                     "however few the circuit ran on; every row of an uploaded one")
    n_units: int = Field(description="test units: prompt pairs, a pair and its mirror (clean and "
                                     "corrupt swapped) counted once")
    n_mirrored: int = Field(description="units that are a pair and its mirror")
    answer: SignTestOut = Field(description="(a) on clean prompts the answer beats the distractor")
    follows: SignTestOut = Field(description="(b) clean minus corrupt logit difference is positive")


class TaskMetricsOut(BaseModel):
    clean: float | None = Field(description="mean logit difference answer - distractor at the "
                                            "last position, clean prompts")
    corrupt: float | None
    clean_accuracy: float | None = Field(description="share of clean prompts whose answer "
                                                     "beats the distractor")
    corrupt_accuracy: float | None
    n_pairs: int
    gap: float | None = Field(description="clean - corrupt")
    able: bool | None = Field(description="the model does the task (ability's paired sign tests "
                                          "over the task's prompt pairs); false: its circuit "
                                          "explains little; null: too few pairs to tell")
    ability: AbilityOut = Field(description="the test behind able: its rule, p-values and units")


class CircuitEdge(BaseModel):
    rank: int = Field(description="1 = the largest |score|")
    writer: str = Field(description="'embed', a head 'L3H2' or an MLP 'L3MLP'")
    reader: str = Field(description="'L5H1.Q', a K / V input ('L5KV0.K' on grouped-query "
                                    "models, one per KV group), 'L5MLP' or 'logits'")
    path: str = Field(description="Q | K | V | MLP | logits")
    writer_kind: str
    writer_layer: int | None = Field(description="attention-layer position (not the block "
                                                 "number); null for embed")
    writer_head: int | None
    reader_layer: int | None
    reader_head: int | None = Field(description="a query head (Q) or a KV head (K, V)")
    score: float | None = Field(description="attribution in metric units: the estimated change "
                                            "of the metric when this edge alone goes from "
                                            "corrupt to clean")
    in_circuit: bool = Field(description="among the circuit's circuit_size edges")


class FaithfulnessOut(BaseModel):
    sizes: list[int] = Field(description="circuit sizes n (the top-n edges by |score|)")
    metrics: list[float | None] = Field(description="mean metric with only those edges clean")
    recovered: list[float | None] = Field(description="(metric - corrupt) / (clean - corrupt)")
    clean: float | None
    corrupt: float | None
    share: float
    circuit_size: int | None = Field(description="the smallest n reaching share; null: none")
    total_edges: int
    ablation: str = Field(description="'corrupt': an edge outside the circuit carries its "
                                      "writer's corrupt output (real intervention)")


class MibOut(BaseModel):
    cpr: float | None = Field(description="MIB's circuit performance ratio: area under the "
                                          "faithfulness f at fractions 0.001..1 of all edges "
                                          "(trapezoid, x the fraction; 0.999 when f = 1 "
                                          "throughout); higher is better")
    cmd: float | None = Field(description="MIB's circuit-model distance: area under |1 - f| "
                                          "over the same fractions; lower is better")
    fractions: list[float] = Field(description="MIB's grid: 0.001, 0.002, 0.005, ..., 0.5, 1")
    sizes: list[int] = Field(description="edges kept at each fraction: int(fraction * "
                                         "n_edges), as MIB")
    faithfulness: list[float | None] = Field(description="f = (M(top-n) - M(no edge)) / "
                                                         "(clean - M(no edge)) at each size")


class MibNode(BaseModel):
    in_graph: bool


class MibEdge(BaseModel):
    score: float
    in_graph: bool


class MibFileOut(BaseModel):
    cfg: dict[str, Any] = Field(description="n_layers, n_heads, parallel_attn_mlp (false), "
                                            "n_key_value_heads")
    nodes: dict[str, MibNode] = Field(description="'input', 'a{L}.h{H}' (one per query head), "
                                                  "'m{L}', 'logits'")
    edges: dict[str, MibEdge] = Field(description="'a0.h1->a3.h2<q>' (<k>, <v>; none into "
                                                  "m{L} or logits): score (a KV head's K / V "
                                                  "score divided equally among its query "
                                                  "heads) and in_graph")


class PatchedEdge(BaseModel):
    writer: str
    reader: str
    score: float | None
    patched: float | None = Field(description="metric change when only this edge is patched "
                                              "from corrupt to clean (real intervention)")


class PatchingOut(BaseModel):
    n_edges: int
    spearman: float | None = Field(description="rank correlation of score and patched over "
                                               "the sample; null with a constant side")
    edges: list[PatchedEdge]


class CircuitOut(BaseModel):
    model: str
    task: dict[str, Any] = Field(description="name, description, n_pairs, hash (of its token "
                                             "ids), lengths, examples")
    bundled: bool
    content: str
    method: str = Field(description="eap | eap-ig")
    steps: int
    metrics: TaskMetricsOut
    n_edges: int
    layer_indices: list[int]
    share: float = Field(description="the share of the metric gap the circuit recovers")
    circuit_size: int | None
    edges: list[CircuitEdge] = Field(description="the top edges by |score|")
    circuit: list[CircuitEdge] = Field(description="the circuit's edges (the top circuit_size)")
    faithfulness: FaithfulnessOut
    patching: PatchingOut
    mib: MibOut | None = Field(None, description="MIB scores (Mueller et al. 2025) of the "
                                                 "ranking; null when the clean and no-edge "
                                                 "metrics are equal")
    lookup: list[CircuitEdge] = Field(default_factory=list,
                                      description="the edges asked for by edge= (rank among "
                                                  "all edges); an edge the graph lacks is left "
                                                  "out")


class CircuitProgressOut(BaseModel):
    model: str
    task: str
    method: str
    steps: int
    state: str = Field(description="cached: GET /api/circuit answers at once; running: a "
                                   "computation reports stage and fraction; idle: none runs "
                                   "(not asked yet, or its model is still loading)")
    stage: str | None = Field(description="load | attribution | faithfulness | patching | "
                                          "store (running only)")
    fraction: float | None = Field(description="share of the whole run done, in [0, 1]")
    message: str | None
    elapsed_s: float | None = Field(description="seconds since the run started")
