"""``headgraph sweep`` on a real local Ray runtime: a sweep over the bundled checkpoint series (and
the demo, a random: spec and a folder that is no model) fills the cache
(a transiently failing task retried by Ray, a bad spec reported without stopping the others),
then a real uvicorn server started on that cache with the settings the sweep prints lists
every swept model and serves its results without computing anything."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import psutil
import pytest
import torch
from safetensors.torch import load_file

from headgraph.core.models.demo import DEMO_DIR
from headgraph.core.models.series import demo_series
from headgraph.server.cli.main import main as cli_main
from headgraph.server.settings import Settings
from headgraph.server.sweep.specs import expand_specs, hub_revision, serve_env
from headgraph.server.sweep.task import FAIL_FIRST_ENV, parse_results

ray = pytest.importorskip("ray")

RANDOM_SPEC = "random:gpt2-tiny@3"
FLAKY_STEP = 417  # the checkpoint whose first sweep attempt fails (just before induction forms)
ALL = parse_results("all")


# -- fixtures ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def ray_runtime(tmp_path_factory):
    """One local Ray runtime (2 CPUs, no dashboard, no usage stats) for every sweep here; its
    temp dir under the test's tmp path when short enough for Ray's unix sockets, and no Ray
    process left behind afterwards."""
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    base = tmp_path_factory.mktemp("ray")
    own_tmp = None
    if len(str(base)) > 40:  # session dir + socket names must stay under 107 characters
        own_tmp = base = Path(tempfile.mkdtemp(prefix="hg-ray-", dir="/tmp"))
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, _temp_dir=str(base))
    try:
        yield base
    finally:
        ray.shutdown()
        deadline = time.monotonic() + 20
        left: list[psutil.Process] = []
        while time.monotonic() < deadline:
            left = [p for p in psutil.process_iter(["cmdline"])
                    if str(base) in " ".join(p.info["cmdline"] or [])]
            if not left:
                break
            time.sleep(0.2)
        if own_tmp is not None:
            shutil.rmtree(own_tmp, ignore_errors=True)
        assert not left, f"Ray processes left behind: {[p.pid for p in left]}"


@pytest.fixture(scope="module")
def swept(ray_runtime, tmp_path_factory):
    """One sweep: demo, a glob over a copy of three of the bundled checkpoint series (training
    steps of the demo: the first, step 417, which fails its first attempt, and the last), a
    random: spec and a folder that is no model; results 'all'."""
    from headgraph.server.sweep.run import run_sweep

    root = tmp_path_factory.mktemp("ckpts")
    series = demo_series()
    kept = [c for c in series if c.step in (series[0].step, FLAKY_STEP, series[-1].step)]
    steps = {c.step: shutil.copytree(c.folder, root / c.folder.name) for c in kept}
    (root / "notes").mkdir()  # a folder, but no model in it
    broken = shutil.copytree(demo_series()[0].folder, root / "broken")  # its weights unreadable
    (broken / "model.safetensors").write_bytes(b"\xff" * 300)
    cache = tmp_path_factory.mktemp("sweep") / "cache"
    specs = expand_specs(["demo", str(root / "step-*"), RANDOM_SPEC, str(root / "notes"),
                          str(root / "broken")])
    os.environ[FAIL_FIRST_ENV] = str(steps[FLAKY_STEP])
    try:
        report = run_sweep(Settings.from_env(cache_dir=cache), specs, ALL, progress=False)
    finally:
        del os.environ[FAIL_FIRST_ENV]
    return {"report": report, "root": root, "steps": steps, "cache": cache, "specs": specs}


# -- the sweep --------------------------------------------------------------------------------

@pytest.mark.slow  # a sweep on a local Ray runtime: ~20 s
def test_sweep_fills_the_cache_retries_a_transient_failure_and_reports_a_bad_spec(swept):
    root, steps = swept["root"], swept["steps"]
    folders = sorted(str(p) for p in steps.values())  # the glob's order
    assert len(steps) == 3 and swept["specs"] == ["demo", *folders, RANDOM_SPEC, str(root / "notes"),
                                                  str(root / "broken")]
    rows = {r["spec"]: r for r in swept["report"].rows}
    assert [r["spec"] for r in swept["report"].rows] == swept["specs"]  # the order given
    expected = [("demo", "demo"), (RANDOM_SPEC, RANDOM_SPEC)] + [(str(p), f"local:{p.name}") for p in steps.values()]
    for spec, model in expected:
        row = rows[spec]
        assert row["status"] == "done", row
        assert row["model"] == model and row["fingerprint"] and row["seconds"] > 0
        assert row["computed"][0] == "pk" and row["computed"][-1] == "pairs"
        assert {"graph", "scatter OK", "datapk text"} <= set(row["computed"]), row
    flaky = str(steps[FLAKY_STEP])
    assert rows[flaky]["retries"] == 1 and rows[flaky]["attempts"] == 2
    assert all(rows[s]["retries"] == 0 for s, _ in expected if s != flaky)
    bad = rows[str(root / "notes")]
    assert bad["status"] == "failed" and bad["retries"] == 0  # bad input is not retried
    assert "is not a model folder" in bad["error"] and "\n" not in bad["error"]
    broken = rows[str(root / "broken")]  # a file nobody can read: reported once, not retried
    assert broken["status"] == "failed" and broken["retries"] == 0 and broken["attempts"] == 1
    assert "a model file cannot be read" in broken["error"], broken
    # three distinct weight sets; the last step is the shipped demo itself
    prints = {step: rows[str(p)]["fingerprint"] for step, p in steps.items()}
    assert len(set(prints.values())) == 3 and prints[max(steps)] == rows["demo"]["fingerprint"]
    assert swept["report"].serve_env["HEADGRAPH_MODEL_ROOT"] == str(root.resolve())
    assert RANDOM_SPEC in swept["report"].serve_env["HEADGRAPH_MODELS"].split(",")


def _pk_reference(folder: Path, pairing: str) -> torch.Tensor:
    """float64 PK of every head pair from the folder's safetensors (SVD bases)."""
    sd = {k: v.double() for k, v in load_file(str(folder / "model.safetensors")).items()}
    mats = {"Q": sd["W_Q"], "K": sd["W_K"], "V": sd["W_V"], "O": sd["W_O"].transpose(-2, -1)}
    U = {r: torch.linalg.svd(m, full_matrices=False).U for r, m in mats.items()}
    return torch.einsum("abdi,cedj->abceij", U[pairing[0]], U[pairing[1]]).square().sum((-2, -1))


@pytest.mark.slow  # needs the swept cache (a Ray sweep)
def test_a_server_on_the_swept_cache_lists_and_serves_every_model_without_computing(launch_server, swept):
    report = swept["report"]
    env = {**report.serve_env, "HF_HUB_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu"}
    models = [r["model"] for r in report.rows if r["status"] == "done"]
    with launch_server(swept["cache"], env=env) as srv, \
            httpx.Client(base_url=srv.url, timeout=120) as api:
        before = api.get("/api/cache/stats").json()
        assert before["computations"] > 0 and set(before["counts"].values()) == {1}  # each once, by the sweep
        listed = {m["id"]: m for m in api.get("/api/models").json()["models"]}
        assert set(models) <= set(listed)
        for m in ["demo", *(f"local:{p.name}" for p in swept["steps"].values())]:  # identities known
            assert "graph" in " ".join(listed[m]["cached"]) and listed[m]["fingerprint"]
        for m in models:
            for path, params in (("/api/pk", {"pairing": "OK"}), ("/api/pk", {"pairing": "OV", "metric": "z"}),
                                 ("/api/cs", {"mode": "K"}), ("/api/reference", {}),
                                 ("/api/tokens", {"role": "O", "k": 5}), ("/api/patterns", {}),
                                 ("/api/graph", {}), ("/api/graph", {"labels": "patterns"}),
                                 ("/api/top", {"pairing": "OK", "k": 10})):
                resp = api.get(path, params={"model": m, **params})
                assert resp.status_code == 200, (m, path, resp.text[:300])
            # what the dashboard shows next: each pairing's scatter and the pair panel of a
            # default-graph edge
            for pairing in ("OQ", "OK", "OV"):
                resp = api.get("/api/scatter", params={"model": m, "pairing": pairing})
                assert resp.status_code == 200, (m, pairing, resp.text[:300])
                edge = api.get("/api/top", params={"model": m, "pairing": pairing, "k": 20}).json()["pairs"][-1]
                resp = api.get("/api/pair", params={"model": m, "pairing": pairing,
                                                    "source": edge["source"], "target": edge["target"]})
                assert resp.status_code == 200, (m, pairing, edge, resp.text[:300])
        grid = api.get("/api/pk", params={"model": f"local:step-{FLAKY_STEP}", "pairing": "OK"}).json()
        after = api.get("/api/cache/stats").json()
        errors = srv.server_errors()
    assert after["computations"] == before["computations"], after["counts"]  # nothing computed
    assert not errors, errors
    served, valid = torch.tensor(grid["grid"], dtype=torch.float64), torch.tensor(grid["valid"])
    ref = _pk_reference(swept["steps"][FLAKY_STEP], "OK")
    assert valid.any() and torch.allclose(served[valid], ref[valid], atol=1e-4)
    assert not torch.allclose(ref[valid], _pk_reference(DEMO_DIR, "OK")[valid], atol=1e-3)


@pytest.mark.slow  # needs the swept cache (a Ray sweep)
def test_cli_sweep_prints_the_summary_and_fails_for_a_bad_spec(swept, capsys):
    first = min(swept["steps"])
    code = cli_main(["sweep", "demo", str(swept["steps"][first]), "no-such-model", "--results", "pk,cs",
                     "--cache-dir", str(swept["cache"]), "-q"])
    out = capsys.readouterr().out
    assert code == 1  # one model failed
    lines = out.splitlines()
    assert lines[0].split() == ["model", "status", "seconds", "retries", "message"]
    assert lines[1].split()[:2] == ["demo", "done"] and lines[1].split()[3] == "0"
    assert lines[2].split()[:2] == [f"local:step-{first}", "done"]
    assert lines[3].split()[:2] == ["no-such-model", "failed"] and "not in the local Hugging Face cache" in lines[3]
    assert "2 of 3 models done" in out and "headgraph serve" in out
    assert f"HEADGRAPH_MODEL_ROOT={swept['root'].resolve()}" in out


@pytest.mark.slow  # the console script in a subprocess: ~4 s
def test_cli_sweep_without_ray_says_how_to_install_it():
    code = ("import sys; sys.modules['ray'] = None\n"
            "from headgraph.server.cli.main import main\nsys.exit(main(['sweep', 'demo']))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Ray, which is not installed" in proc.stderr and "headgraph-server[sweep]" in proc.stderr


# -- specs ------------------------------------------------------------------------------------

def test_specs_expand_globs_and_hub_revision_lists(tmp_path):
    for name in ("step-2", "step-10", "other"):
        (tmp_path / name).mkdir()
    assert expand_specs([str(tmp_path / "step-*"), "org/model@main,v1.0", "random:gpt2-tiny@7",
                         "demo", "demo", str(tmp_path / "none-*")]) == [
        str(tmp_path / "step-10"), str(tmp_path / "step-2"), "org/model@main", "org/model@v1.0",
        "random:gpt2-tiny@7", "demo", str(tmp_path / "none-*")]
    rev = hub_revision("org/model@v1.0")
    assert rev is not None and rev.folder_name == "org--model@v1.0"
    assert hub_revision("random:gpt2-tiny@7") is None and hub_revision("gpt2") is None
    env = serve_env(["demo", "local:step-2", "random:x@1"], ("demo", "gpt2"), tmp_path / "c", tmp_path)
    assert env == {"HEADGRAPH_CACHE_DIR": str(tmp_path / "c"), "HEADGRAPH_MODELS": "demo,gpt2,random:x@1",
                   "HEADGRAPH_MODEL_ROOT": str(tmp_path)}
    with pytest.raises(ValueError, match="unknown result"):
        parse_results("pk,nope")
    assert parse_results("graph,pk") == ["pk", "graph"] and parse_results("job")[-1] == "pairs"
