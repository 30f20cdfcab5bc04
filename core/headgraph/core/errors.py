"""Errors headgraph raises on purpose, so callers (server, CLI) can show a clear message."""

from __future__ import annotations


class HeadgraphError(Exception):
    """Base of every error headgraph raises deliberately (message is user-facing)."""


class ModelUnavailable(HeadgraphError):
    """A model cannot be obtained: not cached locally and the hub is offline or unreachable."""


class PathNotAllowed(HeadgraphError):
    """A local path given as a model spec lies outside the allowed model root, or a model
    folder inside it would read a file from outside (a link, an index entry). Its message
    names what the caller gave, never the root or where a link points."""


class UnsupportedModel(HeadgraphError):
    """A model was found but cannot be read or processed the way it was asked for."""


class InvalidInput(HeadgraphError):
    """A value given by the caller is not allowed (unknown pairing, malformed head name, ...).

    ``allowed`` lists the accepted values where there is a finite list.
    """

    def __init__(self, message: str, *, allowed: list[str] | None = None) -> None:
        super().__init__(message)
        self.allowed = allowed
