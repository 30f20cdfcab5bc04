"""Write the architecture support table of docs/models.md from the conformance suite.

Runs every case of tests/conformance_support.py (a tiny random model of each causal-LM type
the installed transformers knows) through every stage and replaces the table between the
markers in docs/models.md (appending a section when the markers are missing).
tests/core/test_conformance.py checks that the table there is what this writes.

    .venv/bin/python scripts/conformance_table.py
"""

from __future__ import annotations

import logging
import sys
import tempfile
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

import conformance_support as cs  # type: ignore[import-not-found]  # noqa: E402

DOC = ROOT / "docs" / "models.md"


def main() -> None:
    warnings.filterwarnings("ignore")
    logging.disable(logging.WARNING)
    import transformers

    transformers.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory() as tmp:
        table = cs.render_table(cs.run_all(Path(tmp)))
    text = DOC.read_text(encoding="utf-8")
    old = cs.table_in(text)
    if old is None:
        text = text.rstrip("\n") + "\n\n## Architecture support\n\n" + table + "\n"
    else:
        text = text.replace(old, table)
    DOC.write_text(text, encoding="utf-8")
    print(f"wrote {DOC.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
