"""Head-class overlays: the label-set list and uploads (validation errors shown in the page)."""

from __future__ import annotations

import base64
import binascii
import time
from typing import Any

from dash import Dash, Input, Output, State, html, no_update
from dash.exceptions import PreventUpdate

from headgraph.frontend.api_client import ApiError
from headgraph.frontend.callbacks.common import ApiProvider
from headgraph.frontend.state import parse_query, to_query


def decode_upload(contents: str) -> bytes:
    """Bytes of a dcc.Upload data URL ("data:<type>;base64,<payload>")."""
    _, _, payload = contents.partition(",")
    try:
        return base64.b64decode(payload, validate=False)
    except (binascii.Error, ValueError) as err:
        raise ApiError(422, f"could not read the uploaded file: {err}") from err


def register(app: Dash, api: ApiProvider) -> None:
    @app.callback(Output("labels-store", "data"),
                  Input("models-store", "data"), Input("uploaded-store", "data"))
    def list_overlays(_models: Any, _uploaded: Any) -> list[dict[str, Any]]:
        """The API's label sets (the URL sync turns them into dropdown options)."""
        try:
            return api().labels()
        except ApiError:
            raise PreventUpdate from None

    @app.callback(
        Output("upload-error", "children"), Output("upload-error", "className"),
        Output("uploaded-store", "data"), Output("url", "search", allow_duplicate=True),
        Output("overlay-upload", "contents"), Output("overlay-select", "options", allow_duplicate=True),
        Input("overlay-upload", "contents"), State("overlay-upload", "filename"), State("url", "search"),
        State("overlay-select", "options"),
        prevent_initial_call=True,
    )
    def upload_overlay(contents: str | None, filename: str | None, search: str | None,
                       options: list[dict[str, Any]] | None) -> tuple:
        if not contents:
            raise PreventUpdate
        state = parse_query(search)
        try:
            data = decode_upload(contents)
            saved = api().upload_labels(data, filename or "labels.csv", model=state.model)
        except ApiError as err:
            msg = f"{filename or 'upload'}: {err.message}"
            return [html.B("upload rejected: "), msg], "upload-error shown", no_update, no_update, None, no_update
        name = saved["name"]
        n = len(saved.get("classes", {}))
        note = f"uploaded {name}: {n} heads"
        # The new set joins the options in the same update that selects it.
        opts = [o for o in (options or []) if o.get("value") != name]
        opts.append({"label": f"{name} ({n} heads)", "value": name, "title": saved.get("description", "")})
        return (note, "upload-ok", {"name": name, "t": time.time()}, to_query(state.with_(overlay=name)),
                None, opts)
