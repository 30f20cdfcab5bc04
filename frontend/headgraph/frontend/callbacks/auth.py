"""Sign-in: the user's API token kept in their browser (cookie), and what the server says of it.

The clientside callback sets or clears the cookie (``auth.TOKEN_COOKIE``) in the browser;
the dashboard process never sees the token except inside the requests of that browser,
which it forwards to the API. ``auth_status`` shows open mode, signed in, rejected or
read-only, from ``GET /api/auth`` answered for this browser's own credential.
"""

from __future__ import annotations

from typing import Any

import flask
from dash import Dash, Input, Output, State

from headgraph.frontend.api.auth import TOKEN_COOKIE
from headgraph.frontend.api.client import ApiError
from headgraph.frontend.api.context import api
from headgraph.frontend.callbacks.define import callback

SIGN_IN_JS = """
function(nIn, nSubmit, nOut, value) {
  const ctx = window.dash_clientside.callback_context;
  const trig = ctx.triggered.length ? ctx.triggered[0].prop_id : "";
  const nu = window.dash_clientside.no_update;
  const secure = window.location.protocol === "https:" ? "; Secure" : "";
  const base = "; path=/; SameSite=Strict" + secure;
  if (trig.startsWith("signout-btn")) {
    document.cookie = "__COOKIE__=" + base + "; Max-Age=0";
  } else if (value && (trig.startsWith("signin-btn") || trig.startsWith("token-input"))) {
    document.cookie = "__COOKIE__=" + encodeURIComponent(value) + base;
  } else {
    return [nu, nu];
  }
  return [Date.now(), ""];
}
""".replace("__COOKIE__", TOKEN_COOKIE)


def register_clientside(app: Dash) -> None:
    """The sign-in / sign-out handler, run in the browser (the token never leaves it but in
    the user's own requests)."""
    app.clientside_callback(
        SIGN_IN_JS,
        Output("auth-store", "data"), Output("token-input", "value"),
        Input("signin-btn", "n_clicks"), Input("token-input", "n_submit"),
        Input("signout-btn", "n_clicks"), State("token-input", "value"),
        prevent_initial_call=True)


def auth_view() -> tuple[str, str]:
    """What this browser may do, as (status text, sign-in box class): open server, signed in,
    token refused, or read-only (``GET /api/auth`` for the current request's credential)."""
    try:
        answer = api().auth()
    except ApiError as err:
        return f"sign-in unavailable: {err.message}", "signin-box"
    if answer.get("mode") == "open":
        return "open server: no sign-in needed", "signin-box open"
    if answer.get("authorized"):
        return "signed in: you may compute and upload", "signin-box signed-in"
    if flask.request.cookies.get(TOKEN_COOKIE):
        return "token not accepted: sign in again", "signin-box refused"
    return "read-only: sign in with the lab's API token to compute or upload", "signin-box"


@callback(Output("signin-status", "children"), Output("signin-box", "className"),
          Input("auth-store", "data"), prevent_initial_call=True)
def auth_status(_stamp: Any) -> tuple[str, str]:
    """The status again after a sign-in or sign-out (the page's layout brings the first one,
    callbacks/model.py ``page_data``)."""
    return auth_view()
