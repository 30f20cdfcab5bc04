"""headgraph.core: attention-head affinity from weights (Projection Kernel, Composition Score).

Pure torch computation, no web. The public API is this flat namespace (``__all__``); every
name lives in a topic package, imported on first use so that ``import headgraph.core`` stays
cheap::

    import headgraph.core as hg
    heads = hg.load_heads("demo")            # hub name, local folder, GGUF, "random:...", "demo"
    ok = hg.projection_kernel(heads, "OK")   # .scores/.normalized/.valid [Ls, Hs, Lt, Ht]
    cs = hg.composition_score(heads, "K")
    graph = hg.build_graph({"OK": ok}, k=20)

Packages (each imports only those listed after it): ``graphs`` (head graphs, hubs, label
sets, diffs, timelines), ``activations`` (pattern scores, path ablation, data-weighted PK,
validation), ``readout`` (token names of subspaces), ``stats`` (Haar reference, nulls, FDR),
``scores`` (subspaces, overlaps, PK, CS, rankings), ``models`` (loading every kind of model);
and the base modules ``types``, ``names`` (roles, pairings, head labels) and ``errors``.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

# public name -> the module defining it
_HOME = {
    # models
    "load_heads": "models.loading", "load_model": "models.loading", "LoadedModel": "models.loading",
    # scores
    "projection_kernel": "scores.pk", "all_pairings": "scores.pk", "pair_detail": "scores.pk",
    "composition_score": "scores.composition_score", "role_bases": "scores.subspaces",
    "top_pairs": "scores.ranking", "spearman": "scores.ranking", "compare_metrics": "scores.ranking",
    "kv_level_cs": "scores.ranking",
    # stats
    "kl_grid": "stats.reference", "zscores": "stats.reference", "haar_moments": "stats.reference",
    "anisotropic_null": "stats.nulls", "pair_pvalues": "stats.nulls",
    "benjamini_hochberg": "stats.nulls",
    # readout
    "top_tokens": "readout.tokens",
    # activations
    "pattern_scores": "activations.patterns", "path_ablation": "activations.ablation",
    "data_weighted_pk": "activations.data_pk",
    # graphs
    "build_graph": "graphs.build", "hub_table": "graphs.hubs", "parse_label_set": "graphs.labels",
    "builtin_label_sets": "graphs.labels",
    # base
    "HeadWeights": "types", "ModelInfo": "types", "PairScores": "types",
    "head_label": "names", "HeadRef": "names", "PAIRINGS": "names", "GRAPH_PAIRINGS": "names",
    "ROLES": "names",
    "HeadgraphError": "errors", "InvalidInput": "errors", "UnsupportedModel": "errors",
    "ModelUnavailable": "errors", "PathNotAllowed": "errors",
}
__all__ = [
    "GRAPH_PAIRINGS",
    "PAIRINGS",
    "ROLES",
    "HeadRef",
    "HeadWeights",
    "HeadgraphError",
    "InvalidInput",
    "LoadedModel",
    "ModelInfo",
    "ModelUnavailable",
    "PairScores",
    "PathNotAllowed",
    "UnsupportedModel",
    "__version__",
    "all_pairings",
    "anisotropic_null",
    "benjamini_hochberg",
    "build_graph",
    "builtin_label_sets",
    "compare_metrics",
    "composition_score",
    "data_weighted_pk",
    "haar_moments",
    "head_label",
    "hub_table",
    "kl_grid",
    "kv_level_cs",
    "load_heads",
    "load_model",
    "pair_detail",
    "pair_pvalues",
    "parse_label_set",
    "path_ablation",
    "pattern_scores",
    "projection_kernel",
    "role_bases",
    "spearman",
    "top_pairs",
    "top_tokens",
    "zscores",
]

if TYPE_CHECKING:
    from headgraph.core.activations.ablation import path_ablation
    from headgraph.core.activations.data_pk import data_weighted_pk
    from headgraph.core.activations.patterns import pattern_scores
    from headgraph.core.errors import (
        HeadgraphError,
        InvalidInput,
        ModelUnavailable,
        PathNotAllowed,
        UnsupportedModel,
    )
    from headgraph.core.graphs.build import build_graph
    from headgraph.core.graphs.hubs import hub_table
    from headgraph.core.graphs.labels import builtin_label_sets, parse_label_set
    from headgraph.core.models.loading import LoadedModel, load_heads, load_model
    from headgraph.core.names import GRAPH_PAIRINGS, PAIRINGS, ROLES, HeadRef, head_label
    from headgraph.core.readout.tokens import top_tokens
    from headgraph.core.scores.composition_score import composition_score
    from headgraph.core.scores.pk import all_pairings, pair_detail, projection_kernel
    from headgraph.core.scores.ranking import compare_metrics, kv_level_cs, spearman, top_pairs
    from headgraph.core.scores.subspaces import role_bases
    from headgraph.core.stats.nulls import anisotropic_null, benjamini_hochberg, pair_pvalues
    from headgraph.core.stats.reference import haar_moments, kl_grid, zscores
    from headgraph.core.types import HeadWeights, ModelInfo, PairScores


def __getattr__(name: str) -> Any:
    # Lazy, so importing one submodule (errors, names) does not load torch and TransformerLens.
    if name in _HOME:
        return getattr(importlib.import_module(f"headgraph.core.{_HOME[name]}"), name)
    raise AttributeError(f"module 'headgraph.core' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_HOME))
