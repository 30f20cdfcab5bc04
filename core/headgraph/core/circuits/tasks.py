"""Tasks: prompt pairs (clean, corrupt) with an answer and a distractor token, per model.

A task's metric is the logit difference answer - distractor at the last position of a
prompt; a task reports the mean metric on clean and on corrupt prompts and the accuracy (the
share of prompts whose answer beats the distractor). Token ids are the model's own: prompts
go through ``core.models.runnable.tokenize_prompts`` (BOS as the model's tokenizer adds it),
answers must be one token on their own.

Builders of the bundled tasks here (each seeded, each checked against the model's tokenizer;
``core.circuits.benchmark_tasks`` adds MIB's, ``core.circuits.bundled`` names them all):

- ``ioi``: indirect-object identification in the style of Wang et al. (2023): "When Mary and
  John went to the store, John gave a drink to" -> " Mary" (answer: the indirect object)
  vs " John" (distractor: the subject); the corrupt prompt puts a third name where the
  subject is repeated, so nothing says who the indirect object is. Names are kept only when
  each is one token for this tokenizer (with a leading space; the demo hashes words).
- ``induction``: random tokens r (``length`` of them) then r again up to its second-last
  token; answer: r's last token; distractor: a random token in neither prompt; corrupt: the
  first half replaced by other random tokens, so the second half repeats nothing. Works on
  any vocabulary (the demo's 64 tokens too).
- ``successor``: three consecutive items of an ordered list (weekdays, months, letters) ->
  the next item (answer) vs the item before the first (distractor); the corrupt prompt
  lists the same items in reverse, so continuing the order points at the distractor.

User tasks come as JSONL, one ``{"clean", "corrupt", "answer", "distractor"}`` object a line
(``parse_jsonl``), checked row by row: InvalidInput names the first bad row.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headgraph.core.errors import InvalidInput
from headgraph.core.names import TASK_ROWS_MAX, TASK_TOKENS_MAX

JSONL_KEYS: tuple[str, ...] = ("clean", "corrupt", "answer", "distractor")


@dataclass(frozen=True)
class Task:
    """Prompt pairs in one model's token ids: ``clean[i]`` and ``corrupt[i]`` have equal
    lengths; ``answer[i]`` / ``distractor[i]`` are the tokens compared at the last position."""

    name: str
    clean: tuple[tuple[int, ...], ...]
    corrupt: tuple[tuple[int, ...], ...]
    answer: tuple[int, ...]
    distractor: tuple[int, ...]
    description: str = ""
    texts: tuple[tuple[str, str, str, str], ...] = ()  # (clean, corrupt, answer, distractor)

    def __post_init__(self) -> None:
        n = len(self.clean)
        if not n:
            raise InvalidInput(f"task {self.name!r} has no prompt pairs")
        if not (len(self.corrupt) == len(self.answer) == len(self.distractor) == n):
            raise InvalidInput(f"task {self.name!r}: clean, corrupt, answer and distractor "
                               "must have one entry per prompt pair")
        for i, (a, b) in enumerate(zip(self.clean, self.corrupt, strict=True)):
            if len(a) != len(b):
                raise InvalidInput(f"task {self.name!r} row {i + 1}: clean and corrupt are "
                                   f"{len(a)} and {len(b)} tokens; they must be equally long")
            if not a:
                raise InvalidInput(f"task {self.name!r} row {i + 1}: an empty prompt")

    @property
    def n_pairs(self) -> int:
        return len(self.clean)

    def content_hash(self) -> str:
        """sha256 (hex, 16 digits) of the token ids: the same ids, the same hash."""
        body = json.dumps([self.clean, self.corrupt, self.answer, self.distractor])
        return hashlib.sha256(body.encode()).hexdigest()[:16]

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "description": self.description, "n_pairs": self.n_pairs,
                "hash": self.content_hash(),
                "lengths": sorted({len(r) for r in self.clean}),
                "examples": [dict(zip(JSONL_KEYS, t)) for t in self.texts[:5]]}


# -- the model's tokenizer -------------------------------------------------------------------

class TaskTokenizer:
    """What a task needs of a model's tokenizer: prompts as the model reads them, single
    tokens, and ids to draw random tokens from."""

    def __init__(self, source: Any) -> None:
        from headgraph.core.models.demo import DemoModel

        self.source = source
        self.demo = isinstance(source, DemoModel)
        # the checkpoint's own tokenizer (a TokenizedSource's), else its bridge's
        self.tokenizer = None if self.demo else getattr(source, "tokenizer", None)
        if not self.demo and self.tokenizer is None:
            bridge = getattr(source, "bridge", None)
            self.tokenizer = None if bridge is None else getattr(bridge, "tokenizer", None)
        if not self.demo and self.tokenizer is None:
            raise InvalidInput("this model has no tokenizer, so it cannot run a task")

    @property
    def bos(self) -> int | None:
        return getattr(self.source, "bos_token_id", None)

    def prompts(self, texts: Sequence[str]) -> list[tuple[int, ...]]:
        """Each text's ids as the model reads it (BOS as its tokenizer adds it)."""
        from headgraph.core.models.runnable import tokenize_prompts

        out: list[tuple[int, ...]] = []
        for start in range(0, len(texts), 64):
            ids, mask = tokenize_prompts(self.source, list(texts[start:start + 64]))
            for row, m in zip(ids.tolist(), mask.bool().tolist(), strict=True):
                out.append(tuple(int(i) for i, keep in zip(row, m, strict=True) if keep))
        return out

    def single(self, text: str) -> list[int]:
        """The ids of ``text`` on its own (no BOS): one id when it is a single token."""
        if self.demo:
            return [int(self.source.token_id(w)) for w in text.split()]
        assert self.tokenizer is not None
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def pool(self) -> list[int]:
        """Token ids safe to draw random tokens from."""
        pool = getattr(self.source, "token_pool", None)
        if callable(pool):
            return [int(i) for i in torch.as_tensor(pool()).tolist()]
        return list(range(int(self.source.d_vocab)))


def task_tokenizer(model: Any) -> TaskTokenizer:
    """The TaskTokenizer of the demo model, a pattern source, a bridge or a LoadedModel."""
    if hasattr(model, "patterns") and hasattr(model, "info") and not hasattr(model, "blocks_with"):
        model = model.patterns
    if hasattr(model, "source") and not hasattr(model, "tokenize"):  # a circuits CircuitModel
        model = model.source
    if callable(getattr(model, "blocks_with", None)):
        from headgraph.core.models.runnable import BridgePatternSource

        model = BridgePatternSource(model)
    return TaskTokenizer(model)


def from_texts(tok: TaskTokenizer, name: str, description: str,
                rows: Sequence[tuple[str, str, str, str]], *, where: str = "row") -> Task:
    """A Task from (clean, corrupt, answer, distractor) texts; InvalidInput names the bad row."""
    if len(rows) > TASK_ROWS_MAX:
        raise InvalidInput(f"the task has {len(rows)} rows; at most {TASK_ROWS_MAX}")
    clean = tok.prompts([r[0] for r in rows])
    corrupt = tok.prompts([r[1] for r in rows])
    answers, distractors = [], []
    for i, (row, a, b) in enumerate(zip(rows, clean, corrupt, strict=True)):
        label = f"{where} {i + 1}"
        if len(a) != len(b):
            raise InvalidInput(f"{label}: clean and corrupt are {len(a)} and {len(b)} tokens "
                               "for this model's tokenizer; they must be equally long")
        if len(a) > TASK_TOKENS_MAX:
            raise InvalidInput(f"{label}: the prompt is {len(a)} tokens; at most {TASK_TOKENS_MAX}")
        if not a:
            raise InvalidInput(f"{label}: the clean prompt is empty")
        ids = []
        for key, text in (("answer", row[2]), ("distractor", row[3])):
            got = tok.single(text)
            if len(got) != 1:
                raise InvalidInput(f"{label}: {key} {text!r} is {len(got)} tokens for this "
                                   "model's tokenizer; it must be exactly one")
            ids.append(got[0])
        if ids[0] == ids[1]:
            raise InvalidInput(f"{label}: answer and distractor are the same token")
        answers.append(ids[0])
        distractors.append(ids[1])
    return Task(name=name, clean=tuple(clean), corrupt=tuple(corrupt), answer=tuple(answers),
                distractor=tuple(distractors), description=description,
                texts=tuple(tuple(r) for r in rows))  # type: ignore[arg-type]


# -- bundled tasks ----------------------------------------------------------------------------

NAMES: tuple[str, ...] = (
    "Mary", "John", "Tom", "James", "Dan", "Sid", "Martin", "Amy", "Kate", "Paul", "Anna",
    "Mark", "Sarah", "David", "Lisa", "Peter", "Emma", "Jack", "Laura", "Michael", "Alice",
    "Bob", "Chris", "Eric", "Frank", "George", "Helen", "Ian", "Jane", "Kevin", "Linda",
    "Nick", "Rachel", "Steve", "Tim", "Victoria", "William", "Adam", "Ben", "Carl")
IOI_TEMPLATES: tuple[str, ...] = (
    "When {A} and {B} went to the store, {S} gave a drink to",
    "When {A} and {B} went to the park, {S} gave a ball to",
    "After {A} and {B} went to the office, {S} gave a book to",
    "While {A} and {B} were working at the garden, {S} gave a key to",
    "Then, {A} and {B} had a long argument. Afterwards {S} said to",
    "Friends {A} and {B} found a necklace at the school. {S} gave it to",
    "When {A} and {B} got a letter at the house, {S} decided to give it to",
    "The local big {A} and {B} went to the restaurant. {S} gave a snack to")
SEQUENCES: tuple[tuple[str, ...], ...] = (
    ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday"),
    ("January", "February", "March", "April", "May", "June", "July", "August", "September",
     "October", "November", "December"),
    tuple("ABCDEFGHIJKLMNOPQRSTUVWXYZ"))


def single_words(tok: TaskTokenizer, words: Sequence[str]) -> dict[str, int]:
    """The words that are one token with a leading space, with their ids, ids distinct."""
    out: dict[str, int] = {}
    seen: set[int] = set()
    for w in words:
        ids = tok.single(" " + w)
        if len(ids) == 1 and ids[0] not in seen:
            out[w] = ids[0]
            seen.add(ids[0])
    return out


def ioi(model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """Indirect-object identification (module docstring): ``n`` prompt pairs."""
    tok = model if isinstance(model, TaskTokenizer) else task_tokenizer(model)
    names = list(single_words(tok, NAMES))
    if len(names) < 3:
        raise InvalidInput(f"ioi needs three names that are single tokens for this tokenizer; "
                           f"it has {len(names)} ({names})")
    rng = random.Random(seed)
    rows = []
    for i in range(n):
        template = IOI_TEMPLATES[i % len(IOI_TEMPLATES)]
        io, s, third = rng.sample(names, 3)
        first, second = (io, s) if rng.random() < 0.5 else (s, io)  # ABB and BAB orders
        rows.append((template.format(A=first, B=second, S=s),
                     template.format(A=first, B=second, S=third), " " + io, " " + s))
    return from_texts(tok, "ioi", "indirect-object identification (Wang et al. 2023): answer "
                       "the indirect object, distractor the subject; corrupt: a third name "
                       "for the repeated subject", rows, where="prompt")


def induction(model: Any, *, n: int = 32, length: int = 10, seed: int = 0) -> Task:
    """Repeated random tokens (module docstring): ``n`` prompt pairs of ``length`` random
    tokens, then that sequence again up to its second-last token."""
    tok = model if isinstance(model, TaskTokenizer) else task_tokenizer(model)
    if length < 3:
        raise InvalidInput("induction needs a length of at least 3")
    pool = tok.pool()
    if len(pool) < 2 * length + 1:
        raise InvalidInput(f"induction of length {length} needs {2 * length + 1} distinct "
                           f"tokens; the model has {len(pool)}")
    bos = [] if tok.bos is None else [int(tok.bos)]
    rng = random.Random(seed)
    clean, corrupt, answers, distractors = [], [], [], []
    for _ in range(n):
        drawn = rng.sample(pool, 2 * length + 1)
        r, other, distractor = drawn[:length], drawn[length:2 * length], drawn[-1]
        clean.append(tuple(bos + r + r[:-1]))
        corrupt.append(tuple(bos + other + r[:-1]))
        answers.append(r[-1])
        distractors.append(distractor)
    return Task(name="induction", clean=tuple(clean), corrupt=tuple(corrupt),
                answer=tuple(answers), distractor=tuple(distractors),
                description=f"repeated random tokens ({length} then the first {length - 1} "
                            "again): answer the next repeated token, distractor a token in "
                            "neither prompt; corrupt: the first half replaced, so nothing repeats")


def successor(model: Any, *, n: int = 32, seed: int = 0) -> Task:
    """Ordered lists (module docstring): ``n`` prompt pairs."""
    tok = model if isinstance(model, TaskTokenizer) else task_tokenizer(model)
    windows: list[tuple[str, ...]] = []
    for seq in SEQUENCES:
        single = single_words(tok, seq)
        for i in range(len(seq)):  # cyclic windows (before, a, b, c, next), all single tokens
            w = tuple(seq[(i + j) % len(seq)] for j in range(5))
            if all(x in single for x in w) and len({single[x] for x in w}) == 5:
                windows.append(w)
    if not windows:
        raise InvalidInput("successor needs five consecutive weekdays, months or letters that "
                           "are single tokens for this tokenizer; there are none")
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        before, a, b, c, nxt = rng.choice(windows)
        rows.append((f"Sequence: {a}, {b}, {c},", f"Sequence: {c}, {b}, {a},",
                     " " + nxt, " " + before))
    return from_texts(tok, "successor", "the next item of an ordered list (weekdays, months, "
                       "letters): answer the successor, distractor the item before; corrupt: "
                       "the same items reversed", rows, where="prompt")


# -- user tasks --------------------------------------------------------------------------------

def read_jsonl(data: bytes | str) -> list[tuple[str, str, str, str]]:
    """Rows (clean, corrupt, answer, distractor) of a JSONL task, checked without a model:
    UTF-8, one JSON object a line with exactly the four string keys, at most TASK_ROWS_MAX rows
    (blank lines skipped). InvalidInput names the line."""
    if isinstance(data, str):
        lines = data.splitlines()
    else:
        lines = []
        for i, raw in enumerate(data.splitlines()):
            try:
                lines.append(raw.decode("utf-8-sig" if i == 0 else "utf-8"))
            except UnicodeDecodeError as err:
                raise InvalidInput(f"line {i + 1}: not UTF-8 text (byte {err.start})") from None
    rows: list[tuple[str, str, str, str]] = []
    for i, line in enumerate(lines):
        if not line.strip():
            continue
        if len(rows) >= TASK_ROWS_MAX:
            raise InvalidInput(f"line {i + 1}: too many rows; a task has at most {TASK_ROWS_MAX}")
        try:
            obj = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as err:
            raise InvalidInput(f"line {i + 1}: not JSON ({getattr(err, 'msg', err)})") from None
        if not isinstance(obj, dict):
            raise InvalidInput(f"line {i + 1}: expected an object with keys {list(JSONL_KEYS)}")
        missing = [k for k in JSONL_KEYS if k not in obj]
        extra = sorted(set(obj) - set(JSONL_KEYS))
        if missing or extra:
            raise InvalidInput(f"line {i + 1}: missing keys {missing}, unknown keys {extra}; "
                               f"a row has exactly {list(JSONL_KEYS)}")
        bad = [k for k in JSONL_KEYS if not isinstance(obj[k], str) or not obj[k]]
        if bad:
            raise InvalidInput(f"line {i + 1}: {bad[0]} must be a non-empty string")
        if any("\x00" in obj[k] for k in JSONL_KEYS):
            raise InvalidInput(f"line {i + 1}: a NUL character")
        rows.append(tuple(obj[k] for k in JSONL_KEYS))  # type: ignore[arg-type]
    if not rows:
        raise InvalidInput("the task has no rows")
    return rows


def parse_jsonl(data: bytes | str, model: Any, *, name: str = "uploaded",
                description: str = "") -> Task:
    """A user Task from JSONL (read_jsonl) in ``model``'s token ids; InvalidInput names the
    line of the first bad row (unequal clean / corrupt lengths, an answer or distractor that
    is not one token, too many rows, bad encoding)."""
    rows = read_jsonl(data)
    lines = _line_numbers(data)
    tok = model if isinstance(model, TaskTokenizer) else task_tokenizer(model)
    try:
        return from_texts(tok, name, description, rows, where="row")
    except InvalidInput as err:
        msg = str(err)
        if msg.startswith("row ") and lines:
            n = int(msg.split(":", 1)[0].split()[1])
            msg = f"line {lines[n - 1]}:" + msg.split(":", 1)[1]
        raise InvalidInput(msg) from None


def _line_numbers(data: bytes | str) -> list[int]:
    text = data if isinstance(data, str) else data.decode("utf-8-sig", errors="replace")
    return [i + 1 for i, line in enumerate(text.splitlines()) if line.strip()]


# -- the metric ---------------------------------------------------------------------------------

def logit_diff(logits: torch.Tensor, answer: torch.Tensor, distractor: torch.Tensor
               ) -> torch.Tensor:
    """logit[answer] - logit[distractor] at the last position, per row: logits [B, T, V],
    answer / distractor [B] -> [B]."""
    last = logits[:, -1, :]
    return (last.gather(-1, answer[:, None]) - last.gather(-1, distractor[:, None]))[:, 0]


def batches(task: Task, batch_size: int) -> list[list[int]]:
    """Row indices grouped by prompt length (no padding anywhere), at most ``batch_size`` a
    group, in a fixed order."""
    by_len: dict[int, list[int]] = {}
    for i, row in enumerate(task.clean):
        by_len.setdefault(len(row), []).append(i)
    out = []
    for length in sorted(by_len):
        rows = by_len[length]
        out.extend(rows[s:s + batch_size] for s in range(0, len(rows), batch_size))
    return out


__all__ = ["JSONL_KEYS", "NAMES", "Task", "TaskTokenizer", "batches", "from_texts",
           "induction", "ioi", "logit_diff", "parse_jsonl", "read_jsonl", "single_words",
           "successor", "task_tokenizer"]
