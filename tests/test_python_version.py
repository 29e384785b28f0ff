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
