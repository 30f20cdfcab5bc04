"""Task circuits: GET /api/tasks (bundled and uploaded), POST /api/tasks (a JSONL upload),
GET /api/circuit (a task's metric, all-edge attribution, circuit, faithfulness curve and the
EAP vs patching check; core.circuits).

Listing tasks never loads a model. An upload is checked row by row (UTF-8, JSON, the four
keys, at most limits.TASK_ROWS_MAX rows; with ``model=`` also in that model's
tokens), a bad row a 422 naming its line, and nothing stored; in lab mode it needs the
token. A cold circuit is computed like every other result (a compute process, once; in lab
mode only with the token) and cached under the model, the task's content, the method and
the steps; GET /api/circuit/progress says meanwhile where it is (stage and fraction), and
``edge=`` looks up single edges' scores and ranks (the dashboard's pair panel); GET
/api/circuit/mib exports a computed circuit as a MIB circuit-track file (core.circuits.mib).
"""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query, Request
from fastapi.concurrency import run_in_threadpool
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from headgraph.server.computations.circuits import (
    BUNDLED_PAIRS,
    CIRCUIT_METHODS,
    DEFAULT_METHOD,
    DEFAULT_STEPS,
    DEFAULT_TOP,
    TASK_NAME_PATTERN,
)
from headgraph.server.errors import Invalid
from headgraph.server.http.deps import (
    MODEL_PATTERN,
    TOKEN_PROTECTED,
    CatalogDep,
    ModelDep,
    _service,
    require_token,
)
from headgraph.server.http.params import CIRCUIT_EDGE_PATTERN, ERRORS
from headgraph.server.http.responses import warm_json
from headgraph.server.http.schemas.circuits import (
    CircuitOut,
    CircuitProgressOut,
    MibFileOut,
    TaskList,
    TaskSummary,
)
from headgraph.server.http.schemas.common import ErrorBody
from headgraph.server.limits import CIRCUIT_LOOKUP_MAX, CIRCUIT_PAIRS_MAX, CIRCUIT_PAIRS_MIN, CIRCUIT_STEPS_MAX, CIRCUIT_TOP_MAX, TASK_ROWS_MAX, TASK_UPLOAD_BYTES_MAX
from headgraph.server.services.circuits import CircuitService

router = APIRouter(prefix="/api", tags=["circuits"])
PAIRS_HELP = ("a bundled task's first n prompt pairs (a quicker circuit of a large model: the "
              "time grows with n); an uploaded task is used whole")
JSONL_MEDIA_TYPE = "application/x-ndjson"
NO_NUL = r"^[^\x00]*$"
# An edge to look up (validated, and documented as the items' pattern).
EdgeName = Annotated[str, StringConstraints(pattern=CIRCUIT_EDGE_PATTERN)]
CircuitsDep = Annotated[CircuitService, Depends(_service("circuits"))]
METHOD_PATTERN = "^(" + "|".join(m.replace("-", r"\-") for m in CIRCUIT_METHODS) + ")$"


class TaskRow(BaseModel):
    """One line of an uploaded task (core.circuits.tasks.read_jsonl's rules): a clean prompt,
    its corrupt counterpart, the answer and the distractor, each a non-empty string."""

    model_config = ConfigDict(extra="forbid")
    clean: str = Field(min_length=1, pattern=NO_NUL, description="the clean prompt")
    corrupt: str = Field(min_length=1, pattern=NO_NUL,
                         description="the corrupt prompt (as many tokens as clean)")
    answer: str = Field(min_length=1, pattern=NO_NUL, description="the right next token (one token)")
    distractor: str = Field(min_length=1, pattern=NO_NUL, description="the token the answer's logit "
                            "is compared with: the metric is logit(answer) - logit(distractor)")


# JSONL is a sequence of JSON texts: as OpenAPI 3.2 reads a sequential media type, the schema
# is that of the whole sequence as an array, one item a line.
UPLOAD_BODY = {
    "requestBody": {
        "required": True,
        "description": "the task as JSONL (UTF-8): one object a line, with exactly the keys "
                       "clean, corrupt, answer and distractor (non-empty strings), blank lines "
                       f"skipped, 1 to {TASK_ROWS_MAX} rows, at most {TASK_UPLOAD_BYTES_MAX} bytes; "
                       "the schema is that of the lines as an array. With model=, clean and "
                       "corrupt must also be as many tokens long and answer and distractor one "
                       "token each in that model's tokenizer. The same JSONL is also taken as "
                       "text/plain or as the 'file' part of a multipart form",
        "content": {JSONL_MEDIA_TYPE: {"schema": {
            "type": "array", "minItems": 1, "maxItems": TASK_ROWS_MAX,
            "items": TaskRow.model_json_schema()}}},
    }
}


@router.get("/tasks", response_model=TaskList, summary="Bundled and uploaded tasks")
async def list_tasks(*, circuits: CircuitsDep) -> Any:
    return {"tasks": await run_in_threadpool(circuits.tasks)}


@router.post("/tasks", status_code=201, response_model=TaskSummary,
             openapi_extra={**UPLOAD_BODY, **TOKEN_PROTECTED},
             responses={401: {"model": ErrorBody}, 403: {"model": ErrorBody},
                        404: {"model": ErrorBody}, 409: {"model": ErrorBody},
                        413: {"model": ErrorBody}, 422: {"model": ErrorBody}},
             dependencies=[Depends(require_token)],
             summary="Upload a task (JSONL); a bad row -> 422 naming its line, nothing stored")
async def upload_task(*, request: Request,
                      name: str = Query(..., pattern=TASK_NAME_PATTERN, description="task name"),
                      description: str = Query("", max_length=1000),
                      model: str | None = Query(None, min_length=1, max_length=512,
                                                pattern=MODEL_PATTERN,
                                                description="also check every row in this "
                                                            "model's tokens (loads it)"),
                      replace: bool = Query(False, description="replace a stored task of the "
                                                               "same name (otherwise 409)"),
                      circuits: CircuitsDep, catalog: CatalogDep) -> Any:
    content_type = request.headers.get("content-type", "").lower()
    if content_type.startswith("multipart/form-data"):
        try:
            form = await request.form(max_files=1, max_fields=10, max_part_size=TASK_UPLOAD_BYTES_MAX)
        except Exception as err:
            raise Invalid(f"malformed multipart body: {err}") from None
        part = form.get("file")
        if part is None or isinstance(part, str):
            raise Invalid("multipart upload needs a 'file' part")
        raw = await part.read(TASK_UPLOAD_BYTES_MAX + 1)
    else:
        raw = await request.body()
    if len(raw) > TASK_UPLOAD_BYTES_MAX:
        raise Invalid(f"a task is at most {TASK_UPLOAD_BYTES_MAX} bytes")

    def save() -> Any:
        ref = catalog.resolve(model) if model else None
        return circuits.save_task(name, raw, description=description, ref=ref, replace=replace)

    return await run_in_threadpool(save)


@router.get("/circuit", response_model=CircuitOut, responses=ERRORS,
            summary="A task's circuit: metric, all-edge attribution (EAP / EAP-IG), "
                    "faithfulness curve, EAP vs patching")
async def get_circuit(request: Request, *, ref: ModelDep,
                      task: str = Query("induction", pattern=TASK_NAME_PATTERN,
                                        description="a task from GET /api/tasks"),
                      method: str = Query(DEFAULT_METHOD, pattern=METHOD_PATTERN,
                                          description="eap: edge attribution patching; eap-ig: "
                                                      "with integrated gradients over steps"),
                      steps: int = Query(DEFAULT_STEPS, ge=1, le=CIRCUIT_STEPS_MAX,
                                         description="EAP-IG's integration steps (eap: 1)"),
                      top: int = Query(DEFAULT_TOP, ge=1, le=CIRCUIT_TOP_MAX,
                                       description="edges listed, strongest first"),
                      pairs: int = Query(BUNDLED_PAIRS, ge=CIRCUIT_PAIRS_MIN, le=CIRCUIT_PAIRS_MAX,
                                         description=PAIRS_HELP),
                      edge: list[EdgeName] = Query([], max_length=CIRCUIT_LOOKUP_MAX,
                                                   description="edges to look up (repeatable): "
                                                               "WRITER>READER, e.g. L0H0>L1H3.K; "
                                                               "answered in lookup with their rank"),
                      circuits: CircuitsDep) -> Any:
    _, jsonl = await run_in_threadpool(circuits.task_source, task)
    variant = None if jsonl is None else circuits_content(jsonl)
    return await warm_json(request, CircuitOut, ref,
                           lambda: circuits.answer(ref, task, method, steps, top, lookup=edge,
                                                   pairs=pairs),
                           variant=variant)


@router.get("/circuit/mib", response_model=MibFileOut, responses=ERRORS,
            summary="A computed circuit as a MIB circuit-track file (never computes)")
async def circuit_mib(request: Request, *, ref: ModelDep,
                      task: str = Query("induction", pattern=TASK_NAME_PATTERN),
                      method: str = Query(DEFAULT_METHOD, pattern=METHOD_PATTERN),
                      steps: int = Query(DEFAULT_STEPS, ge=1, le=CIRCUIT_STEPS_MAX),
                      pairs: int = Query(BUNDLED_PAIRS, ge=CIRCUIT_PAIRS_MIN, le=CIRCUIT_PAIRS_MAX,
                                         description=PAIRS_HELP),
                      size: int | None = Query(None, ge=0, description="the top n edges "
                                               "in_graph (default: the circuit size)"),
                      circuits: CircuitsDep) -> Any:
    """Every edge's score and the circuit in MIB's JSON (EAP-IG's Graph.to_json); 404 until
    GET /api/circuit has computed it with the same parameters."""
    _, jsonl = await run_in_threadpool(circuits.task_source, task)
    variant = None if jsonl is None else circuits_content(jsonl)
    return await warm_json(request, MibFileOut, ref,
                           lambda: circuits.mib_file(ref, task, method, steps, size=size,
                                                     pairs=pairs, cached_only=True),
                           variant=variant)


@router.get("/circuit/progress", response_model=CircuitProgressOut, responses=ERRORS,
            summary="Where a task's circuit is: cached, running (stage, fraction) or idle")
async def circuit_progress(*, ref: ModelDep,
                           task: str = Query("induction", pattern=TASK_NAME_PATTERN),
                           method: str = Query(DEFAULT_METHOD, pattern=METHOD_PATTERN),
                           steps: int = Query(DEFAULT_STEPS, ge=1, le=CIRCUIT_STEPS_MAX),
                           pairs: int = Query(BUNDLED_PAIRS, ge=CIRCUIT_PAIRS_MIN, le=CIRCUIT_PAIRS_MAX,
                                              description=PAIRS_HELP),
                           circuits: CircuitsDep) -> Any:
    """Never computes nor loads a model (no token needed in lab mode): what the dashboard
    polls while a cold GET /api/circuit runs."""
    return await run_in_threadpool(circuits.progress, ref, task, method, steps, pairs)


def circuits_content(jsonl: str) -> str:
    """An uploaded task's content: the kept response changes when the task is replaced."""
    from headgraph.server.computations.circuits import task_content

    return task_content("", jsonl)
