"""cs336sys runs on every Python that pyproject.toml's requires-python admits: no module uses
what a later Python added. vermin reads the sources for it; `from datetime import UTC`
(3.11's) made `--nsys` and everything importing measure/nsys.py fail on 3.10."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_no_module_needs_a_newer_python_than_requires_python():
    oldest = re.search(r'requires-python = ">=(\d+\.\d+)"',
                       (ROOT / "pyproject.toml").read_text()).group(1)
    done = subprocess.run(
        [sys.executable, "-c", "import sys, vermin; sys.exit(vermin.main())", "--no-tips",
         "--violations", f"--target={oldest}-", "cs336sys", "benchmarks", "tests", "docs/hooks"],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert f"Minimum required versions: {oldest}" in done.stdout, done.stdout[-1000:]


def test_no_sql_binds_a_sequence_to_numbered_placeholders():
    """The newest Pythons too: sqlite3 warns from 3.12 and refuses from 3.14 a sequence bound
    to numbered placeholders (`?1`), which `report --compare` had; plain `?` it binds in
    order on every version."""
    import ast

    numbered = re.compile(r"\?\d")
    found = []
    for path in sorted((ROOT / "cs336sys").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Constant) and isinstance(node.value, str)
                    and re.search(r"\b(SELECT|INSERT|UPDATE|DELETE)\b", node.value)
                    and numbered.search(node.value)):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert found == []
