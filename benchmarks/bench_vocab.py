"""Time the token tables of a large-vocabulary model, and its whole compute job.

    .venv/bin/python benchmarks/bench_vocab.py [--shape gemma270m] [--threads 2] [--keep DIR]
        [--job] [--cache DIR]

Builds a random-weight checkpoint of the shape (default Gemma-3-270M's: vocabulary 262,144,
d_model 640, 18 layers, 4 query heads / 1 KV head, head_dim 256, tied embeddings; bf16
safetensors from transformers' Gemma3ForCausalLM) in a temporary folder, with a synthetic
byte-level BPE tokenizer of exactly the vocabulary's size (the 256 byte characters and merges
of them), so decoding and the forward passes see the real vocabulary. Then, in this process:

* ``reference``: this machine's single-process sgemm rate now (best of 5 products of
  [2048, 2048] float32), so times from a busy shared machine can be compared between runs;
* ``tokens``: the job's tokens stage (core.readout.tokens.top_tokens, k=50, for O, V, Q, K,
  as the server's tokens computation) on the attention weights read in bf16;
* ``token_null``: the unembedding-shaped baseline of one rank (the server's token_null);

each as wall seconds and as this process's CPU seconds (``cpu``: both threads' time, which a
busy machine inflates less than the wall time).

``--job`` also runs the dashboard's compute job (``headgraph compute``, every stage in one
process) and prints its per-stage table (wall and CPU seconds, the job's estimate of the time
left). ``--skip-tokens`` leaves out the separate timing. Run with another checkout's code on
PYTHONPATH (``PYTHONPATH=OLD/core:OLD/server``) to time that version on the same checkpoint.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

SHAPES = {  # vocab, d_model, layers, query heads, kv heads, head_dim, d_mlp
    "gemma270m": (262144, 640, 18, 4, 1, 256, 2048),
    "tiny": (4096, 64, 2, 4, 1, 16, 128),
}


def bpe_tokenizer(vocab: int) -> object:
    """A byte-level BPE tokenizer of exactly ``vocab`` tokens: one special token, the 256
    byte characters, then merges of ever longer strings (pairs of byte characters first)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tokens = ["<|endoftext|>", *alphabet]
    merges: list[tuple[str, str]] = []
    seen = set(tokens)
    frontier = list(alphabet)
    while len(tokens) < vocab:
        grown = []
        for left in frontier:
            for right in alphabet:
                if len(tokens) >= vocab:
                    break
                t = left + right
                if t not in seen:
                    seen.add(t)
                    tokens.append(t)
                    merges.append((left, right))
                    grown.append(t)
        frontier = grown
    tok = Tokenizer(models.BPE(vocab={t: i for i, t in enumerate(tokens)}, merges=merges))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<|endoftext|>",
                                   eos_token="<|endoftext|>", unk_token="<|endoftext|>")


def build_checkpoint(folder: Path, shape: str) -> Path:
    """Random bf16 Gemma-3 text checkpoint of ``shape`` with its tokenizer, in ``folder``."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    vocab, d, L, H, Hkv, dh, mlp = SHAPES[shape]
    tok = bpe_tokenizer(vocab)
    assert len(tok) == vocab, (len(tok), vocab)  # type: ignore[arg-type]
    cfg = Gemma3TextConfig(vocab_size=vocab, hidden_size=d, intermediate_size=mlp,
                           num_hidden_layers=L, num_attention_heads=H, num_key_value_heads=Hkv,
                           head_dim=dh, max_position_embeddings=32768, sliding_window=512,
                           tie_word_embeddings=True, bos_token_id=0, eos_token_id=0, pad_token_id=0)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = Gemma3ForCausalLM(cfg).bfloat16()
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)  # type: ignore[attr-defined]
    return folder


def sgemm_rate(n: int = 2048, repeats: int = 5) -> float:
    """GFLOP/s of the best of ``repeats`` [n, n] float32 products on this process's threads."""
    import torch

    a, b = torch.randn(n, n), torch.randn(n, n)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        _ = a @ b
        best = min(best, time.perf_counter() - t)
    return 2 * n**3 / best / 1e9


def time_tokens(folder: Path) -> dict[str, float]:
    """Seconds of the tokens stage (four roles, k=50) and of one unembedding-shaped baseline."""
    import torch

    from headgraph.core.models.streamed import load_heads_safetensors
    from headgraph.core.readout.tokens import UNEMBEDDING_SAMPLES, token_baseline, top_tokens
    from headgraph.core.scores.subspaces import release_bases

    heads = load_heads_safetensors(folder, dtype=torch.bfloat16)
    out: dict[str, float] = {}
    start, cpu = time.perf_counter(), time.process_time()
    for role in ("O", "V", "Q", "K"):  # as the server's tokens computation
        t = time.perf_counter()
        top_tokens(heads, role, k=50)
        release_bases(heads)
        out[f"tokens {role}"] = time.perf_counter() - t
    out["tokens"] = time.perf_counter() - start
    out["tokens cpu"] = time.process_time() - cpu
    assert heads.W_U is not None
    t, cpu = time.perf_counter(), time.process_time()
    token_baseline(heads.W_U, heads.info.d_head, 50, samples=UNEMBEDDING_SAMPLES, method="unembedding")
    out["token_null"] = time.perf_counter() - t
    out["token_null cpu"] = time.process_time() - cpu
    return out


def _tree_cpu(proc: object) -> float:
    """CPU seconds of a psutil process, its reaped children and its live ones."""
    import psutil

    assert isinstance(proc, psutil.Process)
    total = 0.0
    try:
        t = proc.cpu_times()
        total = t.user + t.system + t.children_user + t.children_system
        for child in proc.children(recursive=True):
            try:
                c = child.cpu_times()
                total += c.user + c.system
            except psutil.Error:
                pass
    except psutil.Error:
        pass
    return total


def run_job(root: Path, name: str, cache: Path, threads: int) -> None:
    """``headgraph compute local:NAME`` (the dashboard's job, every stage in one process): a
    row per stage with its wall seconds, its CPU seconds (the job's process tree: what a busy
    machine inflates less) and the job's own estimate of the time left at its start."""
    import os
    import subprocess

    import psutil

    env = {**os.environ, "HEADGRAPH_MODEL_ROOT": str(root), "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1", "OMP_NUM_THREADS": str(threads),
           "HEADGRAPH_TORCH_THREADS": str(threads)}
    exe = Path(sys.executable).with_name("headgraph")
    start = time.time()
    job = subprocess.Popen([str(exe), "compute", f"local:{name}", "--cache-dir", str(cache),
                            "--progress", "json"], env=env, stdout=subprocess.DEVNULL,
                           stderr=subprocess.PIPE, text=True)
    proc = psutil.Process(job.pid)
    rows: list[tuple[str, float, float, float | None]] = []
    current: tuple[str, float, float, float | None] | None = None
    assert job.stderr is not None
    for line in job.stderr:
        try:
            ev = json.loads(line) if line.startswith("{") else None
        except ValueError:
            ev = None
        if not isinstance(ev, dict) or "stage" not in ev or "time" not in ev:
            continue
        now, cpu = float(ev["time"]), _tree_cpu(proc)
        if current is not None:
            rows.append((current[0], now - current[1], cpu - current[2], current[3]))
            print(f"  {rows[-1][0]}: {rows[-1][1]:.1f} s, {rows[-1][2]:.1f} cpu s", file=sys.stderr, flush=True)
        current = (str(ev["stage"]), now, cpu, ev.get("remaining_s"))
    cpu = _tree_cpu(proc)
    job.wait()
    end = time.time()
    if current is not None:
        rows.append((current[0], end - current[1], cpu - current[2], current[3]))
    print("| stage | s | cpu s | estimated s left at its start | s left in fact |")
    print("|---|---|---|---|---|")
    left = end - start
    for stage, wall, used, est in rows:
        print(f"| {stage} | {wall:.1f} | {used:.1f} | {'' if est is None else f'{est:.0f}'} | {left:.0f} |")
        left -= wall
    print(f"\njob {'done' if job.returncode == 0 else f'FAILED ({job.returncode})'}: "
          f"{end - start:.0f} s, {sum(r[2] for r in rows):.0f} cpu s", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--shape", choices=sorted(SHAPES), default="gemma270m")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--keep", type=Path, help="build (or reuse) the checkpoint in this folder")
    parser.add_argument("--job", action="store_true", help="also run the whole compute job")
    parser.add_argument("--skip-tokens", action="store_true",
                        help="with --job: only the job (no separate tokens / token_null timing)")
    parser.add_argument("--cache", type=Path, help="the job's cache folder (default: a temporary one)")
    args = parser.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.keep or Path(tmp) / args.shape
        start = time.perf_counter()
        if not (folder / "config.json").exists():
            build_checkpoint(folder, args.shape)
        vocab, d, L, H, Hkv, dh, _ = SHAPES[args.shape]
        print(f"{args.shape}: vocabulary {vocab}, d_model {d}, {L} layers, {H} q / {Hkv} kv heads, "
              f"head_dim {dh}; checkpoint ready in {time.perf_counter() - start:.0f} s; "
              f"{args.threads} threads", flush=True)
        if not args.skip_tokens:
            rate = sgemm_rate()
            times = time_tokens(folder)
            after = sgemm_rate()
            print(json.dumps({"sgemm_gflops_before": round(rate, 1), "sgemm_gflops_after": round(after, 1),
                              **{k: round(v, 2) for k, v in times.items()}}), flush=True)
        if args.job:
            print(json.dumps({"sgemm_gflops_start": round(sgemm_rate(), 1)}), flush=True)
            run_job(folder.parent, folder.name, args.cache or Path(tmp) / "cache", args.threads)
            print(json.dumps({"sgemm_gflops_end": round(sgemm_rate(), 1)}), flush=True)


if __name__ == "__main__":
    main()
