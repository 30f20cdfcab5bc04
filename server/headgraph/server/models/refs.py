"""What a resolved model is (ModelRef) and its id's norm-aware variant (``MODEL@norm``)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

NORM_SUFFIX = "@norm"  # a model id's norm-aware variant (ModelRef.subspaces "norm")


@dataclass(frozen=True)
class ModelRef:
    """A resolved model: its API id, the spec core.models.loading gets, where it comes from and
    which subspaces it is read in ("raw" weights, or "norm": the gains of the norms around
    attention folded in, core.models.norm_fold; its id then ends in NORM_SUFFIX)."""

    id: str
    spec: str
    kind: str  # "builtin" | "random" | "hub" | "local"
    path: Path | None = None
    subspaces: str = "raw"

    def with_subspaces(self, subspaces: str) -> ModelRef:
        """The same model in mode ``subspaces``: ``demo`` <-> ``demo@norm``."""
        if subspaces == self.subspaces:
            return self
        base = self.id.removesuffix(NORM_SUFFIX) if self.subspaces == "norm" else self.id
        return dataclasses.replace(self, id=base + NORM_SUFFIX if subspaces == "norm" else base,
                                   subspaces=subspaces)
