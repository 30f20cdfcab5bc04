"""Peak memory and time of the Composition Score (Q, K, V) on a large GQA attention shape.

    .venv/bin/python benchmarks/bench_cs_memory.py [--shape llama1b|llama7b] [--threads 2]

Random bf16 weights (the stored precision of the checkpoints) in HeadWeights; one fresh child
process runs ``composition_score`` for Q, K and V in turn and reports each mode's wall time and
the process's peak resident size (VmHWM, reset after the weights are built) above the
resident size with the weights in memory.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

SHAPES = {  # layers, query heads, kv heads, d_model, d_head
    "llama1b": (16, 32, 8, 2048, 64),
    "llama7b": (32, 32, 32, 4096, 128),
    "mistral7b": (32, 32, 8, 4096, 128),
}
MiB = 1024**2


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def child(shape: str, threads: int) -> None:
    import torch

    from headgraph.core.scores.composition_score import composition_score
    from headgraph.core.types import HeadWeights, ModelInfo

    torch.set_num_threads(threads)
    L, H, Hkv, d, dh = SHAPES[shape]
    g = torch.Generator().manual_seed(0)
    w = [torch.randn(L, n, a, b, generator=g).to(torch.bfloat16)
         for n, a, b in ((H, d, dh), (Hkv, d, dh), (Hkv, d, dh), (H, dh, d))]
    info = ModelInfo(name=shape, architecture="random", n_layers=L, n_heads=H, n_kv_heads=Hkv,
                     d_model=d, d_head=dh, d_vocab=None, dtype="bfloat16",
                     layer_indices=tuple(range(L)), processing="raw", source="config")
    heads = HeadWeights(info=info, W_Q=w[0], W_K=w[1], W_V=w[2], W_O=w[3], W_U=None,
                        fingerprint=shape)
    base = _status("VmRSS")
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")
    rows = []
    for mode in "QKV":
        start = time.perf_counter()
        composition_score(heads, mode)
        rows.append({"mode": mode, "seconds": time.perf_counter() - start,
                     "peak_above_weights": _status("VmHWM") - base})
    print(json.dumps({"weights_rss": base, "rows": rows}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama1b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.shape, args.threads)
        return
    out = subprocess.run([sys.executable, __file__, "--child", "--shape", args.shape,
                          "--threads", str(args.threads)], capture_output=True, text=True, check=True)
    data = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"{args.shape} {SHAPES[args.shape]}: RSS with bf16 weights {data['weights_rss'] / MiB:.0f} MiB")
    for row in data["rows"]:
        print(f"  CS {row['mode']}: {row['seconds']:.1f} s, peak so far "
              f"{row['peak_above_weights'] / MiB:.0f} MiB above the weights")


if __name__ == "__main__":
    main()
