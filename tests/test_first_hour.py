"""A user's first hour: one option vocabulary, --label, the store named at the end and found from the git checkout, progress
inside a point, Ctrl-C that says how to go on, and the warnings a CPU run needs."""

import os
import sqlite3
from dataclasses import replace

import pytest

from cs336sys.cli.vocabulary import SHARED
from tests.conftest import MICRO, invoke, query

# The commands that measure and store (the others read: sql, report, db, env).
EXPERIMENTS = {
    ("model",), ("attention",), ("comm",), ("ddp",), ("memory",), ("memory", "residuals"),
    ("precision", "accumulate"), ("precision", "autocast"), ("profile", "model"),
    ("profile", "attention"),
}
# Options that choose points: each a list that sweeps, wherever a command has it.
SWEPT = ("size", "seq", "batch", "precision", "attention", "world_size", "mode", "impl")


def _commands():
    """(path, click command) for every command and subcommand; a group with a callback
    that measures (`memory`) counts as a command too."""
    import typer.main

    from cs336sys.cli import app

    def walk(cmd, path):
        if path and any(p.param_type_name == "option" and p.name != "help" for p in cmd.params):
            yield tuple(path), cmd
        for name, sub in getattr(cmd, "commands", {}).items():
            yield from walk(sub, [*path, name])

    return dict(walk(typer.main.get_command(app), []))


def _options(cmd):
    return [p for p in cmd.params if p.param_type_name == "option"]


def test_one_name_per_concept_across_every_command():
    commands = _commands()
    assert EXPERIMENTS <= set(commands)
    seen = {}
    for path, cmd in commands.items():
        for opt in _options(cmd):
            names = opt.opts + opt.secondary_opts
            # the shared concept is spelled the shared way
            if opt.name in SHARED:
                assert SHARED[opt.name] in names, (path, opt.name, names)
                seen.setdefault(opt.name, []).append(path)
            if path in EXPERIMENTS and opt.name in SWEPT:
                assert opt.multiple, f"{' '.join(path)} {names[0]} does not sweep"
        if path in EXPERIMENTS:
            assert "label" in {o.name for o in _options(cmd)}, path
    # the concepts the issue names really are shared by several commands
    for concept in ("seq", "batch", "precision", "iters", "attention", "label"):
        assert len(seen[concept]) >= 3, (concept, seen.get(concept))
    # comm's buffer size has its own name; --size is a model preset wherever it appears
    comm = {n for o in _options(commands[("comm",)]) for n in o.opts}
    assert "--bytes" in comm and "--size" not in comm


def test_ddp_sweeps_size_seq_and_batch():
    from cs336sys.experiments import ddp

    specs = ddp.specs(impl=["flat"], size=["tiny", "small"], seq=["32,64"],
                      batch=[2, 4], world_size=[2], device="cpu")
    got = {(s.size, s.seq, s.batch) for s in specs}
    assert got == {(s, t, b) for s in ("tiny", "small") for t in (32, 64) for b in (2, 4)}
    # a single value still works from Python, as before
    (one,) = ddp.specs(impl=["flat"], size="tiny", seq=32, batch=2,
                       world_size=[2], device="cpu")
    assert (one.size, one.seq, one.batch) == ("tiny", 32, 2)
    bad = invoke("ddp", "--batch", "4,3", "--world-size", "2", "--device", "cpu")
    assert bad.exit_code == 2 and "--batch 3 does not split evenly over 2 ranks" in bad.stderr


def test_label_is_stored_and_selects_runs(db_path, tmp_path):
    args = ["model", *MICRO, "--seq", "8", "--mode", "forward", "--db", db_path]
    assert invoke(*args, "--label", "before fusing").exit_code == 0
    assert invoke(*args).exit_code == 0
    labels = [r["label"] for r in query(db_path, "SELECT label FROM invocations ORDER BY started")]
    assert labels == ["before fusing", None]
    assert [r["label"] for r in query(db_path, "SELECT label FROM model_runs ORDER BY created")] == [
        "before fusing", None]
    out = tmp_path / "rep"
    result = invoke("report", "--where", "label=before fusing", "--format", "md", "--out", out,
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    text = (out / "report.md").read_text()
    assert "before fusing" in text
    export = invoke("db", "export", "--where", "label=before fusing", "--format", "jsonl",
                    "--db", db_path)
    assert export.exit_code == 0 and len(export.stdout.splitlines()) == 1


@pytest.mark.parametrize("args", [
    ["precision", "accumulate", "--variant", "fp32"],
    ["model", *MICRO, "--seq", "8", "--mode", "forward"],
    ["step", *MICRO, "--seq", "8", "--switches", "none"],
    ["attention", "--attention", "naive", "--seq", "16", "--d-head", "16", "--batch", "1",
     "--warmup", "0", "--iters", "1", "--device", "cpu"],
    ["plan", "--size", "tiny", "--strategy", "dp", "--n", "2"],
], ids=lambda a: a[0])
def test_every_measuring_command_names_its_store(db_path, args):
    result = invoke(*args, "--db", db_path)
    assert result.exit_code == 0, result.output
    (inv,) = query(db_path, "SELECT id FROM invocations")
    (n,) = query(db_path, "SELECT count(*) AS n FROM runs")
    assert n["n"] >= 1
    said = f"{n['n']} point(s) stored in {db_path} (invocation {inv['id'][:8]})"
    assert result.stderr.strip().splitlines()[-1] == said


def test_default_store_is_at_the_top_of_the_checkout_or_in_the_user_data_folder(
    tmp_path, monkeypatch
):
    # In this process (the store is found from the current folder and the environment when
    # a command runs): three `python -m cs336sys` took 8 s of CPU, two of them importing torch.
    monkeypatch.delenv("CS336SYS_DB", raising=False)
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    checkout = tmp_path / "project"
    (checkout / ".git").mkdir(parents=True)
    deep = checkout / "notes" / "today"
    deep.mkdir(parents=True)
    monkeypatch.chdir(deep)
    result = invoke("precision", "accumulate", "--variant", "fp32")
    assert result.exit_code == 0, result.output
    assert (checkout / "db" / "results.db").is_file()
    assert not (deep / "db").exists()
    assert f"stored in {checkout / 'db' / 'results.db'}" in result.stderr
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    monkeypatch.chdir(outside)
    result = invoke("precision", "accumulate", "--variant", "fp32")
    assert result.exit_code == 0, result.output
    assert (tmp_path / "data" / "cs336sys" / "results.db").is_file()
    assert not (outside / "db").exists()
    # reading commands look in the same place
    result = invoke("sql", "SELECT count(*) AS n FROM runs", "--json")
    assert result.exit_code == 0 and '"n": 1' in result.stdout


def test_ctrl_c_says_how_many_points_are_stored_and_how_to_resume(db_path, monkeypatch):
    from cs336sys.experiments import model

    real, calls = model.run, []

    def run(spec):
        calls.append(spec)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return real(spec)

    monkeypatch.setattr(model, "EXPERIMENT", replace(model.EXPERIMENT, run=run))
    result = invoke("model", *MICRO, "--seq", "8,16,32", "--mode", "forward", "--db", db_path)
    assert result.exit_code == 130
    assert "Interrupted: 1 point(s) stored in" in result.stderr
    assert "--resume" in result.stderr
    assert len(query(db_path, "SELECT * FROM runs")) == 1
    (inv,) = query(db_path, "SELECT exit_status FROM invocations")
    assert inv["exit_status"] == 130


def test_progress_moves_per_step_in_plain_lines_when_not_a_terminal(db_path, monkeypatch):
    from cs336sys.cli.common import Bar

    monkeypatch.setattr(Bar, "EVERY_S", 0.0)  # a line for every step
    result = invoke("model", *MICRO, "--seq", "8,16", "--mode", "forward", "--db", db_path)
    assert result.exit_code == 0
    err = result.stderr.splitlines()
    assert "model: 2 point(s)" in err
    # warm-up 1 + 3 timed steps, then the point's own line
    assert [line for line in err if line.startswith("model [1/2]")] == [
        *(f"model [1/2] tiny T=8 forward fp32: step {i}/4" for i in range(1, 5)),
        next(line for line in err if line.startswith("model [1/2]") and ": ok in " in line),
    ]
    assert any(line.startswith("model [2/2] tiny T=16 forward fp32: ok in ") for line in err)
    assert "\x1b" not in result.stderr and "\r" not in result.stderr  # no bar drawing in a log


def test_progress_names_the_phase_each_attention_step_belongs_to(db_path, monkeypatch):
    """Attention times its forward, backward and both in turn: without the phase, the step
    count ran 1..N three times and read as going backwards."""
    from cs336sys.cli.common import Bar

    monkeypatch.setattr(Bar, "EVERY_S", 0.0)
    result = invoke("attention", "--seq", "16", "--d-head", "8", "--attention", "naive",
                    "--warmup", "1", "--iters", "2", "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    steps = [line.split(": ", 1)[1] for line in result.stderr.splitlines()
             if line.startswith("attention [1/1]") and " step " in line]
    assert steps == [f"{phase} step {i}/3" for phase in ("forward", "backward", "forward+backward")
                     for i in (1, 2, 3)]


@pytest.mark.slow
def test_progress_reaches_the_parent_from_distributed_ranks(db_path, monkeypatch):
    from cs336sys.cli.common import Bar

    monkeypatch.setattr(Bar, "EVERY_S", 0.0)
    result = invoke("ddp", "--impl", "flat", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
                    "--num-layers", "1", "--num-heads", "2", "--vocab-size", "64", "--seq", "8",
                    "--batch", "2", "--world-size", "2", "--warmup", "1", "--iters", "2",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    # warm-up 1, the measured step, 2 timed: rank 0 reports its last step at least
    assert "ddp [1/1]" in result.stderr and "step 4/4" in result.stderr


def test_emulated_precision_warns_once_with_the_expected_slowdown(monkeypatch, capsys):
    from cs336sys.cli import common
    from cs336sys.experiments import precision

    monkeypatch.setattr(precision, "native_support",
                        lambda dev, dt: (dt == "bf16", f"no {dt} units"))
    common.emulated("cpu", ["fp32", "fp16", "bf16", "fp16"])
    lines = capsys.readouterr().err.splitlines()
    assert lines == [f"warning: fp16 is emulated on this CPU (no fp16 units); expect each step "
                     f"to take about {common.EMULATED_SLOWDOWN}x as long as in fp32"]
    common.emulated("cuda:0", ["fp16"])  # GPUs are not second-guessed
    assert capsys.readouterr().err == ""


def test_more_ranks_than_cores_warns(monkeypatch, capsys):
    from types import SimpleNamespace

    from cs336sys.cli import common

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    specs = [SimpleNamespace(world_size=w, backend="gloo") for w in (2, 4, 4)]
    common.oversubscribed(specs)
    err = capsys.readouterr().err
    assert err.startswith("warning: --world-size 4 runs more ranks than the 2 CPU core(s)")
    common.oversubscribed([SimpleNamespace(world_size=8, backend="nccl")])
    assert capsys.readouterr().err == ""


def test_root_help_has_examples_and_completion():
    result = invoke("--help")
    assert result.exit_code == 0
    text = " ".join(result.stdout.split())
    assert "Examples:" in text and "cs336sys model --size tiny" in text
    assert "--install-completion" in text and "--show-completion" in text


def test_cpu_defaults_are_small_enough_for_seconds():
    """The defaults a CPU gets: a tiny model, short sweeps, few steps."""
    from cs336sys.experiments import attention, comm, ddp, model

    (m,) = model.specs(device="cpu")
    assert (m.size, m.seq, m.warmup, m.iters) == ("tiny", 128, 2, 5)
    a = attention.specs(device="cpu")
    assert max(s.seq for s in a) <= 1024 and a[0].iters == 10
    c = comm.specs(device="cpu", world_size=[2])
    assert max(s.bytes for s in c) <= 100 * 10**6 and c[0].iters == 10
    d = ddp.specs(device="cpu", impl=["flat"], world_size=[2])
    assert (d[0].size, d[0].iters) == ("tiny", 5)


def test_store_migrates_to_label(tmp_path):
    """A v3 store (before --label) gains the column on open and keeps its rows."""
    from cs336sys.experiments.catalog import EXPERIMENTS as CATALOG
    from cs336sys.store import schema
    from cs336sys.store.db import Store

    path = tmp_path / "old.db"
    conn = sqlite3.connect(path, isolation_level=None)
    schema.migrate(conn, 3)
    conn.execute("INSERT INTO invocations (id, command) VALUES ('a', 'model')")
    conn.close()
    with Store(path, CATALOG):
        pass
    assert query(path, "SELECT id, label FROM invocations") == [{"id": "a", "label": None}]


@pytest.mark.parametrize("path", [["sql"]])
def test_sql_help_lists_every_view(path):
    from cs336sys.experiments.catalog import EXPERIMENTS

    text = " ".join(invoke(*path, "--help").stdout.split())
    for e in EXPERIMENTS:
        assert e.view in text, e.view


def test_compare_two_labelled_runs_of_the_same_code(db_path, tmp_path):
    """Two runs of the same code, told apart by --label: the compare covers only them and
    gives each point a verdict. (Whether it flags anything depends on the machine: millisecond
    steps on a busy 2-core box drift between runs, which is a real difference, so this test
    does not assert "unchanged"; tests/test_compare.py does, on controlled samples.)"""
    args = ["model", *MICRO, "--seq", "8,16", "--mode", "forward", "--iters", "8", "--db", db_path]
    for label in ("a", "b", "other"):
        assert invoke(*args, "--label", label).exit_code == 0
    out = tmp_path / "cmp"
    result = invoke("report", "--compare", "a", "b", "--format", "md", "--out", out,
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    assert "Comparison by label: a (A) against b (B)" in result.stdout
    assert "2 points compared:" in result.stdout
    md = (out / "report.md").read_text()
    # the report's runs are a's and b's only: 2 invocations of 2 points
    assert "ok 4" in md and "ok 6" not in md
    bad = invoke("report", "--compare", "a", "nope", "--out", out, "--db", db_path)
    assert bad.exit_code == 2 and "matches no commit, invocation id, label or GPU" in bad.stderr


def test_the_heartbeat_counts_seconds_from_the_points_start(monkeypatch, capsys):
    """Off a terminal, a point whose ranks report steps (ddp, step on ranks) said
    `60520 s in`: the time since the machine started, since nothing set the point's start."""
    import re
    import time

    from cs336sys.cli.progress_bar import Bar

    monkeypatch.setattr(Bar, "EVERY_S", 0.2)
    bar = Bar("ddp", show=str, tty=False)
    bar.start(None, 1)
    try:
        bar.tick(1, 5, point="naive")  # a rank's first step of the point, from its pipe
        time.sleep(0.8)
    finally:
        bar.finish()
    beats = re.findall(r"ddp \[1/1\] naive: step 1/5, (\d+) s in", capsys.readouterr().err)
    assert beats and all(int(s) <= 1 for s in beats), beats
