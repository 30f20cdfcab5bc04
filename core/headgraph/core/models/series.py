"""Model series: checkpoints of one training run, in step order (the bundled demo series).

``demo-series`` is the demo model saved at log-spaced steps of its own training run
(``scripts/train_demo.py --checkpoints 7``, same seed and recipe as the shipped demo): folders
``core/data/demo_series/step-<step>`` in the demo's format. Each checkpoint loads as the model
spec ``demo@step-<step>``; the series shows the induction edge L0H0 -> layer 1 forming.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from headgraph.core.errors import InvalidInput

DEMO_SERIES = "demo-series"
DEMO_SERIES_DIR = Path(__file__).resolve().parents[1] / "data" / "demo_series"
DEMO_CHECKPOINT_PREFIX = "demo@step-"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """One checkpoint of a series: its training step, model spec / id and folder."""

    step: int
    model_id: str
    folder: Path


def demo_series(folder: Path = DEMO_SERIES_DIR) -> tuple[Checkpoint, ...]:
    """The bundled demo checkpoints in step order (empty when none are installed)."""
    if not folder.is_dir():
        return ()
    out = []
    for p in folder.iterdir():
        m = _STEP_DIR.match(p.name)
        if m and (p / "config.json").is_file():
            step = int(m.group(1))
            out.append(Checkpoint(step, f"{DEMO_CHECKPOINT_PREFIX}{step}", p))
    return tuple(sorted(out, key=lambda c: c.step))


def is_demo_checkpoint_spec(spec: str) -> bool:
    """True for a spec of the form ``demo@step-<digits>`` (whether or not it exists)."""
    return re.fullmatch(re.escape(DEMO_CHECKPOINT_PREFIX) + r"\d{1,9}", spec) is not None


def demo_checkpoint(spec: str) -> Checkpoint:
    """The bundled checkpoint a ``demo@step-<step>`` spec names; InvalidInput naming the steps
    that exist otherwise."""
    for c in demo_series():
        if c.model_id == spec:
            return c
    steps = [c.step for c in demo_series()]
    raise InvalidInput(f"no demo checkpoint {spec[:40]!r}; the demo series has steps {steps} "
                       f"(model ids {DEMO_CHECKPOINT_PREFIX}<step>)",
                       allowed=[c.model_id for c in demo_series()])
