"""Every bound the server puts on one request, each under one name that says what it bounds.

Computations, services, routers and the CLI read their bounds from here (core's own, which core
enforces itself, are defined in headgraph.core.names and re-exported here), so an HTTP query
parameter, a CLI option and the check behind both can never disagree. ``GET /api/vocabulary``
serves every one in its ``limits`` object under its name lower-cased (:func:`published`), where
the dashboard reads them. A request past a limit is a 422 (a body past its size, a 413).
"""

from __future__ import annotations

from headgraph.core.names import (
    CIRCUIT_STEPS_MAX,
    GRAPH_K_MAX,
    SUBGRAPH_CAP_MAX,
    SUBGRAPH_DEPTH_MAX,
    SUBGRAPH_HEADS_MAX,
    TASK_ROWS_MAX,
    TASK_TOKENS_MAX,
    THRESHOLD_EDGES_MAX,
)

# -- graphs and rankings ------------------------------------------------------------------------
THRESHOLD_MAGNITUDE_MAX = 1e6  # |threshold| of a graph: finite, and far past the scales of the scores
TIMELINE_EDGES_MAX = 50  # edges one timeline follows across its checkpoints: one line each in one chart
TIMELINE_SERIES_MAX = 64  # checkpoints one timeline reads: each is one model's cached scores

# -- measurements that run forward passes ------------------------------------------------------
ABLATION_TOP_MAX = 50  # edges one path-ablation request patches: each costs a few forward passes
VALIDATION_SAMPLE_MAX = 1000  # random pairs one validation ablates: each costs a few forward passes
VALIDATION_TOP_MAX = 20  # top pairs per metric one validation ablates besides the sample (six metrics)

# -- circuits and recovery ---------------------------------------------------------------------
CIRCUIT_TOP_MAX = 2000  # edges one circuit answer lists: as many as a thresholded graph keeps
CIRCUIT_LOOKUP_MAX = 50  # edges one GET /api/circuit looks up by name (edge=): a short list typed by hand
CIRCUIT_PAIRS_MIN = 2  # the fewest prompt pairs a bundled task is cut to (a quick look at a large model)
CIRCUIT_PAIRS_MAX = 32  # the most: every prompt pair of a bundled task (the default)
RECOVERY_K_MAX = 200  # top edges per metric a recovery table compares with its reference (a table read row by row)
RECOVERY_HEADS_MAX = 4096  # heads in one reference set: four times a 7B model's 1024 heads
RECOVERY_EDGES_MAX = 100_000  # edges in one reference edge set: a tenth of a 7B model's million head pairs

# -- uploads and bodies ------------------------------------------------------------------------
LABEL_UPLOAD_BYTES_MAX = 1 << 20  # one uploaded label set: thousands of heads' classes fit in a MiB
TASK_UPLOAD_BYTES_MAX = 1 << 20  # one uploaded task (JSONL): TASK_ROWS_MAX rows of short prompts fit in a MiB
API_BODY_BYTES_MAX = 2 << 20  # any body under /api, refused before it is buffered: the uploads above and their form
PAGE_BODY_BYTES_MAX = 4 << 20  # a dashboard callback's body: an uploaded 1 MiB file travels as base64 inside JSON

__all__ = [
    "ABLATION_TOP_MAX", "API_BODY_BYTES_MAX", "CIRCUIT_LOOKUP_MAX", "CIRCUIT_PAIRS_MAX", "CIRCUIT_PAIRS_MIN",
    "CIRCUIT_STEPS_MAX", "CIRCUIT_TOP_MAX", "GRAPH_K_MAX", "LABEL_UPLOAD_BYTES_MAX", "PAGE_BODY_BYTES_MAX",
    "RECOVERY_EDGES_MAX", "RECOVERY_HEADS_MAX", "RECOVERY_K_MAX", "SUBGRAPH_CAP_MAX", "SUBGRAPH_DEPTH_MAX",
    "SUBGRAPH_HEADS_MAX", "TASK_ROWS_MAX", "TASK_TOKENS_MAX", "TASK_UPLOAD_BYTES_MAX", "THRESHOLD_EDGES_MAX",
    "THRESHOLD_MAGNITUDE_MAX", "TIMELINE_EDGES_MAX", "TIMELINE_SERIES_MAX", "VALIDATION_SAMPLE_MAX",
    "VALIDATION_TOP_MAX", "published",
]


def published() -> dict[str, int | float]:
    """Every limit above by its name lower-cased (``recovery_k_max``), as ``GET /api/vocabulary``
    serves them in ``limits``."""
    values = globals()
    return {name.lower(): values[name] for name in __all__ if name.isupper()}
