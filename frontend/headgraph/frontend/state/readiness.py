"""What each view renders from, and when its model's results are ready for it.

A view (a figure block or a side panel) renders from a few fields of the URL's
:class:`~headgraph.frontend.state.url.ViewState` (``VIEW_PARAMS``) and the model bar's ready record:
``view_params`` gives them, or None while the view is hidden or its results are not cached yet
(``is_ready``: the whole job, or every stage of a running job's plan it reads). Pure, like state.py.
"""

from __future__ import annotations

from typing import Any

from headgraph.frontend.state.url import DEFAULT_TASK, PATTERN_OVERLAY, ViewState

VIEW_PARAMS: dict[str, tuple[str, ...]] = {
    "graph": ("model", "pairings", "k", "rule", "rank_on", "threshold_on", "threshold", "layout", "overlay",
              "head", "pair", "pairing", "verification", "layers", "find", "pins", "task", "method", "steps", "pairs"),
    "heatmap": ("model", "pairing", "metric", "overlay", "grain", "zoom"),
    "head-grid": ("model", "pairing", "metric", "direction"),
    "scatter": ("model", "pairing", "top_percent"),
    "reference": ("model", "pairing"),
    "tokens": ("model", "role", "overlay"),
    # GET /api/validation?cached=true of the pairing (the API's n, k and seed): read only.
    "validation": ("model", "pairing"),
    # GET /api/recovery of the pairing, the class overlay's label set as the reference, top-k.
    "recovery": ("model", "pairing", "overlay", "k"),
    # GET /api/compare of A (or the model) and B; GET /api/timeline of the series (k <= 50).
    "compare": ("model", "a", "b", "pairing", "k"),
    "timeline": ("series", "pairing", "k", "checkpoint"),
    # GET /api/circuit of the task, method and steps (its top k edges): computed on request.
    "task": ("model", "task", "method", "steps", "k", "pairs"),
    # GET /api/subgraph of the pinned heads (edges among them), drawn with their groups and labels.
    "subgraph": ("model", "pairings", "metric", "overlay", "pins", "groups", "labels"),
    # the panel's pin link carries the pins, groups and labels: it is redrawn when they change
    "head-panel": ("model", "head", "overlay", "pins", "groups", "labels"),
    # The chosen task's circuit (task, method, steps) marks the graph and the pair panel.
    "pair-panel": ("model", "pairing", "pair", "overlay", "task", "method", "steps", "pairs"),
}
# Views the browser-side router feeds (callbacks/router.py): each renders from its own stores
# ``in-<view>-<part>``, written only while the view is shown.
ROUTED_VIEWS: tuple[str, ...] = tuple(VIEW_PARAMS)
ROUTED_PARTS: tuple[str, ...] = ("search", "ready", "labels", "rendered")
# The tab each figure block belongs to (panels show on every tab).
TAB_OF = {"graph": "graph", "heatmap": "heatmap", "head-grid": "heatmap", "scatter": "scatter",
          "reference": "reference", "tokens": "tokens", "validation": "validation",
          "recovery": "recovery", "compare": "compare", "timeline": "timeline", "task": "task",
          "subgraph": "subgraph"}
# Views that read no result of the model's job (only their own cache entries): they render
# while it runs, or with no job at all, never waiting for the ready record.
JOB_FREE_VIEWS: tuple[str, ...] = ("validation", "compare", "timeline", "task")


def focus_head(state: ViewState) -> str | None:
    """The head the head grid is about: the selected head, else the selected pair's end."""
    if state.head:
        return state.head
    if state.pair:
        return state.pair[0] if state.direction == "out" else state.pair[1]
    return None


def needed_stages(state: ViewState, view: str) -> tuple[str, ...] | None:
    """Job stages (names, or prefixes ending in a blank) whose results ``view`` reads; None
    for a view that waits for the whole job. The panels need PK and CS (and the class
    overlay's pattern scores): the rest they show when cached, naming what is pending."""
    base = ("pk", "pk ", "cs ")
    overlay = ("patterns",) if state.overlay == PATTERN_OVERLAY else ()
    if view in ("head-panel", "pair-panel"):
        return base + overlay
    if view == "graph":
        scale = state.threshold_on if state.rule == "threshold" else state.rank_on
        extra = {"z": ("z ",), "fdr": ("null ",)}.get(scale, ())
        return base + overlay + extra
    if view in ("heatmap", "head-grid"):
        extra = (f"z {state.pairing}",) if state.metric == "z" else ()
        return base + (overlay if view == "heatmap" else ()) + extra
    if view == "scatter":
        return base
    if view == "reference":
        return ("reference", "null ")
    if view == "tokens":
        return ("tokens ", "patterns")
    if view == "recovery":  # PK and CS from the job; CKA / Procrustes are the request's own
        return base + overlay
    if view == "subgraph":
        return base + overlay + (("z ",) if state.metric == "z" else ())
    return None


def is_ready(state: ViewState, ready: dict[str, Any] | None, view: str | None = None) -> bool:
    """True when ``ready`` (the model-status callback's record) says what ``view`` reads exists:
    the whole job is done, or (a running job's partial record) every stage of its plan that
    ``view`` needs is cached."""
    if not (ready and ready.get("model") == state.model and ready.get("token")):
        return False
    if not ready.get("partial"):
        return True
    needs = None if view is None else needed_stages(state, view)
    if needs is None:
        return False
    done = set(ready.get("computed") or ())
    required = [s for s in ready.get("plan") or ()
                if any(s == n or (n.endswith(" ") and s.startswith(n)) for n in needs)]
    return bool(required) and all(s in done for s in required)


def waiting_for(state: ViewState, ready: dict[str, Any] | None, view: str) -> str:
    """What ``view`` waits for, in words: the stages of the model's running job it reads that
    are not cached yet ("waiting for z OQ, z OK (being computed: see the progress bar)"), or
    the model's results in general while there is no job record."""
    if not (ready and ready.get("model") == state.model and ready.get("partial")):
        return "waiting for the model's results (see the progress bar above)…"
    needs = needed_stages(state, view)
    done = set(ready.get("computed") or ())
    plan = list(ready.get("plan") or ())
    missing = [s for s in plan if s not in done and (needs is None or any(
        s == n or (n.endswith(" ") and s.startswith(n)) for n in needs))]
    if not missing:
        return "waiting for the model's results (see the progress bar above)…"
    shown = ", ".join(missing[:4]) + (f" and {len(missing) - 4} more" if len(missing) > 4 else "")
    return f"waiting for {shown} (the model's job computes them: see the progress bar above)…"


def ready_token(ready: dict[str, Any] | None) -> str | None:
    """The token a view renders with: one per job while it runs (a view shown early renders
    again only once, when the job is done), the job's own when done."""
    token = (ready or {}).get("token")
    if token and (ready or {}).get("partial"):
        return str(token).split(":", 1)[0] + ":partial"
    return token


def view_params(state: ViewState, view: str, ready: dict[str, Any] | None) -> dict[str, Any] | None:
    """The parameters ``view`` (a figure block or a panel) renders from, or None.

    None when the view is not shown (another tab; a panel with nothing selected) or its
    model's results are not ready yet (a JOB_FREE_VIEWS view never waits: its ready token is
    None until the model bar has a record of its model). The dict carries the ready token so
    a recompute shows.
    """
    if view in TAB_OF and TAB_OF[view] != state.view:
        return None
    if (view == "head-panel" and not state.head) or (view == "pair-panel" and not state.pair):
        return None
    if view not in JOB_FREE_VIEWS and not is_ready(state, ready, view):
        return None
    d = state.to_dict()
    out = {f: d[f] for f in VIEW_PARAMS[view]}
    if view == "task":
        out["task"] = out["task"] or DEFAULT_TASK
    if view == "head-grid":
        out["head"] = focus_head(state)
    own = bool(ready) and (ready or {}).get("model") == state.model
    out["ready"] = ready_token(ready) if own or view not in JOB_FREE_VIEWS else None
    return out
