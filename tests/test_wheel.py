"""A non-editable install works: the built wheel ships the report templates.

The templates live in the repository's top-level templates/ folder; pyproject.toml maps them
into the wheel as cs336sys/templates/. This builds the wheel from a copy of the sources (no
network), installs it into a throwaway venv that sees the project venv's dependencies but not
its editable cs336sys, and runs that venv's `cs336sys report` outside the repository.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

from tests.report_fixture import build

REPO = Path(__file__).resolve().parent.parent
# What the build reads; copied so that the build writes nothing into the checkout and no
# stale build/ folder there can leak deleted modules into the wheel.
SOURCES = ("pyproject.toml", "README.md", "cs336sys", "templates")
SHIPPED = ("cs336sys/templates/report.html.j2", "cs336sys/templates/report.md.j2")


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("PYTHON", "PIP_", "VIRTUAL_ENV", "CS336SYS_"))}
    return {**env, "PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}


def _run(*cmd, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    proc = subprocess.run(list(map(str, cmd)), cwd=cwd, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, f"{cmd}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.slow
def test_wheel_installs_a_working_report(tmp_path):
    src = tmp_path / "src"
    for name in SOURCES:
        if (REPO / name).is_dir():
            ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
            shutil.copytree(REPO / name, src / name, ignore=ignore)
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(REPO / name, src / name)
    wheels = tmp_path / "wheels"
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation",
         "-w", wheels, src, cwd=tmp_path)
    (wheel,) = wheels.glob("cs336sys-*.whl")

    # The wheel has the templates, and every module of the source tree (the package list
    # in pyproject.toml is explicit: a subpackage missing there is missing here).
    names = set(zipfile.ZipFile(wheel).namelist())
    assert set(SHIPPED) <= names
    modules = {p.relative_to(src).as_posix() for p in (src / "cs336sys").rglob("*.py")}
    assert not modules - names, (
        f"not in the wheel (add to [tool.setuptools] packages): {sorted(modules - names)}"
    )

    # A bare venv; the wheel goes in first, so that pip sees no other cs336sys.
    venv = tmp_path / "venv"
    _run(sys.executable, "-m", "venv", "--without-pip", venv, cwd=tmp_path)
    py = venv / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", py, "install", "--no-deps", "--no-index",
         wheel, cwd=tmp_path)
    # Then the project venv's dependencies (torch, jinja2, ...) become visible to it. A path
    # line in a .pth adds that folder to sys.path, after the venv's own site-packages, without
    # running the .pth files in it: the project's editable-install finder stays out.
    site = _run(py, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))",
                cwd=tmp_path).stdout.strip()
    deps = dict.fromkeys(sysconfig.get_path(k) for k in ("purelib", "platlib"))
    (Path(site) / "_project_deps.pth").write_text("".join(f"{d}\n" for d in deps))

    work = tmp_path / "work"  # outside the repository: no checkout on sys.path
    work.mkdir()
    probe = _run(py, "-c", "import cs336sys; from cs336sys.report.render import TEMPLATES; "
                 "print(cs336sys.__file__); print(TEMPLATES)", cwd=work).stdout.splitlines()
    package, templates = (Path(p).resolve() for p in probe)
    assert package.is_relative_to(venv.resolve()), probe  # the wheel's copy, not the repo's
    assert templates == package.parent / "templates", probe

    db = build(tmp_path / "fixture.db")
    out = work / "report"
    proc = _run(venv / "bin" / "cs336sys", "report", "--db", db, "--out", out, cwd=work)
    assert {str(out / "report.html"), str(out / "report.md")} <= set(proc.stdout.splitlines())
    html = (out / "report.html").read_text()
    md = (out / "report.md").read_text()
    for text in (html, md):
        assert "Model: end-to-end training step" in text
        assert "aaaa1111" in text  # a commit from the fixture's provenance
    assert html.lstrip().lower().startswith("<!doctype html>")
    assert (out / "report_files").is_dir() and any((out / "report_files").glob("*.png"))
