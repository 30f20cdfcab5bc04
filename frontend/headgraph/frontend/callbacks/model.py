"""Model bar: model list, shape and cache state, the Compute job and its progress bar.

On a cold cache the job starts by itself; the views wait for ``ready-store`` (the model id and
a token that changes when new results land) and fill in when the job is done.
"""

from __future__ import annotations

import time
from typing import Any
from urllib.parse import parse_qs, urlparse

from dash import Input, Output, State, ctx, no_update

from headgraph.frontend.api.answers import Job
from headgraph.frontend.api.client import ApiClient, ApiError
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.callbacks.auth import auth_view
from headgraph.frontend.callbacks.common import UNAVAILABLE, api, state_of
from headgraph.frontend.callbacks.common import vocab as client_vocab
from headgraph.frontend.callbacks.define import callback

HIDDEN = {"display": "none"}


def page_data() -> dict[str, Any]:
    """What the page's layout brings along (layout.build_layout): the API's label sets and, when
    the model the page's link names (the layout request's Referer) is fully cached, its ready
    record, as the model bar would write it, the view that link opens (displayed at mount) and
    this browser's sign-in status (so no callback of the page load has to fetch it).
    Read for this browser's own credential; without the API's answer, only the view (the
    callbacks then fill the rest)."""
    import flask

    if not flask.has_request_context():
        return {}
    out: dict[str, Any] = {}
    referrer = urlparse(flask.request.referrer or "")
    link = state_of("?" + referrer.query) if referrer.netloc == flask.request.host else None  # this page's own
    if link is not None:
        out["view"] = link.view
    out["auth"] = auth_view()
    client = api()
    try:
        out["labels"] = client.labels()
        if link is not None:
            vocab = client_vocab()
            entry = next((m for m in client.models() if m["id"] == link.model), None)
            if entry and entry.get("status") != UNAVAILABLE and is_complete(entry.get("cached"), vocab.graph_pairings):
                out["ready"] = {"model": link.model, "token": entry.get("fingerprint") or link.model}
    except ApiError:
        pass
    return out


def cached_names(cached: list[str] | None) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    """Parsed cache entries ("pk?order=forward&pairing=OK") as (name, sorted params)."""
    out = set()
    for item in cached or []:
        name, _, query = item.partition("?")
        params = tuple(sorted((k, v[-1]) for k, v in parse_qs(query).items()))
        out.add((name, params))
    return out


def is_complete(cached: list[str] | None, pairings: tuple[str, ...]) -> bool:
    """True when what a full compute job stores for ``pairings`` (the graph pairings) is all
    in the cache."""
    have = cached_names(cached)
    names = {n for n, _ in have}
    if not {"reference", "patterns"} <= names:
        return False
    for p in pairings:
        for name in ("pk", "z", "null"):
            if not any(n == name and dict(params).get("pairing") == p
                       and dict(params).get("order", "forward") == "forward" for n, params in have):
                return False
    return True


def describe(info: dict[str, Any] | None) -> str:
    """One line about a model's shape: layers x heads, widths, vocabulary, dtype (and the
    quantization a GGUF model's weights were dequantized from, and the norm gains a
    norm-aware model folds in)."""
    if not info:
        return "shape known after loading"
    kv = f" ({info['n_kv_heads']} KV)" if info.get("n_kv_heads") != info.get("n_heads") else ""
    vocab = f" · vocab {info['d_vocab']}" if info.get("d_vocab") else ""
    quant = f" · GGUF {info['quantization']}" if info.get("quantization") else ""
    norm = (f" · norm-aware ({info.get('norm_gains') or 'norm gains'} folded in)"
            if info.get("subspaces") == "norm" else "")
    return (f"{info['n_layers']} layers × {info['n_heads']} heads{kv} · d_model {info['d_model']} · "
            f"d_head {info['d_head']}{vocab} · {info.get('dtype', '')} · {info.get('architecture', '')}"
            f"{quant}{norm}")


def time_left(job: Job, now: float | None = None) -> str:
    """What a running job's record says of the time left, counted down to ``now``: "about
    12 min left", "finishing (past the estimate)", or "estimating time left…" while it has
    no estimate (``finish_by`` null)."""
    finish_by = job.get("finish_by")
    if not isinstance(finish_by, (int, float)):
        return ESTIMATING
    return seconds_left(float(finish_by) - (time.time() if now is None else now))


ESTIMATING = "estimating time left…"


def seconds_left(seconds: float) -> str:
    """"about 40 s left", "about 12 min left", "about 1.5 h left", or "finishing (past the
    estimate)" once ``seconds`` is not positive."""
    if seconds <= 0:
        return "finishing (past the estimate)"
    if seconds < 90:
        return f"about {max(5, int(round(seconds / 5.0)) * 5)} s left"
    if seconds < 5400:
        return f"about {int(round(seconds / 60.0))} min left"
    return f"about {seconds / 3600.0:.1f} h left"


def progress_view(job: Job) -> tuple[dict[str, str], dict[str, str], str, str]:
    """(container style, bar style, label, state) for a job record: stage, share done and the
    time left while it runs (the whole label shows: it wraps, never cut)."""
    frac = float(job.get("fraction") or 0.0)
    state = job.get("state", "queued")
    if state in ("queued", "running"):
        label = f"{job.get('stage', '')} · {frac * 100:.0f}% · {time_left(job)}"
    else:
        label = f"{job.get('stage', '')} · {frac * 100:.0f}% · {job.get('message', '')}"
    if state == "failed":
        label = f"failed: {job.get('error') or job.get('message', '')} (press Compute to retry)"
    elif state == "done" and job.get("unavailable"):
        label = (f"{job.get('message', '')}; the views of those results say why (press Compute "
                 "to try them again)")
    return ({"display": "flex"}, {"width": f"{frac * 100:.1f}%"}, label, state)


MODEL_OUTPUTS = (
    Output("ready-store", "data"), Output("job-store", "data"), Output("job-poll", "disabled"),
    Output("progress", "style"), Output("progress-bar", "style"), Output("progress-label", "children"),
    Output("progress", "data-state"), Output("progress", "data-fraction"),
    Output("model-info", "children"), Output("model-message", "children"),
    Output("models-store", "data"), Output("compute-btn", "disabled"),
)


@callback(*MODEL_OUTPUTS,
          Input("url", "search"), Input("compute-btn", "n_clicks"), Input("job-poll", "n_intervals"),
          State("job-store", "data"), State("ready-store", "data"), State("models-store", "data"))
def model_status(search: str | None, _clicks: int | None, _ticks: int | None, job: dict | None,
                 ready: dict | None, models: list | None) -> tuple:
    """The one writer of ``ready-store`` (and the model bar): what ``ctx`` says fired decides.

    ``job-poll``: read the job, show progress, mark the model ready when it is done.
    ``compute-btn``: (re)start the job. The URL (or first load): when the URL names a model
    that is neither ready nor being computed, read its cache state; complete -> ready, else the
    job starts by itself. Every path returns values (no PreventUpdate), so a call that Dash
    drops because a newer one started is redone by that newer one.
    """
    return model_status_step(api(), client_vocab(), state_of(search).model, ctx.triggered_id, job, ready,
                             models)


def model_status_step(client: ApiClient, vocab: Vocabulary, model: str, trigger: str | None,
                      job: dict | None, ready: dict | None, models: list | None) -> tuple:
    """``model_status`` for an explicit client, vocabulary, model and trigger (the callback's body)."""
    pairings = vocab.graph_pairings
    keep = [no_update] * len(_SLOTS)
    try:
        if trigger == "job-poll":
            return tuple(_poll(client, job, keep, ready))
        if trigger == "compute-btn":
            return tuple(_start(client, pairings, model, keep))
        # URL changed (or first load): nothing to do while the model stays the same.
        if ready and ready.get("model") == model and models:
            return tuple(keep)
        if job and job.get("model") == model and job.get("state") in ("queued", "running"):
            return tuple(keep)
        models = client.models()
        entry = next((m for m in models if m["id"] == model), None)
        out = _set(keep, models=models)
        if entry is None:
            info = client.model_info(model)  # resolves paths / raises the API's 4xx message
            entry = {"id": model, "status": "available", "info": info.get("info"),
                     "cached": info.get("cached")}
        if entry.get("status") == UNAVAILABLE:
            return tuple(_set(out, ready=None, info=describe(entry.get("info")),
                              message=entry.get("message", UNAVAILABLE), compute_off=True,
                              progress=HIDDEN, poll=True))
        out = _set(out, compute_off=False, message="", info=describe(entry.get("info")))
        if is_complete(entry.get("cached"), pairings):
            return tuple(_set(out, ready={"model": model, "token": entry.get("fingerprint") or model},
                              info=describe(entry.get("info")) + " · cached ✓", progress=HIDDEN,
                              poll=True))
        return tuple(_resume(client, pairings, model, out))
    except ApiError as err:
        return tuple(_set(keep, message=f"{model}: {err.message}", poll=True))


def _poll(client: ApiClient, job: dict | None, keep: list[Any],
          ready: dict | None = None) -> list[Any]:
    if not job:
        return _set(keep, poll=True)
    rec = client.job(job["id"])
    style, bar, label, state = progress_view(rec)
    out = _set(keep, progress=style, bar=bar, label=label, pstate=state,
               pfrac=f"{float(rec.get('fraction') or 0):.4f}", job={**job, "state": state})
    if state == "done":
        info = client.model_info(job["model"])
        out = _set(out, poll=True, info=describe(info.get("info")) + " · cached ✓",
                   ready={"model": job["model"], "token": rec["id"]}, message="")
    elif state == "running" and rec.get("computed") and rec.get("plan"):
        # Partly done: views whose own results exist render now (readiness.is_ready); the
        # record changes only when another stage is cached, so views re-render only then.
        token = f"{rec['id']}:{len(rec['computed'])}"
        if (ready or {}).get("token") != token:
            out = _set(out, ready={"model": job["model"], "token": token,
                                   "partial": True, "computed": list(rec["computed"]),
                                   "plan": list(rec["plan"])})
    elif state == "failed":
        out = _set(out, poll=True, message=label)
    return out


def _resume(client: ApiClient, pairings: tuple[str, ...], model: str, out: list[Any]) -> list[Any]:
    """A model whose results are not all cached: follow its running job, show the finished one
    that could not give every result (its views say why), or the failed one (with its reason,
    not started again on every visit: Compute retries); start a job only when it has none."""
    rec = client.latest_job(model, list(pairings))
    if rec is None or (rec.get("state") == "done" and not rec.get("unavailable")):
        return _start(client, pairings, model, out, ready=None)  # none yet, or since evicted
    style, bar, label, state = progress_view(rec)
    out = _set(out, job={"id": rec["id"], "model": model, "state": state}, progress=style, bar=bar,
               label=label, pstate=state, pfrac=f"{float(rec.get('fraction') or 0):.4f}")
    if state in ("queued", "running"):
        return _set(out, poll=False, ready=None)
    if state == "failed":
        return _set(out, poll=True, ready=None, message=label)
    return _set(out, poll=True, ready={"model": model, "token": rec["id"]})


def _start(client: ApiClient, pairings: tuple[str, ...], model: str, out: list[Any],
           **extra: Any) -> list[Any]:
    submitted = client.compute(model, list(pairings))
    rec = submitted["job"]
    style, bar, label, state = progress_view(rec)
    return _set(out, job={"id": rec["id"], "model": model, "state": state}, poll=False,
                progress=style, bar=bar, label=label, pstate=state, pfrac="0", **extra)


_SLOTS = ("ready", "job", "poll", "progress", "bar", "label", "pstate", "pfrac", "info", "message",
          "models", "compute_off")


def _set(values: list[Any], **changes: Any) -> list[Any]:
    """Copy of the output list with named slots replaced (keeps the many outputs readable)."""
    out = list(values)
    for name, value in changes.items():
        out[_SLOTS.index(name)] = value
    return out
