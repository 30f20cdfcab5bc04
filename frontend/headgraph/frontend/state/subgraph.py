"""The subgraph view's state as links carry it: pinned heads, named groups of them
(supernodes) and custom labels. In the URL: ``pins=L0H1,L1H3``,
``groups=name:L0H1,L0H2;other:L1H3`` and ``labels=L1H3:text;name:text``, so names and labels
never hold ``;``, ``:``, ``,`` or ``=`` (NAME_DROP) and are NAME_MAX long. Whatever a link or
an import holds is made consistent (``clean_subgraph``), so a hand-edited link still opens.
"""

from __future__ import annotations

from typing import Any

from headgraph.frontend.api.names import Vocabulary

PINS_MAX = 64
GROUPS_MAX = 16
NAME_MAX = 48
NAME_DROP = ";:,=|"


def clean_name(value: Any) -> str:
    """A group name or custom label as the URL keeps it: no control characters nor NAME_DROP
    characters, blanks collapsed, at most NAME_MAX characters ("" when nothing is left)."""
    text = "".join(" " if c in NAME_DROP or ord(c) < 32 or ord(c) == 127 else c for c in str(value or ""))
    return " ".join(text.split())[:NAME_MAX].strip()


def clean_subgraph(pins: Any, groups: Any, labels: Any, vocab: Vocabulary
                   ) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[str, str], ...]]:
    """Pins, groups and labels made consistent: pins are head names (at most PINS_MAX, no
    repeats); a group is a name (``clean_name``, not a head name, at most GROUPS_MAX groups) of
    pinned heads, each head in one group at most (the first); a label's key is a pin or a
    group and its text non-blank. Anything else is dropped, so a hand-edited link still opens."""
    clean_pins = tuple(dict.fromkeys(str(h) for h in pins or () if vocab.is_head(str(h))))[:PINS_MAX]
    taken: set[str] = set()
    clean_groups: list[tuple[str, tuple[str, ...]]] = []
    for name, heads in groups or ():
        name = clean_name(name)
        members = tuple(h for h in dict.fromkeys(str(x) for x in heads or ()) if h in clean_pins and h not in taken)
        if not name or vocab.is_head(name) or not members or any(n == name for n, _ in clean_groups):
            continue
        taken |= set(members)
        clean_groups.append((name, members))
        if len(clean_groups) == GROUPS_MAX:
            break
    keys = set(clean_pins) | {n for n, _ in clean_groups}
    clean_labels = {}
    for key, text in labels or ():
        key, text = (str(key) if vocab.is_head(str(key)) else clean_name(key)), clean_name(text)
        if key in keys and text:
            clean_labels[key] = text
    return clean_pins, tuple(clean_groups), tuple(clean_labels.items())


def parse_subgraph(pins: str | None, groups: str | None, labels: str | None, vocab: Vocabulary
                   ) -> tuple[tuple[str, ...], tuple[tuple[str, tuple[str, ...]], ...], tuple[tuple[str, str], ...]]:
    """The URL's ``pins`` / ``groups`` / ``labels`` values (see PINS_MAX) made consistent."""
    pin_list = [p.strip().upper() for p in (pins or "").split(",") if p.strip()]
    group_list = []
    for item in (groups or "").split(";"):
        name, sep, heads = item.partition(":")
        if sep:
            group_list.append((name, [h.strip().upper() for h in heads.split(",") if h.strip()]))
    label_list = [(k.strip(), v) for k, sep, v in (item.partition(":") for item in (labels or "").split(";")) if sep]
    label_list = [(k.upper() if vocab.is_head(k.upper()) else k, v) for k, v in label_list]
    return clean_subgraph(pin_list, group_list, label_list, vocab)


__all__ = ["GROUPS_MAX", "NAME_DROP", "NAME_MAX", "PINS_MAX", "clean_name", "clean_subgraph",
           "parse_subgraph"]
