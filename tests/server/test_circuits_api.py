"""Task circuits through the server (core's side is tests/core/test_circuits.py): GET/POST
/api/tasks and GET /api/circuit on a real lab-mode server (a token) serving the demo,
checked against core.circuits run here, and ``headgraph circuit``.
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import numpy as np
import pytest

from headgraph.core.circuits.ability import task_ability
from headgraph.core.circuits.attribution import attribute
from headgraph.core.circuits.faithfulness import faithfulness
from headgraph.core.circuits.mib import from_mib
from headgraph.core.circuits.bundled import bundled_task
from headgraph.core.circuits.tasks import induction, parse_jsonl
from headgraph.core.models.demo import load_demo_model
from headgraph.core.names import BUNDLED_TASKS

from api_support import err, ok

pytestmark = pytest.mark.slow  # a real server computing circuits (attribution, curve, patching)

TOKEN = "circuits-test-token-0123456789"
SIGNED = {"Authorization": f"Bearer {TOKEN}"}
ROW = {"clean": "t01 t02 t03 t01", "corrupt": "t05 t06 t07 t01", "answer": "t02",
       "distractor": "t09"}
ROW2 = {"clean": "t04 t08 t03 t04", "corrupt": "t05 t06 t07 t04", "answer": "t08",
        "distractor": "t09"}


def jsonl(*rows: dict) -> bytes:
    return ("\n".join(json.dumps(r) for r in rows) + "\n").encode()


@pytest.fixture(scope="module")
def http(launch_server, tmp_path_factory):
    env = {"HEADGRAPH_API_TOKEN": TOKEN, "HEADGRAPH_MODELS": "demo", "HEADGRAPH_DEVICE": "cpu"}
    with launch_server(tmp_path_factory.mktemp("circuits") / "cache", env=env,
                       check_errors=True) as srv, \
            httpx.Client(base_url=srv.url, timeout=600) as client:
        yield client


@pytest.fixture(scope="module")
def demo():
    return load_demo_model()


def test_tasks_list_the_bundled_ones_anonymously(http):
    tasks = {t["name"]: t for t in ok(http.get("/api/tasks"))["tasks"]}
    assert {"ioi", "induction", "successor", "ioi-mib", "addition", "subtraction", "mcqa"} \
        == set(BUNDLED_TASKS) <= set(tasks)
    assert all(tasks[n]["bundled"] and tasks[n]["n_rows"] == 32 and tasks[n]["description"]
               for n in BUNDLED_TASKS)


def test_upload_needs_the_token_and_names_bad_rows(http):
    r = http.post("/api/tasks", params={"name": "mine"}, content=jsonl(ROW))
    err(r, 401)
    bad = jsonl(ROW, {**ROW, "corrupt": "t05 t06 t01"})
    msg = err(http.post("/api/tasks", params={"name": "bad", "model": "demo"}, content=bad,
                        headers=SIGNED), 422)
    assert msg.startswith("line 2: clean and corrupt are 4 and 3 tokens"), msg
    msg = err(http.post("/api/tasks", params={"name": "bad"}, headers=SIGNED,
                        content=jsonl(ROW) + b'{"clean": "\xff"}\n'), 422)
    assert msg.startswith("line 2: not UTF-8"), msg
    msg = err(http.post("/api/tasks", params={"name": "bad", "model": "demo"}, headers=SIGNED,
                        content=jsonl({**ROW, "answer": "t02 t03"})), 422)
    assert msg.startswith("line 1: answer 't02 t03' is 2 tokens"), msg
    assert "bad" not in {t["name"] for t in ok(http.get("/api/tasks"))["tasks"]}  # nothing stored
    err(http.post("/api/tasks", params={"name": "ioi"}, content=jsonl(ROW), headers=SIGNED), 409)
    r = http.post("/api/tasks", params={"name": "mine", "model": "demo", "description": "two"},
                  content=jsonl(ROW, ROW2), headers=SIGNED)
    assert r.status_code == 201, r.text
    assert r.json()["n_rows"] == 2 and r.json()["content"].startswith("sha256-")
    err(http.post("/api/tasks", params={"name": "mine"}, content=jsonl(ROW), headers=SIGNED), 409)
    listed = {t["name"]: t for t in ok(http.get("/api/tasks"))["tasks"]}
    assert listed["mine"]["n_rows"] == 2 and not listed["mine"]["bundled"]


def test_circuit_cold_needs_the_token_then_reads_anonymously(http, demo):
    params = {"model": "demo", "task": "induction", "method": "eap-ig", "steps": 2, "top": 30}
    err(http.get("/api/circuit", params=params), 401)
    where = {k: params[k] for k in ("model", "task", "method", "steps")}
    assert ok(http.get("/api/circuit/progress", params=where))["state"] == "idle"
    # While the cold circuit computes, its progress (read anonymously) names the stage and
    # the share of the run done, never going back; then it reads cached.
    with ThreadPoolExecutor(1) as pool:
        running = pool.submit(lambda: ok(http.get("/api/circuit", params=params, headers=SIGNED)))
        seen = []
        while not running.done():
            p = ok(http.get("/api/circuit/progress", params=where))
            if p["state"] == "running":
                seen.append((p["stage"], p["fraction"], p["elapsed_s"]))
            time.sleep(0.05)
        body = running.result()
    assert seen, "no progress seen while the circuit computed"
    assert {s for s, _, _ in seen} <= {"start", "load", "attribution", "faithfulness", "patching", "store"}
    fractions = [f for _, f, _ in seen]
    assert fractions == sorted(fractions) and all(0 <= f <= 1 for f in fractions)
    assert {s for s, _, _ in seen} & {"attribution", "faithfulness", "patching"}
    done = ok(http.get("/api/circuit/progress", params=where))
    assert (done["state"], done["fraction"], done["stage"]) == ("cached", 1.0, None)
    task = induction(demo, n=32)
    att = attribute(demo, task, method="eap-ig", steps=2)
    assert body["task"]["hash"] == task.content_hash() and body["n_edges"] == att.n_edges == 257
    m = body["metrics"]
    assert m["clean"] == pytest.approx(att.metrics.clean, rel=1e-6) and m["able"]
    assert att.metrics.ability is not None
    ability = att.metrics.ability.to_dict()  # the paired sign tests on the same 32 pairs
    assert {k: m["ability"][k] for k in ability} == ability and m["ability"]["state"] == "able"
    assert m["corrupt_accuracy"] == pytest.approx(att.metrics.corrupt_accuracy)
    order = att.order()[:30].tolist()
    assert [(e["writer"], e["reader"]) for e in body["edges"]] == \
        [(w.name, r.name) for w, r in (att.edge(e) for e in order)]
    for row, e in zip(body["edges"], order):
        assert row["score"] == pytest.approx(float(att.scores[e]), rel=1e-6, abs=1e-9)
    curve = body["faithfulness"]
    assert curve["recovered"][0] == pytest.approx(0, abs=1e-6)
    assert curve["recovered"][-1] == pytest.approx(1, abs=1e-6)
    size = body["circuit_size"]
    assert size is not None and len(body["circuit"]) == size and body["share"] == 0.8
    assert curve["recovered"][curve["sizes"].index(size)] >= 0.8
    direct = faithfulness(demo, task, att, sizes=[size])
    assert direct.recovered[0] == pytest.approx(curve["recovered"][curve["sizes"].index(size)],
                                                abs=1e-6)
    assert body["patching"]["n_edges"] == 24 and body["patching"]["spearman"] is not None
    # MIB's CPR / CMD: the curve measured at int(fraction * 257) edges, trapezoid over fractions
    mib, at = body["mib"], dict(zip(curve["sizes"], curve["metrics"]))
    assert mib["sizes"] == [int(p * 257) for p in mib["fractions"]] and mib["fractions"][-1] == 1
    f = np.array([(at[n] - at[0]) / (curve["clean"] - at[0]) for n in mib["sizes"]])
    assert mib["faithfulness"] == pytest.approx(f.tolist(), abs=1e-9)
    assert mib["cpr"] == pytest.approx(float(np.trapezoid(f, mib["fractions"])), abs=1e-9)
    assert mib["cmd"] == pytest.approx(float(np.trapezoid(np.abs(1 - f), mib["fractions"])),
                                       abs=1e-9)
    assert ok(http.get("/api/circuit", params=params)) == body  # cached: anonymous reads it
    # edge= looks single edges up: their rank among all edges, as core orders them.
    full = att.order().tolist()
    asked = [full[0], full[100], full[-1]]
    names = [f"{w.name}>{r.name}" for w, r in (att.edge(e) for e in asked)]
    looked = ok(http.get("/api/circuit", params={**params, "edge": [*names, "L1H0>L0H0.Q"]}))["lookup"]
    assert [(e["writer"] + ">" + e["reader"], e["rank"]) for e in looked] == \
        [(n, full.index(e) + 1) for n, e in zip(names, asked)]  # L1H0 -> L0H0 is no edge: left out
    assert [e["in_circuit"] for e in looked] == [True, size >= 101, size >= len(full)]
    assert looked[1]["score"] == pytest.approx(float(att.scores[asked[1]]), rel=1e-6, abs=1e-9)
    err(http.get("/api/circuit", params={**params, "edge": "L0H0"}), 422)


def test_mib_export_of_a_computed_circuit(http):
    """GET /api/circuit/mib: the cached circuit of the test above in MIB's JSON, read back by
    core.circuits.mib; never computing (404 for parameters not computed)."""
    params = {"model": "demo", "task": "induction", "method": "eap-ig", "steps": 2}
    body = ok(http.get("/api/circuit", params={**params, "top": 257}))  # cached: anonymous
    exported = ok(http.get("/api/circuit/mib", params=params))
    assert exported["cfg"]["n_layers"] == 2 and exported["cfg"]["n_heads"] == 8
    back = from_mib(exported)
    got = {(e.writer, e.reader): (e.score, e.in_graph) for e in back.edges}
    want = {(e["writer"], e["reader"]): (e["score"], e["in_circuit"]) for e in body["edges"]}
    assert set(got) == set(want) and len(got) == body["n_edges"]
    for k, (score, kept) in want.items():
        assert got[k][0] == pytest.approx(score, rel=1e-12) and got[k][1] == kept
    few = from_mib(ok(http.get("/api/circuit/mib", params={**params, "size": 3})))
    assert len(few.circuit) == 3
    assert "not computed yet" in err(http.get("/api/circuit/mib", params={**params, "steps": 3}), 404)
    err(http.get("/api/circuit/mib", params={**params, "size": 9999}), 422)


def test_circuit_of_an_uploaded_task_and_unknown_names(http, demo):
    params = {"model": "demo", "task": "mine", "method": "eap"}
    body = ok(http.get("/api/circuit", params=params, headers=SIGNED))
    task = parse_jsonl(jsonl(ROW, ROW2), demo, name="mine")
    assert body["task"]["hash"] == task.content_hash() and body["metrics"]["n_pairs"] == 2
    # Two pairs: no outcome could reach the sign tests' 0.05, so neither "does" nor "does not".
    a = body["metrics"]["ability"]
    assert body["metrics"]["able"] is None and (a["state"], a["n_pairs"], a["n_units"]) == ("too_few_pairs", 2, 2)
    assert body["steps"] == 1 and body["bundled"] is False
    att = attribute(demo, task, method="eap")
    assert body["edges"][0]["score"] == pytest.approx(float(att.scores[att.order()[0]]), rel=1e-6)
    # A bundled task cut to its first n prompt pairs: its own cache key, refused below 2.
    few = ok(http.get("/api/circuit", params={"model": "demo", "task": "induction", "method": "eap",
                                              "pairs": 4}, headers=SIGNED))
    assert few["metrics"]["n_pairs"] == 4 and few["task"]["hash"] == induction(demo, n=4).content_hash()
    # ... whose able is decided on all 32 bundled pairs (4 alone would be too few to tell).
    every = task_ability(demo, induction(demo, n=32))
    assert few["metrics"]["able"] is True is every.able and task_ability(demo, induction(demo, n=4)).able is None
    got = few["metrics"]["ability"]
    assert (got["n_pairs"], got["answer"]["wins"], got["follows"]["wins"]) == \
        (32, every.answer.wins, every.follows.wins)
    assert ok(http.get("/api/circuit/progress", params={"model": "demo", "task": "induction", "method": "eap",
                                                        "pairs": 4}))["state"] == "cached"
    err(http.get("/api/circuit", params={"model": "demo", "task": "induction", "pairs": 1}), 422)
    err(http.get("/api/circuit", params={"model": "demo", "task": "nope"}), 404)
    err(http.get("/api/circuit", params={"model": "demo", "task": "x", "method": "ig"}), 422)


def test_a_task_the_demo_cannot_do_is_said_so(http, demo, tmp_path, capsys):
    """GET /api/circuit/progress knows the new bundled names (idle, not 404); ``headgraph
    circuit`` on the bundled addition (32 pairs) reports core's metric, which says the demo
    does not add, and says so in words."""
    from headgraph.server.cli.main import main

    for name in ("ioi-mib", "addition", "subtraction", "mcqa"):
        where = {"model": "demo", "task": name, "method": "eap"}
        assert ok(http.get("/api/circuit/progress", params=where))["state"] == "idle"
    args = ["circuit", "demo", "--task", "addition", "--method", "eap", "--top", "3", "-q",
            "--cache-dir", str(tmp_path / "cache")]
    assert main([*args, "--json"]) == 0
    body = json.loads(capsys.readouterr().out)
    task = bundled_task("addition", demo)
    att = attribute(demo, task, method="eap")
    assert body["task"]["hash"] == task.content_hash() and body["metrics"]["n_pairs"] == 32
    m = body["metrics"]
    assert m["clean"] == pytest.approx(att.metrics.clean, rel=1e-6)
    assert m["clean_accuracy"] == pytest.approx(att.metrics.clean_accuracy)
    assert m["able"] is False is att.metrics.able
    assert main(args) == 0  # cached now
    text = capsys.readouterr().out
    assert "task: addition (32 prompt pairs)" in text
    a = att.metrics.ability
    assert a is not None and m["ability"]["answer"]["p"] == pytest.approx(a.answer.p)
    assert (f"the model does not do this task (answer beats distractor p = {a.answer.p:.2g} "
            f"({a.answer.wins}/{a.answer.n}), follows the prompt p = {a.follows.p:.2g} "
            f"({a.follows.wins}/{a.follows.n}); 16 units of 32 prompt pairs, alpha 0.05)") in text


def test_cli_circuit_of_a_file(tmp_path, capsys):
    from headgraph.server.cli.main import main

    path = tmp_path / "my-task.jsonl"
    path.write_bytes(jsonl(ROW, ROW2))
    code = main(["circuit", "demo", "--task", str(path), "--method", "eap", "--top", "5",
                 "--json", "--mib", str(tmp_path / "mib.json"), "--mib-size", "7",
                 "--cache-dir", str(tmp_path / "cache")])
    assert code == 0
    captured = capsys.readouterr()
    body = json.loads(captured.out)  # stdout: the one JSON object; the progress bar on stderr
    assert body["task"]["name"] == "my-task" and len(body["edges"]) == 5
    assert body["mib"] is not None and body["mib"]["cmd"] >= 0
    # the MIB file: every edge (the demo has no grouped KV heads), its top 7 in the circuit
    exported = from_mib(json.loads((tmp_path / "mib.json").read_text()))
    assert len(exported.edges) == body["n_edges"] and len(exported.circuit) == 7
    top = {(e["writer"], e["reader"]) for e in body["edges"]}
    assert top <= {(e.writer, e.reader) for e in exported.circuit}
    assert all(stage in captured.err for stage in ("attribution", "faithfulness", "patching", "100%"))
    assert main(["circuit", "demo", "--task", str(path), "--method", "eap", "--top", "3",
                 "--cache-dir", str(tmp_path / "cache")]) == 0
    text = capsys.readouterr().out
    assert "circuit:" in text and "Spearman" in text and text.count("logits") >= 1
    assert "MIB (fractions 0.1%..100% of edges): CPR" in text
    assert main(["circuit", "demo", "--task", str(path), "--method", "eap", "--mib",
                 str(tmp_path / "m.json"), "--mib-size", "9999", "--cache-dir",
                 str(tmp_path / "cache")]) == 2
    assert "size must be in 0.." in capsys.readouterr().err
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(jsonl({**ROW, "corrupt": "t01"}))
    assert main(["circuit", "demo", "--task", str(bad), "--cache-dir", str(tmp_path / "c")]) == 2
    assert "line 1: clean and corrupt are 4 and 1 tokens" in capsys.readouterr().err
