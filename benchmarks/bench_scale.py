"""Time and peak memory of every compute-job stage on 1B- and 7B-class attention shapes.

    .venv/bin/python benchmarks/bench_scale.py [--shape llama1b|llama7b] [--threads 2]
        [--keep DIR] [--stages load,pk,cs,...] [--order forward|same-layer] [--null-samples N]

Builds a random-weight local checkpoint of the shape in a temporary folder (bf16 safetensors,
one file per layer, written tensor by tensor with safetensors directly so the 7B shape never
exists in memory as a model; a Llama config.json from transformers and the tests' byte-level
BPE tokenizer, so the vocabulary is 300 tokens, not the real model's). Then each stage runs in
its own fresh process, as a compute process would: it reads the attention weights in their
stored precision (core.models.streamed.load_heads_safetensors, dtype bf16), runs the stage's
core computation (the same calls the server's computations make) and reports the stage's wall
time and the process's peak resident size (VmHWM, load included: what the job's budget must
hold). "load" is the server's default load of the folder (core.models.loading.load_model:
TransformerBridge in float32 when the model fits in memory, else the attention weights streamed
in their stored precision) for comparison. ``--order same-layer`` and ``--null-samples`` make a
memory probe: the PK / CS buffers and factors and the null's batches are those of the full
job, with a fraction of its products (the times are then not the job's). API sizes: the JSON length of the PK / CS grids
of one pairing as the API's full (download) answer, and of the bounded default answer.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SHAPES = {  # layers, query heads, kv heads, d_model, d_head, d_mlp
    "tiny": (2, 4, 2, 64, 16, 128),
    "llama1b": (16, 32, 8, 2048, 64, 8192),
    "llama7b": (32, 32, 32, 4096, 128, 11008),
}
STAGES = ["load", "load_bf16", "pk", "cs", "reference", "null", "tokens"]
PAIRINGS = ["OQ", "OK", "OV"]
MiB = 1024**2


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def build_checkpoint(folder: Path, shape: str) -> Path:
    """Random bf16 Llama checkpoint of ``shape`` in ``folder``, a layer per safetensors file."""
    import torch
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
    from model_support import byte_bpe_tokenizer

    L, H, Hkv, d, dh, mlp = SHAPES[shape]
    tok = byte_bpe_tokenizer()
    vocab = len(tok)
    cfg = LlamaConfig(hidden_size=d, intermediate_size=mlp, num_hidden_layers=L,
                      num_attention_heads=H, num_key_value_heads=Hkv, head_dim=dh,
                      vocab_size=vocab, bos_token_id=tok.bos_token_id, eos_token_id=tok.bos_token_id,
                      torch_dtype="bfloat16", tie_word_embeddings=False)
    folder.mkdir(parents=True, exist_ok=True)
    tok.save_pretrained(folder)
    g = torch.Generator().manual_seed(0)

    def rnd(*s: int) -> torch.Tensor:
        return (torch.randn(*s, generator=g) * 0.02).to(torch.bfloat16)

    index: dict[str, str] = {}
    total = 0

    def write(name: str, tensors: dict[str, torch.Tensor]) -> None:
        nonlocal total
        fname = f"model-{name}.safetensors"
        save_file(tensors, str(folder / fname), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        index.update({k: fname for k in tensors})

    write("embed", {"model.embed_tokens.weight": rnd(vocab, d), "model.norm.weight":
                    torch.ones(d, dtype=torch.bfloat16), "lm_head.weight": rnd(vocab, d)})
    for i in range(L):  # one layer in memory at a time
        p = f"model.layers.{i}."
        write(f"layer{i:03d}", {
            p + "self_attn.q_proj.weight": rnd(H * dh, d), p + "self_attn.k_proj.weight": rnd(Hkv * dh, d),
            p + "self_attn.v_proj.weight": rnd(Hkv * dh, d), p + "self_attn.o_proj.weight": rnd(d, H * dh),
            p + "mlp.gate_proj.weight": rnd(mlp, d), p + "mlp.up_proj.weight": rnd(mlp, d),
            p + "mlp.down_proj.weight": rnd(d, mlp),
            p + "input_layernorm.weight": torch.ones(d, dtype=torch.bfloat16),
            p + "post_attention_layernorm.weight": torch.ones(d, dtype=torch.bfloat16)})
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": index}))
    cfg.to_json_file(str(folder / "config.json"))  # last: a folder with it is complete
    return folder


def build_gguf(file: Path, shape: str) -> Path:
    """The same shape as a llama.cpp GGUF (float16 tensors, random), written a tensor at a time
    (header and tensor infos first, then each tensor's data), so it never exists in memory."""
    import gguf
    import numpy as np

    L, H, Hkv, d, dh, mlp = SHAPES[shape]
    vocab = 300
    file.parent.mkdir(parents=True, exist_ok=True)
    shapes: dict[str, tuple[int, ...]] = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,),
                                          "output.weight": (vocab, d)}
    for i in range(L):
        shapes.update({f"blk.{i}.attn_q.weight": (H * dh, d), f"blk.{i}.attn_k.weight": (Hkv * dh, d),
                       f"blk.{i}.attn_v.weight": (Hkv * dh, d), f"blk.{i}.attn_output.weight": (d, H * dh),
                       f"blk.{i}.ffn_gate.weight": (mlp, d), f"blk.{i}.ffn_up.weight": (mlp, d),
                       f"blk.{i}.ffn_down.weight": (d, mlp), f"blk.{i}.attn_norm.weight": (d,),
                       f"blk.{i}.ffn_norm.weight": (d,)})
    w = gguf.GGUFWriter(str(file), "llama")
    w.add_block_count(L)
    w.add_head_count(H)
    w.add_head_count_kv(Hkv)
    w.add_embedding_length(d)
    w.add_feed_forward_length(mlp)
    w.add_key_length(dh)
    w.add_value_length(dh)
    w.add_context_length(2048)
    w.add_layer_norm_rms_eps(1e-6)
    for name, shp in shapes.items():
        dtype = np.float32 if len(shp) == 1 else np.float16
        w.add_tensor_info(name, shp, np.dtype(dtype), int(np.prod(shp)) * np.dtype(dtype).itemsize)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_ti_data_to_file()
    rng = np.random.default_rng(0)
    for shp in shapes.values():
        if len(shp) == 1:
            w.write_tensor_data(np.ones(shp, dtype=np.float32))
        else:
            w.write_tensor_data((rng.standard_normal(shp, dtype=np.float32) * 0.02).astype(np.float16))
    w.close()
    return file


def _bounded_size(payload: dict[str, Any]) -> int:
    return len(json.dumps(payload, separators=(",", ":")))


def child(folder: str, stage: str, threads: int, order: str = "forward",
          null_samples: int = 2000) -> dict[str, Any]:
    """Run one stage in this (fresh) process; returns its time, peak RSS and notes."""
    import torch

    torch.set_num_threads(threads)
    out: dict[str, Any] = {"stage": stage}
    start = time.perf_counter()
    if stage == "load":
        from headgraph.core.models.loading import load_model

        load_model(folder, model_root="/")
    else:
        from headgraph.core.models.streamed import load_heads_safetensors

        heads = load_heads_safetensors(folder, dtype=torch.bfloat16)
        out["load_s"] = time.perf_counter() - start
        start = time.perf_counter()
        if stage == "pk":
            from headgraph.core.scores.pk import all_pairings
            from headgraph.core.stats.reference import zscores

            res = all_pairings(heads, pairings=PAIRINGS, order=order)
            for p in PAIRINGS:
                zscores(res[p], heads.info.d_model)
            grid = res["OQ"].scores
            out["pk_grid_json_bytes"] = _bounded_size({"scores": grid.reshape(
                grid.shape[0] * grid.shape[1], -1).tolist()})
        elif stage == "cs":
            from headgraph.core.scores.composition_score import composition_scores

            composition_scores(heads, ["Q", "K", "V"], order=order)
        elif stage == "reference":
            from headgraph.core.stats.reference import kl_grid

            grid = kl_grid(heads, samples=20000, seed=0)
            out["heads_per_layer"] = grid.heads_per_layer
        elif stage == "null":
            from headgraph.core.stats.nulls import anisotropic_null, haar_null

            for p in PAIRINGS:
                a = anisotropic_null(heads, p, samples=null_samples, seed=0)
                haar_null(heads.info.d_model, a.source_rank, a.target_rank, samples=null_samples, seed=0)
        elif stage == "tokens":
            from headgraph.core.readout.tokens import top_tokens
            from headgraph.core.scores.subspaces import release_bases

            for role in ("O", "V", "Q", "K"):  # as the server's tokens computation
                top_tokens(heads, role, k=50)
                release_bases(heads)
        elif stage != "load_bf16":
            raise SystemExit(f"unknown stage {stage}")
    out["seconds"] = time.perf_counter() - start
    out["peak_rss"] = _status("VmHWM")
    return out


class TreeMemory:
    """Samples the resident size of a process and its children every ``every_s`` seconds; the
    peak since the last ``mark`` (a stage's peak: the job runs its stages in one process)."""

    def __init__(self, pid: int, every_s: float = 0.2) -> None:
        import threading

        import psutil

        self.proc = psutil.Process(pid)
        self.every_s = every_s
        self.peak = 0
        self.overall = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _rss(self) -> int:
        import psutil

        total = 0
        try:
            for p in [self.proc, *self.proc.children(recursive=True)]:
                try:
                    total += p.memory_info().rss
                except psutil.Error:
                    pass
        except psutil.Error:
            pass
        return total

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            rss = self._rss()
            self.peak = max(self.peak, rss)
            self.overall = max(self.overall, rss)

    def mark(self) -> int:
        """The peak since the last mark, and start a new one."""
        peak, self.peak = max(self.peak, self._rss()), 0
        return peak

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def run_job(root: Path, name: str, cache: Path, threads: int) -> list[dict[str, Any]]:
    """``headgraph compute local:NAME`` (the dashboard's job, every stage in one process) with
    per-stage wall time, peak RSS and the job's own estimate of the time left at each stage's
    start; prints a row per stage as it ends. Returns the rows."""
    import os

    env = {**os.environ, "HEADGRAPH_MODEL_ROOT": str(root), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "HEADGRAPH_TORCH_THREADS": str(threads)}
    exe = Path(sys.executable).with_name("headgraph")
    start = time.time()
    proc = subprocess.Popen([str(exe), "compute", f"local:{name}", "--cache-dir", str(cache),
                             "--progress", "json"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    mem = TreeMemory(proc.pid)
    rows: list[dict[str, Any]] = []
    current: dict[str, Any] | None = None
    assert proc.stderr is not None
    for line in proc.stderr:
        if not line.startswith("{"):
            continue
        try:
            ev = json.loads(line)
        except ValueError:
            continue
        if not isinstance(ev, dict) or "stage" not in ev or "time" not in ev:
            if isinstance(ev, dict) and ev.get("message"):  # the job's own log lines
                print(f"  log: {str(ev.get('message'))[:300]}", file=sys.stderr, flush=True)
            continue
        now = float(ev["time"])
        if current is not None:
            current.update(seconds=now - current["start"], peak_rss=mem.mark())
            rows.append(current)
            print(f"  {current['stage']}: {current['seconds']:.1f} s, "
                  f"{current['peak_rss'] / MiB:.0f} MiB", file=sys.stderr, flush=True)
        else:
            mem.mark()
        current = {"stage": ev["stage"], "start": now, "estimate_left": ev["remaining_s"]}
    proc.wait()
    mem.stop()
    end = time.time()
    out = proc.stdout.read() if proc.stdout else ""
    for r in rows:
        r["left_in_fact"] = end - r["start"]
    print("| stage | s | peak RSS | estimated s left at its start | s left in fact |")
    print("|---|---|---|---|---|")
    for r in rows:
        est = "" if r["estimate_left"] is None else f"{r['estimate_left']:.0f}"
        print(f"| {r['stage']} | {r['seconds']:.1f} | {r['peak_rss'] / MiB:.0f} MiB | {est} | "
              f"{r['left_in_fact']:.0f} |")
    status = "done" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
    print(f"\njob {status}: {end - start:.0f} s in all, peak RSS {mem.overall / MiB:.0f} MiB "
          f"(sampled every {mem.every_s} s)", flush=True)
    if proc.returncode:
        print(out[-2000:])
    return rows


API_LIMIT = 5 * 1000 * 1000  # no answer above this without the client asking for a download


def time_views(root: Path, name: str, cache: Path, repeats: int) -> None:
    """Serve the job's cache (``headgraph serve``, the model root ``root``) and open every view
    of ``local:NAME`` that reads the job's results in headless chromium, as bench_browser.py
    does: the warm time from navigation to the figure drawn (median and max of ``repeats``), and
    the largest API answer each view's load asked for (the server's access log)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import statistics

    from bench_browser import (CHROMIUM, CHROMIUM_ARGS, DRAWN, Traffic, links, measure,
                               pick_head_and_pair, wait_job)
    from playwright.sync_api import sync_playwright

    from headgraph.server.http.launch import ServerProcess

    model = f"local:{name}"
    DRAWN.setdefault("subgraph", "g('subgraph-fig', d => d.some(t => (t.customdata||[]).length))")
    server = ServerProcess(cache, env={"HEADGRAPH_MODEL_ROOT": str(root), "HF_HUB_OFFLINE": "1",
                                       "TRANSFORMERS_OFFLINE": "1", "BROWSER_PATH": CHROMIUM}).start()
    rows = []
    try:
        waited = wait_job(server.url, model, 3600)  # all cached: the job only reads
        head, pair = pick_head_and_pair(server.url, model)
        views = links(model, head, pair)
        views["subgraph"] = f"/?model={model}&view=subgraph&pins={pair[0]},{pair[1]}"
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1500, "height": 1000}).new_page()
            traffic = Traffic(page)
            measure(page, server.url, views["graph"], "graph", 1, traffic)  # warm the LRU
            for view, link in views.items():
                seen = len(server.records())
                times, moved = measure(page, server.url, link, view, repeats, traffic)
                answers = [r for r in server.records()[seen:] if r.get("logger") == "headgraph.access"
                           and str(r.get("path", "")).startswith("/api/")]
                big = max(answers, key=lambda r: int(r.get("bytes", 0)), default={})
                rows.append((view, statistics.median(times), max(times), moved,
                             big.get("path", ""), int(big.get("bytes", 0))))
            browser.close()
        every = [r for r in server.records() if r.get("logger") == "headgraph.access"
                 and str(r.get("path", "")).startswith("/api/")]
    finally:
        server.stop()
    print(f"\nwarm views of {model} (the job's cache; the job re-read in {waited:.0f} s), "
          f"median / max of {repeats} loads in headless chromium:\n")
    print("| view | median ms | max ms | callback KiB | largest API answer |")
    print("|---|---|---|---|---|")
    for view, med, mx, moved, path, size in rows:
        print(f"| {view} | {med:.0f} | {mx:.0f} | {moved / 1024:.0f} | {path} {size / 1e6:.2f} MB |")
    biggest = max(every, key=lambda r: int(r.get("bytes", 0)), default={})
    over = [r for r in every if int(r.get("bytes", 0)) > API_LIMIT]
    print(f"\n{len(every)} API answers; the largest {biggest.get('path')} "
          f"{int(biggest.get('bytes', 0)) / 1e6:.2f} MB; over 5 MB: {len(over)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="llama1b")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="build (or reuse) the checkpoint in this folder")
    parser.add_argument("--stages", default=",".join(STAGES))
    parser.add_argument("--order", default="forward",
                        help="head pairs PK and CS compute: forward (the job's) or same-layer, a "
                             "memory probe: the same buffers and factors, 1/L of the pair products")
    parser.add_argument("--null-samples", type=int, default=2000,
                        help="null samples per pairing (the job's 2000; fewer probe its memory: "
                             "samples are drawn in batches of bounded size)")
    parser.add_argument("--job", action="store_true",
                        help="run the dashboard's compute job (headgraph compute, one process, "
                             "every stage) instead of the stages apart, then time the warm views")
    parser.add_argument("--cache", type=Path, help="the job's cache folder (default: a temporary one)")
    parser.add_argument("--gguf", action="store_true",
                        help="the shape as one llama.cpp GGUF file (float16) instead of safetensors")
    parser.add_argument("--views-only", action="store_true",
                        help="with --job: only time the views of an already computed --cache")
    parser.add_argument("--repeats", type=int, default=3, help="loads of each warm view")
    parser.add_argument("--child", nargs=2, metavar=("FOLDER", "STAGE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(args.child[0], args.child[1], args.threads, args.order,
                               args.null_samples)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / args.shape
        start = time.perf_counter()
        if args.gguf:
            if not (folder / "model.gguf").exists():
                build_gguf(folder / "model.gguf", args.shape)
        elif not (folder / "config.json").exists():
            build_checkpoint(folder, args.shape)
        L, H, Hkv, d, dh, _ = SHAPES[args.shape]
        print(f"{args.shape}: {L} layers, {H} q / {Hkv} kv heads, d_model {d}, d_head {dh}; "
              f"checkpoint ready in {time.perf_counter() - start:.0f} s; {args.threads} threads; "
              f"PK / CS order {args.order}; {args.null_samples} null samples per pairing")
        if args.job:
            cache = args.cache or Path(tmp) / "cache"
            if not args.views_only:
                run_job(folder.parent, folder.name, cache, args.threads)
            time_views(folder.parent, folder.name, cache, args.repeats)
            return
        print("| stage | load (bf16) s | stage s | peak RSS | notes |")
        print("|---|---|---|---|---|")
        for stage in args.stages.split(","):
            run = subprocess.run([sys.executable, __file__, "--threads", str(args.threads),
                                  "--order", args.order, "--null-samples", str(args.null_samples),
                                  "--child", str(folder), stage],
                                 capture_output=True, text=True)
            if run.returncode:
                tail = (run.stderr.strip().splitlines() or ["?"])[-1]
                print(f"| {stage} | | | | failed (exit {run.returncode}): {tail} |", flush=True)
                continue
            row = json.loads(run.stdout.strip().splitlines()[-1])
            notes = {k: v for k, v in row.items()
                     if k not in ("stage", "seconds", "peak_rss", "load_s")}
            load = f"{row['load_s']:.1f}" if "load_s" in row else ""
            print(f"| {stage} | {load} | {row['seconds']:.1f} | {row['peak_rss'] / MiB:.0f} MiB | "
                  f"{json.dumps(notes) if notes else ''} |", flush=True)


if __name__ == "__main__":
    main()
