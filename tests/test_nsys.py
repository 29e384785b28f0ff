"""`--nsys` on every measuring command that runs on a GPU: one nsys run per point, the report
named after the point, the handout's flags, the command printed; refusals that write nothing;
and the NVTX ranges the timelines show, recorded through a fake NVTX.

nsys itself is a fake here (a script that runs the command it is given, as nsys would, and
writes the report file); the CUDA check is patched where the points run on the CPU."""

from __future__ import annotations

import contextlib
import shlex
import stat
import sys
from pathlib import Path

import pytest
import torch

from cs336sys.cli import nsys as cli_nsys
from cs336sys.measure import nsys, nvtx
from tests.conftest import MICRO, invoke, view_rows

rows = view_rows("model_runs")

# What nsys does with the options the tests rely on: --env-var=A=B,C=D into the environment
# of the command, and the report written at --output (.nsys-rep added).
FAKE_NSYS = """#!{python}
import os, subprocess, sys
args = sys.argv[2:]  # after `profile`
app = next(i for i, a in enumerate(args) if not a.startswith("--"))
flags, command = args[:app], args[app:]
env = dict(os.environ)
for flag in flags:
    if flag.startswith("--env-var="):
        env.update(kv.split("=", 1) for kv in flag.removeprefix("--env-var=").split(","))
output = next(f.removeprefix("--output=") for f in flags if f.startswith("--output="))
code = subprocess.run(command, env=env).returncode
with open(output + ".nsys-rep", "w") as report:
    report.write(" ".join(sys.argv))
sys.exit(code)
"""


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    """A fake nsys on PATH, and the points' CPU taken for CUDA by the --nsys check."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nsys"
    fake.write_text(FAKE_NSYS.format(python=sys.executable))
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(cli_nsys, "on_cuda", lambda device: True)
    monkeypatch.chdir(tmp_path)
    return fake


@pytest.mark.parametrize("command", [
    ["model", *MICRO], ["attention", "--seq", "16", "--d-head", "16"], ["memory", *MICRO],
    ["step", *MICRO], ["ddp", *MICRO, "--world-size", "2"], ["comm", "--world-size", "2"],
    ["profile", "model", *MICRO], ["profile", "attention", "--seq", "16", "--d-head", "16"],
])
def test_without_nsys_or_cuda_nothing_runs(tmp_path, monkeypatch, command):
    """No nsys on PATH: one line, exit 2; nsys but no CUDA: one line, exit 2; nothing is
    written either way."""
    db = tmp_path / "r.db"
    monkeypatch.setenv("PATH", str(tmp_path))
    result = invoke(*command, "--nsys", "--db", db)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().splitlines() == [
        "Error: --nsys: Nsight Systems (nsys) is not installed or not on PATH"]
    (tmp_path / "nsys").write_text("#!/bin/sh\nexit 0\n")
    (tmp_path / "nsys").chmod(0o755)
    result = invoke(*command, "--nsys", "--db", db)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: --nsys needs a CUDA device"), line
    assert not db.exists()


def test_dry_run_prints_the_commands_without_nsys_or_cuda(tmp_path, monkeypatch):
    """--dry-run runs nothing: it prints the commands on a laptop too, saying whom for."""
    db = tmp_path / "r.db"
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    result = invoke("profile", "model", *MICRO, "--nsys", "--dry-run", "--db", db)
    assert result.exit_code == 0, result.output
    lines = result.stdout.strip().splitlines()
    assert lines[0].startswith("nsys profile --trace=cuda") and "--capture-range=nvtx" in lines[0]
    assert lines[-1] == ("dry run: 1 nsys command(s) above; nothing recorded (here nsys is not "
                         "on PATH and device cpu is no CUDA device: they are for a CUDA host "
                         "with nsys)")
    assert not db.exists() and not (tmp_path / "nsys").exists()


def test_dry_run_prints_one_command_per_point_with_the_handouts_flags(tmp_path, fake_nsys):
    """Each point's command: the handout's flags, the capture limited to the timed steps,
    the point's number in the environment, its report named after it in one folder per
    invocation; ranks forked without exec traced. Nothing runs or is written."""
    db = tmp_path / "r.db"
    result = invoke("ddp", *MICRO, "--seq", "16,32", "--world-size", "2", "--impl", "flat",
                    "--nsys", "--dry-run", "--db", db)
    assert result.exit_code == 0, result.output
    lines = [shlex.split(line) for line in result.stdout.splitlines() if "profile" in line]
    assert len(lines) == 2 and "dry run: 2 nsys command(s)" in result.stdout
    for i, argv in enumerate(lines):
        assert argv[:2] == [str(fake_nsys), "profile"]
        for flag in (*nsys.FLAGS, "--trace-fork-before-exec=true"):
            assert flag in argv, flag
        # the handout's: module calls and autograd ranges with shapes
        assert "--pytorch=functions-trace,autograd-shapes-nvtx" in argv
        assert "--python-backtrace=cuda" in argv and "--cuda-memory-usage=true" not in argv
        env = next(a for a in argv if a.startswith("--env-var="))
        assert f"{nsys.POINT_ENV}={i}" in env and f"{nsys.NVTX_ENV}=1" in env
        output = next(a for a in argv if a.startswith("--output="))
        assert output.startswith("--output=nsys/ddp-") and f"/0{i + 1}-flat" in output
        rest = argv[argv.index(sys.executable):]
        assert rest[:4] == [sys.executable, "-m", "cs336sys", "ddp"]
        assert "--nsys" not in rest and "--dry-run" not in rest
        assert rest[rest.index("--seq") + 1] == "16,32" and rest[rest.index("--db") + 1] == str(db)
    assert not db.exists() and not (tmp_path / "nsys").exists()


def test_points_that_read_alike_are_named_apart(tmp_path, fake_nsys, monkeypatch):
    """A report's name is the point in words: `profile model --attention naive,sdpa` named
    both `01-tiny-T=16-train-fp32`, and a user's model at two sizes lost the size. The
    settings that tell such points apart follow the words."""
    def outputs(*args):
        result = invoke(*args, "--nsys", "--dry-run", "--db", tmp_path / "r.db")
        assert result.exit_code == 0, result.output
        return [Path(a.split("=", 1)[1]).name for line in result.stdout.splitlines()
                for a in shlex.split(line) if a.startswith("--output=")]

    assert outputs("profile", "model", *MICRO, "--seq", "16", "--mode", "train",
                   "--attention", "naive,sdpa") == [
        "01-tiny-T=16-train-fp32-attention=naive", "02-tiny-T=16-train-fp32-attention=sdpa"]
    from tests.user_repos import course_repo

    monkeypatch.chdir(course_repo(tmp_path))
    yours = outputs("model", "--model", "cs336_basics", "--size", "tiny,small", "--seq", "16",
                    "--mode", "train", "--iters", "1")
    assert [name.split("-T=")[0] for name in yours] == [
        "01-cs336-basics-tiny", "02-cs336-basics-small"], yours


def test_the_command_under_nsys_does_not_repeat_python_m(tmp_path, fake_nsys):
    """Started as `python -m cs336sys` (the program's name three words), the command under
    nsys still names `cs336sys profile model` once: it ran `-m cs336sys -m cs336sys`, which
    failed every recording."""
    result = invoke("profile", "model", *MICRO, "--nsys", "--dry-run", "--db",
                    tmp_path / "r.db", prog_name="python -m cs336sys")
    assert result.exit_code == 0, result.output
    (argv,) = [shlex.split(line) for line in result.stdout.splitlines() if " profile --" in line]
    rest = argv[argv.index(sys.executable):]
    assert rest[:5] == [sys.executable, "-m", "cs336sys", "profile", "model"]
    assert rest.count("-m") == 1


@pytest.mark.parametrize("command", [
    ["model", *MICRO, "--rounds", "3"], ["attention", "--seq", "16", "--d-head", "16"],
    ["memory", *MICRO], ["step", *MICRO], ["comm", "--world-size", "2"],
    ["profile", "model", *MICRO],
    ["profile", "attention", "--seq", "16", "--d-head", "16"],
])
def test_every_command_prints_what_it_would_record(tmp_path, fake_nsys, command):
    """--nsys --dry-run on each command: one nsys line per point that runs the same command,
    and nothing written. (The commands whose body takes the context itself pass it on.)"""
    result = invoke(*command, "--nsys", "--dry-run", "--db", tmp_path / "r.db")
    assert result.exit_code == 0, result.output
    lines = [shlex.split(line) for line in result.stdout.splitlines() if " profile --" in line]
    assert lines and all(argv[argv.index(sys.executable) + 3] == command[0] for argv in lines)
    # one round: nsys records the first measured range alone (--capture-range-end=stop)
    rounds = [argv[i + 1] for argv in lines for i, a in enumerate(argv) if a == "--rounds"]
    assert rounds == (["1"] * len(lines) if command[0] in ("model", "attention", "step") else [])
    # memory's reports track CUDA memory (memory_profiling (f)), the others' do not
    assert all(("--cuda-memory-usage=true" in argv) == (command[0] == "memory")
               for argv in lines)
    assert not (tmp_path / "r.db").exists() and not (tmp_path / "nsys").exists()


@pytest.mark.slow
def test_each_point_is_recorded_under_nsys_and_stores_its_row(tmp_path, fake_nsys):
    """Two points, two nsys runs: each runs one point (its row stored by the command under
    nsys) and leaves its report, named after the point, in the invocation's folder."""
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "8,16", "--mode", "forward", "--nsys",
                    "--db", db)
    assert result.exit_code == 0, result.output
    assert sorted(r["seq"] for r in rows(db)) == [8, 16]
    (folder,) = (tmp_path / "nsys").iterdir()
    reports = sorted(p.name for p in folder.iterdir())
    assert [r.split("-T=")[0] for r in reports] == ["01-tiny", "02-tiny"]
    assert all(r.endswith(".nsys-rep") for r in reports) and "T=8" in reports[0]
    assert "2 of 2 report(s) in nsys/model-" in result.stdout


def test_a_point_number_past_the_sweep_is_refused(tmp_path, monkeypatch):
    monkeypatch.setenv(nsys.POINT_ENV, "5")
    result = invoke("model", *MICRO, "--seq", "8", "--db", tmp_path / "r.db")
    assert result.exit_code == 2
    assert "CS336SYS_NSYS_POINT=5: this command has 1 point(s)" in result.stderr
    assert not (tmp_path / "r.db").exists()


# -- the NVTX ranges, through a fake NVTX -----------------------------------------------------


@pytest.fixture
def ranges(monkeypatch):
    """Every NVTX range pushed, by name, as if on CUDA with CS336SYS_NVTX=1."""
    pushed: list[str] = []

    @contextlib.contextmanager
    def fake(name):
        pushed.append(name)
        yield

    monkeypatch.setattr(nvtx, "_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range", fake)
    monkeypatch.setattr(nvtx, "_ASKED", True)
    return pushed


@pytest.fixture
def one_rank():
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _train(wrapper) -> None:
    x = torch.randn(4, 8)
    wrapper(x).sum().backward()
    wrapper.finish_gradient_synchronization()


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def test_ddp_names_every_all_reduce_after_its_gradients(ranges, one_rank):
    from cs336sys.parallel import DDPBucketed, DDPIndividualParameters

    _train(DDPIndividualParameters(_model()))
    assert sorted(r for r in ranges if r.startswith("all-reduce")) == [
        f"all-reduce {n}" for n in ("0.bias", "0.weight", "2.bias", "2.weight")]
    assert ranges[-1] == "wait for the gradients' all-reduces"
    ranges.clear()
    _train(DDPBucketed(_model(), bucket_size_mb=1))  # one bucket: four gradients
    assert [r for r in ranges if r.startswith("all-reduce")] == ["all-reduce 2.bias +3"]


def test_fsdp_names_each_units_gather_and_each_weights_reduce_scatter(ranges, one_rank):
    from cs336sys.parallel import FSDP

    _train(FSDP(_model()))
    assert "all-gather 0" in ranges and "wait for all-gather 0" in ranges
    assert ranges.index("all-gather 0") < ranges.index("wait for all-gather 0")
    assert {"reduce-scatter 0.weight", "reduce-scatter 2.weight"} <= set(ranges)
    assert "all-reduce the replicated gradients" in ranges


@pytest.mark.parametrize("passes, timed", [("forward", 3), ("both", 9)])
def test_attention_warms_up_outside_the_recorded_range(monkeypatch, passes, timed):
    """docs/nsys.md: only the timed calls are recorded. attention timed each pass with its
    warm-up inside `measured_steps`: --warmup 5 --iters 3 put 8 forwards in the report.
    Under NVTX every pass warms up first; inside, 3 calls a pass (a backward's and an end
    to end's each run one forward)."""
    from cs336sys.attention import registry
    from cs336sys.experiments import attention

    inside, calls = [False], {True: 0, False: 0}

    @contextlib.contextmanager
    def fake(name):
        was = inside[0]
        inside[0] = was or name == nsys.MEASURED_RANGE
        yield
        inside[0] = was

    monkeypatch.setattr(nvtx, "_cuda", lambda: True)
    monkeypatch.setattr(torch.cuda.nvtx, "range", fake)
    monkeypatch.setattr(nvtx, "_ASKED", True)
    naive = registry.get("naive")

    def counted(*args, **kwargs):
        calls[inside[0]] += 1
        return naive(*args, **kwargs)

    monkeypatch.setattr(registry, "get", lambda name: counted)
    spec = attention.specs(impl=["naive"], seq=[32], d_head=[16], batch=[1], passes=passes,
                           warmup=5, iters=3, device="cpu")[0]
    assert attention.run(spec).status == "ok"
    assert calls[True] == timed, calls
    assert calls[False] >= 5 * (1 if passes == "forward" else 3), calls


def test_the_timed_steps_sit_in_one_measured_range(ranges):
    """run_steps: warm-up outside, every timed step inside the one range nsys captures."""
    from cs336sys.experiments.training_step import run_steps

    class Step:
        last_loss = torch.tensor(0.0)

        def __call__(self):
            ranges.append("step")
            return {"step_ms": 1.0}

    run_steps(Step(), warmup=2, iters=3)
    assert ranges == ["step", "step", nsys.MEASURED_RANGE, "step", "step", "step"]


# -- on a GPU, with Nsight Systems installed ----------------------------------------------------

CUDA_MICRO = [a if a != "cpu" else "cuda" for a in MICRO]


# Each nsys run costs a process, CUDA's start and nsys's own (seconds): the two ways the
# timed part is marked (run_steps, attention's passes), within the GPU tests' budget.
@pytest.mark.gpu
@pytest.mark.parametrize("command, points", [
    (["model", *CUDA_MICRO, "--seq", "32,64"], 2),
    (["attention", "--impl", "sdpa", "--seq", "256", "--d-head", "64", "--iters", "3"], 1),
])
def test_one_real_nsys_report_per_point(tmp_path, monkeypatch, command, points):
    import shutil

    if shutil.which("nsys") is None:  # a tool this host lacks, not a fault of the code
        pytest.skip("Nsight Systems (nsys) is not installed on this GPU host")
    monkeypatch.chdir(tmp_path)
    result = invoke(*command, "--nsys", "--db", tmp_path / "r.db")
    assert result.exit_code == 0, result.output
    (folder,) = (tmp_path / "nsys").iterdir()
    assert len(list(folder.glob("*.nsys-rep"))) == points


@pytest.mark.parametrize("script, why", [
    ("#!/bin/sh\nexit 3\n", "(nsys exited 3)"),
    ("#!/bin/sh\nexit 0\n", "(nsys exited 0 but wrote no 01-"),
])
def test_a_recording_that_failed_says_why_on_stderr(tmp_path, monkeypatch, script, why):
    """nsys failing, or exiting 0 without a report, read `not recorded: ... (exit 0)`: the
    missing report was not named. Exit 1, and one line naming each point and why."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nsys").write_text(script)
    (bin_dir / "nsys").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    monkeypatch.setattr(cli_nsys, "on_cuda", lambda device: True)
    monkeypatch.chdir(tmp_path)
    result = invoke("model", *MICRO, "--seq", "8", "--mode", "forward", "--nsys",
                    "--db", tmp_path / "r.db")
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("not recorded: ")]
    assert why in line, line
