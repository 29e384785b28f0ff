"""cs336sys runs on every Python that pyproject.toml's requires-python admits: no module uses
what a later Python added. vermin reads the sources for it; `from datetime import UTC`
(3.11's) made `--nsys` and everything importing measure/nsys.py fail on 3.10."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_trees() -> list[tuple[str, ast.Module]]:
    """(path from the root, parsed module) of every module of the package."""
    return [(str(path.relative_to(ROOT)), ast.parse(path.read_text()))
            for path in sorted((ROOT / "cs336sys").rglob("*.py"))]


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
    numbered = re.compile(r"\?\d")
    found = [f"{path}:{node.lineno}" for path, tree in package_trees() for node in ast.walk(tree)
             if isinstance(node, ast.Constant) and isinstance(node.value, str)
             and re.search(r"\b(SELECT|INSERT|UPDATE|DELETE)\b", node.value)
             and numbered.search(node.value)]
    assert found == []


def _loops_in_handled_blocks(tree) -> list[int]:
    """Lines of `while cond:` loops (not `while True:`) inside a try or with block of their
    own function."""
    found = []

    def walk(node, handled: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
                walk(child, False)
            elif isinstance(child, ast.Try | getattr(ast, "TryStar", ast.Try) | ast.With
                            | ast.AsyncWith):  # (TryStar: 3.11's except*)
                for body in child.body:
                    walk_stmt(body, True)
                for rest in (getattr(child, "handlers", []) + getattr(child, "orelse", [])
                             + getattr(child, "finalbody", [])):
                    walk_stmt(rest, handled)
            else:
                walk_stmt(child, handled)

    def walk_stmt(node, handled: bool) -> None:
        if (isinstance(node, ast.While) and handled
                and not (isinstance(node.test, ast.Constant) and node.test.value is True)):
            found.append(node.lineno)
        walk(node, handled)

    walk(tree, False)
    return found


def test_no_loop_tests_its_condition_inside_a_try_of_its_own_frame():
    """On Python 3.13 a KeyboardInterrupt raised as `while cond:` tests `cond` escapes the try
    (or with) around the loop in the same function, its except, finally or __exit__ skipped
    (CPython issue 130279: 15 of 30 runs under load on 3.13.0 with a one-call body). Such a
    loop is written `while True:` with `if not cond: break`, which 3.13 handles."""
    found = [f"{path}:{line}" for path, tree in package_trees()
             for line in _loops_in_handled_blocks(tree)]
    assert found == []
    sample = ast.parse("def f():\n    try:\n        while x:\n            y()\n    finally:\n"
                       "        z()\n    with a:\n        while True:\n            break\n")
    assert _loops_in_handled_blocks(sample) == [3]
