import atexit
import gc
import os
import shutil
import signal
import sqlite3
import tempfile
import time

import pytest

# Times without an offset (`--since 2026-01-05`) are the machine's local time: the tests that
# select the fixtures' UTC times by date run in UTC wherever the tests run (a test that needs
# another zone sets TZ itself).
os.environ["TZ"] = "UTC"
time.tzset()

# The suite sends Ctrl-C to commands it starts (tests/test_signals*.py). A shell starts a
# background job (`make test &`) with SIGINT ignored; every process below inherits that, and
# cs336sys honours it as it honours nohup's: each signalled command ran on, its ranks
# spinning, and every later test slowed. The suite's processes take Python's own handler
# back, so that the commands they start get the default.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)

# pytest-xdist (`make test` runs `pytest -n auto`): this process is one of several workers.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")

# torch.compile's cache (inductor's C++ and Triton files) in a folder of this session: two
# test runs on one machine sharing /tmp/torchinductor_$USER raced on a half-written .so
# ("file too short"). Under xdist each worker has a folder of its own, for the same reason
# (the workers inherit the folder the controlling process made). Subprocesses inherit it,
# and so do the ranks that import a test module: each made a folder of its own, which its
# os._exit left behind (20 to 40 empty folders in /tmp a run), hence the owner's mark.
_OWNER = "PYTEST_INDUCTOR_CACHE_OWNER"  # not a variable the store records
if ("TORCHINDUCTOR_CACHE_DIR" not in os.environ
        or (_XDIST_WORKER and os.environ.get(_OWNER) != _XDIST_WORKER)):
    _cache = tempfile.mkdtemp(prefix=f"cs336sys-inductor-{_XDIST_WORKER or ''}")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = _cache
    os.environ[_OWNER] = _XDIST_WORKER or ""
    atexit.register(shutil.rmtree, _cache, ignore_errors=True)
# Before its first CPU build, inductor probes which vector instructions the compiler can
# build and load (a C++ build and a subprocess per ISA the CPU reports), in every process
# that compiles, with a fresh cache folder each: the first of `pytest -p no:xdist -k compiled
# tests/test_attention_impls.py` took 12.9 s with the probe and 10.1 s without. Here the ISAs
# the CPU reports are taken as buildable (torch._inductor.config.cpp.vec_isa_ok);
# TORCHINDUCTOR_VEC_ISA_OK set empty probes again (0 would turn vector code off).
os.environ.setdefault("TORCHINDUCTOR_VEC_ISA_OK", "1")
# Inductor builds a graph's C++ kernels in a pool of worker processes, each of which imports
# torch: for a few small graphs, on cores the test workers already share, building in the
# process itself costs less. The seven compile tests in one process (`pytest -p no:xdist`,
# test_attention_impls -k compiled, test_cli's and test_memory's compiled tests, the step's
# every-switch test, flash_torch's compiled backward) took 73 s of user CPU with the pool and
# 59 s without, in the same wall time.
os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")


def commit_seed() -> int:
    """A number from the checked-out commit (0 outside a checkout): what the suite samples
    (signal moments, sm_90 build pairs) is the same on every xdist worker and whenever a
    commit's failure is rerun, and new with each commit."""
    import subprocess

    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=os.path.dirname(__file__),
                          capture_output=True, text=True).stdout.strip()
    return int(head[:12], 16) if head else 0


def _patch_the_language_once_per_launch() -> bool:
    """Triton's interpreter swaps triton.language's functions for interpreted ones when a
    kernel launches, and swaps them again, walking every member of triton.language (inspect.
    getmembers), at each call of a @triton.jit helper inside the kernel: the same swap, as
    the launch's is still in place. Our kernels call helpers per tile, so that walk was
    about 40% of every interpreted test. Here a helper call skips it when the running
    launch has swapped the same modules already (otherwise it swaps as before). Results are
    unchanged (test_flash_triton.py::test_interpreter_patch_changes_no_result checks it
    bit for bit). False where the interpreter is not the one this was written against."""
    import functools
    import inspect
    import threading

    try:
        import triton.language as tl
        from triton.runtime import interpreter
    except ImportError:
        return False
    needed = ("_patch_lang", "GridExecutor", "_LangPatchScope", "InterpretedFunction")
    if not all(hasattr(interpreter, name) for name in needed):
        return False
    swap, launch = interpreter._patch_lang, interpreter.GridExecutor.__call__
    state = threading.local()  # per thread: the modules each running launch swapped

    @functools.cache
    def languages(fn):
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def patch_lang(fn):
        running = getattr(state, "running", None)
        if running and languages(fn) <= running[-1]:
            return interpreter._LangPatchScope()  # nothing to swap, nothing to restore
        scope = swap(fn)
        if running:
            running[-1].update(languages(fn))
        return scope

    def run(self, *args, **kwargs):
        running = state.__dict__.setdefault("running", [])
        running.append(set())
        try:
            return launch(self, *args, **kwargs)
        finally:
            running.pop()

    patch_lang.original, run.original = swap, launch
    interpreter._patch_lang, interpreter.GridExecutor.__call__ = patch_lang, run
    return True


# CS336SYS_TEST_OVERFLOW_CHECKS=1 keeps the interpreter's int32 overflow checks in the tests.
OVERFLOW_CHECKS_ENV = "CS336SYS_TEST_OVERFLOW_CHECKS"


def _skip_overflow_checks():
    """Triton's interpreter checks every int32 addition, subtraction and multiplication for
    overflow (InterpreterOptions.sanitize_overflow; compiled kernels check none unless asked):
    each becomes a cast to int64, the operation, two comparisons and an assert. The tests'
    tensors hold far fewer than 2**31 elements, so no offset into them can overflow and the
    check can never fire here. `pytest -p no:xdist tests/test_flash_triton.py` took 14 s and
    16 s without it against 20 s and 24 s with it (OVERFLOW_CHECKS_ENV=1), runs side by side
    on the 2-core box;
    test_flash_triton.py::test_interpreter_patch_changes_no_result checks the kernels give
    the same bits. Returns the interpreter's own options, or None where they are kept (the
    variable, or an interpreter without the option)."""
    import dataclasses

    if os.environ.get(OVERFLOW_CHECKS_ENV) == "1":
        return None
    try:
        from triton.runtime import interpreter
    except ImportError:
        return None
    builder = getattr(interpreter, "interpreter_builder", None)
    options = getattr(builder, "options", None)
    if not dataclasses.is_dataclass(options) or not hasattr(options, "sanitize_overflow"):
        return None
    builder.options = dataclasses.replace(options, sanitize_overflow=False)
    return options


INTERPRETER_PATCHED = False  # set by pytest_configure
INTERPRETER_OPTIONS = None  # the interpreter's own options, where the tests replaced them


def _hands_out_tests_only(config) -> bool:
    """The xdist process of `pytest -n N` that hands tests to the workers and runs none."""
    return not hasattr(config, "workerinput") and bool(config.getoption("numprocesses", None))


def pytest_configure(config):
    global INTERPRETER_PATCHED, INTERPRETER_OPTIONS
    if _hands_out_tests_only(config):
        return  # it needs no torch (3 s of CPU before the workers even start)
    import torch

    # Without CUDA, Triton kernels can only run in the interpreter; the flag must be set
    # before any kernel module is imported (triton.jit reads it when a kernel is defined):
    # here, before the test modules are collected.
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
    # Neither has an effect on compiled kernels.
    INTERPRETER_PATCHED = _patch_the_language_once_per_launch()
    INTERPRETER_OPTIONS = _skip_overflow_checks()
    # Each xdist worker computes on its share of the cores. torch's default, a thread per
    # core in every worker, oversubscribes them: OpenMP threads spin waiting for cores the
    # other workers hold (the model, attention and precision tests took 2.5 times the CPU
    # time for it on 2 cores, 86 s against 35 s). Only this process's torch: nothing is put
    # in the environment (the store records OMP_NUM_THREADS with each run), and the
    # processes a test starts choose their own (the launcher's ranks split the cores).
    if _XDIST_WORKER:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
        workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
        torch.set_num_threads(max(1, (cores or 1) // workers))


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


def micro(**changes) -> list[str]:
    """MICRO with some values changed: micro(num_layers=1) for `--num-layers 1`."""
    args = list(MICRO)
    for name, value in changes.items():
        args[args.index("--" + name.replace("_", "-")) + 1] = str(value)
    return args


def pytest_collection_modifyitems(config, items):
    import torch

    if not torch.cuda.is_available():
        skip = pytest.mark.skip(reason="needs CUDA")
        for item in items:
            if "gpu" in item.keywords:
                item.add_marker(skip)
    # Slow tests first (a stable sort: otherwise in file order), so that under xdist the
    # last tests handed out are short ones and no worker waits long for another at the end.
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)


def pytest_collection_finish(session):
    # What the test modules imported (torch, Triton, the package: some 400,000 objects) is
    # never garbage: leave it out of every later collection. Each sweep point ends with a
    # gc.collect() (sweep/result.free_memory), which took 0.25 s of CPU each time it walked
    # them all; a fifth of the CLI tests' time. Objects made after this, by the tests
    # themselves, are collected as before.
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """A test's promise (tests/promises.py) travels with its report: under xdist the
    reports reach the controlling process, which prints the summary."""
    outcome = yield
    marker = item.get_closest_marker("promise")
    if marker is not None:
        outcome.get_result().user_properties.append(("promise", marker.args[0]))


def pytest_terminal_summary(terminalreporter):
    """The hostile promises: per promise, the attempts this run made and how many held. A
    test is one attempt unless it records how many it made (`record_property("attempts",
    n)`, and "broken" for those that did not hold); a test that failed in any phase without
    saying how many broke counts as one broken; a skipped test made no attempt."""
    tests: dict[str, dict] = {}
    for outcome in ("passed", "failed", "error"):
        for report in terminalreporter.stats.get(outcome, []):
            props = dict(getattr(report, "user_properties", ()))
            if "promise" not in props:
                continue
            test = tests.setdefault(report.nodeid, {"failed": False})
            test.update(props)
            test["failed"] |= outcome != "passed"
    if not tests:
        return
    table: dict[str, list[int]] = {}
    for test in tests.values():
        attempts = test.get("attempts", 1)
        broken = test.get("broken", 1) if test["failed"] else 0
        row = table.setdefault(test["promise"], [0, 0])
        row[0] += attempts
        row[1] += attempts - min(broken, attempts)
    width = max(map(len, table))
    terminalreporter.section("hostile promises")
    terminalreporter.write_line(f"{'promise':<{width}}  attempts  held")
    for promise in sorted(table):
        attempts, held = table[promise]
        terminalreporter.write_line(f"{promise:<{width}}  {attempts:>8}  {held:>4}")


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    """The same after each test: what the tests left alive (modules imported on first use,
    such as matplotlib and inductor, and their caches) joins the frozen objects once its
    garbage is collected, so that the next test's gc.collect() walks only what that test
    made. Freezing does not keep anything alive: an object whose count drops to zero is
    freed as always; only a cycle among frozen objects waits for the end of the session."""
    gc.collect()
    gc.freeze()


def pytest_unconfigure(config):
    gc.unfreeze()  # collectable again when the interpreter exits (nanobind warns otherwise)


# Drawer.__init__ as the package has it (a test of the forked drawing processes uses it).
from cs336sys.report.drawer import Drawer  # noqa: E402

DRAWER_INIT = Drawer.__init__


@pytest.fixture(autouse=True)
def _draw_in_this_process(monkeypatch):
    """A report forks a process per core to draw its plots (report/drawer.py). Forking a
    pytest worker (torch loaded) costs more than the drawing saves on these small reports:
    a third of the report tests' CPU time. Tests draw in their own process, except
    test_report.py::test_plots_drawn_in_forked_processes_are_the_ones_drawn_here; reports
    made by a `cs336sys` subprocess fork as they always do."""
    monkeypatch.setattr(Drawer, "__init__", lambda self, start=True: DRAWER_INIT(self, False))


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def _figures_unrasterized(request, monkeypatch):
    """In a test marked `unrasterized` (a module's pytestmark), every matplotlib figure is
    built as always, our plotting code included, but not rasterized: `savefig` writes a PNG
    signature and no pixels. For tests whose subject is what a report says (verdicts,
    tables, filters), not how its plots look. Rasterizing (Agg) was half of their CPU time:
    `pytest -p no:xdist` of test_compare.py took 16 s against 8 s, of test_report.py 13 s
    against 7 s. Pixels stay the subject of test_report_browser.py (Chromium), test_hostile.py
    and test_report_sections.py; `@pytest.mark.unrasterized(False)` keeps them for one test
    in a marked module."""
    marker = request.node.get_closest_marker("unrasterized")
    if marker is None or marker.args == (False,):
        return
    from matplotlib.figure import Figure

    def savefig(self, fname, **kwargs):
        if hasattr(fname, "write"):
            fname.write(PNG_SIGNATURE)
        else:
            with open(fname, "wb") as f:
                f.write(PNG_SIGNATURE)

    monkeypatch.setattr(Figure, "savefig", savefig)


# Modules whose tests share an expensive module-scoped fixture (one launch of every case, or
# one build): under xdist all their tests go to one worker, in a row, which runs the fixture
# once. Spread over the workers, each would run it, and again each time it came back to the
# module from another (slow tests first): three times in one run, for test_report_sections.
ONE_WORKER = {
    "tests/test_ddp_bench.py",  # swept: six DDP variants on two ranks
    "tests/test_ddp_wrappers.py",  # runs: every DDP case, 3 rounds
    "tests/test_sharding.py",  # runs: every sharded-optimizer and FSDP case
    "tests/test_sm90_codegen.py",  # builds: the kernels compiled for sm_90
    "tests/test_report_browser.py",  # fixture_report: the fixture's report, plots drawn
    "tests/test_report_sections.py",  # rendered: the fixture's report, plots drawn
}


@pytest.hookimpl(optionalhook=True)  # a pytest-xdist hook; without xdist it is never called
def pytest_xdist_make_scheduler(config, log):
    """`pytest -n N` (make test): each test is handed to the next free worker, as with xdist's
    default (--dist load), except that a module of ONE_WORKER goes to one worker whole.
    (xdist_group marks and --dist loadgroup would say the same, but under pytest 9.2 xdist
    3.8 no longer sees the marks: it renames node ids through an attribute pytest dropped.)"""
    if config.getvalue("dist") != "load":
        return None  # another --dist asked for by name
    from xdist.scheduler import LoadScopeScheduling

    class Scheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return module if module in ONE_WORKER else nodeid

    return Scheduling(config, log)


@pytest.fixture
def db_path(tmp_path, monkeypatch):
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    return tmp_path / "results.db"


# -- what every CLI test needs ----------------------------------------------------------------


_BUILT: dict = {}


def _built_once(app):
    """typer.main.get_command(app), built again only when the app's commands change (a test
    that adds a toy command): typer's CliRunner builds the whole click tree on every
    invoke, which made it the largest cost of the CLI tests."""
    import typer.main

    key = (id(app), *map(id, app.registered_commands), *map(id, app.registered_groups))
    if key not in _BUILT:
        _BUILT.clear()
        _BUILT[key] = typer.main.get_command(app)
    return _BUILT[key]


import typer.testing  # noqa: E402

typer.testing._get_command = _built_once  # what CliRunner.invoke calls for the click tree


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
def _no_signal_remembered():
    """What sweep/stopping.py remembers of signals is per process: a command's. In-process
    CLI tests that stop a sweep leave it set; each test starts without."""
    from cs336sys.sweep import stopping

    stopping.reset()
    yield
    stopping.reset()


@pytest.fixture(autouse=True)
def _no_user_code():
    """No test inherits another's adapters file or one-off targets (cs336sys.yours keeps
    them per process, and in the environment for the ranks it spawns)."""
    from cs336sys import yours

    yours.forget()
    yield
    yours.forget()
