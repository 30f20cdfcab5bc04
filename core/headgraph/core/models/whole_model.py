"""The digest of a whole runnable model beyond its head weights, which the model fingerprint
(core.models.fingerprint.model_fingerprint) joins to the weights fingerprint."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from headgraph.core.models.demo import DemoModel
from headgraph.core.models.fingerprint import (
    config_digest,
    files_digest,
    module_digest,
    tokenizer_digest,
)
from headgraph.core.models.streamed import safetensors_files
from headgraph.core.types import COMPUTE_VERSION

__all__ = ["runnable_digest"]


def runnable_digest(lm: Any) -> str:
    """SHA-256 (hex, 16 chars) of what runs ``lm`` (a ``core.models.loading.LoadedModel``)
    beyond its head weights: the bridge's model (every parameter and buffer, its config), the
    demo model's tensors and config, the GGUF file's bytes, or a streamed folder's safetensors
    and config.json; plus the tokenizer. A model without a pattern source still has one (its
    files, or what it is built from), so its refusals are keyed like any other result."""
    h = hashlib.sha256()
    h.update(f"v{COMPUTE_VERSION}|runnable|".encode())
    original = getattr(lm.bridge, "original_model", None) if lm.bridge is not None else None
    if isinstance(original, torch.nn.Module):
        h.update(f"hf:{type(original).__name__}|".encode())
        config_digest(h, getattr(original, "config", None))
        module_digest(h, original)
    elif isinstance(lm.patterns, DemoModel):
        h.update(b"demo|")
        config_digest(h, lm.patterns.cfg)
        module_digest(h, lm.patterns)
    elif lm.gguf is not None:
        h.update(b"gguf|")
        files_digest(h, [Path(lm.gguf)])
    elif getattr(lm, "folder", None) is not None:
        folder = Path(lm.folder)
        h.update(b"safetensors|")
        config_digest(h, json.loads((folder / "config.json").read_text(encoding="utf-8")))
        files_digest(h, safetensors_files(folder))
    else:  # nothing known beyond the head weights: say what kind of thing runs it
        h.update(f"other:{type(lm.patterns).__name__}|".encode())
    h.update(f"tokenizer:{tokenizer_digest(lm.tokenizer)}|".encode())
    return h.hexdigest()[:16]
