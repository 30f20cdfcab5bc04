"""Benchmark headgraph's core math against TransformerLens, one subprocess per measurement.

    .venv/bin/python benchmarks/bench_core.py [--quick] [--repeat 7] [--out benchmarks/RESULTS.md]

headgraph runs on plain torch (one product path: torch.bmm / addmm, MKL on this CPU); each
cell prints headgraph's and TransformerLens's time side by side, measured in the same run.

Measures PK OQ+OK+OV and CS Q+K+V on GPT-2-small, Qwen2-0.5B and BLOOM-560M attention shapes
(random weights, no download) and PK OK on a 32 x 32 x 4096 x 128 shape (headgraph only).
Each measurement runs in a fresh child process with ``torch.set_num_threads(1)``: peak memory is
the child's ``ru_maxrss`` after the computation minus its resident size just before it (the
peak counter is reset first via /proc/self/clear_refs), so measurements cannot contaminate
each other. headgraph reads HeadWeights built from random tensors; TransformerLens reads a
TransformerBridge booted from a random model of the same attention shape saved to a temporary
folder (small MLPs and vocabulary; they do not enter either computation). The GPT-2 PK cells
(the speed target) are measured ``--repeat`` times per tool, alternating, keeping each tool's
best wall time. ``--out`` replaces the table and keeps a trailing "## Notes" section if the file
has one.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 1024**3
MiB = 1024**2
TL_CS_LIMIT_BYTES = 14 * GiB
PK_SPEEDUP = 5  # GPT-2 PK OQ+OK+OV: headgraph must be at least this many times faster than TL


@dataclass(frozen=True)
class Shape:
    name: str
    arch: str
    layers: int
    heads: int
    kv_heads: int
    d_model: int
    d_head: int


SHAPES = {
    "gpt2": Shape("GPT-2 small", "gpt2", 12, 12, 12, 768, 64),
    "qwen2": Shape("Qwen2-0.5B", "qwen2", 24, 14, 2, 896, 64),
    "bloom": Shape("BLOOM-560M", "bloom", 24, 16, 16, 1024, 64),
    "big": Shape("7B-class", "none", 32, 32, 32, 4096, 128),
}


def shape_label(s: Shape) -> str:
    kv = f"{s.heads}q/{s.kv_heads}kv" if s.kv_heads != s.heads else f"{s.heads}"
    return f"{s.name} ({s.layers} x {kv} x {s.d_model} x {s.d_head})"


# ----------------------------------------------------------------------------- child side


def _rss_bytes() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak() -> None:
    try:
        with open("/proc/self/clear_refs", "w") as fh:
            fh.write("5")
    except OSError:
        pass  # peak then includes setup; noted in the table header


def _random_heads(shape: Shape, dtype: Any = None, share_qv: bool = False) -> Any:
    import torch

    from headgraph.core.types import HeadWeights, ModelInfo

    dtype = dtype or torch.float32
    g = torch.Generator().manual_seed(0)

    def draw(*size: int) -> torch.Tensor:
        out = torch.empty(*size, dtype=dtype)
        for i in range(size[0]):  # layer by layer: no float32 copy of a whole low-precision stack
            out[i] = torch.randn(*size[1:], generator=g).mul_(0.02)
        return out

    L, H, Hkv, d, dh = shape.layers, shape.heads, shape.kv_heads, shape.d_model, shape.d_head
    W_K = draw(L, Hkv, d, dh)
    W_O = draw(L, H, dh, d)
    W_Q = W_K if share_qv else draw(L, H, d, dh)
    W_V = W_K if share_qv else draw(L, Hkv, d, dh)
    info = ModelInfo(name=shape.name, architecture="random", n_layers=L, n_heads=H, n_kv_heads=Hkv,
                     d_model=d, d_head=dh, d_vocab=None, dtype=str(dtype).replace("torch.", ""),
                     layer_indices=tuple(range(L)), processing="raw", source="config")
    return HeadWeights(info=info, W_Q=W_Q, W_K=W_K, W_V=W_V, W_O=W_O, W_U=None, fingerprint="bench")


def run_child(spec: dict[str, Any]) -> dict[str, Any]:
    """One measurement; returns {"status", "seconds", "peak_bytes"}."""
    os.environ["HF_HUB_OFFLINE"] = "1"
    import torch

    torch.set_num_threads(1)
    shape = SHAPES[spec["shape"]]
    if spec["tool"] == "headgraph":
        from headgraph.core.scores.composition_score import composition_score
        from headgraph.core.scores.pk import all_pairings

        if spec["shape"] == "big":
            heads = _random_heads(shape, dtype=torch.bfloat16, share_qv=True)
        else:
            heads = _random_heads(shape)
        if spec["what"] == "pk":
            # One call for the pairings: each role's bases and projector pieces are built once.
            job = lambda: all_pairings(heads, pairings=spec["pairings"])  # noqa: E731
        else:
            job = lambda: [composition_score(heads, m) for m in "QKV"]  # noqa: E731
    else:
        from transformer_lens.model_bridge import TransformerBridge
        from transformer_lens.tools.analysis.projection_kernel import attention_head_subspace_affinity

        bridge = TransformerBridge.boot_transformers(spec["folder"], device="cpu")
        bridge.eval()
        if spec["what"] == "pk":
            job = lambda: [attention_head_subspace_affinity(bridge, target_role=p[1])  # noqa: E731
                           for p in spec["pairings"]]
        else:
            # no_grad: bridge weights require grad, and kept results would otherwise hold
            # TransformerLens's whole autograd graph (several GiB) alive between modes.
            def job() -> list[Any]:
                with torch.no_grad():
                    return [bridge.all_composition_scores(m) for m in "QKV"]
        if spec.get("limit_bytes"):
            resource.setrlimit(resource.RLIMIT_AS, (spec["limit_bytes"], spec["limit_bytes"]))
    import gc

    gc.collect()
    _reset_peak()
    base = _rss_bytes()
    start = time.perf_counter()
    cpu_start = time.process_time()
    try:
        job()
    except (MemoryError, RuntimeError) as err:
        text = str(err)
        if isinstance(err, MemoryError) or "alloc" in text.lower() or "memory" in text.lower():
            return {"status": "OOM", "seconds": time.perf_counter() - start, "peak_bytes": None,
                    "detail": text[:200]}
        raise
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu_start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base
    return {"status": "ok", "seconds": seconds, "cpu_seconds": cpu_seconds, "peak_bytes": max(0, peak)}


# ----------------------------------------------------------------------------- parent side


def _tokenizer() -> Any:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(["the quick brown fox jumps over the lazy dog"] * 20, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>", eos_token="<|endoftext|>")


def save_model(shape: Shape, folder: Path) -> Path:
    """A random model with ``shape``'s attention (small MLP/vocab) + tokenizer, saved to folder."""
    import torch
    from transformers import (
        BloomConfig,
        BloomForCausalLM,
        GPT2Config,
        GPT2LMHeadModel,
        Qwen2Config,
        Qwen2ForCausalLM,
    )

    tok = _tokenizer()
    common = dict(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id)
    if shape.arch == "gpt2":
        cfg, cls = GPT2Config(n_layer=shape.layers, n_head=shape.heads, n_embd=shape.d_model,
                              n_inner=64, n_positions=64, **common), GPT2LMHeadModel
    elif shape.arch == "qwen2":
        cfg, cls = Qwen2Config(num_hidden_layers=shape.layers, num_attention_heads=shape.heads,
                               num_key_value_heads=shape.kv_heads, hidden_size=shape.d_model,
                               intermediate_size=64, max_position_embeddings=64, **common), Qwen2ForCausalLM
    else:
        cfg, cls = BloomConfig(n_layer=shape.layers, n_head=shape.heads, hidden_size=shape.d_model,
                               **common), BloomForCausalLM
    torch.manual_seed(0)
    cls(cfg).save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


def measure(spec: dict[str, Any], timeout: float) -> dict[str, Any]:
    """Run one measurement in a fresh interpreter."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", json.dumps(spec)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return {"status": f"timeout > {timeout:.0f} s", "seconds": None, "peak_bytes": None}
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    if proc.returncode != 0 or not lines:
        tail = proc.stderr.strip().splitlines()[-1:] or ["?"]
        oom = proc.returncode in (-9, 137) or "memory" in tail[0].lower() or "alloc" in tail[0].lower()
        return {"status": "OOM" if oom else f"error: {tail[0][:120]}", "seconds": None, "peak_bytes": None}
    return json.loads(lines[-1][len("RESULT "):])


def _fmt_time(r: dict[str, Any] | None) -> str:
    if r is None:
        return "-"
    if r["status"] != "ok":
        return r["status"]
    return f"{r['seconds']:.2f} s"


def _fmt_peak(r: dict[str, Any] | None) -> str:
    if r is None or r.get("peak_bytes") is None:
        return "-"
    return f"{r['peak_bytes'] / GiB:.2f} GiB" if r["peak_bytes"] >= GiB else f"{r['peak_bytes'] / MiB:.0f} MiB"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="GPT-2 shape only")
    parser.add_argument("--out", type=Path, help="also write the Markdown table here")
    parser.add_argument("--repeat", type=int, default=7,
                        help="GPT-2 PK cells: runs per tool, alternating, best wall time kept (default 7)")
    parser.add_argument("--what", choices=("pk", "cs", "both"), default="both",
                        help="which computations to measure (default both)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--save-model", nargs=2, metavar=("SHAPE", "FOLDER"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(run_child(json.loads(args.child))), flush=True)
        return 0
    if args.save_model:
        save_model(SHAPES[args.save_model[0]], Path(args.save_model[1]))
        return 0

    os.environ["HF_HUB_OFFLINE"] = "1"
    load_start = os.getloadavg()
    shapes = ["gpt2"] if args.quick else ["gpt2", "qwen2", "bloom"]
    rows: list[list[str]] = []
    pk3 = ["OQ", "OK", "OV"]
    with tempfile.TemporaryDirectory(prefix="hg-bench-") as tmp:
        for key in shapes:
            shape = SHAPES[key]
            print(f"[{shape.name}] saving random model for TransformerLens ...", flush=True)
            # In a child process: the parent stays small, so its memory cannot shape the
            # children's measurements.
            folder = Path(tmp) / key
            subprocess.run([sys.executable, str(Path(__file__).resolve()), "--save-model", key, str(folder)],
                           check=True, capture_output=True)
            for what in ("pk", "cs") if args.what == "both" else (args.what,):
                label = "PK OQ+OK+OV" if what == "pk" else "CS Q+K+V"
                repeats = max(1, args.repeat) if (key == "gpt2" and what == "pk") else 1
                hg_spec = {"tool": "headgraph", "shape": key, "what": what, "pairings": pk3}
                tl_spec: dict[str, Any] | None = None
                if what == "pk" or key == "gpt2":
                    tl_spec = {"tool": "tl", "shape": key, "what": what, "pairings": pk3,
                               "folder": str(folder)}
                    if what == "cs":
                        tl_spec["limit_bytes"] = TL_CS_LIMIT_BYTES
                hg_runs: list[dict[str, Any]] = []
                tl_runs: list[dict[str, Any]] = []
                for i in range(repeats):  # alternate, so both tools see the same machine load
                    print(f"[{shape.name}] {label}: headgraph ({i + 1}/{repeats}) ...", flush=True)
                    hg_runs.append(measure(hg_spec, 1200))
                    if tl_spec is not None:
                        print(f"[{shape.name}] {label}: TransformerLens ({i + 1}/{repeats}) ...", flush=True)
                        tl_runs.append(measure(tl_spec, 1800))
                hg = _best(hg_runs)
                tl: dict[str, Any] | None = (_best(tl_runs) if tl_runs else
                                             {"status": "not run (asks 26-39 GB)", "seconds": None,
                                              "peak_bytes": None})
                speed = "-"
                pairs = [t["seconds"] / h["seconds"] for h, t in zip(hg_runs, tl_runs)
                         if h["status"] == "ok" and t["status"] == "ok"]
                if hg["status"] == "ok" and tl and tl["status"] == "ok":
                    speed = f"{tl['seconds'] / hg['seconds']:.1f}x"
                    if hg.get("cpu_seconds") and tl.get("cpu_seconds"):
                        speed += f" (CPU {tl['cpu_seconds'] / hg['cpu_seconds']:.1f}x)"
                    if repeats > 1:
                        speed += f", best of {repeats}"
                        if pairs:
                            speed += f"; run by run {min(pairs):.1f}-{max(pairs):.1f}x"
                target, met = _target(key, what, hg, tl, pairs)
                rows.append([shape_label(shape), label, _fmt_time(hg), _fmt_peak(hg), _fmt_time(tl),
                             _fmt_peak(tl), speed, target, met])
                print(f"  {label}: headgraph (plain torch) {_fmt_time(hg)} | TransformerLens "
                      f"{_fmt_time(tl)} | {speed} | target {target}: {met}", flush=True)
            import shutil

            shutil.rmtree(folder, ignore_errors=True)
        if not args.quick:
            big = SHAPES["big"]
            print(f"[{big.name}] PK OK: headgraph (several minutes) ...", flush=True)
            hg = measure({"tool": "headgraph", "shape": "big", "what": "pk", "pairings": ["OK"]}, 3000)
            ok = hg["status"] == "ok" and hg["peak_bytes"] < 8 * GiB
            rows.append([shape_label(big) + ", bf16 weights", "PK OK", _fmt_time(hg), _fmt_peak(hg),
                         "not run (too slow: per-head SVD loop + ~140 TFLOP of overlaps, "
                         "all 1024 x 1024 pairs)", "-", "-",
                         "peak < 8 GiB", "yes" if ok else "NO"])
            print("  " + " | ".join(rows[-1]), flush=True)
    table = _table(rows, load_start, os.getloadavg())
    print(table)
    if args.out:
        notes = ""
        if args.out.exists():
            old = args.out.read_text()
            if "\n## Notes" in old:
                notes = "\n" + old[old.index("\n## Notes") + 1:]
        args.out.write_text(table + notes)
    return 0


def _best(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The run with the least wall time (others' load only slows runs down); peak = max of all."""
    ok = [r for r in runs if r["status"] == "ok"]
    if not ok:
        return runs[0]
    best = dict(min(ok, key=lambda r: r["seconds"]))
    best["peak_bytes"] = max(r["peak_bytes"] for r in ok)
    return best


def _target(key: str, what: str, hg: dict[str, Any], tl: dict[str, Any] | None,
            pairs: list[float]) -> tuple[str, str]:
    """(target, verdict) of a cell; pairs: the run-by-run TL / headgraph time ratios."""
    done = hg["status"] == "ok"
    if key == "gpt2" and what == "pk":
        ok = done and tl is not None and tl["status"] == "ok" and hg["seconds"] <= tl["seconds"] / PK_SPEEDUP
        if ok and pairs and min(pairs) < PK_SPEEDUP:  # the best times meet it, some single runs do not
            return f">= {PK_SPEEDUP}x faster", f"best times only (single runs down to {min(pairs):.1f}x)"
        return f">= {PK_SPEEDUP}x faster", "yes" if ok else "NO"
    if key == "gpt2":
        fast = done and tl is not None and tl["status"] == "ok" and hg["seconds"] <= tl["seconds"] / 10
        small = done and hg["peak_bytes"] <= 2 * GiB
        return "<= 1/10 TL time, <= 2 GiB", "yes" if fast and small else "NO"
    if what == "cs":
        return "completes, <= 4 GiB", "yes" if done and hg["peak_bytes"] <= 4 * GiB else "NO"
    return "-", "-"


def _blas_note(torch: Any) -> str:
    """The BLAS torch's CPU products run on (from its build configuration)."""
    config = torch.__config__.show()
    for name in ("oneAPI Math Kernel Library", "OpenBLAS"):
        if name in config:
            return "MKL" if name.startswith("oneAPI") else name
    return "torch's default BLAS"


def _table(rows: list[list[str]], load_start: tuple[float, ...], load_end: tuple[float, ...]) -> str:
    import torch

    head = ["shape", "what", "headgraph (plain torch) time", "headgraph peak", "TransformerLens time",
            "TransformerLens peak", "speedup", "target", "met"]
    lines = [
        "# headgraph core benchmark",
        "",
        f"{time.strftime('%Y-%m-%d %H:%M')}; {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} CPUs (shared with other jobs while measured), torch {torch.__version__}, "
        "torch.set_num_threads(1) in every measurement; headgraph's products on plain torch "
        f"({_blas_note(torch)}). Load average (1/5/15 min) "
        f"{'/'.join(f'{x:.2f}' for x in load_start)} at start, "
        f"{'/'.join(f'{x:.2f}' for x in load_end)} at end.",
        "Each cell is one fresh subprocess (GPT-2 PK: best wall time of several, the tools "
        "alternating; speedup also given as the ratio of process CPU times, which others' load "
        "disturbs less); headgraph PK is one all_pairings call for OQ, OK, OV; "
        "peak = ru_maxrss after the computation minus the resident "
        "size just before it (peak counter reset). Random weights; headgraph from fresh HeadWeights "
        "(bases, projectors all computed inside the timing), TransformerLens from a booted "
        "TransformerBridge; TL CS runs under torch.no_grad() and RLIMIT_AS 14 GiB; on Qwen2/BLOOM shapes it asks "
        "26-39 GB and is not run. The 4096 shape uses bf16 W_K/W_O (W_Q, W_V share W_K's storage; "
        "OK reads only O and K) so the weights fit in memory; they are excluded from the peak.",
        "",
        "| " + " | ".join(head) + " |",
        "|" + "|".join("---" for _ in head) + "|",
    ]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
