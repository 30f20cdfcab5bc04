"""Head-class label sets: built-in (IOI, identity heads...), uploaded (JSON or CSV), and the
per-model ``patterns`` set (each model's heads classed by its own attention-pattern scores),
which every endpoint taking ``labels=`` accepts for any model that can be run here."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, Field, StringConstraints, ValidationError

from headgraph.core.graphs.labels import CLASS_FORBIDDEN
from headgraph.server.errors import Invalid, NotFound, one_line
from headgraph.server.http.deps import MODEL_PATTERN, TOKEN_PROTECTED, CatalogDep, LabelsDep, require_token
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.common import ErrorBody
from headgraph.server.http.schemas.labels import LabelSetList, LabelSetOut
from headgraph.server.limits import LABEL_UPLOAD_BYTES_MAX
from headgraph.server.services.labels import (
    PATTERN_LABEL_CLASSES,
    PATTERN_LABEL_DESCRIPTION,
    PATTERN_LABEL_THRESHOLDS,
    PATTERN_LABELS,
)

router = APIRouter(prefix="/api/labels", tags=["labels"])
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.\-]{0,63}$"
HEAD_KEY_PATTERN = r"^L(0|[1-9][0-9]{0,3})H(0|[1-9][0-9]{0,3})$"
# as core.graphs.labels: no control character (C0, C1, DEL) nor bidirectional control
CLASS_PATTERN = rf"^[^\s{CLASS_FORBIDDEN}](?:[^{CLASS_FORBIDDEN}]{{0,62}}[^\s{CLASS_FORBIDDEN}])?$"
HeadKey = Annotated[str, StringConstraints(pattern=HEAD_KEY_PATTERN)]
ClassName = Annotated[str, StringConstraints(pattern=CLASS_PATTERN)]


class LabelSetUpload(BaseModel):
    """A label set as a JSON body: query head (canonical L9H6) -> class name."""

    name: str | None = Field(None, pattern=NAME_PATTERN, description="set name")
    description: str | None = Field(None, max_length=1000)
    model: str | None = Field(None, min_length=1, max_length=512,
                              description="the model the classes were found in (informational)")
    classes: dict[HeadKey, ClassName] = Field(min_length=1, description="head -> class",
                                              json_schema_extra={"additionalProperties": False})


UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "the label set as JSON (this schema); the same endpoint also takes a CSV "
                       "text (Content-Type text/csv, header 'head,class', heads like L9H6 or 9.6) "
                       "or a multipart form with a 'file' part (.csv or .json)",
        "content": {"application/json": {"schema": LabelSetUpload.model_json_schema()}},
    }
}


def summary(label_set: Any, builtin: bool) -> dict[str, Any]:
    return {"name": label_set.name, "description": label_set.description,
            "model": label_set.model, "builtin": builtin, "per_model": False,
            "n_heads": len(label_set.classes), "classes": label_set.class_names}


def pattern_summary() -> dict[str, Any]:
    """The per-model set PATTERN_LABELS as listed without a model (its heads depend on one)."""
    return {"name": PATTERN_LABELS, "description": PATTERN_LABEL_DESCRIPTION, "model": None,
            "builtin": True, "per_model": True, "n_heads": None,
            "classes": list(PATTERN_LABEL_CLASSES)}


@router.get("", response_model=LabelSetList, summary="Available label sets")
def list_label_sets(*, labels: LabelsDep) -> Any:
    builtin = set(labels.builtin_label_sets())
    sets = labels.label_sets()
    listed = [summary(ls, name in builtin) for name, ls in sets.items()] + [pattern_summary()]
    return {"label_sets": sorted(listed, key=lambda s: s["name"])}


@router.get("/{name}", response_model=LabelSetOut,
            responses={404: {"model": ErrorBody}, 403: {"model": ErrorBody},
                       422: {"model": ErrorBody}},
            summary="One label set with its head -> class map (per-model sets need ?model=)")
async def get_label_set(request: Request, *, name: str = Path(..., min_length=1, max_length=128),
                        model: str | None = Query(None, min_length=1, max_length=512,
                                                  pattern=MODEL_PATTERN,
                                                  description="model of a per-model set "
                                                  f"({PATTERN_LABELS!r}); ignored for the others"),
                        labels: LabelsDep,
                        catalog: CatalogDep) -> Any:
    if name != PATTERN_LABELS:  # a store read: off the event loop
        ls = await run_in_threadpool(labels.label_set, name)
        return {**ls.to_dict(), "builtin": name in labels.builtin_label_sets()}
    if model is None:
        raise Invalid(f"label set {PATTERN_LABELS!r} is computed per model: give model=")
    ref = catalog.resolve(model)
    return await warm_json(request, LabelSetOut, ref, lambda: {
        **labels.pattern_label_set(ref).to_dict(), "builtin": True, "per_model": True,
        "thresholds": dict(PATTERN_LABEL_THRESHOLDS)})


def _format_of(fmt: str | None, filename: str | None, content_type: str) -> str:
    if fmt:
        return fmt
    if filename and "." in filename:
        ext = filename.rsplit(".", 1)[1].lower()
        if ext in ("csv", "json"):
            return ext
    if "json" in content_type:
        return "json"
    if "csv" in content_type or content_type.startswith("text/"):
        return "csv"
    raise Invalid("cannot tell the upload format: give format=csv|json, a .csv/.json file name "
                  "or a text/csv / application/json content type")


@router.post("", status_code=201, response_model=LabelSetOut,
             openapi_extra={**UPLOAD_BODY, **TOKEN_PROTECTED},
             responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody}, 404: {"model": ErrorBody},
                        409: {"model": ErrorBody}, 413: {"model": ErrorBody},
                        422: {"model": ErrorBody}},
             dependencies=[Depends(require_token)],
             summary="Upload a label set (JSON or CSV); malformed input -> 422 naming the line")
async def upload_label_set(*,
    request: Request,
    name: str | None = Query(None, pattern=NAME_PATTERN, description="set name (default: from the JSON or the file name)"),
    model: str | None = Query(None, min_length=1, max_length=512, pattern=MODEL_PATTERN,
                              description="check every head exists in this model"),
    format: str | None = Query(None, pattern="^(csv|json)$", description="csv or json (default: from file name / content type)"),
    replace: bool = Query(False, description="replace a stored set of the same name (otherwise 409)"),
    labels: LabelsDep,
    catalog: CatalogDep,
) -> Any:
    from headgraph.core.graphs.labels import UnknownHead, parse_label_set

    content_type = request.headers.get("content-type", "").lower()
    filename = None
    if content_type.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=1, max_fields=10, max_part_size=LABEL_UPLOAD_BYTES_MAX)
        except Exception as err:
            raise Invalid(f"malformed multipart body: {err}") from None
        part = form.get("file")
        if part is None or isinstance(part, str):
            raise Invalid("multipart upload needs a 'file' part")
        filename = part.filename
        raw = await part.read(LABEL_UPLOAD_BYTES_MAX + 1)
    else:
        raw = await request.body()
    if len(raw) > LABEL_UPLOAD_BYTES_MAX:
        raise Invalid(f"label set larger than {LABEL_UPLOAD_BYTES_MAX} bytes")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        raise Invalid(f"label set is not UTF-8 text (byte {err.start})") from None
    # A JSON body is JSON (the documented schema) whatever format= says; files and text
    # bodies go by format=, then the file name, then the content type.
    json_body = filename is None and content_type.split(";")[0].strip() == "application/json"
    fmt = "json" if json_body else _format_of(format, filename, content_type)
    if fmt == "json" and filename is None:  # a JSON body: the documented schema, strictly
        try:
            LabelSetUpload.model_validate_json(text)
        except ValidationError as err:
            first = err.errors()[0] if err.errors() else {}
            msg = str(first.get("msg", "invalid"))
            if first.get("type") == "json_invalid" and "recursion" in msg:
                raise Invalid("label set JSON nested too deeply") from None
            if first.get("type") != "json_invalid":
                where = ".".join(str(p) for p in first.get("loc", ())) or "body"
                raise Invalid(f"label set JSON: {where}: {msg}") from None
            # not JSON at all: core's parser names the line and column below
    default_name = None
    if filename:
        stem = filename.rsplit("/", 1)[-1].rsplit(".", 1)[0]
        if re.match(NAME_PATTERN, stem):
            default_name = stem

    def parse_and_save() -> Any:
        info = None
        if model:
            ref = catalog.resolve(model)
            info = catalog.model_info(ref)
        try:
            ls = parse_label_set(text, fmt, name=name or default_name, info=info)
        except UnknownHead as err:  # a head the model lacks: not found, like /api/head
            raise NotFound(one_line(err, 1000)) from None
        if not re.match(NAME_PATTERN, ls.name):
            raise Invalid(f"label set name {ls.name!r} must match {NAME_PATTERN}")
        labels.save_label_set(ls, replace=replace)
        return {**ls.to_dict(), "builtin": False}

    return await run_in_threadpool(parse_and_save)
