"""Request parameter names and checks shared by the service, routers and CLI.

Role pairings (source role then target role), the Literal query types that OpenAPI lists,
and the validators that turn a bad pairing, order, role or CS mode into an Invalid (400)
listing the allowed values.
"""

from __future__ import annotations

from typing import Literal

from headgraph.core.types import CS_MODES, LAYER_ORDERS, ROLES
from headgraph.server.errors import Invalid

PAIRINGS: tuple[str, ...] = tuple(a + b for a in ROLES for b in ROLES)
# Query-parameter types: OpenAPI lists the allowed values, FastAPI rejects others with 422.
PairingName = Literal["QQ", "QK", "QV", "QO", "KQ", "KK", "KV", "KO",
                      "VQ", "VK", "VV", "VO", "OQ", "OK", "OV", "OO"]
RoleName = Literal["Q", "K", "V", "O"]
ModeName = Literal["Q", "K", "V"]
PAIRINGS_PATTERN = r"^[QKVOqkvo]{2}(,[QKVOqkvo]{2})*$"
GRAPH_PAIRINGS: tuple[str, ...] = ("OQ", "OK", "OV")


def check_pairing(pairing: str) -> str:
    if pairing not in PAIRINGS:
        raise Invalid(f"unknown pairing {pairing!r}; allowed: {list(PAIRINGS)} (source role "
                      "then target role)", allowed=list(PAIRINGS))
    return pairing


def parse_pairings(text: str) -> list[str]:
    """"OQ,OK,OV" -> ["OQ", "OK", "OV"] (validated, de-duplicated, order kept)."""
    items = [p.strip().upper() for p in (text or "").split(",") if p.strip()]
    if not items:
        raise Invalid(f"no pairings given; allowed: {list(PAIRINGS)}", allowed=list(PAIRINGS))
    return [check_pairing(p) for p in dict.fromkeys(items)]


def check_order(order: str) -> str:
    if order not in LAYER_ORDERS:
        raise Invalid(f"unknown order {order!r}; allowed: {list(LAYER_ORDERS)}",
                      allowed=list(LAYER_ORDERS))
    return order


def check_role(role: str) -> str:
    if role not in ROLES:
        raise Invalid(f"unknown role {role!r}; allowed: {list(ROLES)}", allowed=list(ROLES))
    return role


def check_mode(mode: str) -> str:
    if mode not in CS_MODES:
        raise Invalid(f"unknown CS mode {mode!r}; allowed: {list(CS_MODES)}",
                      allowed=list(CS_MODES))
    return mode


def cs_mode_of(pairing: str) -> str | None:
    """The Composition Score mode comparable to a pairing: O->Q/K/V gives Q/K/V, else None."""
    return pairing[1] if pairing[0] == "O" and pairing[1] in CS_MODES else None
