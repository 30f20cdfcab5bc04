"""Hubs of a head graph: degree, weighted degree, PageRank and betweenness per node.

The paper (Yamagiwa et al. 2026, Sec. "graph") reads the directed PK graph of GPT-2 small
(OQ/OK/OV, top-20 edges each) and finds L4H7 as its hub; ``core.graphs.build.check_paper_hub``
rebuilds exactly that graph from any model's weights and returns its top-ranked node. This
module reads graphs only (it imports nothing that builds them), so it has no import cycle.

Ties are shown as ties: ``rank`` is the full order (degree, then weighted degree, then name),
``degree_rank`` the competition rank by degree alone (1, 1, 3, ...) and ``tie`` says whether
another node has the same degree; ``top_tie`` names every node sharing the top degree. With
head flags (core.activations.flags, from attention-pattern scores) each row says what its head does
(``description``: identity, previous-token, sink, duplicate, induction or unclassified) and
whether it is an attention sink; without them both are None ("not measured").
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import networkx as nx

from headgraph.core.activations.flags import DESCRIBE_RULE, HeadFlags

HUB_STD = 2.0
# Exact betweenness costs ~ nodes * edges; above this it is estimated from sampled pivots.
BETWEENNESS_EXACT_WORK = 20_000_000
HUB_RULE = ("hub = total degree > mean + 2 std of total degree over the graph's nodes "
            "(population std), or the top-ranked node; ranking = total degree, ties by "
            "weighted degree (sum of edge scores), then node name")


@dataclass(frozen=True)
class HubRow:
    """Centrality of one node. Degrees count parallel edges (one per pairing), as nx does."""

    name: str
    rank: int  # 1-based
    in_degree: int
    out_degree: int
    degree: int
    weighted_degree: float  # sum of "score" over in- and out-edges
    pagerank: float  # nx.pagerank, weight = score
    betweenness: float  # nx.betweenness_centrality (unweighted, normalized)
    is_hub: bool
    degree_rank: int = 0  # 1 + number of nodes with a strictly larger degree (shared by ties)
    tie: bool = False  # another node has the same degree
    description: str | None = None  # what the head does (core.activations.flags); None: not measured
    sink: bool | None = None  # attention sink (core.activations.flags); None: not measured


@dataclass(frozen=True)
class HubTable:
    """All nodes ranked (``rows``), the first ``top`` of them, and the hub rule applied."""

    rows: tuple[HubRow, ...]
    top: tuple[HubRow, ...]
    rule: str
    threshold: float  # mean + 2 std of total degree
    betweenness_exact: bool = True  # False: estimated from sampled source nodes (seed 0)
    describe_rule: str | None = None  # core.activations.flags.DESCRIBE_RULE when rows carry descriptions

    @property
    def hubs(self) -> list[str]:
        """Names of the nodes called hubs, in rank order."""
        return [r.name for r in self.rows if r.is_hub]

    @property
    def top_hub(self) -> str | None:
        """Name of the top-ranked node (None for an empty graph)."""
        return self.rows[0].name if self.rows else None

    def row(self, name: str) -> HubRow:
        """The row of one node."""
        for r in self.rows:
            if r.name == name:
                return r
        raise KeyError(name)

    def to_dict(self) -> dict[str, Any]:
        """JSON form: rule, threshold, hubs, top_tie, describe_rule (None without flags) and
        the ranked rows."""
        threshold = None if math.isnan(self.threshold) else self.threshold  # strict JSON
        return {"rule": self.rule, "threshold": threshold, "hubs": self.hubs,
                "betweenness_exact": self.betweenness_exact,
                "top_tie": self.top_tie, "describe_rule": self.describe_rule,
                "rows": [asdict(r) for r in self.rows], "top": [r.name for r in self.top]}

    @property
    def top_tie(self) -> list[str]:
        """Names of every node sharing the top degree (one name when the top is not tied)."""
        return [r.name for r in self.rows if r.degree_rank == 1]


def _what(g: nx.DiGraph, n: Any, flags: HeadFlags | None) -> tuple[str | None, bool | None]:
    """(description, sink) of a node from head flags; (None, None) without flags."""
    if flags is None:
        return None, None
    members = g.nodes[n].get("heads")
    heads = str(members).split(",") if members else None
    return flags.describe(str(n), heads), flags.is_sink(str(n), heads)


def hub_table(graph: Any, *, top: int = 10, flags: HeadFlags | None = None) -> HubTable:
    """Rank the nodes of a (Multi)DiGraph (or a HeadGraph) by degree and call hubs.

    Degrees and weights come from NetworkX itself (``graph.degree``, weight = edge "score").
    Betweenness is exact unless nodes * edges > BETWEENNESS_EXACT_WORK (then sampled pivots,
    seed 0; ``betweenness_exact`` says which). Ties: module docstring. ``flags`` (core.activations.flags
    .head_flags) describes each node's head(s); node names are head names ("L4H7", "L6KV1",
    "L4H7 O"), a node's "heads" attribute naming the query heads it stands for.
    """
    g: nx.DiGraph = graph if isinstance(graph, nx.DiGraph) else graph.graph
    nodes = list(g.nodes)
    if not nodes:
        return HubTable(rows=(), top=(), rule=HUB_RULE, threshold=math.nan)
    deg = dict(g.degree())
    ind = dict(g.in_degree())
    outd = dict(g.out_degree())
    wdeg = dict(g.degree(weight="score"))
    n_edges = g.number_of_edges()
    pr = nx.pagerank(g, weight="score") if n_edges else {n: 1.0 / len(nodes) for n in nodes}
    exact = len(nodes) * max(n_edges, 1) <= BETWEENNESS_EXACT_WORK
    pivots = None if exact else max(1, min(len(nodes), BETWEENNESS_EXACT_WORK // n_edges))
    btw = nx.betweenness_centrality(g, k=pivots, seed=None if exact else 0)
    vals = [float(deg[n]) for n in nodes]
    mean = sum(vals) / len(vals)
    std = math.sqrt(sum((v - mean) ** 2 for v in vals) / len(vals))
    threshold = mean + HUB_STD * std
    order = sorted(nodes, key=lambda n: (-deg[n], -float(wdeg[n]), str(n)))
    first_at: dict[int, int] = {}
    for i, n in enumerate(order):
        first_at.setdefault(int(deg[n]), i + 1)
    same = {d: sum(1 for n in nodes if int(deg[n]) == d) for d in first_at}
    rows = []
    for i, n in enumerate(order):
        description, sink = _what(g, n, flags)
        rows.append(HubRow(name=str(n), rank=i + 1, in_degree=int(ind[n]), out_degree=int(outd[n]),
                           degree=int(deg[n]), weighted_degree=float(wdeg[n]),
                           pagerank=float(pr[n]), betweenness=float(btw[n]),
                           is_hub=bool(i == 0 or deg[n] > threshold),
                           degree_rank=first_at[int(deg[n])], tie=same[int(deg[n])] > 1,
                           description=description, sink=sink))
    rows_t = tuple(rows)
    return HubTable(rows=rows_t, top=rows_t[: max(int(top), 0)], rule=HUB_RULE,
                    threshold=threshold, betweenness_exact=exact,
                    describe_rule=None if flags is None else DESCRIBE_RULE)
