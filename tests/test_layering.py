"""The package's layers (docs/architecture.md), checked on its imports.

    cli -> handout -> experiments -> {report, models} -> {attention, store} -> yours -> sweep
        -> parallel -> measure

Nothing below imports anything above; experiments never import the store; attention does
not import models (the model picks its kernel through attention's registry); the user's
code (yours/) is reached through attention's registry and the experiments; measure, the
measuring machinery, imports no other package; store/ has no import cycle. Every import
counts, also those inside functions (the lazy ones that keep `cs336sys --help` fast). No
hidden edges: the package root imports nothing, and no module imports another by a name
in a string (importlib), except yours/, whose job is importing the user's code by name, the
experiments' catalog, whose KINDS the graph reads as its imports, and measure/lazy.py, whose
`attach` calls the graph reads as the imports of the packages that make them.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import cs336sys

ROOT = Path(cs336sys.__file__).parent

# layer -> the layers it may import (its own always)
ALLOWED = {
    "cli": {"handout", "experiments", "report", "models", "attention", "store", "parallel",
            "yours", "sweep", "measure"},
    "handout": {"experiments", "report", "models", "attention", "store", "parallel", "yours",
                "sweep", "measure"},
    "experiments": {"report", "models", "attention", "parallel", "yours", "sweep", "measure"},
    "report": {"store", "sweep", "measure"},
    "models": {"attention", "sweep", "measure"},
    "attention": {"yours", "sweep", "measure"},
    "store": {"sweep", "measure"},
    "yours": {"sweep", "measure"},
    "sweep": {"parallel", "measure"},  # the rank executor starts process groups
    "parallel": {"measure"},
    "measure": set(),
}


def module_name(path: Path, root: Path = ROOT) -> str:
    parts = ["cs336sys", *path.relative_to(root).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _nodes(tree: ast.AST, at_import: bool):
    """Every node, or (at_import) those that run when the module is imported: not the
    bodies of functions."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        for child in ast.iter_child_nodes(node):
            if not (at_import and isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef)):
                todo.append(child)


def imports(source: str, module: str, is_package: bool, known: set[str],
            at_import: bool = False) -> set[str]:
    """The cs336sys modules `source` imports, anywhere in it or (at_import) when it is
    imported; relative imports resolved; a `from package import name` is an import of the
    submodule when `name` is one. At import time, importing a submodule first imports every
    package above it: those count too."""
    out: set[str] = set()
    for node in _nodes(ast.parse(source), at_import):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                package = module if is_package else module.rpartition(".")[0]
                for _ in range(node.level - 1):
                    package = package.rpartition(".")[0]
                base = f"{package}.{base}".rstrip(".")
            subs = {f"{base}.{a.name}" for a in node.names} & known
            out |= subs or {base}
    if at_import:
        out |= {m.rsplit(".", k)[0] for m in out for k in range(1, m.count(".") + 1)}
    return {m for m in out if m == "cs336sys" or m.startswith("cs336sys.")}


def layer(module: str) -> str | None:
    """cs336sys.<layer>.…; None for the package root (cs336sys, cs336sys.__main__)."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in ALLOWED else None


@functools.cache
def _runtime(source: str) -> str:
    """`source` without its `if TYPE_CHECKING:` blocks, which never run."""
    tree = ast.parse(source)
    tree.body = [n for n in tree.body
                 if not (isinstance(n, ast.If) and "TYPE_CHECKING" in ast.unparse(n.test))]
    return ast.unparse(tree)


CATALOG = "cs336sys.experiments.catalog"


def catalog_kinds(source: str) -> set[str]:
    """The modules the catalog imports by name when its EXPERIMENTS is first read: its KINDS."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "KINDS" for t in node.targets):
            return {f"cs336sys.experiments.{kind}" for kind in ast.literal_eval(node.value)}
    raise AssertionError("experiments/catalog.py declares no KINDS")


LAZY = "cs336sys.measure.lazy"


def attached(source: str) -> set[str]:
    """The modules a package's `__init__` gives names from on first use: the keys of its
    `attach(__name__, {module: names})` (measure/lazy.py), which must be written out."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and getattr(node.func, "id", "") == "attach":
            assert isinstance(node.args[1], ast.Dict), "attach's modules must be a literal dict"
            found |= {ast.literal_eval(key) for key in node.args[1].keys}
    return found


def graph(root: Path = ROOT, at_import: bool = False) -> dict[str, set[str]]:
    """Each module's imports of the package's modules: all of them, or (at_import) those
    that run when it is imported, `if TYPE_CHECKING:` blocks left out. All of them include
    the kinds the catalog imports by name and the modules a package attaches its names from
    (not at import: on first use)."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    known = set(files)
    edges = {m: imports(_runtime(p.read_text()) if at_import else p.read_text(), m,
                        p.name == "__init__.py", known, at_import) - {m}
             for m, p in files.items()}
    if not at_import:
        for m, p in files.items():
            edges[m] |= attached(p.read_text())
        if CATALOG in files:
            edges[CATALOG] |= catalog_kinds(files[CATALOG].read_text())
    return edges


def forbidden(edges: dict[str, set[str]]) -> list[str]:
    bad = []
    for module, targets in sorted(edges.items()):
        here = layer(module)
        if here is None:
            continue
        for target in sorted(targets):
            there = layer(target)
            if there is not None and there != here and there not in ALLOWED[here]:
                bad.append(f"{module} imports {target} ({here} -> {there})")
    return bad


def cycles(edges: dict[str, set[str]], inside: str) -> list[list[str]]:
    """Import cycles among the modules under `inside`."""
    nodes = {m for m in edges if m == inside or m.startswith(inside + ".")}
    found, state = [], {}

    def visit(m: str, path: list[str]) -> None:
        state[m] = "open"
        for t in sorted(edges[m] & nodes):
            if state.get(t) == "open":
                found.append(path[path.index(t):] + [t] if t in path else [m, t])
            elif t not in state:
                visit(t, [*path, t])
        state[m] = "done"

    for m in sorted(nodes):
        if m not in state:
            visit(m, [m])
    return found


def test_no_layer_imports_one_above_it():
    assert forbidden(graph()) == []


def test_store_has_no_import_cycle():
    assert cycles(graph(at_import=True), "cs336sys.store") == []


def test_no_package_has_an_import_cycle_imports_in_functions_counted():
    """Every package, every import (those inside functions too): a circle hidden by a lazy
    import is still a circle."""
    assert cycles(graph(), "cs336sys") == []


# Imports inside functions keep `cs336sys --help` light. One is justified when its target is
# heavy -- it imports one of HEAVY when imported (or imports such a module, or lives in a
# package that does) -- or when it keeps a module out of what `--help` loads: the import is
# in a module the command line loads and its target is not (a command loads its experiment
# when it runs). Every other import of the package's own modules is at the top; a package's
# names given on first use are attached (measure/lazy.py), not imported in a function.
# (sqlite-utils imports numpy.)
HEAVY = ("torch", "triton", "matplotlib", "datasette", "numpy", "sqlite_utils")
# The places that import a light module inside a function anyway, each with its reason.
LAZY_ON_PURPOSE = {
    ("cs336sys.__main__", "cs336sys.cli"): "a Ctrl-C while the command line loads is caught",
}


def heavy_modules(root: Path = ROOT) -> set[str]:
    """The modules whose import imports one of HEAVY: directly, through a module they
    import when imported, or through a package above them."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    edges = graph(root, at_import=True)
    heavy = set()
    for m, p in files.items():
        for node in _nodes(ast.parse(_runtime(p.read_text())), at_import=True):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module] if isinstance(node, ast.ImportFrom) and not node.level
                     else [])
            if any(n and n.split(".")[0] in HEAVY for n in names):
                heavy.add(m)
    grew = True
    while grew:
        before = len(heavy)
        for m in files:
            above = {m.rsplit(".", k)[0] for k in range(1, m.count("."))}
            if (edges[m] | above) & heavy:
                heavy.add(m)
        grew = len(heavy) > before
    return heavy


def loaded_by_help(root: Path = ROOT) -> set[str]:
    """The package's modules `cs336sys --help` imports: cs336sys.cli and what it imports
    when imported, transitively."""
    edges, todo, seen = graph(root, at_import=True), ["cs336sys.cli"], set()
    while todo:
        m = todo.pop()
        if m not in seen and m in edges:
            seen.add(m)
            todo += edges[m]
    return seen


def lazy_light_imports(root: Path = ROOT) -> list[str]:
    """Imports inside functions of package modules that neither HEAVY nor `--help` explain."""
    files = {module_name(p, root): p for p in root.rglob("*.py")}
    known, heavy, at_help = set(files), heavy_modules(root), loaded_by_help(root)
    found = []
    for m, p in sorted(files.items()):
        source = p.read_text()
        tree = ast.parse(source)
        at_import = {id(n) for n in _nodes(tree, at_import=True)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Import | ast.ImportFrom) and id(node) not in at_import:
                segment = ast.get_source_segment(source, node) or ""
                targets = imports(segment.strip(), m, p.name == "__init__.py", known) - {m}
                for target in sorted(targets - heavy):
                    kept_from_help = m in at_help and target not in at_help
                    if not kept_from_help and (m, target) not in LAZY_ON_PURPOSE:
                        found.append(f"{m}:{node.lineno} imports {target} in a function")
    return sorted(set(found))


def test_imports_inside_functions_only_keep_the_command_line_light():
    """An import inside a function hides an edge and runs at every call: it is there only
    to keep torch, Triton, matplotlib and datasette, or a command's experiment, out of
    `cs336sys --help`."""
    assert lazy_light_imports() == []


def test_the_lazy_import_checker_tells_heavy_from_light(tmp_path):
    pkg = tmp_path / "cs336sys"
    (pkg / "models").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "models" / "__init__.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from cs336sys.models import net\n")
    (pkg / "models" / "net.py").write_text("import torch\n")
    (pkg / "models" / "config.py").write_text("import json\n")
    (pkg / "models" / "uses.py").write_text(
        "def f():\n    from cs336sys.models import net\n\n"
        "def g():\n    from cs336sys.models.config import json\n")
    assert heavy_modules(pkg) == {"cs336sys.models.net"}
    assert lazy_light_imports(pkg) == [
        "cs336sys.models.uses:5 imports cs336sys.models.config in a function"]


def test_the_checker_sees_a_forbidden_edge(tmp_path):
    """The checker itself: an upward import inside a function, a relative one, an attached
    one, and a cycle."""
    pkg = tmp_path / "cs336sys"
    for sub in ("store", "measure", "experiments", "models", "attention"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("import cs336sys.cli\n")  # the root: its own test
    (pkg / "experiments" / "run.py").write_text("def f():\n    from cs336sys.store import db\n")
    (pkg / "attention" / "k.py").write_text("from ..models import cfg\n")
    (pkg / "models" / "cfg.py").write_text("from cs336sys.measure import clock\n")
    (pkg / "measure" / "clock.py").write_text("")
    (pkg / "store" / "db.py").write_text("from cs336sys.store import views\n")
    (pkg / "store" / "views.py").write_text("def lazy():\n    from . import db\n")
    (pkg / "models" / "__init__.py").write_text(
        "__getattr__, __dir__, _ = attach(__name__, {'cs336sys.experiments.run': ['f']})\n")
    assert forbidden(graph(pkg)) == [
        "cs336sys.attention.k imports cs336sys.models.cfg (attention -> models)",
        "cs336sys.experiments.run imports cs336sys.store.db (experiments -> store)",
        "cs336sys.models imports cs336sys.experiments.run (models -> experiments)",
    ]
    assert "cs336sys.experiments.run" not in graph(pkg, at_import=True)["cs336sys.models"]
    assert cycles(graph(pkg, at_import=True), "cs336sys.store") == []  # views imports db lazily
    # a package whose __init__ imports a submodule that imports from the package
    (pkg / "store" / "__init__.py").write_text("from cs336sys.store.db import views\n")
    assert cycles(graph(pkg, at_import=True), "cs336sys.store") == [
        ["cs336sys.store", "cs336sys.store.db", "cs336sys.store"]
    ]


def test_the_package_root_imports_nothing():
    tree = ast.parse((ROOT / "__init__.py").read_text())
    assert not [n for n in ast.walk(tree) if isinstance(n, ast.Import | ast.ImportFrom)]


def _by_name(tree: ast.AST) -> list[int]:
    """Lines that import a module named by a string: importlib.import_module, __import__."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call):
            f = node.func
            name = f.attr if isinstance(f, ast.Attribute) else getattr(f, "id", "")
            if name in ("import_module", "__import__"):
                out.append(node.lineno)
    return out


def test_no_module_imports_another_by_a_string():
    found = {module_name(p): _by_name(ast.parse(p.read_text())) for p in ROOT.rglob("*.py")}
    assert {m: lines for m, lines in found.items()
            if lines and layer(m) != "yours" and m not in (CATALOG, LAZY)} == {}
    assert _by_name(ast.parse("import importlib\nimportlib.import_module('x')\n")) == [2]


def test_no_module_is_longer_than_500_lines():
    """A module past 500 lines holds two ideas: split it where the code has a seam."""
    long = {str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py")
            if (n := len(p.read_text(encoding="utf-8").splitlines())) > 500}
    assert long == {}
