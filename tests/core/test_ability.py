"""Whether a model does a task (core.circuits.ability): the two paired sign tests decided
against scipy on the demo's own forward in float64, the mirrored pair as one unit, a planted
preference for the answer token that is not doing the task, and too few pairs to tell."""

from __future__ import annotations

import copy
import json

import pytest
import torch
from scipy.stats import binomtest

from headgraph.core.circuits.ability import ALPHA, decide, min_units, task_ability, units
from headgraph.core.circuits.attribution import attribute
from headgraph.core.circuits.bundled import bundled_task
from headgraph.core.circuits.tasks import Task, parse_jsonl
from headgraph.core.models.demo import load_demo_model


@pytest.fixture(scope="module")
def demo():
    return load_demo_model()


def diffs64(model, task: Task) -> tuple[torch.Tensor, torch.Tensor]:
    """Per pair, logit[answer] - logit[distractor] at the last position of the clean and the
    corrupt prompt: the demo's own forward in float64, one prompt at a time."""
    m64 = copy.deepcopy(model).double()
    out = []
    with torch.no_grad():
        for prompts in (task.clean, task.corrupt):
            d = [m64(torch.tensor([ids]))[0, -1] for ids in prompts]
            out.append(torch.tensor([float(x[a] - x[b]) for x, a, b in zip(d, task.answer, task.distractor)],
                                    dtype=torch.float64))
    return out[0], out[1]


def p_greater(wins: int, n: int) -> float:
    return float(binomtest(wins, n, 0.5, alternative="greater").pvalue) if n else 1.0


@pytest.mark.parametrize("name, able", [("induction", True), ("successor", False), ("subtraction", False)])
def test_the_rule_against_scipy_on_the_demos_forward(demo, name, able):
    """The bundled task (32 pairs, seed 0): ``subtraction``'s rows come as pair, mirror (by
    construction: its texts), the others as single pairs; each test's p-value is scipy's
    exact binomial tail on the float64 differences. The demo does induction; successor and
    subtraction, which the former rule (clean accuracy > 50% and clean mean above corrupt)
    called done, it does not: neither follows the prompt more often than chance."""
    task = bundled_task(name, demo)
    c, k = diffs64(demo, task)
    mirrored = name == "subtraction"
    if mirrored:
        t = task.texts
        assert all(t[i + 1] == (t[i][1], t[i][0], t[i][3], t[i][2]) for i in range(0, 32, 2))
        groups = [(i, i + 1) for i in range(0, 32, 2)]
    else:
        groups = [(i,) for i in range(32)]
    assert units(task) == tuple(groups)
    answer = [int((c[list(g)] > 0).sum()) for g in groups]  # clean prompts right, per unit
    decided = [r for r, g in zip(answer, groups) if 2 * r != len(g)]
    a_wins = sum(2 * r > len(g) for r, g in zip(answer, groups) if 2 * r != len(g))
    f_wins = sum(float((c[list(g)] - k[list(g)]).sum()) > 0 for g in groups)
    p_a, p_f = p_greater(a_wins, len(decided)), p_greater(f_wins, len(groups))
    got = task_ability(demo, task)
    assert (got.answer.wins, got.answer.n, got.follows.wins, got.follows.n) == \
        (a_wins, len(decided), f_wins, len(groups))
    assert got.answer.p == pytest.approx(p_a, rel=1e-12) and got.follows.p == pytest.approx(p_f, rel=1e-12)
    assert got.able is (p_a <= ALPHA and p_f <= ALPHA) is able
    assert got.n_pairs == 32 and got.n_units == len(groups) and got.n_mirrored == (16 if mirrored else 0)
    assert got.state == ("able" if able else "not_able") and "sign tests" in got.rule
    if not able:  # what the former rule said
        assert float((c > 0).double().mean()) > 0.5 and float(c.mean()) > float(k.mean())


def test_the_circuits_metrics_carry_the_same_decision(demo):
    """attribute's metrics decide on its own forward's differences: the same as task_ability."""
    task = bundled_task("subtraction", demo, n=12)
    metrics = attribute(demo, task, method="eap").metrics
    again = task_ability(demo, task)
    assert metrics.ability is not None and metrics.able is again.able is False
    assert metrics.to_dict()["ability"] == again.to_dict() and metrics.to_dict()["able"] is False


def test_a_preference_for_the_answer_token_is_not_doing_the_task(demo):
    """A demo with a large bias towards one token X in the unembedding prefers X whatever the
    prompt. On mirrored pairs (X the answer of each pair, the distractor of its mirror) it is
    right on every pair and wrong on every mirror: every unit splits, nothing is for the answer,
    and it is not said to do the task; on the pairs alone the answer test would pass."""
    biased = copy.deepcopy(demo)
    X = 7
    with torch.no_grad():
        biased.b_U[X] += 50.0
    g = torch.Generator().manual_seed(3)
    rows = []
    for _ in range(16):
        clean = torch.randint(0, 64, (8,), generator=g).tolist()
        corrupt = clean[:4] + torch.randint(0, 64, (4,), generator=g).tolist()
        y = int(torch.randint(0, 63, (1,), generator=g))
        y += y >= X
        rows += [(clean, corrupt, X, y), (corrupt, clean, y, X)]
    task = Task("planted", tuple(tuple(r[0]) for r in rows), tuple(tuple(r[1]) for r in rows),
                tuple(r[2] for r in rows), tuple(r[3] for r in rows))
    c, k = diffs64(biased, task)
    assert bool((c[0::2] > 0).all()) and bool((c[1::2] < 0).all())  # the planted preference
    got = task_ability(biased, task)
    assert got.n_units == got.n_mirrored == 16 and got.able is False and got.state == "not_able"
    assert (got.answer.wins, got.answer.n, got.answer.p) == (0, 0, 1.0)
    # Counted pair by pair, the same prompts would pass the answer test (every pair right).
    alone = decide(c[0::2], k[0::2], [(i,) for i in range(16)])
    assert alone.answer.p == pytest.approx(p_greater(16, 16)) and alone.answer.p <= ALPHA


def test_too_few_pairs_to_tell(demo):
    """Under min_units(0.05) = 5 units not even a perfect outcome reaches 0.05 (scipy: 1/2^4 >
    0.05 >= 1/2^5): an uploaded task of 4 rows is "too few pairs to tell", never "does not";
    5 units decide, and 10 rows as 5 mirrored couples are 5 units."""
    assert min_units(ALPHA) == 5
    assert p_greater(4, 4) > ALPHA >= p_greater(5, 5)
    rows = [{"clean": f"t0{i} t1{i} t2{i} t0{i}", "corrupt": f"t3{i} t4{i} t5{i} t0{i}",
             "answer": f"t1{i}", "distractor": f"t6{i}"} for i in range(5)]
    four = parse_jsonl("\n".join(json.dumps(r) for r in rows[:4]), demo, name="four")
    got = task_ability(demo, four)
    assert got.n_units == 4 and got.able is None and got.state == "too_few_pairs"
    assert got.follows.p == pytest.approx(p_greater(got.follows.wins, 4))
    five = task_ability(demo, parse_jsonl("\n".join(json.dumps(r) for r in rows), demo, name="five"))
    assert five.n_units == 5 and five.able is not None
    mirrored = [r for row in rows for r in (row, {"clean": row["corrupt"], "corrupt": row["clean"],
                                                   "answer": row["distractor"], "distractor": row["answer"]})]
    task = parse_jsonl("\n".join(json.dumps(r) for r in mirrored), demo, name="mirrored")
    assert units(task) == tuple((i, i + 1) for i in range(0, 10, 2))
    assert task_ability(demo, task).n_units == 5
