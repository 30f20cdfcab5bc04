"""Fault injection, part 6 of issue 14: bad input is never a 500, no response shows a server
path, and model files come only from inside the model root after resolving every link.

One real server on loopback (``ServerProcess``) with a model root in a temporary folder: a
tiny loadable Qwen2 checkpoint, and folders that would read a VALID weights file outside the
root (a file symlink, an index whose weight_map is absolute or ``../``, a folder symlink); had
the server read them, they would load. Bad ``model=`` values, odd label uploads and paths
outside the root (existing or not: the answers must be identical) are all 4xx with a JSON
error body naming only what the client sent; every body is checked for the root, the
temporary folder and the cache folder; the server log must show no 500.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import httpx
import pytest
import torch


ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HEADGRAPH_DEVICE": "cpu",
       "HEADGRAPH_MODELS": "demo"}
REFUSED = ("linkweights", "absindex", "dotindex", "linkfolder", "danglinglink")


def _tiny_checkpoint(folder: Path) -> None:
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                      hidden_size=32, intermediate_size=64, vocab_size=300,
                      max_position_embeddings=64, tie_word_embeddings=False)
    torch.manual_seed(5)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)


def _index(folder: Path, target: str) -> None:
    from safetensors import safe_open

    with safe_open(str(folder.parent.parent / "outside" / "model.safetensors"), "pt") as fh:
        keys = list(fh.keys())
    (folder / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {}, "weight_map": {k: target for k in keys}}))


@pytest.fixture(scope="module")
def layout(tmp_path_factory):
    """base/models (the root) and base/outside (valid weights and a whole model folder)."""
    base = tmp_path_factory.mktemp("faults_inputs")
    root, outside = base / "models", base / "outside"
    _tiny_checkpoint(root / "tiny")
    _tiny_checkpoint(outside / "real_model")
    shutil.copy(outside / "real_model" / "model.safetensors", outside / "model.safetensors")
    (outside / "secret.txt").write_text("not for clients")
    # a weight file that is a link to a file outside the root
    (root / "linkweights").mkdir()
    shutil.copy(root / "tiny" / "config.json", root / "linkweights")
    os.symlink(outside / "model.safetensors", root / "linkweights" / "model.safetensors")
    # index files whose weight_map names a file outside (absolute; through ..)
    for name, target in (("absindex", str(outside / "model.safetensors")),
                         ("dotindex", "../../outside/model.safetensors")):
        (root / name).mkdir()
        shutil.copy(root / "tiny" / "config.json", root / name)
        _index(root / name, target)
    # folder links inside the root leading out (to a real model; to nothing)
    os.symlink(outside / "real_model", root / "linkfolder", target_is_directory=True)
    os.symlink(outside / "missing", root / "danglinglink", target_is_directory=True)
    return base, root, outside


@pytest.fixture(scope="module")
def server(launch_server, layout):
    base, root, _ = layout
    with launch_server(base / "cache", workers=1,
                       env={**ENV, "HEADGRAPH_MODEL_ROOT": str(root)}) as srv:
        yield srv


BODIES: list[str] = []  # every response body of this module, checked for server paths


@pytest.fixture(scope="module")
def api(server):
    def remember(resp: httpx.Response) -> None:
        resp.read()
        BODIES.append(resp.text)

    with httpx.Client(base_url=server.url, timeout=120,
                      event_hooks={"response": [remember]}) as client:
        yield client


def error(resp: httpx.Response) -> dict:
    """The JSON error of a 4xx answer."""
    assert 400 <= resp.status_code < 500, (resp.status_code, resp.text[:500])
    body = resp.json()["error"]
    assert body["status"] == resp.status_code and body["message"]
    return body


# -- the outside weights are valid: only the confinement stops them ------------------------------

def test_the_refused_folders_would_load_without_a_root(layout):
    from headgraph.core.errors import PathNotAllowed
    from headgraph.core.models.loading import load_model

    _, root, _ = layout
    lm = load_model(str(root / "linkweights"), device="cpu")  # the CLI: any path, links followed
    assert lm.info.n_kv_heads == 2
    with pytest.raises(PathNotAllowed, match="links outside the model root"):
        load_model(str(root / "linkweights"), device="cpu", model_root=str(root))


# -- model= -----------------------------------------------------------------------------------------

BAD_MODELS = {
    "~x": 403, "~": 403, "~root/x": 403, "~root": 403, "./x": 403, "../x": 403, "..": 403,
    ".": 403, "\\x": 403, "/%2e%2e/etc/passwd": 403, "/etc/passwd": 403, "/": 403,
    "local:../x": 404, "local:": 404, "local:/etc": 404, "local:a//b": 404, "local:x/..": 404,
    "local:" + "a" * 300: 404, "a\x00b": 422, "/tmp/a\x00b": 422, "local:a\x00": 422,
    "x\ny": 422, "a" * 300: 404, "/" + "a" * 300: 403, ("/" + "a" * 299) * 2: 422,
    "ü-modèl": 404, "%2e%2e": 404, "local:nope": 404, "local:~x": 404, "local:ü": 404,
    "local:%2e%2e": 404, "Qwen/not-listed": 404, "random:gpt2-tiny": 404, "demo/..": 404,
}


@pytest.mark.parametrize("model", list(BAD_MODELS), ids=lambda m: repr(m)[:40])
@pytest.mark.parametrize("path", ["/api/models/info", "/api/pk"])
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_bad_model_values_are_4xx_json(api, path, model):
    body = error(api.get(path, params={"model": model}))
    assert body["status"] == BAD_MODELS[model], body


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_model_paths_and_links_outside_the_root_get_one_answer(api, layout):
    """Whether a path outside the root exists (file, folder, link target) changes nothing."""
    base, root, outside = layout
    pairs = [
        (str(outside / "secret.txt"), str(outside / "nosuch.txt")),
        (str(outside / "real_model"), str(base / "nosuch_dir")),
        (str(root) + "/../outside/real_model", str(root) + "/../nosuch"),
        (str(root) + "/../outside", str(root) + "/../../nonexistent-xyz"),
        ("/etc/passwd", "/etc/nosuch-file-xyz"),
        (str(root / "linkfolder"), str(root / "danglinglink")),
        (str(root / "linkfolder" / "config.json"), str(root / "danglinglink" / "config.json")),
        ("local:linkfolder", "local:danglinglink"),
        ("local:linkfolder/x", "local:danglinglink/x"),
        ("~root/.bashrc", "~nosuchuser-xyz/x"),
    ]
    answers = set()
    for existing, missing in pairs:
        a, b = (api.get("/api/models/info", params={"model": m}) for m in (existing, missing))
        assert a.status_code == b.status_code == 403, (existing, a.text, b.text)
        assert a.content == b.content
        answers.add(a.content)
    assert len(answers) == 1  # one uniform refusal
    assert "outside the model root" in error(a)["message"]


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_inside_the_root_a_missing_folder_is_404_naming_the_relative_path(api, layout):
    _, root, _ = layout
    msg = error(api.get("/api/models/info", params={"model": str(root / "nope")}))["message"]
    assert "'nope'" in msg and str(root) not in msg
    assert error(api.get("/api/models/info", params={"model": str(root)}))["status"] == 404


@pytest.mark.parametrize("name", REFUSED)
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_folders_reading_outside_the_root_are_refused_and_listed_as_not_offered(api, layout, name):
    """Refused when asked for (403), and listed as "not offered" with the reason (never left
    out without a word, never offered), the reason naming no server path."""
    _, root, _ = layout
    for model in (f"local:{name}", str(root / name)):
        body = error(api.get("/api/models/info", params={"model": model}))
        assert body["status"] == 403 and body["type"] == "PathNotAllowed", body
        assert "outside the model root" in body["message"] or "plain file names" in body["message"]
    listed = {m["id"]: m for m in api.get("/api/models").json()["models"]}
    assert listed["local:tiny"]["status"] == "available"
    if name == "danglinglink":  # a link to nothing is no model at all: nothing to list
        assert f"local:{name}" not in listed
        return
    refused = listed[f"local:{name}"]
    assert refused["status"] == "not offered" and refused["info"] is None, refused
    assert "outside the model root" in refused["message"] or "plain file names" in refused["message"]
    assert str(root) not in refused["message"]


@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_a_local_model_is_named_by_its_id(api, layout):
    _, root, _ = layout
    info = api.get("/api/models/info", params={"model": "local:tiny"})
    assert info.status_code == 200, info.text
    assert info.json()["info"]["name"] == "local:tiny"
    by_path = api.get("/api/models/info", params={"model": str(root / "tiny")})
    assert by_path.status_code == 200 and by_path.json()["model"] == "local:tiny"
    models = {m["id"]: m for m in api.get("/api/models").json()["models"]}
    assert models["local:tiny"]["message"] == "local checkpoint tiny under the model root"
    assert models["local:tiny"]["info"]["name"] == "local:tiny"


def test_without_a_model_root_every_path_gets_the_same_refusal(tmp_path):
    """In-process Registry: no root configured -> one 403 for any path; the CLI (any path
    allowed) takes ``~unknown-user`` literally instead of raising."""
    from headgraph.core.errors import PathNotAllowed
    from headgraph.server.errors import NotFound
    from headgraph.server.models.offered import OUTSIDE_ROOT, Registry
    from headgraph.server.settings import Settings

    registry = Registry(Settings(cache_dir=tmp_path / "c", models=("demo",)))
    for model in ("/etc/passwd", "/nonexistent-xyz", str(tmp_path), "~x", "~", "../x"):
        with pytest.raises(PathNotAllowed) as e:
            registry.resolve(model)
        assert str(e.value) == OUTSIDE_ROOT
    with pytest.raises(NotFound):
        registry.resolve("local:x")
    cli = Registry(Settings(cache_dir=tmp_path / "c", models=("demo",), allow_any_path=True))
    for model in ("~nosuchuser-xyz/x", "~nosuchuser-xyz", "/" + "a" * 300):
        with pytest.raises(NotFound):
            cli.resolve(model)


# -- label uploads ----------------------------------------------------------------------------------

def _upload(api, name: str, content: str | bytes, kind: str) -> httpx.Response:
    return api.post("/api/labels", params={"name": name}, content=content,
                    headers={"content-type": "text/csv" if kind == "csv" else "application/json"})


@pytest.mark.parametrize("ending", ["\r", "\r\n", "\n"], ids=["cr", "crlf", "lf"])
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_csv_line_endings_are_accepted(api, ending):
    text = ending.join(["head,class", "L0H1,Previous Token", "L1H2,Induction", ""])
    resp = _upload(api, f"endings-{len(ending)}-{ord(ending[-1])}", text, "csv")
    assert resp.status_code == 201, resp.text
    assert resp.json()["classes"] == {"L0H1": "Previous Token", "L1H2": "Induction"}


BAD_CSV = {
    "cr-bad-line": ("head,class\rL0H1,A\rnot-a-head,B\r", "line 3"),
    "nul": ("head,class\nL0H1,A\x00B\n", "line 2"),
    "nul-head": ("head,class\nL0\x00H1,A\n", "line 2"),
    "huge-line": ("head,class\nL0H1," + "x" * 300_000 + "\n", "line 2"),
    "huge-header": ("h" * 500_000 + "\n", "line 1"),
    "long-class": ("head,class\r\nL0H1,A\r\nL0H2," + "y" * 5000 + "\r\n", "line 3"),
    "quote-newline": ('head,class\nL0H1,"A\nB"\n', "line 2"),
    "three-columns": ("head,class\r\rL0H1,A,B\r", "line 3"),
    "only-cr": ("\r\r\r", "line 1"),
}


@pytest.mark.parametrize("case", list(BAD_CSV))
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_malformed_csv_is_422_naming_the_line(api, case):
    text, line = BAD_CSV[case]
    body = error(_upload(api, f"bad-csv-{case}", text, "csv"))
    assert body["status"] == 422 and line in body["message"], body


BAD_JSON = {
    "deep-list": ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    "deep-object": ('{"a":' * 100_000 + "1" + "}" * 100_000, "nested too deeply"),
    "deep-class": ('{"classes": {"L0H1": ' + "[" * 100_000 + "]" * 100_000 + "}}", "nested"),
    "number": ("5", "expected"),
    "string": ('"head,class"', "expected"),
    "null": ("null", "expected"),
    "class-number": ('{"classes": {"L0H1": 5}}', "must be a string"),
    "class-bool": ('{"classes": {"L0H1": true}}', "must be a string"),
    "class-null": ('{"classes": {"L0H1": null}}', "empty class"),
    "head-number": ('{"classes": [{"head": 9.6, "class": "A"}]}', "must be a string"),
    "head-object": ('{"classes": [{"head": {"L": 1}, "class": "A"}]}', "must be a string"),
    "name-object": ('{"name": {"x": 1}, "classes": {"L0H1": "A"}}', "must be a string"),
    "huge-int": ('{"classes": {"L0H1": "A"}, "n": ' + "9" * 5000 + "}", "bad JSON"),
    "truncated": ('{"classes": {"L0H1": "A"', "line 1"),
    "not-utf8": (b'{"classes": {"L0H1": "\xff\xfe"}}', "UTF-8"),
    "nul-class": ('{"classes": {"L0H1": "A\\u0000B"}}', "control characters"),
    "bidi-override-class": ('{"classes": {"L0H1": "A\\u202eB"}}', "bidirectional overrides"),
    "bidi-isolate-class": ('{"classes": {"L0H1": "\\u2066A"}}', "bidirectional overrides"),
    "c1-class": ('{"classes": {"L0H1": "A\\u0085B"}}', "control characters"),
}


@pytest.mark.parametrize("case", list(BAD_JSON))
@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_malformed_json_is_422(api, case):
    """As a JSON body (the router's strict schema first) and as a .json file (core's parser,
    whose message is checked)."""
    content, words = BAD_JSON[case]
    body = error(_upload(api, f"bad-json-{case}", content, "json"))
    assert body["status"] == 422, body
    if "nested" in words:
        assert "nested too deeply" in body["message"], body
    raw = content.encode() if isinstance(content, str) else content
    body = error(api.post("/api/labels", params={"name": f"bad-jfile-{case}"},
                          files={"file": (f"{case}.json", raw, "application/json")}))
    assert body["status"] == 422 and words in body["message"], body


# -- last: what every answer of this module held, and the server log --------------------------------

@pytest.mark.slow  # on this module's real server (a uvicorn start and cold computes, ~15 s a module)
def test_no_response_shows_a_server_path_and_the_log_has_no_500(server, layout):
    base, root, outside = layout
    secrets = {str(base), os.path.realpath(base), str(root), str(outside), str(server.cache_dir),
               os.path.realpath(server.cache_dir), str(Path.home())}
    # (all the bodies of the tests above; fewer when only some of them were selected)
    for text in BODIES:
        for secret in secrets:
            assert secret not in text, (secret, text[:500])
    assert not server.server_errors(), server.server_errors()
