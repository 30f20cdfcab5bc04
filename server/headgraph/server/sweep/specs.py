"""What ``headgraph sweep SPEC...`` sweeps: SPEC arguments expanded into one model spec each,
and how a server started afterwards lists them.

A SPEC is one of

- a model spec as ``headgraph compute`` takes it: a registry id (``demo``, ``smollm2``), a
  ``random:`` spec, a Hugging Face hub id, a local checkpoint folder or ``.gguf`` file;
- a glob of checkpoint folders (``ckpts/step-*``), expanded here in sorted order (a glob that
  matches nothing stays one spec, which then fails as "not a model folder");
- a hub revision list ``org/model@rev1,rev2``: one spec ``org/model@rev`` per revision,
  downloaded by the task into ``<model root>/org--model@rev`` (a local folder from then on).

Listing (GET /api/models): a server lists the registry ids of ``HEADGRAPH_MODELS`` and the
folders directly under ``HEADGRAPH_MODEL_ROOT``; :func:`serve_env` gives the two values that
list every swept model (the sweep prints them), and the cache keys are the fingerprints of the
weights, so that server reads every swept result from the cache.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from headgraph.core.models.random_weights import RANDOM_PREFIX
from headgraph.server.models.offered import BUILTIN_MODELS, LOCAL_PREFIX, PACKAGED_GGUF

GLOB_CHARS = frozenset("*?[")


@dataclass(frozen=True)
class HubRevision:
    """``repo@revision`` of a hub revision list, and the folder name it is downloaded to."""

    repo: str
    revision: str

    @property
    def spec(self) -> str:
        return f"{self.repo}@{self.revision}"

    @property
    def folder_name(self) -> str:
        return f"{self.repo.replace('/', '--')}@{self.revision}"


def is_path_spec(spec: str) -> bool:
    """A spec naming a file or folder (rather than a registry or hub id)."""
    if spec.startswith((RANDOM_PREFIX, LOCAL_PREFIX)):
        return False
    if spec.startswith(("/", "~", "./", "../")) or spec in (".", ".."):
        return True
    return Path(spec).expanduser().exists()


def hub_revision(spec: str) -> HubRevision | None:
    """``org/model@rev`` as a HubRevision; None for any other spec."""
    if spec.startswith(RANDOM_PREFIX) or is_path_spec(spec) or spec.count("@") != 1:
        return None
    repo, _, rev = spec.partition("@")
    if not repo or not rev or "," in rev:
        return None
    return HubRevision(repo, rev)


def expand_specs(args: Iterable[str]) -> list[str]:
    """SPEC arguments -> model specs (globs and revision lists expanded), first occurrence kept."""
    out: list[str] = []
    for raw in args:
        spec = raw.strip()
        if not spec:
            continue
        if not spec.startswith(RANDOM_PREFIX) and GLOB_CHARS & set(spec):
            matches = sorted(glob.glob(os.path.expanduser(spec)))
            out.extend(matches or [spec])
            continue
        repo, at, revs = spec.partition("@")
        if at and "," in revs and not spec.startswith(RANDOM_PREFIX) and not is_path_spec(spec):
            out.extend(f"{repo}@{r.strip()}" for r in revs.split(",") if r.strip())
            continue
        out.append(spec)
    return list(dict.fromkeys(out))


def default_model_root(specs: Sequence[str], configured: Path | None) -> Path | None:
    """The model root a sweep uses: ``configured`` (``--model-root`` or HEADGRAPH_MODEL_ROOT),
    else the one folder every swept local checkpoint sits in (so a server started with it
    lists them all as ``local:<folder>``), else None."""
    if configured is not None:
        return Path(configured).expanduser().resolve()
    paths = [Path(os.path.realpath(os.path.expanduser(s))) for s in specs if is_path_spec(s)]
    parents = {p.parent for p in paths if p.exists()}
    return parents.pop() if len(parents) == 1 else None


def registry_ids(specs: Sequence[str]) -> list[str]:
    """The swept specs a server offers through HEADGRAPH_MODELS (random: and hub ids)."""
    return [s for s in specs if not is_path_spec(s) and hub_revision(s) is None
            and s not in BUILTIN_MODELS and s not in PACKAGED_GGUF and not s.startswith(LOCAL_PREFIX)]


def serve_env(model_ids: Sequence[str], configured_models: Sequence[str], cache_dir: Path,
              model_root: Path | None) -> dict[str, str]:
    """HEADGRAPH_* settings under which ``headgraph serve`` lists every swept model (ids as
    the sweep reports them) and reads their results from the sweep's cache."""
    listed = [m for m in configured_models if m not in BUILTIN_MODELS]
    listed += [m for m in registry_ids(model_ids) if m not in listed]
    env = {"HEADGRAPH_CACHE_DIR": str(cache_dir), "HEADGRAPH_MODELS": ",".join(["demo", *listed])}
    if model_root is not None and any(m.startswith(LOCAL_PREFIX) for m in model_ids):
        env["HEADGRAPH_MODEL_ROOT"] = str(model_root)
    return env
