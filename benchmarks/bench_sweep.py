"""Sweep throughput: models per minute of ``headgraph sweep`` with 1 and 2 Ray workers.

headgraph only (nothing else sweeps these results). Builds ``--models`` checkpoints of the
demo's shape in a temporary folder (the demo's weights plus seeded noise, so each one has
its own fingerprint and computes everything afresh), or sweeps ``--specs`` instead, then for
each worker count starts a fresh local Ray runtime of that many CPUs, sweeps every model into
a fresh cache (server.sweep.run_sweep, the job's results unless ``--results``) and shuts it
down. Prints a Markdown table: Ray start-up, the sweep's wall time and models per minute with
and without the start-up; ``--out FILE`` also writes it into FILE (replacing an earlier
"## Sweep throughput" section there).

    .venv/bin/python benchmarks/bench_sweep.py [--models 8] [--workers 1,2] [--results job]
                                               [--out benchmarks/RESULTS.md]
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

SECTION = "## Sweep throughput"


def demo_checkpoints(folder: Path, n: int) -> list[str]:
    """``n`` copies of the demo folder with seeded noise on the weights (own fingerprints)."""
    import torch
    from safetensors.torch import load_file, save_file

    from headgraph.core.models.demo import DEMO_DIR

    sd = load_file(str(DEMO_DIR / "model.safetensors"))
    out = []
    for i in range(n):
        target = folder / f"step-{(i + 1) * 100}"
        shutil.copytree(DEMO_DIR, target)
        gen = torch.Generator().manual_seed(i)
        save_file({k: (v + 0.05 * torch.randn(v.shape, generator=gen, dtype=v.dtype)).contiguous()
                   if v.is_floating_point() else v for k, v in sd.items()},
                  str(target / "model.safetensors"))
        out.append(str(target))
    return out


def measure(specs: list[str], workers: int, results: list[str], work: Path) -> dict[str, float]:
    import ray

    from headgraph.server.settings import Settings
    from headgraph.server.sweep.run import run_sweep

    cache = Path(tempfile.mkdtemp(prefix=f"cache-{workers}-", dir=work))
    started = time.perf_counter()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    up = time.perf_counter() - started
    try:
        report = run_sweep(Settings.from_env(cache_dir=cache), specs, results, progress=False)
    finally:
        ray.shutdown()
    total = time.perf_counter() - started
    done = sum(r["status"] == "done" for r in report.rows)
    failed = [r for r in report.rows if r["status"] != "done"]
    if failed:
        print(f"failed: {failed[:3]}", file=sys.stderr)
    task_s = [float(r["seconds"]) for r in report.rows if r.get("seconds") is not None]
    return {"workers": workers, "models": len(specs), "done": done, "ray_up": up,
            "sweep": report.seconds, "total": total, "per_min": 60 * done / total,
            "per_min_sweep": 60 * done / report.seconds,
            "task_mean": sum(task_s) / max(len(task_s), 1)}


def table(rows: list[dict[str, float]], results: list[str], what: str) -> str:
    load = os.getloadavg()
    head = (f"{SECTION}\n\n{time.strftime('%Y-%m-%d %H:%M')}; {platform.machine()}, "
            f"{os.cpu_count()} CPUs (shared with other jobs), load average {load[0]:.2f}; {what}; "
            f"results: {','.join(results)}; one fresh local Ray runtime and cache per row, "
            "one model per Ray worker at a time (1 torch thread each).\n\n"
            "| Ray workers | models | Ray start-up s | sweep s | total s | models/min (total) "
            "| models/min (sweep only) | mean s per model |\n|---|---|---|---|---|---|---|---|\n")
    lines = [f"| {int(r['workers'])} | {int(r['done'])}/{int(r['models'])} | {r['ray_up']:.1f} | "
             f"{r['sweep']:.1f} | {r['total']:.1f} | {r['per_min']:.1f} | {r['per_min_sweep']:.1f} | "
             f"{r['task_mean']:.1f} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def write_section(path: Path, text: str) -> None:
    old = path.read_text() if path.exists() else ""
    start = old.find(SECTION)
    if start >= 0:
        nxt = old.find("\n## ", start + len(SECTION))
        old = old[:start] + (old[nxt + 1:] if nxt >= 0 else "")
    path.write_text(old.rstrip() + "\n\n" + text)


def main() -> int:
    from headgraph.server.sweep.task import parse_results

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", type=int, default=8, help="demo-shaped checkpoints to build and sweep")
    ap.add_argument("--specs", nargs="*", help="sweep these specs instead (the same for each row)")
    ap.add_argument("--workers", default="1,2", help="comma list of Ray worker counts")
    ap.add_argument("--results", default="job")
    ap.add_argument("--out", type=Path, help="also write the table into this file")
    args = ap.parse_args()
    results = parse_results(args.results)
    work = Path(tempfile.mkdtemp(prefix="bench-sweep-"))
    try:
        if args.specs:
            specs, what = list(args.specs), f"specs {' '.join(args.specs)}"
        else:
            specs = demo_checkpoints(work / "ckpts", args.models)
            what = (f"{args.models} demo-shaped checkpoints (2 layers x 8 heads, d_model 128; the "
                    "demo's weights plus seeded noise)")
        rows = []
        for w in (int(x) for x in args.workers.split(",")):
            rows.append(measure(specs, w, results, work))
            print(f"{w} workers: {rows[-1]['per_min']:.1f} models/min", file=sys.stderr)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    text = table(rows, results, what)
    print(text)
    if args.out:
        write_section(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
