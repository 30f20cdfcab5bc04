"""The subgraph import's bounds: an attacker's file is refused by its counts before any item is
checked, and the biggest file the link can hold parses with one head check per pin."""

from __future__ import annotations

import json
from typing import Any

import pytest

from headgraph.server.http.routers.vocabulary import served_vocabulary as vocabulary
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.figures.subgraph import (
    EXPORT_FORMAT,
    IMPORT_MAX_BYTES,
    SubgraphImportError,
    parse_import,
)
from headgraph.frontend.state.subgraph import GROUPS_MAX, PINS_MAX
from headgraph.frontend.state.transitions import next_state
from headgraph.frontend.state.url import default_state

VOCAB = Vocabulary.from_json(vocabulary())


class CountingIsHead:
    """VOCAB.is_head, counting its calls (the per-item work an import does)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, name: str) -> bool:
        self.calls += 1
        return VOCAB.is_head(name)


def heads(n: int) -> list[str]:
    return [f"L{i // 1000}H{i % 1000}" for i in range(n)]


def record(pins: list[str], groups: dict[str, Any] | None = None, labels: dict[str, str] | None = None) -> bytes:
    return json.dumps({"format": EXPORT_FORMAT, "model": "demo", "pins": pins, "groups": groups or {},
                       "labels": labels or {}}).encode()


def test_the_attack_file_is_refused_by_its_pin_count_before_any_head_is_checked() -> None:
    pins = heads(48_000)  # the reported file: 48k pins, one group listing them all
    raw = record(pins, {"all": pins})
    assert 900_000 < len(raw) <= IMPORT_MAX_BYTES  # under the byte limit: the count must stop it
    is_head = CountingIsHead()
    with pytest.raises(SubgraphImportError, match=f"48000 pins: a subgraph holds at most {PINS_MAX} pinned heads"):
        parse_import(raw, is_head)
    assert is_head.calls == 0


@pytest.mark.parametrize("groups, labels, words", [
    ({"all": ["L0H0"] * 48_000}, {}, f"group 'all' lists 48000 heads: at most {PINS_MAX}"),
    ({f"g{i}": ["L0H0"] for i in range(GROUPS_MAX + 1)}, {}, f"{GROUPS_MAX + 1} groups: .* at most {GROUPS_MAX}"),
    ({}, {f"x{i}": "t" for i in range(PINS_MAX + GROUPS_MAX + 1)}, "at most one per pin or group"),
    ({"g" * 5000: ["L9H9"]}, {}, r"group 'g{10,}… names 'L9H9', which is not pinned"),
])
def test_oversized_groups_and_labels_are_refused_with_their_limit(groups: dict, labels: dict, words: str) -> None:
    with pytest.raises(SubgraphImportError, match=words) as err:
        parse_import(record(heads(PINS_MAX), groups, labels), VOCAB.is_head)
    assert len(str(err.value)) < 200  # a message quotes names shortened, never a whole file


def test_the_biggest_allowed_import_parses_with_one_head_check_per_pin() -> None:
    pins = heads(PINS_MAX)
    size = PINS_MAX // GROUPS_MAX
    groups = {f"group {g}": pins[g * size:(g + 1) * size] for g in range(GROUPS_MAX)}
    labels = {**{p: f"head {p}" for p in pins}, **{g: f"label of {g}" for g in groups}}
    is_head = CountingIsHead()
    action = parse_import(record(pins, groups, labels), is_head)
    assert is_head.calls == PINS_MAX
    assert action["pins"] == pins and dict(action["groups"]) == groups and dict(action["labels"]) == labels
    state = next_state(default_state(VOCAB), "sub-action", action, VOCAB)
    assert state.pins == tuple(p for p in pins if VOCAB.is_head(p))
    assert len(state.groups) == GROUPS_MAX and len(state.labels) == len(labels)
