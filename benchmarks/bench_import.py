"""CPU time of the dashboard's subgraph import (figures.subgraph.parse_import) on the file an
anonymous client can upload: 48k pins and one group listing them (1.0 MB, under the byte
limit; refused by its counts), next to the biggest file the link holds (PINS_MAX pins,
GROUPS_MAX groups, a label on each). Target: both well under 50 ms on one core.

    .venv/bin/python benchmarks/bench_import.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import time

from headgraph.core.names import vocabulary
from headgraph.frontend.api.names import Vocabulary
from headgraph.frontend.figures.subgraph import EXPORT_FORMAT, SubgraphImportError, parse_import
from headgraph.frontend.state.subgraph import GROUPS_MAX, PINS_MAX


def heads(n: int) -> list[str]:
    return [f"L{i // 1000}H{i % 1000}" for i in range(n)]


def files() -> dict[str, bytes]:
    attack = heads(48_000)
    pins = heads(PINS_MAX)
    size = PINS_MAX // GROUPS_MAX
    groups = {f"group {g}": pins[g * size:(g + 1) * size] for g in range(GROUPS_MAX)}
    labels = {**{p: f"head {p}" for p in pins}, **{g: f"label of {g}" for g in groups}}
    return {"48k pins, one group of them (refused)": json.dumps(
                {"format": EXPORT_FORMAT, "pins": attack, "groups": {"all": attack}}).encode(),
            f"{PINS_MAX} pins, {GROUPS_MAX} groups, {len(labels)} labels (parsed)": json.dumps(
                {"format": EXPORT_FORMAT, "pins": pins, "groups": groups, "labels": labels}).encode()}


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU time of the subgraph import")
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    is_head = Vocabulary.from_json(vocabulary()).is_head
    print(f"| file | bytes | CPU ms (best of {args.repeat}) | outcome |\n|---|---:|---:|---|")
    for name, raw in files().items():
        best, outcome = float("inf"), "parsed"
        for _ in range(args.repeat):
            start = time.process_time()
            try:
                parse_import(raw, is_head)
            except SubgraphImportError as err:
                outcome = f"refused: {err}"
            best = min(best, time.process_time() - start)
        print(f"| {name} | {len(raw)} | {best * 1000:.1f} | {outcome} |")


if __name__ == "__main__":
    main()
