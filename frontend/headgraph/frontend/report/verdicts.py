"""The findings page's verdict vocabulary: the outcomes a claim's rule can give, how the page
marks each, and the ``Verdict`` a rule returns (shared by ``claims`` and ``recovery``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

HOLDS, PARTLY, FAILS, NA = "holds", "partly holds", "does not hold", "not applicable here"
BASELINE_BEATS = "not supported over the trivial baselines"  # the claim's win, but a trivial predictor does as well
MARK = {HOLDS: "✅ holds", PARTLY: "◐ partly holds", FAILS: "❌ does not hold", NA: "– not applicable here",
        BASELINE_BEATS: "⚠️ not supported over the trivial baselines"}


@dataclass(frozen=True)
class Verdict:
    """One claim decided: ``rule`` is the sentence the page prints, ``verdict`` one of the
    outcomes above, ``evidence`` what the rule read, ``because`` the outcome in numbers;
    ``title`` names the claim in the summary (empty: the page's title for ``key``)."""

    key: str
    claim: str
    rule: str
    verdict: str
    evidence: dict[str, Any] = field(default_factory=dict)
    because: str = ""
    title: str = ""


def opening(v: Verdict) -> str:
    """A claim section's opening: the claim, its rule and its verdict."""
    return (f"**Claim.** {v.claim}\n\n**Rule.** {v.rule[0].upper() + v.rule[1:]}.\n\n"
            f"**Verdict: {MARK[v.verdict]}** ({v.because}).")
