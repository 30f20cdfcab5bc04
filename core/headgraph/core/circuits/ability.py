"""Whether a model does a task: a stated paired test over the task's prompt pairs.

**Unit.** A prompt pair, or a mirrored couple: pair i followed by its mirror (pair i's corrupt
prompt as the clean one and the reverse, answer and distractor swapped: the bundled MIB-style
tasks, core.circuits.benchmark_tasks, are built so; ``units`` finds couples in any task from
the token ids). With d(p, a, b) the logit difference a - b at the last position of prompt p,
a couple's mirror has clean - corrupt = d(K, B, A) - d(C, B, A) = d(C, A, B) - d(K, A, B),
its pair's own value: the two are one observation, so a couple is one unit.

**Rule** (``RULE``): two one-sided exact sign tests (binomial, p = 1/2, scipy.stats.binomtest)
over the units, each at ``alpha`` (0.05):

- (a) *answer*: on clean prompts the answer beats the distractor more often than chance. A
  pair counts for when its clean logit difference is > 0, else against; a couple counts for
  when both its clean prompts do, against when neither does, and a split (one right, one
  wrong: what a mere preference for one answer token gives) is a tie, left out. A couple's
  mean accuracy is 1/2 exactly when "both right" and "both wrong" are equally likely, so
  this is the sign test of accuracy 1/2 with the couple as the unit, whatever the dependence
  within a couple.
- (b) *follows*: the behaviour follows the prompt: clean minus corrupt logit difference
  (summed over a couple) is > 0 more often than chance; 0 counts against.

The model does the task when both p-values are <= alpha; an intersection-union test, so a
model for which either null holds is called able at most alpha of the time, with no
correction. Fewer units than ``min_units(alpha)`` (5 at 0.05: 1/2^4 > 0.05) can never reach
alpha whatever the model does: then the answer is None, "too few pairs to tell".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.circuits.tasks import Task, batches, logit_diff

ALPHA = 0.05
STATES: tuple[str, ...] = ("able", "not_able", "too_few_pairs")
RULE = ("the model does the task when two one-sided exact sign tests over its prompt pairs (a pair "
        "and its mirror, clean and corrupt swapped, are one unit) both give p <= {alpha:g}: (a) on "
        "clean prompts the answer beats the distractor in more units than chance (a mirrored unit: "
        "both clean prompts right against both wrong, a split left out), (b) clean minus corrupt "
        "logit difference is positive in more units than chance (0 counts against); under "
        "{min_units} units no test can reach {alpha:g}: too few pairs to tell")


def min_units(alpha: float = ALPHA) -> int:
    """The fewest units whose best outcome (every unit for) reaches ``alpha`` one-sided."""
    return max(1, math.ceil(math.log(1 / alpha, 2) - 1e-12))


def units(task: Task) -> tuple[tuple[int, ...], ...]:
    """The task's rows as test units, in order: (i, i + 1) where row i + 1 is row i's mirror
    (module docstring), else (i,)."""
    out: list[tuple[int, ...]] = []
    i, n = 0, task.n_pairs
    while i < n:
        if (i + 1 < n and task.clean[i + 1] == task.corrupt[i] and task.corrupt[i + 1] == task.clean[i]
                and task.answer[i + 1] == task.distractor[i] and task.distractor[i + 1] == task.answer[i]):
            out.append((i, i + 1))
            i += 2
        else:
            out.append((i,))
            i += 1
    return tuple(out)


@dataclass(frozen=True)
class SignTest:
    """One one-sided exact sign test: ``wins`` of ``n`` decided units for, p-value ``p``
    (binomial tail P(X >= wins), X ~ Bin(n, 1/2); 1 when n = 0)."""

    wins: int
    n: int
    p: float

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def sign_test(wins: int, n: int) -> SignTest:
    from scipy.stats import binomtest

    p = float(binomtest(wins, n, 0.5, alternative="greater").pvalue) if n else 1.0
    return SignTest(wins=wins, n=n, p=p)


@dataclass(frozen=True)
class Ability:
    """The rule's answer (module docstring): ``able`` True / False, None when too few units;
    the two tests; the pairs and units read."""

    able: bool | None
    answer: SignTest
    follows: SignTest
    n_pairs: int
    n_units: int
    n_mirrored: int  # units that are mirrored couples
    alpha: float = ALPHA

    @property
    def state(self) -> str:
        return "too_few_pairs" if self.able is None else "able" if self.able else "not_able"

    @property
    def rule(self) -> str:
        return RULE.format(alpha=self.alpha, min_units=min_units(self.alpha))

    def to_dict(self) -> dict[str, Any]:
        return {"able": self.able, "state": self.state, "rule": self.rule, "alpha": self.alpha,
                "min_units": min_units(self.alpha), "n_pairs": self.n_pairs, "n_units": self.n_units,
                "n_mirrored": self.n_mirrored,
                "answer": self.answer.to_dict(), "follows": self.follows.to_dict()}


def decide(clean: torch.Tensor, corrupt: torch.Tensor, groups: Sequence[Sequence[int]],
           alpha: float = ALPHA) -> Ability:
    """The rule on per-pair logit differences ``clean`` and ``corrupt`` ([N], answer -
    distractor at the last position) grouped into ``groups`` (``units``)."""
    c, k = clean.double().cpu(), corrupt.double().cpu()
    a_wins = a_n = f_wins = 0
    for g in groups:
        idx = torch.as_tensor(list(g))
        right = int((c[idx] > 0).sum())
        if 2 * right != len(g):  # a split couple is a tie
            a_n += 1
            a_wins += 2 * right > len(g)
        f_wins += bool(float((c[idx] - k[idx]).sum()) > 0)
    n = len(groups)
    answer, follows = sign_test(a_wins, a_n), sign_test(f_wins, n)
    able = None if n < min_units(alpha) else (answer.p <= alpha and follows.p <= alpha)
    return Ability(able=able, answer=answer, follows=follows, n_pairs=int(c.numel()), n_units=n,
                   n_mirrored=sum(len(g) == 2 for g in groups), alpha=alpha)


def pair_logit_diffs(model: Any, task: Task, *, batch_size: int = 32
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair, the logit difference answer - distractor at the last position on the clean
    and on the corrupt prompt ([N] float64 each): plain forwards of ``model`` (the demo, a
    bridge, a pattern source or a LoadedModel)."""
    from headgraph.core.circuits.model import Probe, circuit_model

    cm = circuit_model(model)
    out = {"clean": torch.zeros(task.n_pairs, dtype=torch.float64),
           "corrupt": torch.zeros(task.n_pairs, dtype=torch.float64)}
    with torch.no_grad():
        for rows in batches(task, batch_size):
            ans = torch.tensor([task.answer[i] for i in rows], device=cm.device)
            dis = torch.tensor([task.distractor[i] for i in rows], device=cm.device)
            for field, diffs in out.items():
                ids = torch.tensor([getattr(task, field)[i] for i in rows], device=cm.device)
                diffs[rows] = logit_diff(cm.forward(ids, Probe()), ans, dis).double().cpu()
    return out["clean"], out["corrupt"]


def task_ability(model: Any, task: Task, *, alpha: float = ALPHA) -> Ability:
    """Whether ``model`` does ``task`` (module docstring): two forwards per prompt pair."""
    clean, corrupt = pair_logit_diffs(model, task)
    return decide(clean, corrupt, units(task), alpha)


__all__ = ["ALPHA", "RULE", "STATES", "Ability", "SignTest", "decide", "min_units",
           "pair_logit_diffs", "sign_test", "task_ability", "units"]
