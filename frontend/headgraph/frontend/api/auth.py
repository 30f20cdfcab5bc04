"""The browser user's own credential, and guards on what a page request may send.

Sign-in stores the user's API token in their browser only: a cookie ``TOKEN_COOKIE`` the page
itself sets (SameSite=Strict, so no other site's page can make the browser send it). Each
callback forwards it to the API as ``Authorization: Bearer`` (``app.api_provider``); the
dashboard process never holds a token of its own.

``install_request_guards`` makes malformed callback requests a 400 with a JSON message
instead of a 500: bodies that are not a JSON object naming a known callback output, and JSON
nested too deeply for the parser.
"""

from __future__ import annotations

from typing import Any

import flask
from dash.exceptions import CallbackException
from werkzeug.exceptions import BadRequest

TOKEN_COOKIE = "headgraph_token"
CALLBACK_PATH = "_dash-update-component"


def _refuse(message: str) -> flask.Response:
    resp = flask.jsonify({"error": {"status": 400, "message": message}})
    resp.status_code = 400
    return resp


def _is_prop(item: Any) -> bool:
    return (isinstance(item, dict) and isinstance(item.get("id"), str)
            and isinstance(item.get("property"), str))


def install_request_guards(server: flask.Flask) -> None:
    """Check each Dash callback request's body before Dash reads it (parsed once, cached)."""

    @server.before_request
    def _check_callback_body() -> Any:
        request = flask.request
        if request.method != "POST" or not request.path.endswith(CALLBACK_PATH):
            return None
        try:
            body = request.get_json(force=True, cache=True)
        except RecursionError:
            return _refuse("callback request: JSON nested too deeply")
        except BadRequest:
            return _refuse("callback request: the body is not JSON")
        if not isinstance(body, dict) or not isinstance(body.get("output"), str):
            return _refuse("callback request: expected a JSON object with an 'output'")
        for part in ("inputs", "state"):
            items = body.get(part, [])
            if not isinstance(items, list) or not all(_is_prop(x) for x in items):
                return _refuse(f"callback request: '{part}' must be a list of {{id, property}}")
        outputs = body.get("outputs")
        if not (_is_prop(outputs) or (isinstance(outputs, list) and all(map(_is_prop, outputs)))):
            return _refuse("callback request: 'outputs' must be {id, property} or a list of them")
        dash_app = server.config.get("HEADGRAPH_DASH_APP")
        if dash_app is not None and body["output"] not in dash_app.callback_map:
            return _refuse("callback request: unknown output")
        return None

    @server.errorhandler(CallbackException)
    def _bad_callback(err: CallbackException) -> flask.Response:
        # Dash's own checks of a request against the callback it names (wrong output spec...)
        return _refuse(f"callback request does not match its callback: {err}".splitlines()[0])
