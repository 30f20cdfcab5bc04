"""Tasks after MIB's circuit track (Mueller et al. 2025): its IOI variant, two-digit addition
and subtraction, and a synthetic multiple-choice task.

Like the other bundled tasks (core.circuits.tasks) each is drawn from a seeded generator and
built for one model's tokenizer: a drawn pair whose prompts are not equally long, or whose
answer or distractor is not one token (or both are the same token), is skipped and another
drawn, so the first n pairs are the same whatever n; a tokenizer that leaves too few pairs
raises InvalidInput saying why. The metric is the logit difference answer - distractor at
the last position, as for every task.

In each task the counterfactual's right answer is the clean prompt's distractor, so every
drawn pair is followed by its mirror (the counterfactual as the clean prompt, answer and
distractor swapped): a model's mere preference for one answer token over another (SmolLM2's
for some letters) then adds as much to the metric as it takes away, so it cannot raise the
clean accuracy by which a model is said to do the task.

- ``ioi-mib``: MIB's IOI (Wang et al. 2023's templates, a place and an object, both name
  orders): "Then, Mary and John went to the garden. John gave a ring to" -> " Mary" vs
  " John". Counterfactual: MIB's default for its circuit track (``s2_io_flip``): the repeated
  subject replaced by the indirect object ("... Mary gave a ring to"), so the distractor
  becomes the right answer.
- ``addition`` / ``subtraction``: "Calculate:\\n23 + 45 = 68" cut before the result: two-digit
  operands and result. Counterfactual: other operands (MIB's ``random_counterfactual``) with another answer
  token. The answer is the result's first token as the tokenizer writes the whole line: the
  whole number where every two-digit number is one token there (the demo, GPT-2, Llama 3),
  else its tens digit (tokenizers that split digits, as SmolLM2's does); the prompt ends where
  that token starts, so it may end in a space token.
- ``mcqa``: after MIB's CopyColors MCQA: "The apple is red. What color is the apple?\\nA.
  blue\\nB. red\\nC. green\\nD. pink\\nAnswer:" -> " B"; counterfactual: the same four options
  permuted so the right colour sits under another letter (the distractor).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from typing import Any

from headgraph.core.circuits.tasks import (
    NAMES,
    Task,
    TaskTokenizer,
    from_texts,
    single_words,
    task_tokenizer,
)
from headgraph.core.errors import InvalidInput
from headgraph.core.names import TASK_TOKENS_MAX

Row = tuple[str, str, str, str]  # (clean, corrupt, answer, distractor) texts
DRAWS_PER_PAIR = 20  # draws tried per prompt pair before a tokenizer is said to leave too few

MIB_IOI_TEMPLATES: tuple[str, ...] = (
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} had a lot of fun at the {PLACE}. {S} gave a {OBJECT} to",
    "Then, {A} and {B} were working at the {PLACE}. {S} decided to give a {OBJECT} to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "While {A} and {B} were commuting to the {PLACE}, {S} gave a {OBJECT} to",
    "Friends {A} and {B} found a {OBJECT} at the {PLACE}. {S} gave it to",
    "Afterwards, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to")
PLACES: tuple[str, ...] = ("store", "garden", "restaurant", "school", "hospital", "office",
                           "house", "station")
IOI_OBJECTS: tuple[str, ...] = ("ring", "kiss", "bone", "basketball", "computer", "necklace",
                                "drink", "snack")
COLORS: tuple[str, ...] = ("red", "blue", "green", "yellow", "black", "white", "brown", "pink",
                           "orange", "purple", "gray")
THINGS: tuple[str, ...] = ("apple", "ball", "car", "shirt", "cup", "chair", "house", "flower",
                           "book", "hat", "bike", "door", "kite", "lamp", "bag", "box")
LETTERS: tuple[str, ...] = ("A", "B", "C", "D")
# Before the operands: a model reading no BOS (SmolLM2) sees a number as its very first token
# otherwise, where it adds no better than chance (SmolLM2: 50% clean accuracy without, 91% with).
ARITHMETIC_PREFIX = "Calculate:\n"


def _tok(model: Any) -> TaskTokenizer:
    return model if isinstance(model, TaskTokenizer) else task_tokenizer(model)


def _fits(tok: TaskTokenizer, row: Row) -> bool:
    """Whether the model can read ``row`` as a task row: equally long prompts (at most
    TASK_TOKENS_MAX), an answer and a distractor of one token each, not the same one."""
    clean, corrupt = tok.prompts([row[0], row[1]])
    if len(clean) != len(corrupt) or not clean or len(clean) > TASK_TOKENS_MAX:
        return False
    a, d = tok.single(row[2]), tok.single(row[3])
    return len(a) == 1 and len(d) == 1 and a != d


def _collect(tok: TaskTokenizer, name: str, description: str, n: int, seed: int,
             draw: Callable[[random.Random], Row | None]) -> Task:
    """A Task of the first ``n`` rows of: each row ``draw`` makes that this tokenizer can read
    (_fits), then its mirror (module docstring); InvalidInput when DRAWS_PER_PAIR * n draws
    leave fewer."""
    rng = random.Random(seed)
    rows: list[Row] = []
    for _ in range(DRAWS_PER_PAIR * max(n, 1)):
        row = draw(rng)
        if row is not None and _fits(tok, row):
            rows += [row, (row[1], row[0], row[3], row[2])]  # the pair, then its mirror
            if len(rows) >= n:
                return from_texts(tok, name, description, rows[:n], where="prompt")
    raise InvalidInput(f"{name}: only {len(rows)} of {n} drawn prompt pairs suit this model's "
                       "tokenizer (equally long prompts, single-token answers)")


# -- IOI as MIB has it --------------------------------------------------------------------------

def ioi_mib(model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """MIB's IOI with its S2-IO flip counterfactual (module docstring): ``n`` prompt pairs."""
    tok = _tok(model)
    names = list(single_words(tok, NAMES))
    if len(names) < 2:
        raise InvalidInput(f"ioi-mib needs two names that are single tokens for this "
                           f"tokenizer; it has {len(names)} ({names})")

    def draw(rng: random.Random) -> Row:
        template = rng.choice(MIB_IOI_TEMPLATES)
        io, s = rng.sample(names, 2)
        first, second = (io, s) if rng.random() < 0.5 else (s, io)  # ABBA and BABA
        slots = {"A": first, "B": second, "PLACE": rng.choice(PLACES),
                 "OBJECT": rng.choice(IOI_OBJECTS)}
        return (template.format(S=s, **slots), template.format(S=io, **slots),
                " " + io, " " + s)

    return _collect(tok, "ioi-mib", "MIB's IOI (Wang et al. 2023 templates with a place and "
                    "an object): answer the indirect object, distractor the subject; "
                    "counterfactual (MIB's s2_io_flip): the repeated subject replaced by the "
                    "indirect object", n, seed, draw)


# -- two-digit arithmetic -------------------------------------------------------------------------

def _cut(tok: TaskTokenizer, text: str, start: int) -> tuple[str, str]:
    """``text`` cut before the token holding its character ``start``, as the tokenizer writes
    the whole text: (the prompt before that token, that token's text)."""
    if tok.demo:  # whitespace words
        return text[:start].rstrip(), " " + text[start:].split()[0]
    hf = tok.tokenizer
    assert hf is not None
    ids = [int(i) for i in hf.encode(text, add_special_tokens=False)]

    def decode(part: Sequence[int]) -> str:
        return hf.decode(list(part), clean_up_tokenization_spaces=False)

    k = next((k for k in range(len(ids)) if len(decode(ids[:k + 1])) > start), len(ids) - 1)
    return decode(ids[:k]), decode(ids[k:k + 1])


def _whole_numbers(tok: TaskTokenizer) -> bool:
    """Whether every two-digit result is one token after "=" for this tokenizer."""
    for c in range(10, 100):
        line = f"10 + 10 = {c}"
        if _cut(tok, line, len(line) - 2)[1].strip() != str(c):
            return False
    return True


def _arithmetic(model: Any, op: str, n: int, seed: int) -> Task:
    """``addition`` (op "+") or ``subtraction`` (op "-"), as the module docstring says."""
    tok = _tok(model)
    whole = _whole_numbers(tok)
    name = "addition" if op == "+" else "subtraction"

    def operands(rng: random.Random) -> tuple[int, int, int]:
        if op == "+":  # 10 <= a, b and a + b <= 99
            a = rng.randint(10, 89)
            b = rng.randint(10, 99 - a)
            return a, b, a + b
        a = rng.randint(20, 99)  # 10 <= b and a - b >= 10
        b = rng.randint(10, a - 10)
        return a, b, a - b

    def line(a: int, b: int, c: int) -> tuple[str, str] | None:
        text = f"{ARITHMETIC_PREFIX}{a} {op} {b} = {c}"
        prompt, answer = _cut(tok, text, len(text) - len(str(c)))
        want = str(c) if whole else str(c)[0]
        return (prompt, answer) if answer.strip() == want else None

    def draw(rng: random.Random) -> Row | None:
        clean = line(*operands(rng))
        if clean is None:
            return None
        for _ in range(8):  # other operands with another answer token
            other = line(*operands(rng))
            if other is not None and other[1] != clean[1]:
                return clean[0], other[0], clean[1], other[1]
        return None

    what = "the whole result" if whole else "its tens digit: this tokenizer splits digits"
    return _collect(tok, name, f"two-digit {name}: 'Calculate: a {op} b = ' -> the result's first token "
                    f"({what}) vs the counterfactual's; counterfactual: other operands",
                    n, seed, draw)


def addition(model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """Two-digit addition (module docstring): ``n`` prompt pairs."""
    return _arithmetic(model, "+", n, seed)


def subtraction(model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """Two-digit subtraction with a two-digit result (module docstring): ``n`` prompt pairs."""
    return _arithmetic(model, "-", n, seed)


# -- multiple choice --------------------------------------------------------------------------------

def mcqa(model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """Synthetic multiple choice (module docstring): ``n`` prompt pairs of four options."""
    tok = _tok(model)
    letters = list(single_words(tok, LETTERS))
    if len(letters) < len(LETTERS):
        raise InvalidInput(f"mcqa needs the letters {list(LETTERS)} as distinct single tokens "
                           f"(with a leading space) for this tokenizer; it has {letters}")

    def prompt(thing: str, color: str, options: Sequence[str]) -> str:
        listed = "".join(f"{letter}. {o}\n" for letter, o in zip(LETTERS, options, strict=True))
        return f"The {thing} is {color}. What color is the {thing}?\n{listed}Answer:"

    def draw(rng: random.Random) -> Row:
        thing = rng.choice(THINGS)
        options = rng.sample(COLORS, len(LETTERS))
        right = rng.randrange(len(LETTERS))
        moved = rng.choice([i for i in range(len(LETTERS)) if i != right])
        rest = [o for i, o in enumerate(options) if i != right]
        rng.shuffle(rest)
        permuted = rest[:moved] + [options[right]] + rest[moved:]
        return (prompt(thing, options[right], options), prompt(thing, options[right], permuted),
                " " + LETTERS[right], " " + LETTERS[moved])

    return _collect(tok, "mcqa", "multiple choice (after MIB's CopyColors MCQA): a stated "
                    "colour asked back among four lettered options -> the right letter; "
                    "counterfactual: the options permuted so the right colour sits under "
                    "another letter (the distractor)", n, seed, draw)


__all__ = ["COLORS", "LETTERS", "MIB_IOI_TEMPLATES", "addition", "ioi_mib", "mcqa",
           "subtraction"]
