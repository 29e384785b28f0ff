"""`make gpu-check` (benchmarks/gpu_check.py) where it can be checked without a GPU: it says so
and exits 2, and its verdict reads the views the reference set fills."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cs336sys.experiments.catalog import EXPERIMENTS
from cs336sys.store import Store
from tests.conftest import query

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"
PROV = {"host": "lab", "device": "cuda:0", "gpu": "NVIDIA H100 80GB HBM3", "gpu_count": 1,
        "git_commit": "abc", "git_dirty": 0}


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow  # two Pythons, one importing torch
@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the machine without CUDA"
)
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, str(SCRIPT), "--out", str(tmp_path / "r")], env=env,
                         capture_output=True, text=True)
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "Error: make gpu-check needs a CUDA GPU (torch.cuda.is_available() is False)"
    ]
    # a Python without torch (the CPU boxes' system Python, say): one line too
    out = subprocess.run([sys.executable, "-S", "-c", f"import runpy, sys; sys.argv = [{str(SCRIPT)!r}]; "
                          f"runpy.run_path({str(SCRIPT)!r}, run_name='__main__')"],
                         capture_output=True, text=True)
    assert out.returncode == 2 and len(out.stderr.splitlines()) == 1
    assert "needs torch with CUDA" in out.stderr
    assert not (tmp_path / "r").exists()


def test_the_verdict_reads_what_the_reference_set_stores(tmp_path):
    gpu_check = _module()
    assert gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
    db = tmp_path / "results.db"
    shape = {"seq": 16384, "d_head": 64, "heads": 16, "batch": 1, "precision": "bf16", "causal": True}
    with Store(db, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, [], "attention")
        for impl, backend, used, ms in (("triton", None, None, 5.0), ("naive", None, None, 94.0),
                                        ("sdpa", "cudnn", "cudnn", 4.5)):
            s.add_run(inv, "attention", "ok", {**shape, "impl": impl, "sdpa_backend": backend},
                      {"e2e_ms_median": ms, "sdpa_backend_used": used})
        for impl, ms in (("triton", 0.6), ("sdpa", 0.2)):  # a sweep point: 3x
            s.add_run(inv, "attention", "ok", {**shape, "seq": 1024, "impl": impl},
                      {"e2e_ms_median": ms})
        for size, precision, bound, phases in (("small", "bf16", True, "fwd,opt"),
                                               ("xl", "fp32", False, "")):
            s.add_run(inv, "model", "ok", {"size": size, "precision": precision, "mode": "train"},
                      {"launch_bound": bound, "launch_bound_phases": phases})
        s.add_run(inv, "profile", "ok", {"size": "small", "target": "model"},
                  {"fwd_profiled_ms_mean": 6.0, "bwd_profiled_ms_mean": 12.0})
    rows = {target: (measured, met) for target, measured, met in
            gpu_check.verdict(db, 95.0, 420.0, "2000-01-01")}
    assert rows["gpu tests under 120 s"] == ("95 s", "met")
    assert rows["gpu-check under 8 minutes"] == ("7.0 min", "met")
    assert rows["leaderboard: triton fwd+bwd under 5.4 ms"] == ("5.000 ms", "met")
    assert rows["leaderboard: triton at least 15x faster than naive"] == ("18.8x", "met")
    assert rows["leaderboard: triton faster than SDPA cuDNN in the same run"] == (
        "5.000 vs 4.500 ms", "NOT met")
    assert rows["small bf16 train (batch 4, context 512) is launch-bound"] == ("fwd,opt", "met")
    assert rows["xl fp32 train is not launch-bound"] == ("", "met")
    assert rows["profile small: backward kernel time above forward's"] == ("12.0 vs 6.0 ms", "met")
    assert rows["profile xl: backward kernel time above forward's"] == ("not measured", "n/a")
    assert rows["attention sweep: no point of triton over 1.5x SDPA's time"] == (
        "worst 3.00x at d 64, seq 1024", "NOT met")
    assert rows["step: xl bf16 with every switch at 45% MFU or more"] == ("not measured", "n/a")


def test_the_verdict_says_what_did_not_run_and_what_failed(tmp_path):
    """A target whose step the budget left out reads "not run", never "met"; a point stored
    as an error reads "error", never "not measured"."""
    gpu_check = _module()
    db = tmp_path / "results.db"
    shape = {"seq": 16384, "d_head": 64, "heads": 16, "batch": 1, "precision": "bf16", "causal": True}
    with Store(db, EXPERIMENTS) as s:
        inv = s.begin_invocation(PROV, [], "step")
        s.add_run(inv, "step", "error", {"size": "xl", "switches": "fused-adamw+fused-ce+flash+compile"},
                  {}, error="RuntimeError: compile failed\ntraceback...")
        s.add_run(inv, "attention", "oom", {**shape, "impl": "triton"}, {},
                  error="CUDA out of memory")
    left = [what for what, _ in gpu_check.STEPS if what.startswith(("model: ", "profile model"))]
    rows = {target: (measured, met) for target, measured, met in
            gpu_check.verdict(db, None, 300.0, "2000-01-01", left + ["gpu tests"])}
    assert rows["gpu-check under 8 minutes"] == ("5.0 min, 3 steps not run", "not run")
    assert rows["gpu tests under 120 s"] == ("not run", "not run")
    assert rows["step: xl bf16 with every switch at 45% MFU or more"] == (
        "error: RuntimeError: compile failed", "error")
    assert rows["leaderboard: triton fwd+bwd under 5.4 ms"] == ("oom: CUDA out of memory", "oom")
    assert rows["xl fp32 train is not launch-bound"] == ("not run", "not run")
    assert rows["profile xl: backward kernel time above forward's"] == ("not run", "not run")
    # a step that ran and stored nothing for the target
    assert rows["leaderboard: triton faster than SDPA cuDNN in the same run"][1] != "met"
    assert gpu_check.host_overhead(tmp_path / "none.json", ran=False)[1:] == ("not run", "not run")


OWED = ROOT / "benchmarks" / "gpu_owed.py"


def _owed(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(OWED), *args], env=env, capture_output=True,
                          text=True)


def test_gpu_owed_lists_its_steps_and_refuses_bad_numbers(tmp_path):
    """`make gpu-owed` (issues 15-17's GPU figures): each listed command names a script or
    command that exists, and a bad --only is one line, exit 2, before anything runs."""
    listed = _owed("--list")
    assert listed.returncode == 0, listed.stderr
    commands = [line.split()[0] for line in listed.stdout.splitlines() if line.startswith("   ")]
    scripts = [c for c in commands if c.endswith(".py")]
    assert scripts and all((ROOT / s).exists() for s in scripts)
    steps = re.findall(r"^\d+\. issue \d+: ", listed.stdout, re.M)  # each names its issue
    assert steps and listed.stdout.count("\n   ") == len(steps)
    bad = _owed("--only", "0,99", "--out", str(tmp_path / "o"))
    assert bad.returncode == 2 and len(bad.stderr.splitlines()) == 1
    assert "--only takes step numbers" in bad.stderr and not (tmp_path / "o").exists()


@pytest.mark.slow  # a Python importing torch
@pytest.mark.skipif(
    __import__("torch").cuda.is_available(), reason="checks the machine without CUDA"
)
def test_gpu_owed_without_cuda_says_so_in_one_line(tmp_path):
    out = _owed("--out", str(tmp_path / "o"))
    assert out.returncode == 2 and out.stdout == ""
    assert out.stderr.splitlines() == [
        "Error: make gpu-owed needs a CUDA GPU (torch.cuda.is_available() is False)"
    ]
    assert not (tmp_path / "o").exists()


def _gone(pid: int) -> bool:
    """Whether process pid has ended (a zombie left to a parent that never reaps counts)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return True
    return state in ("Z", "X")


@pytest.mark.slow
def test_a_step_past_its_time_is_stopped_with_every_process_it_started(tmp_path, monkeypatch):
    """--budget's mechanism: the step's whole process group gets SIGTERM, and SIGKILL after
    the grace where it ignores SIGTERM; the status says it was stopped."""
    gpu_check = _module()
    monkeypatch.setattr(gpu_check, "TERM_GRACE_S", 1.0)
    pid_file = tmp_path / "child.pid"
    step = ("import signal, subprocess, sys, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); "
            "c = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
            f"open({str(pid_file)!r}, 'w').write(str(c.pid)); time.sleep(120)")
    with open(tmp_path / "log", "w") as log:
        rc, secs = gpu_check.run([sys.executable, "-c", step], log, timeout=2.0)
    assert rc == gpu_check.STOPPED
    assert 2.0 <= secs < 2.0 + 1.0 + 5.0  # the timeout, the grace, then SIGKILL at once
    child = int(pid_file.read_text())
    deadline = time.monotonic() + 5
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(child)
    assert "stopped after 2 s: the budget was spent" in (tmp_path / "log").read_text()
    with open(tmp_path / "log", "a") as log:  # a step within its time keeps its own status
        assert gpu_check.run([sys.executable, "-c", "raise SystemExit(3)"], log, 60.0)[0] == 3


def test_only_a_cs336sys_command_may_exit_1_without_failing_the_check():
    """It exits 1 when some point was stored as an error: a finding. pytest's 1 is a failed
    test (gpu_owed once let that pass), and a stopped step failed too."""
    gpu_check = _module()
    cli, tests = [sys.executable, "-m", "cs336sys", "step"], [sys.executable, "-m", "pytest"]
    assert not gpu_check.step_failed(cli, 0) and not gpu_check.step_failed(cli, 1)
    assert gpu_check.step_failed(cli, 2) and gpu_check.step_failed(cli, gpu_check.STOPPED)
    assert gpu_check.step_failed(tests, 1) and not gpu_check.step_failed(tests, 0)
    assert gpu_check.step_failed([sys.executable, "benchmarks/adamw.py"], 1)


def test_the_budget_keeps_time_for_the_report_and_starts_no_step_it_cannot_give_time():
    gpu_check = _module()
    assert gpu_check.Budget(None).left() is None and gpu_check.Budget(None).allows_a_step()
    roomy = gpu_check.Budget(gpu_check.RESERVE_S + 100)
    assert 99 < roomy.left() <= 100 and roomy.allows_a_step()
    tight = gpu_check.Budget(gpu_check.RESERVE_S + gpu_check.MIN_STEP_S - 1)
    assert not tight.allows_a_step()


@pytest.mark.parametrize("value", ["10", "abc", "nan", "inf", "-5"])
def test_a_bad_budget_is_one_line_and_exit_2_before_anything_runs(tmp_path, value):
    for script in (OWED, SCRIPT):
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        out = subprocess.run([sys.executable, str(script), "--budget", value, "--out",
                              str(tmp_path / "o")], env=env, capture_output=True, text=True)
        assert out.returncode == 2 and out.stdout == ""
        assert len(out.stderr.splitlines()) == 1 and "--budget" in out.stderr
        assert "takes seconds above 65" in out.stderr
        assert not (tmp_path / "o").exists()


def test_every_cs336sys_step_of_the_gpu_scripts_parses(tmp_path):
    """A GPU session must not spend its minutes on an option a command does not have: each
    cs336sys step of gpu-check and gpu-owed parses (options, types), short of running."""
    import typer.main

    from cs336sys.cli import app

    spec = importlib.util.spec_from_file_location("gpu_owed", OWED)
    owed = importlib.util.module_from_spec(spec)
    sys.path.insert(0, str(OWED.parent))  # it imports gpu_check by name
    try:
        spec.loader.exec_module(owed)
    finally:
        sys.path.remove(str(OWED.parent))
    checked = [argv for _, argv in _module().STEPS]
    owed_cli = [argv[3:] for _, argv, _ in owed.STEPS if argv[:3] == owed.CLI]
    assert checked and owed_cli
    for argv in checked + owed_cli:
        argv = [a.replace("{db}", str(tmp_path / "x.db")) for a in argv]
        cmd, rest, path = typer.main.get_command(app), list(argv), []
        while rest and not rest[0].startswith("-") and hasattr(cmd, "commands"):
            path.append(rest[0])
            cmd = cmd.commands[rest.pop(0)]
        ctx = cmd.make_context(" ".join(path), rest)  # raises click's UsageError on a bad one
        assert ctx.params, argv


@pytest.mark.slow
def test_gpu_owed_end_to_end_under_a_budget(tmp_path, monkeypatch, capsys):
    """The orchestration a lent GPU would run first, here with CPU steps: a step that
    stores points, one still running when the budget is spent (stopped), one never
    started (named with the --only that runs it), then the report and the archive."""
    import tarfile

    monkeypatch.syspath_prepend(str(OWED.parent))  # gpu_owed imports gpu_check by name
    spec = importlib.util.spec_from_file_location("gpu_owed_e2e", OWED)
    owed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(owed)
    check = sys.modules["gpu_check"]
    # Step 1 (a CLI process that imports no torch: `plan`, one point) takes about 1 s of the
    # 5 s the steps are given; step 2 sleeps out the rest.
    budget = 8
    monkeypatch.setattr(check, "RESERVE_S", 3.0)
    monkeypatch.setattr(check, "MIN_STEP_S", 2.0)
    monkeypatch.setattr(check, "TERM_GRACE_S", 5.0)
    monkeypatch.setattr(owed, "preflight", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    plan = ["plan", "--strategy", "dp", "--n", "2"]
    monkeypatch.setattr(owed, "STEPS", [
        ("stores a point", [*owed.CLI, *plan, "--db", "{db}"], {}),
        ("runs past the budget", [sys.executable, "-c", "import time; time.sleep(300)"], {}),
        ("never starts", [sys.executable, "-c", "pass"], {}),
    ])
    # the archive's folder does not exist yet: made before the first step (it was not, and
    # the call's figures were lost at its end)
    out, archive = tmp_path / "owed", tmp_path / "device-out" / "owed-1.tar.gz"
    monkeypatch.setattr(sys, "argv", ["gpu_owed.py", "--out", str(out), "--archive",
                                      str(archive), "--budget", str(budget)])
    t0 = time.monotonic()
    assert owed.main() == 1
    assert time.monotonic() - t0 < budget + 20  # the budget, plus the report's own time
    printed = capsys.readouterr()
    assert "1. stores a point: exit 0" in printed.out
    assert "2. runs past the budget: exit 124" in printed.out and "stopped" in printed.out
    # the stopped step is named with the one never started, for the next call
    assert "steps 2,3; run them with --only 2,3" in printed.err
    assert "stopped after" in (out / "owed.log").read_text()
    with tarfile.open(archive) as tar:
        names = set(tar.getnames())
    assert {"owed/results.db", "owed/report.html", "owed/owed.log"} <= names
    assert query(out / "results.db", "SELECT status FROM runs") == [{"status": "ok"}]


@pytest.mark.slow
@pytest.mark.parametrize("stores", [True, False], ids=["a-point", "nothing"])
def test_gpu_check_end_to_end_writes_its_verdict_and_archive(tmp_path, monkeypatch, capsys, stores):
    """`make gpu-check`'s orchestration with a CPU step in place of the reference set: the
    host-overhead step, the report, a verdict of every target and the archive; also when no
    step stored anything (the verdict then says "not measured" instead of failing)."""
    import tarfile

    check = _module()
    monkeypatch.setattr(check, "preflight", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    # One round of one call: on a CPU its SDPA rows compute for real (bf16, seq 1024, seconds a
    # call), and its default 7 rounds took most of this test's time.
    short = ["--calls", "1", "--repeats", "1"]
    # With nothing stored the host step writes nothing either (a step that ends at once); on a
    # CPU its figure is "not measured" both ways (a CUDA figure).
    host = [*check.HOST_OVERHEAD, *short] if stores else ["-c", "pass"]
    monkeypatch.setattr(check, "HOST_OVERHEAD", host)
    plan = ["plan", "--strategy", "dp", "--n", "2"]  # stores a point; imports no torch
    monkeypatch.setattr(check, "STEPS", [("a plan", plan)] if stores else [])
    out = tmp_path / "check"
    # the device machine's $OUT (what comes back) takes the archive where none is named
    monkeypatch.setenv("OUT", str(tmp_path / "device-out"))
    monkeypatch.setattr(sys, "argv", ["gpu_check.py", "--out", str(out), "--skip-tests"])
    rc = check.main()
    printed = capsys.readouterr()
    verdict = (out / "verdict.md").read_text()
    assert "| gpu tests under 120 s | skipped | n/a |" in verdict
    assert "leaderboard: triton fwd+bwd under 5.4 ms | not measured | n/a |" in verdict
    assert "attention host cost" in verdict
    with tarfile.open(tmp_path / "device-out" / "check.tar.gz") as tar:
        names = set(tar.getnames())
    assert {"check/verdict.md", "check/gpu-check.log"} <= names
    # the verdict read the store without leaving -wal/-shm files to be archived beside it
    assert not {"check/results.db-wal", "check/results.db-shm"} & names
    if stores:
        assert rc == 0, printed.err
        assert "check/results.db" in names and "check/report.html" in names
    else:  # no store: no report to write, and no failure for it
        assert rc == 0 and "failed" not in printed.err, printed.err
        assert "check/report.html" not in names


def _owed_module(monkeypatch):
    """benchmarks/gpu_owed.py as a module, its CUDA check passed and its GPU named."""
    monkeypatch.syspath_prepend(str(OWED.parent))  # gpu_owed imports gpu_check by name
    spec = importlib.util.spec_from_file_location("gpu_owed_io", OWED)
    owed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(owed)
    monkeypatch.setattr(owed, "preflight", lambda: None)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Fake GPU")
    return owed


def test_an_archive_that_is_a_folder_or_an_out_that_is_a_file_is_refused_first(
        tmp_path, monkeypatch, capsys):
    """`--archive $OUT` passed the early check and failed after every step
    (IsADirectoryError: the call's figures lost); an --out that is a file was a traceback."""
    owed = _owed_module(monkeypatch)
    folder, afile = tmp_path / "device-out", tmp_path / "afile"
    folder.mkdir()
    afile.write_text("x")
    for args, said in ((["--out", str(tmp_path / "o"), "--archive", str(folder)],
                        f"Error: --archive: {folder} is a folder: give the file, "
                        f"{folder / 'o.tar.gz'}"),
                       (["--out", str(afile)], f"Error: --out {afile}: a file, not a folder")):
        monkeypatch.setattr(sys, "argv", ["gpu_owed.py", *args, "--only", "1"])
        assert owed.main() == 2
        assert capsys.readouterr().err.strip() == said
    assert not (tmp_path / "o" / "owed.log").exists()


@pytest.mark.slow  # a CLI process
@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the machine without CUDA")
def test_a_call_stopped_from_outside_returns_what_its_finished_steps_measured(
        tmp_path, monkeypatch, capsys):
    """The device's limit ends a command with SIGTERM: the archive was written only at the
    end, so the whole call's figures were lost, and the running step, in a session of its
    own, ran on. The archive follows every step, and SIGTERM stops the step and still
    reports, archives and names the steps to run again."""
    import signal
    import tarfile

    owed = _owed_module(monkeypatch)
    plan = ["plan", "--strategy", "dp", "--n", "2"]
    kill = "import os, signal, time; os.kill(os.getppid(), signal.SIGTERM); time.sleep(60)"
    monkeypatch.setattr(owed, "STEPS", [
        ("stores a point", [*owed.CLI, *plan, "--db", "{db}"], {}),
        ("the limit is reached", [sys.executable, "-c", kill], {}),
        ("never starts", [sys.executable, "-c", "pass"], {}),
    ])
    out, archive = tmp_path / "owed", tmp_path / "device-out" / "owed-1.tar.gz"
    monkeypatch.setattr(sys, "argv", ["gpu_owed.py", "--out", str(out), "--archive",
                                      str(archive)])
    before = signal.getsignal(signal.SIGTERM)
    try:
        t0 = time.monotonic()
        assert owed.main() == 1
        assert time.monotonic() - t0 < 40  # the sleeping step was stopped, not waited out
    finally:
        signal.signal(signal.SIGTERM, before)
    assert "run them with --only 2,3" in capsys.readouterr().err
    with tarfile.open(archive) as tar:
        assert {"owed/results.db", "owed/owed.log"} <= set(tar.getnames())
    assert query(out / "results.db", "SELECT status FROM runs") == [{"status": "ok"}]
