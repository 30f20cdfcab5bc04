"""Label sets (head name -> class): core's built-in sets, uploaded sets and the per-model
"patterns" set.

The "patterns" set holds head classes discovered from the model's own attention-pattern
scores (core.activations.patterns.pattern_scores, mean attention probabilities in [0, 1]). A head gets
the class of its highest score above the threshold among these kinds; heads with none stay
unlabelled. first_token (the usual attention sink) and identity (what heads with nothing to
do fall back to) are left out: they are defaults, not functions.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import numpy as np
import torch

from headgraph.core.graphs.labels import LabelSet, label_set_from_scores
from headgraph.server.cache.store import Store
from headgraph.server.errors import Conflict, Invalid, NotFound
from headgraph.server.models.offered import ModelRef
from headgraph.server.services.scores import ScoresService

PATTERN_LABELS = "patterns"
MAX_LABEL_SETS = 100  # uploaded sets kept (each at most limits.LABEL_UPLOAD_BYTES_MAX bytes)
PATTERN_LABEL_THRESHOLDS: dict[str, float] = {"previous_token": 0.4, "induction": 0.4,
                                              "duplicate_token": 0.4}
PATTERN_LABEL_CLASSES: tuple[str, ...] = ("Previous Token", "Induction", "Duplicate Token")
PATTERN_LABEL_DESCRIPTION = (
    "Per model, from its attention-pattern scores (GET /api/patterns): each head gets the class "
    "of its highest score above the threshold among " + ", ".join(
        f"{k} > {v:g}" for k, v in PATTERN_LABEL_THRESHOLDS.items()) + "; others unlabelled")


class LabelService:
    """Finding, listing and saving label sets; the per-model set is built from patterns."""
    def __init__(self, store: Store, scores: ScoresService) -> None:
        self.store = store
        self.scores = scores
        self._builtin_labels: dict[str, Any] | None = None  # parsed once

    def builtin_label_sets(self) -> dict[str, Any]:
        """core's shipped label sets, parsed once per process."""
        if self._builtin_labels is None:
            from headgraph.core.graphs.labels import builtin_label_sets

            self._builtin_labels = builtin_label_sets()
        return self._builtin_labels

    def label_sets(self) -> dict[str, Any]:
        """Built-in label sets plus uploaded ones (uploaded under a built-in name are refused).

        The per-model set PATTERN_LABELS is not here: it exists only for a given model
        (``label_set(PATTERN_LABELS, ref)``)."""
        out: dict[str, Any] = dict(self.builtin_label_sets())
        for key in list(self.store.meta.iterkeys()):
            if isinstance(key, str) and key.startswith("labels:"):
                ls = self._uploaded(key[len("labels:"):])
                if ls is not None and ls.name not in out:
                    out[ls.name] = ls
        return out

    def _uploaded(self, name: str) -> Any:

        raw = self.store.meta.get("labels:" + name, retry=True)
        if not isinstance(raw, dict):
            return None
        return LabelSet(name=raw["name"], description=raw.get("description", ""),
                        classes=dict(raw.get("classes", {})), model=raw.get("model"))

    def label_set(self, name: str | None, ref: ModelRef | None = None) -> Any:
        """A label set by name (None for no name); NotFound lists the available ones.

        PATTERN_LABELS resolves per model: ``ref``'s classes from its attention patterns
        (``pattern_label_set``); without ``ref`` it is an Invalid request.
        """
        if not name:
            return None
        if name == PATTERN_LABELS:
            if ref is None:
                raise Invalid(f"label set {PATTERN_LABELS!r} is computed per model: give model=")
            return self.pattern_label_set(ref)
        found = self.builtin_label_sets().get(name) or self._uploaded(name)
        if found is None:
            # names only: reading every uploaded set to list them would cost a request per set
            sets = sorted({*self.builtin_label_sets(), *self.uploaded_names(), PATTERN_LABELS})
            raise NotFound(f"unknown label set {name!r}; available: {sets}", allowed=sets)
        return found

    def pattern_label_set(self, ref: ModelRef) -> Any:
        """core.graphs.labels.LabelSet of ``ref``'s heads classed by attention-pattern scores.

        Built from the cached (single-flight) pattern scores with PATTERN_LABEL_THRESHOLDS;
        heads named L{layer}H{head} (original block numbers). UnsupportedModel when the model cannot
        be run here (no attention patterns).
        """
        patterns = self.scores.patterns(ref)
        grids = {kind: torch.tensor(np.asarray(patterns["scores"][kind], dtype=np.float64))
                 for kind in PATTERN_LABEL_THRESHOLDS}  # JSON null (NaN) -> nan
        ls = label_set_from_scores(grids, patterns["layer_indices"], PATTERN_LABEL_THRESHOLDS,
                                   name=PATTERN_LABELS, description=PATTERN_LABEL_DESCRIPTION)
        return replace(ls, model=ref.id)

    def uploaded_names(self) -> list[str]:
        return [k[len("labels:"):] for k in self.store.meta.iterkeys()
                if isinstance(k, str) and k.startswith("labels:")]

    def save_label_set(self, label_set: Any, *, replace: bool = False) -> None:
        """Store an uploaded set. A set of that name already stored is never replaced silently:
        Conflict (409) unless ``replace``; at most MAX_LABEL_SETS uploaded sets are kept."""
        if label_set.name in self.builtin_label_sets() or label_set.name == PATTERN_LABELS:
            raise Conflict(f"label set name {label_set.name!r} is taken by a built-in set; "
                           "upload under another name")
        key, value = "labels:" + label_set.name, label_set.to_dict()
        meta = self.store.meta
        with meta.transact(retry=True):
            exists = meta.get(key, retry=True) is not None
            if exists and not replace:
                raise Conflict(f"a label set named {label_set.name!r} exists; upload under another "
                               "name, or pass replace=true to replace it")
            if not exists and len(self.uploaded_names()) >= MAX_LABEL_SETS:
                raise Conflict(f"the server keeps at most {MAX_LABEL_SETS} uploaded label sets; "
                               "replace one (replace=true) instead")
            if not meta.set(key, value, retry=True):
                raise Conflict(f"label set {label_set.name!r} could not be stored")
