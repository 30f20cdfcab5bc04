"""Head-class overlays: the label-set list and uploads (validation errors shown in the page)."""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from dash import Input, Output, State, ctx, html, no_update

from headgraph.frontend.api.client import ApiError
from headgraph.frontend.callbacks.common import api, state_of
from headgraph.frontend.callbacks.define import callback


def decode_upload(contents: str) -> bytes:
    """Bytes of a dcc.Upload data URL ("data:<type>;base64,<payload>")."""
    _, _, payload = contents.partition(",")
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as err:
        raise ApiError(422, f"could not read the uploaded file: {err}") from err


@callback(Output("labels-store", "data"), Input("uploaded-store", "data"), Input("models-store", "data"),
          State("labels-store", "data"), prevent_initial_call=True)
def list_overlays(_uploaded: Any, _models: Any, current: Any) -> Any:
    """The API's label sets (the controls turn them into dropdown options): after an upload,
    or once the model bar answered when the layout did not bring them (callbacks/model.py
    ``page_data``; no initial call, so the views need not wait for one)."""
    if ctx.triggered_id == "models-store" and current is not None:
        return no_update
    try:
        return api().labels()
    except ApiError:
        return no_update


@callback(Output("upload-error", "children"), Output("upload-error", "className"),
          Output("uploaded-store", "data"), Output("overlay-upload", "contents"),
          Input("overlay-upload", "contents"), State("overlay-upload", "filename"), State("url", "search"),
          prevent_initial_call=True)
def upload_overlay(contents: str | None, filename: str | None, search: str | None) -> tuple:
    """Send an uploaded JSON/CSV label set to the API; show its error, or record the new set
    (the URL writer then selects it as the overlay)."""
    if not contents:
        return no_update, no_update, no_update, no_update
    try:
        data = decode_upload(contents)
        saved = api().upload_labels(data, filename or "labels.csv", model=state_of(search).model)
    except ApiError as err:
        msg = f"{filename or 'upload'}: {err.message}"
        return [html.B("upload rejected: "), msg], "upload-error shown", no_update, None
    name = saved["name"]
    note = f"uploaded {name}: {len(saved.get('classes', {}))} heads"
    return note, "upload-ok", {"name": name, "t": time.time()}, None
