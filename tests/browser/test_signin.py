"""Browser: a lab server (HEADGRAPH_API_TOKEN set) and a user who signs in with their own token.

The dashboard holds no token: an anonymous browser reads the page but its Compute is refused
with the API's message; after signing in (the token kept in this browser only, as a
SameSite=Strict cookie the page sets) the same click computes and the views fill in.
"""

from __future__ import annotations


import httpx
import pytest
from playwright.sync_api import Page

from browser import Server, wait_figure, wait_until

pytestmark = pytest.mark.timeout(300)
TOKEN = "lab-token-for-the-sign-in-test-42"


@pytest.fixture(scope="module")
def server_env() -> dict[str, str]:
    return {"HEADGRAPH_API_TOKEN": TOKEN}  # a lab server


def status(page: Page) -> str:
    return page.locator("#signin-status").inner_text()


def test_sign_in_with_the_users_own_token_then_compute(server: Server, page: Page) -> None:
    page.goto(server.url + "/?model=demo&view=heatmap&pairing=OK")
    wait_until(lambda: "read-only" in status(page), 60, message="read-only status", page=page)
    # Anonymous: the page's own attempt to compute the cold model is refused with the API's message.
    message = page.locator("#model-message")
    wait_until(lambda: "token" in message.inner_text(), 60, message="401 shown", page=page)
    assert httpx.get(server.url + "/api/models").json()["models"][0]["cached"] in (None, [])

    page.fill("#token-input", "not-the-lab-token-at-all")
    page.click("#signin-btn")
    wait_until(lambda: "not accepted" in status(page), 30, message="refused token", page=page)

    page.fill("#token-input", TOKEN)
    page.press("#token-input", "Enter")
    wait_until(lambda: "signed in" in status(page), 30, message="signed in", page=page)
    cookie = next(c for c in page.context.cookies() if c["name"] == "headgraph_token")
    assert cookie["sameSite"] == "Strict" and cookie["value"] == TOKEN
    assert page.locator("#token-input").input_value() == ""  # not left in the page
    assert TOKEN not in page.content()
    # The page's layout itself says so for this browser's cookie (no callback of a page load
    # fetches the status), and a reload keeps it.
    def layout_status(cookies: dict[str, str]) -> str:
        tree = httpx.get(server.url + "/_dash-layout", cookies=cookies, timeout=60).text
        return next(s for s in ("signed in", "not accepted", "read-only", "open server") if s in tree)
    assert layout_status({"headgraph_token": TOKEN}) == "signed in"
    assert layout_status({"headgraph_token": "not-the-lab-token-at-all"}) == "not accepted"
    assert layout_status({}) == "read-only"
    page.reload()
    wait_until(lambda: "signed in" in status(page), 30, message="signed in after a reload", page=page)

    page.click("#compute-btn")
    fig = wait_figure(page, "heatmap", lambda f: f["data"][0]["type"] == "heatmap", timeout=180)
    grid = httpx.get(server.url + "/api/pk", params={"model": "demo", "pairing": "OK"},
                     timeout=60).json()  # cached now: open to anonymous reads
    flat = [v for sl in grid["grid"] for sh in sl for tl in sh for v in tl]
    ok = [v for sl in grid["valid"] for sh in sl for tl in sh for v in tl]
    z = [v for row in fig["data"][0]["z"] for v in row]
    assert [v for v in z if v is not None] == pytest.approx([v for v, o in zip(flat, ok) if o])

    page.click("#signout-btn")
    wait_until(lambda: "read-only" in status(page), 30, message="signed out", page=page)
    assert not [c for c in page.context.cookies() if c["name"] == "headgraph_token"]
