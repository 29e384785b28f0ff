import atexit
import os
import shutil
import sqlite3
import tempfile

import pytest
import torch

# Without CUDA, Triton kernels can only run in the interpreter; the flag must be set before
# any kernel module is imported (triton.jit reads it when a kernel is defined).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# torch.compile's cache (inductor's C++ and Triton files) in a folder of this session: two
# test runs on one machine sharing /tmp/torchinductor_$USER raced on a half-written .so
# ("file too short"). Subprocesses inherit it.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    _cache = tempfile.mkdtemp(prefix="cs336sys-inductor-")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)

# A model small enough that a CLI sweep point takes milliseconds on a CPU.
MICRO = [
    "--size",
    "tiny",
    "--d-model",
    "64",
    "--d-ff",
    "128",
    "--num-layers",
    "2",
    "--num-heads",
    "4",
    "--vocab-size",
    "256",
    "--batch",
    "2",
    "--warmup",
    "1",
    "--iters",
    "3",
    "--device",
    "cpu",
]


def pytest_collection_modifyitems(config, items):
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except ImportError:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    return tmp_path / "results.db"


# -- what every CLI test needs ----------------------------------------------------------------


def invoke(*args, **kw):
    """Run `cs336sys ARGS...` in this process (typer's CliRunner), every argument as text."""
    from typer.testing import CliRunner

    from cs336sys.cli import app

    return CliRunner().invoke(app, [str(a) for a in args], **kw)


def query(db, sql, params=()):
    """The rows of `sql` on the store at `db`, as dicts."""
    conn = sqlite3.connect(db)
    conn.row_factory = sqlite3.Row
    try:
        return [dict(r) for r in conn.execute(sql, params)]
    finally:
        conn.close()


def view_rows(view):
    """`rows(db, sql=...)` for a test file about one view: its rows, oldest first, unless
    `sql` asks for something else."""

    def rows(db, sql=f"SELECT * FROM {view} ORDER BY created"):
        return query(db, sql)

    return rows


@pytest.fixture(autouse=True)
def _no_user_code():
    """No test inherits another's adapters file or one-off targets (cs336sys.yours keeps
    them per process, and in the environment for the ranks it spawns)."""
    from cs336sys import yours

    yours.forget()
    yield
    yours.forget()
