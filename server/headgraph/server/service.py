"""The Service facade: one object with every cached computation per model.

What every endpoint, job and CLI command reads. The work lives in focused modules, each a
layer over the one below (composed here by inheritance, no logic in this file):

- server/modelcache.py: model resolution, loading, identity and the single-flight cache;
- server/results.py: cached core computations (PK, CS, z, nulls, reference, tokens, patterns);
- server/labelsets.py: built-in, uploaded and per-model "patterns" label sets;
- server/views.py: metric grids, top-k tables and the PK-vs-CS scatter;
- server/graphs.py: the head graph, hubs and GraphML / GEXF exports;
- server/details.py: one pair's and one head's detail;
- server/params.py: pairing / order / role / mode names and checks.

The names other code imports from here (constants, checks, CACHE_ONLY, ColdMiss) are
re-exported below so ``from headgraph.server.service import ...`` keeps working.
"""

from __future__ import annotations

from headgraph.server.details import Details
from headgraph.server.graphs import Graphs
from headgraph.server.labelsets import (PATTERN_LABEL_CLASSES, PATTERN_LABEL_DESCRIPTION,
                                        PATTERN_LABEL_THRESHOLDS, PATTERN_LABELS, hash_classes,
                                        label_key)
from headgraph.server.modelcache import (CACHE_ONLY, PROCESSING, ColdMiss, Identity, ModelCache,
                                         info_from_dict)
from headgraph.server.params import (GRAPH_PAIRINGS, PAIRINGS, PAIRINGS_PATTERN, ModeName,
                                     PairingName, RoleName, check_mode, check_order,
                                     check_pairing, check_role, cs_mode_of, parse_pairings)
from headgraph.server.results import (FDR_ALPHA, KL_SAMPLES, NULL_SAMPLES, TOKENS_CACHED_K,
                                      Results)
from headgraph.server.views import Views

__all__ = [
    "CACHE_ONLY",
    "FDR_ALPHA",
    "GRAPH_PAIRINGS",
    "KL_SAMPLES",
    "NULL_SAMPLES",
    "PAIRINGS",
    "PAIRINGS_PATTERN",
    "PATTERN_LABELS",
    "PATTERN_LABEL_CLASSES",
    "PATTERN_LABEL_DESCRIPTION",
    "PATTERN_LABEL_THRESHOLDS",
    "PROCESSING",
    "TOKENS_CACHED_K",
    "ColdMiss",
    "Identity",
    "ModeName",
    "ModelCache",
    "PairingName",
    "Results",
    "RoleName",
    "Service",
    "check_mode",
    "check_order",
    "check_pairing",
    "check_role",
    "cs_mode_of",
    "hash_classes",
    "info_from_dict",
    "label_key",
    "parse_pairings",
]


class Service(Details, Graphs, Views):
    """Model resolution, loading (per-process LRU) and every cached computation.

    ``Service(settings, store=None, *, inline=False)``; see ModelCache for inline vs compute
    processes.
    """
