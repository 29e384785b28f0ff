"""`cs336sys handout`: each release's problems against the handout's names and points, the
size table by release, every problem's commands built at CPU size, a subset measured end to
end and resumed, and the writeup starter's tables checked cell by cell against the stored
rows, with its LaTeX and Typst compiled where an engine is present."""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from cs336sys.handout import named, problems
from cs336sys.handout.pivot import pivot
from cs336sys.handout.problem import Pivot, fitted
from cs336sys.models.config import from_preset, param_count, using_handout
from cs336sys.report.sections import mean_std
from cs336sys.sweep.declaration import Column
from cs336sys.sweep.points import SpecError
from tests.conftest import MICRO, invoke, query

# The problems as the handouts name them, in their order, with their points (read off the
# 2026 release 26.1.4 and the spring 2025 release by hand).
PROBLEMS_2026 = [
    ("benchmarking_script", 4), ("nsys_profile", 5), ("mixed_precision_accumulation", 1),
    ("benchmarking_mixed_precision", 2), ("memory_profiling", 4), ("gradient_checkpointing", 4),
    ("pytorch_attention", 2), ("torch_compile", 2), ("flash_forward", 15),
    ("flash_backward", 5), ("flash_benchmarking", 5), ("distributed_communication_single_node", 5),
    ("naive_ddp", 5), ("naive_ddp_benchmarking", 3), ("minimal_ddp_flat_benchmarking", 2),
    ("ddp_overlap_individual_parameters", 5),
    ("ddp_overlap_individual_parameters_benchmarking", 1), ("optimizer_state_sharding", 15),
    ("optimizer_state_sharding_accounting", 5), ("fsdp", 15), ("fsdp_accounting", 5),
    ("alternate_ring_all_reduce", 1), ("data_parallel_calcs", 3), ("fsdp_calcs", 3),
    ("tp_calcs", 4), ("fsdp_tp_calcs", 6), ("leaderboard", 10),
]
PROBLEMS_2025 = [
    ("benchmarking_script", 4), ("nsys_profile", 5), ("mixed_precision_accumulation", 1),
    ("benchmarking_mixed_precision", 2), ("memory_profiling", 4), ("pytorch_attention", 2),
    ("torch_compile", 2), ("flash_forward", 15), ("flash_backward", 5), ("flash_benchmarking", 5),
    ("distributed_communication_single_node", 5), ("naive_ddp", 5), ("naive_ddp_benchmarking", 3),
    ("minimal_ddp_flat_benchmarking", 2), ("ddp_overlap_individual_parameters", 5),
    ("ddp_overlap_individual_parameters_benchmarking", 1), ("ddp_overlap_bucketed", 8),
    ("ddp_bucketed_benchmarking", 3), ("communication_accounting", 10),
    ("optimizer_state_sharding", 15), ("optimizer_state_sharding_accounting", 5),
]


@pytest.mark.parametrize("year, expected", [("2026", PROBLEMS_2026), ("2025", PROBLEMS_2025)])
def test_problems_are_the_handouts(year, expected):
    assert [(p.name, p.points) for p in problems(year)] == expected


def test_every_command_of_2025_names_the_2025_sizes():
    for p in problems("2025"):
        for run in p.runs:
            words = run.gpu.split()
            if "--size" in words and words[0] != "plan":
                assert "--handout 2025" in run.gpu, (p.name, run.gpu)


# -- the size table by release -----------------------------------------------------------------


def test_xl_is_the_2026_model_unless_2025_is_asked(monkeypatch):
    monkeypatch.delenv("CS336SYS_HANDOUT", raising=False)
    xl = from_preset("xl")
    assert (xl.d_model, xl.d_ff, xl.num_layers, xl.num_heads) == (2560, 10240, 32, 32)
    assert param_count(xl) == param_count(from_preset("2.7B")) == 3_406_809_600
    with using_handout("2025"):
        old = from_preset("xl")
    assert (old.d_model, old.d_ff, old.num_layers, old.num_heads) == (1600, 6400, 48, 25)
    monkeypatch.setenv("CS336SYS_HANDOUT", "2025")
    assert from_preset("xl").d_model == 1600
    monkeypatch.setenv("CS336SYS_HANDOUT", "2024")
    with pytest.raises(SpecError, match="CS336SYS_HANDOUT"):
        from_preset("xl")


def test_a_row_of_either_xl_shows_its_shape(db_path, monkeypatch):
    monkeypatch.delenv("CS336SYS_HANDOUT", raising=False)
    for release, shape in (("2026", "xl (2560×1"), ("2025", "xl (1600×1")):
        r = invoke("model", "--size", "xl", "--handout", release, "--num-layers", "1", "--d-ff",
                   "64", "--vocab-size", "64", "--seq", "8", "--mode", "forward", "--warmup", "0",
                   "--iters", "1", "--db", db_path)
        assert r.exit_code == 0, r.output
        assert shape in r.stdout  # the printed table names the model with its shape
    rows = query(db_path, "SELECT size, d_model, num_layers FROM model_runs ORDER BY d_model")
    assert rows == [{"size": "xl", "d_model": 1600, "num_layers": 1},
                    {"size": "xl", "d_model": 2560, "num_layers": 1}]
    r = invoke("model", "--size", "xl", "--handout", "2024", "--db", db_path)
    assert r.exit_code == 2 and "--handout: unknown handout release '2024'" in r.stderr


# -- the listing and bad input -----------------------------------------------------------------


def test_the_groups_year_and_store_hold_for_run_and_report(db_path, tmp_path, monkeypatch):
    """`handout --year 2025 --db X run ...`, as the listing's own last lines read: the
    subcommands took 2026 and the default store, so a 2025 student's runs went under the
    2026 problems into a store the writeup never read."""
    monkeypatch.chdir(tmp_path)  # the default store would land here
    listing = invoke("handout", "--year", "2025", "--db", db_path).stdout
    assert f"$ cs336sys handout run --year 2025 --db {db_path} PROBLEM..." in listing
    r = invoke("handout", "--year", "2025", "--db", db_path, "run", "--all", "--dry-run")
    assert r.exit_code == 0 and "[1/20] benchmarking_script" in r.stdout, r.output
    r = invoke("handout", "--year", "2025", "--db", db_path, "run", "mixed_precision_accumulation")
    assert r.exit_code == 0, r.output
    assert len(query(db_path, "SELECT id FROM runs")) == 4 and not (tmp_path / "db").exists()
    r = invoke("handout", "--year", "2025", "--db", db_path, "report", "--format", "md", "--out",
               tmp_path / "w")
    assert r.exit_code == 0, r.output
    md = (tmp_path / "w" / "writeup.md").read_text()
    assert "(2025 handout)" in md and "communication_accounting" in md
    assert "Not yet computed" in md and "9.953125" in md
    # the subcommand's own value wins over the group's
    r = invoke("handout", "--year", "2025", "run", "--year", "2026", "--all", "--dry-run",
               "--db", db_path)
    assert "[1/19]" not in r.stdout and r.exit_code == 0, r.output


@pytest.mark.parametrize("kind", ["an empty file", "SQLite without tables"])
def test_an_empty_store_lists_nothing_measured_and_has_no_writeup(tmp_path, kind):
    """What a first command interrupted leaves (docs/bad-input.md: "an empty SQLite file,
    with no tables, which the next command makes a store"): `handout` and `handout report`
    ended in a traceback ("no such table: runs")."""
    import sqlite3

    db = tmp_path / "s.db"
    if kind == "an empty file":
        db.write_bytes(b"")
    else:
        sqlite3.connect(db).execute("VACUUM").connection.close()  # a header, no tables
    before = db.read_bytes()
    r = invoke("handout", "--db", db)
    assert r.exit_code == 0, r.output
    assert "not yet measured" in r.stdout
    r = invoke("handout", "report", "--db", db, "--out", tmp_path / "w")
    assert r.exit_code == 2, r.output
    assert r.stderr.strip() == (f"Error: {db} holds no runs yet (an empty store): run an "
                                "experiment first, or pass --db")
    assert not (tmp_path / "w").exists() and db.read_bytes() == before


def test_listing_names_every_problem_and_its_status(db_path, monkeypatch):
    monkeypatch.setenv("COLUMNS", "200")  # a problem's status on one line
    r = invoke("handout", "--db", db_path)
    assert r.exit_code == 0, r.output
    for name, points in PROBLEMS_2026:
        assert f"{name} ({points} pt" in r.stdout
    assert "not yet measured" in r.stdout and "not yet computed" in r.stdout
    assert "your implementation: the course's tests check it" in r.stdout
    assert "cut down for a CPU" in r.stdout
    assert not db_path.exists()  # listing writes nothing
    r = invoke("handout", "--year", "2025", "--db", db_path)
    assert "2025 handout: 21 problems" in r.stdout and "--handout 2025" not in r.stdout


def test_listing_prints_the_commands_that_measured_what_is_stored(db_path, monkeypatch):
    """After `handout run --yours`, a problem measured on the user's model lists the commands
    on their model (to rerun it, at the handout's sizes, by hand); the others list ours."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    monkeypatch.setenv("COLUMNS", "200")  # a problem's status on one line

    with Store(db_path, EXPERIMENTS) as store:
        for label, settings in (("benchmarking_script", {"model": "cs336_basics"}),
                                ("nsys_profile", {"target": "model"})):
            inv = store.begin_invocation({"gpu": "cpu"}, [], "model", label=label)
            store.add_run(inv, "model", "ok", {"size": "tiny", **settings}, {})
    lines = invoke("handout", "--db", db_path).stdout.splitlines()

    def commands(name):
        at = next(i for i, line in enumerate(lines) if line.startswith(name + " "))
        return [line for line in lines[at + 1:] if line.startswith("  $ ")][:1]

    assert "(your code)" in next(x for x in lines if x.startswith("benchmarking_script "))
    assert commands("benchmarking_script")[0].startswith("  $ cs336sys model --model cs336_basics ")
    assert commands("nsys_profile")[0].startswith("  $ cs336sys profile model --size ")
    # (b)'s "both forward and backward passes": a train point's every phase has the optimizer
    assert "--mode forward,forward-backward,train" in commands("nsys_profile")[0]


def test_listing_counts_the_runs_no_problem_counts(db_path, monkeypatch):
    """Runs measured by hand, without a problem's label (or with a label of the user's own),
    answer no problem: the listing said `not yet measured` beside 79 such runs of the
    shared H100 store, without a word. It now counts them and names the way to label."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    monkeypatch.setenv("COLUMNS", "200")
    with Store(db_path, EXPERIMENTS) as store:
        for experiment, label, n in (("model", "benchmarking_script", 1), ("model", None, 2),
                                     ("attention", "mine", 1), ("memory", "memory_profiling", 3)):
            inv = store.begin_invocation({"gpu": "cpu"}, [], experiment, label=label)
            for _ in range(n):
                store.add_run(inv, experiment, "ok", {"size": "tiny"}, {})
    out = invoke("handout", "--db", db_path).stdout
    assert "1 attention and 2 model run(s) in this store count for no problem" in out
    assert "give `--label PROBLEM`" in out
    # (its one run, of none of the warm-ups and modes the commands ask for, is part of it)
    assert "benchmarking_script (4 pts, §2.1.3): partly measured" in out
    # the writeup starter says so at its head, for the student to label them before handing
    # in: a writeup of one problem counts the runs of another (memory_profiling's) as labelled
    out_dir = db_path.with_name("writeup")
    done = invoke("handout", "report", "benchmarking_script", "--format", "md", "--out", out_dir,
                  "--db", db_path)
    assert done.exit_code == 0, done.output
    assert ("**Not counted:** 1 attention and 2 model run(s) without a problem's label (a run "
            "counts for a problem under --label PROBLEM)") in (out_dir / "writeup.md").read_text()
    labelled = db_path.with_name("labelled.db")
    with Store(labelled, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, [], "model", label="benchmarking_script")
        store.add_run(inv, "model", "ok", {"size": "tiny"}, {})
    assert "count for no problem" not in invoke("handout", "--db", labelled).stdout


def test_a_command_of_cs336sys_code_after_one_of_yours_records_no_code_of_yours(
        db_path, tmp_path, monkeypatch):
    """`handout run --yours pytorch_attention distributed_communication_single_node`: the
    attention command engaged the user's adapters in this process, and the all-reduce
    benchmark after it, cs336sys's own script, was stored with the user's commit."""
    from tests.user_repos import course_repo

    monkeypatch.chdir(course_repo(tmp_path))
    monkeypatch.delenv("CS336SYS_ADAPTERS", raising=False)
    monkeypatch.delenv("CS336SYS_YOURS", raising=False)
    r = invoke("handout", "run", "--yours", "pytorch_attention",
               "distributed_communication_single_node", "--db", db_path)
    assert r.exit_code == 0, r.output
    got = {row["label"]: row["user_commit"] for row in query(
        db_path, "SELECT label, user_commit FROM invocations")}
    assert got["pytorch_attention"] and got["distributed_communication_single_node"] is None
    assert "CS336SYS_ADAPTERS" not in os.environ


def _stored(db_path, label, experiment, impls, **settings):
    """One invocation labelled `label` that stored an ok point of each of `impls`, the
    first at seq 128, the next at 256..., with `settings`."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    with Store(db_path, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, ["cs336sys", "handout", "run", label],
                                     experiment, label=label)
        for i, impl in enumerate(impls):
            store.add_run(inv, experiment, "ok", {"impl": impl, "seq": 128 << i, **settings}, {})
        store.finish_invocation(inv, 0)


def _listed(db_path, name):
    return next(x for x in invoke("handout", "--db", db_path).stdout.splitlines()
                if x.startswith(name + " "))


def test_a_baseline_of_ours_beside_their_code_is_counted_apart(db_path, monkeypatch):
    """flash_benchmarking times naive attention beside the user's kernel: its line read
    `(your code): 4 ok`, the naive points counted as theirs."""
    monkeypatch.setenv("COLUMNS", "200")
    _stored(db_path, "flash_benchmarking", "attention", ["naive", "yours-torch", "yours-torch"])
    line = _listed(db_path, "flash_benchmarking")
    assert line.endswith("on cpu: 2 ok (your code), 1 ok (cs336sys's code)"), line


def test_a_check_whose_triton_points_were_left_out_is_partly_checked(db_path, tmp_path,
                                                                       monkeypatch):
    """`handout run flash_forward` without Triton ran the check's yours-torch points alone
    (cli/handout._without_triton); the listing read `checked ...: 2 ok` and the writeup
    said nothing of the kernel never checked. Its second check, `--no-causal`, is a part
    too: the course's PyTorch forward test runs non-causal alone."""
    monkeypatch.setenv("COLUMNS", "200")
    _stored(db_path, "flash_forward", "attention", ["yours-torch"], causal=True)
    line = _listed(db_path, "flash_forward")
    assert line.startswith("flash_forward (15 pts, §4.2.2): partly checked ") and line.endswith(
        "(your code): 1 ok; not yet: attention (impl=yours-triton, causal=True), attention "
        "(causal=False)"), line
    assert invoke("handout", "report", "flash_forward", "--format", "md", "--out",
                  tmp_path / "w", "--db", db_path).exit_code == 0
    assert ("Not yet checked: attention (impl=yours-triton, causal=True), attention "
            "(causal=False) (`cs336sys handout run flash_forward --yours` checks what is "
            "missing)") in (tmp_path / "w" / "writeup.md").read_text()
    _stored(db_path, "flash_forward", "attention", ["yours-triton"], causal=True)
    line = _listed(db_path, "flash_forward")
    assert line.endswith("(your code): 2 ok; not yet: attention (causal=False)"), line
    _stored(db_path, "flash_forward", "attention", ["yours-torch", "yours-triton"],
            causal=False)
    line = _listed(db_path, "flash_forward")
    assert "partly" not in line and line.endswith("(your code): 4 ok"), line


def test_a_point_a_rerun_measured_counts_by_its_latest_run(db_path, tmp_path, monkeypatch):
    """`handout run` stopped by SIGTERM stored its second point as an error; run again, it
    measured it. The listing still said `2 ok, 1 error`, and the writeup's method line
    `error 1` and `stopped early: ... --resume measures the rest`, though nothing was left."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    monkeypatch.setenv("COLUMNS", "200")
    argv = ["cs336sys", "handout", "run", "minimal_ddp_flat_benchmarking"]
    with Store(db_path, EXPERIMENTS) as store:
        for exit_status, points in ((143, (("naive", "ok"), ("flat", "error"))),
                                    (0, (("flat", "ok"),))):
            inv = store.begin_invocation({"gpu": "cpu"}, argv, "ddp",
                                         label="minimal_ddp_flat_benchmarking")
            for impl, status in points:
                store.add_run(inv, "ddp", status, {"impl": impl, "world_size": 2}, {})
            store.finish_invocation(inv, exit_status)
    out = invoke("handout", "--db", db_path).stdout
    line = next(x for x in out.splitlines() if x.startswith("minimal_ddp_flat_benchmarking "))
    assert line.endswith("(cs336sys's code): 2 ok"), line
    done = invoke("handout", "report", "minimal_ddp_flat_benchmarking", "--format", "md",
                  "--out", tmp_path / "w", "--db", db_path)
    assert done.exit_code == 0, done.output
    md = (tmp_path / "w" / "writeup.md").read_text()
    assert "points by their latest run: ok 2." in md and "**Points by their latest run:** ok 2" in md
    assert "error 1" not in md and "stopped early" not in md.lower()
    # stopped again, its point stopped over an ok run of it, then rerun to an end with a
    # point in error (exit 1, as a sweep with an error ends): the stopped point measured
    # nothing and hides no ok run; the rerun ran to its end, so nothing stopped early
    from cs336sys.sweep.stopping import TERMINATED

    with Store(db_path, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, argv, "ddp",
                                     label="minimal_ddp_flat_benchmarking")
        store.add_run(inv, "ddp", "error", {"impl": "naive", "world_size": 2}, {},
                      error=f"{TERMINATED} 15 (SIGTERM)")
        store.finish_invocation(inv, 143)
        inv = store.begin_invocation({"gpu": "cpu"}, argv, "ddp",
                                     label="minimal_ddp_flat_benchmarking")
        store.add_run(inv, "ddp", "error", {"impl": "bucketed", "world_size": 2}, {},
                      error="RuntimeError: boom")
        store.finish_invocation(inv, 1)
    line = next(x for x in invoke("handout", "--db", db_path).stdout.splitlines()
                if x.startswith("minimal_ddp_flat_benchmarking "))
    assert line.endswith("(cs336sys's code): 2 ok, 1 error"), line
    assert invoke("handout", "report", "minimal_ddp_flat_benchmarking", "--format", "md",
                  "--out", tmp_path / "w2", "--db", db_path).exit_code == 0
    md = (tmp_path / "w2" / "writeup.md").read_text()
    assert "points by their latest run: ok 2, error 1." in md
    assert "stopped early" not in md.lower()


def test_a_problem_whose_every_run_was_stopped_says_none_was_measured():
    """Its points, all stopped, left `points by their latest run: ;` blank."""
    from cs336sys.handout.writeup import _latest_statuses
    from cs336sys.sweep.stopping import TERMINATED

    row = {"status": "error", "error": f"{TERMINATED} 15 (SIGTERM)", "_settings": {"impl": "x"}}
    assert _latest_statuses({"ddp": [row]}) == "none measured (every run was stopped)"


def test_a_stopped_point_runs_no_part_and_a_crashed_rerun_ends_nothing(db_path, tmp_path,
                                                                        monkeypatch):
    """A point SIGTERM stopped measured nothing: the listing read `measured` as if its part
    had run. A rerun that exits 1 having stored no failed point crashed part-way: it hid
    the stopped run's `stopped early` though the flat point was never measured."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store
    from cs336sys.sweep.stopping import TERMINATED

    monkeypatch.setenv("COLUMNS", "200")
    argv = ["cs336sys", "handout", "run", "minimal_ddp_flat_benchmarking"]
    with Store(db_path, EXPERIMENTS) as store:
        for exit_status in (143, 1):
            inv = store.begin_invocation({"gpu": "cpu"}, argv, "ddp",
                                         label="minimal_ddp_flat_benchmarking")
            store.add_run(inv, "ddp", "ok", {"impl": "naive", "world_size": 2}, {})
            if exit_status == 143:
                store.add_run(inv, "ddp", "error", {"impl": "flat", "world_size": 2}, {},
                              error=f"{TERMINATED} 15 (SIGTERM)")
            store.finish_invocation(inv, exit_status)
    line = next(x for x in invoke("handout", "--db", db_path).stdout.splitlines()
                if x.startswith("minimal_ddp_flat_benchmarking "))
    assert "partly measured" in line and "not yet: ddp (impl=flat)" in line, line
    assert invoke("handout", "report", "minimal_ddp_flat_benchmarking", "--format", "md",
                  "--out", tmp_path / "w", "--db", db_path).exit_code == 0
    assert "stopped early" in (tmp_path / "w" / "writeup.md").read_text().lower()


def test_a_stopped_handout_run_is_ended_by_a_narrower_one_that_ran_to_its_end(
        db_path, tmp_path):
    """`handout run --all` stopped in a problem, then `handout run PROBLEM` measured every
    point: the writeup still said "stopped early" (a rerun had to be the same command
    line). A rerun of the problem's command, --yours or not as it was, ends it; one with the
    other --yours does not."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store
    from cs336sys.sweep.stopping import TERMINATED

    name = "minimal_ddp_flat_benchmarking"
    runs = [(["cs336sys", "handout", "run", "--all", "--yours"], 143),
            (["cs336sys", "handout", "run", name], 0)]

    def writeup() -> str:
        assert invoke("handout", "report", name, "--format", "md", "--out", tmp_path / "w",
                      "--force", "--db", db_path).exit_code == 0
        return (tmp_path / "w" / "writeup.md").read_text().lower()

    for extra in ([], ["--yours"]):  # without --yours first: not the stopped run's rerun
        with Store(db_path, EXPERIMENTS) as store:
            for argv, exit_status in (runs if not extra else runs[1:]):
                inv = store.begin_invocation({"gpu": "cpu"}, argv + extra * (exit_status == 0),
                                             "ddp", label=name)
                store.add_run(inv, "ddp", "ok", {"impl": "naive", "world_size": 2}, {})
                store.add_run(inv, "ddp", "ok" if exit_status == 0 else "error",
                              {"impl": "flat", "world_size": 2}, {},
                              error=None if exit_status == 0 else f"{TERMINATED} 15 (SIGTERM)")
                store.finish_invocation(inv, exit_status)
        assert ("stopped early" in writeup()) == (not extra)


def test_a_problem_with_a_part_not_run_says_which(db_path, tmp_path, monkeypatch):
    """memory_profiling with its memory runs stored and its residuals not read `measured`,
    in the listing and the writeup alike: it is `partly measured`, naming the part left."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    monkeypatch.setenv("COLUMNS", "200")
    with Store(db_path, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, [], "memory", label="memory_profiling")
        for mode in ("forward", "train"):
            for precision in ("fp32", "bf16"):
                store.add_run(inv, "memory", "ok", {"size": "tiny", "seq": 64, "mode": mode,
                                                    "precision": precision}, {})
        # two parts of one experiment: (b) after 5 warm-up steps, (c) after 0, 1 and 2
        inv = store.begin_invocation({"gpu": "cpu"}, [], "model", label="benchmarking_script")
        for mode in ("forward", "forward-backward", "train"):
            store.add_run(inv, "model", "ok", {"size": "tiny", "mode": mode, "warmup": 5}, {})
        store.add_run(inv, "model", "ok", {"size": "tiny", "mode": "train", "warmup": 1}, {})
    out = invoke("handout", "--db", db_path).stdout
    assert "memory_profiling (4 pts, §2.1.6): partly measured " in out
    assert "4 ok; not yet: (f) memory residuals\n" in out
    assert "4 ok; not yet: (c) model (mode=train, warmup=0,2)\n" in out
    writeup = tmp_path / "writeup"
    assert invoke("handout", "report", "memory_profiling", "--format", "md", "--out", writeup,
                  "--db", db_path).exit_code == 0
    assert ("Not yet measured: (f) memory residuals (`cs336sys handout run memory_profiling` "
            "measures what is missing)") in (writeup / "writeup.md").read_text()


def test_accumulation_is_measured_with_the_four_loops_of_the_handout(db_path):
    """mixed_precision_accumulation asks four loops of 0.01 added 1000 times: one variant,
    and fp16 at another value, read `measured`."""
    for args in (["--variant", "fp32"], ["--variant", "fp16", "--value", "0.5", "--additions", 3]):
        r = invoke("precision", "accumulate", *args, "--label", "mixed_precision_accumulation",
                   "--db", db_path)
        assert r.exit_code == 0, r.output
    line = " ".join(invoke("handout", "--db", db_path).stdout.split())
    assert ("mixed_precision_accumulation (1 pt, §2.1.5): partly measured" in line
            and "(variant=fp16,fp16-into-fp32,fp16-upcast)" in line), line
    r = invoke("precision", "accumulate", "--label", "mixed_precision_accumulation",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    line = " ".join(invoke("handout", "--db", db_path).stdout.split())
    assert "mixed_precision_accumulation (1 pt, §2.1.5): measured" in line, line


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_memory_profiling_gives_two_numbers_per_length_and_the_residual_tensor(
        db_path, tmp_path, year):
    """(b) a table with two numbers per context length (forward, training step: each run
    stores its own optimizer); (d) the residual-stream tensor B·T·d in fp32, which every
    memory row stores and no table showed."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    with Store(db_path, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, [], "memory", label="memory_profiling")
        for seq in (128, 2048):
            for mode, optimizer in (("forward", "none"), ("train", "adamw")):
                store.add_run(inv, "memory", "ok", {
                    "size": "xl", "seq": seq, "batch": 4, "mode": mode, "precision": "fp32",
                    "optimizer": optimizer}, {"peak_bytes": seq * 2**20,
                                              "residual_bytes": 4 * seq * 2560 * 4})
    out = tmp_path / "w"
    assert invoke("handout", "report", "memory_profiling", "--format", "md", "--out", out,
                  "--year", year, "--db", db_path).exit_code == 0
    md = (out / "writeup.md").read_text()
    peaks = md.split("**Peak memory by context length (MiB), fp32**", 1)[1]
    assert "| seq | forward | train |" in peaks
    assert "| 128 | 128.0 | 128.0 |" in peaks and "| 2048 | 2,048.0 | 2,048.0 |" in peaks
    residual = md.split("**Residual-stream activation tensor B·T·d, fp32 (MiB)**", 1)[1]
    assert "| 128 | 5.0 |" in residual and "| 2048 | 80.0 |" in residual  # xl: d = 2560


def test_fsdp_accounting_b_gives_the_forward_time_beside_the_all_gathers(db_path, tmp_path):
    """(b) "Does the communication finish in time for the forward pass? ... with your
    timings": the writeup had memory and step time only; it shows each impl's forward beside
    the FSDP's all-gathers."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    with Store(db_path, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, [], "ddp", label="fsdp_accounting")
        for impl, fwd, calls in (("overlap", 40.0, 0), ("fsdp", 52.0, 58)):
            store.add_run(inv, "ddp", "ok", {"impl": impl, "size": "tiny"},
                          {"fwd_ms_mean": fwd, "step_ms_mean": 3 * fwd, "comm_ms_mean": 9.0,
                           "allgather_calls": calls, "allgather_bytes": calls * 2**20})
    out = tmp_path / "w"
    assert invoke("handout", "report", "fsdp_accounting", "--format", "md", "--out", out,
                  "--db", db_path).exit_code == 0
    md = (out / "writeup.md").read_text()
    table = md.split("**(b) Forward time beside the all-gathers**", 1)[1]
    assert "| forward ms | step ms | communication ms | all-gathers/step | all-gathered MiB |" \
        in table
    assert "| 52 " in table and "| 58 | 58.0 |" in table, table[:800]
    # measured on cs336sys's code alone, which the handout's "your implementation" is not
    assert ("These are cs336sys's own implementations: `cs336sys handout run "
            "fsdp_accounting --yours` measures yours.") in md


def test_ddp_bucketed_benchmarking_shows_the_buckets_its_overhead_model_takes(db_path,
                                                                              tmp_path):
    """2025's (b) models the bucketed DDP's overhead by the number of buckets; the writeup
    showed bucket caps alone, and a 1 MiB cap on the tiny model is one bucket per parameter,
    the overlapped DDP's run under another name."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    with Store(db_path, EXPERIMENTS) as store:
        inv = store.begin_invocation({"gpu": "cpu"}, [], "ddp",
                                     label="ddp_bucketed_benchmarking")
        for impl, mb, buckets in (("overlap", None, 39), ("bucketed", 1, 39), ("bucketed", 10, 7)):
            store.add_run(inv, "ddp", "ok", {"impl": impl, "bucket_mb": mb, "size": "tiny"},
                          {"step_ms_mean": 10.0, "buckets": buckets, "allreduce_calls": buckets})
    out = tmp_path / "w"
    assert invoke("handout", "report", "ddp_bucketed_benchmarking", "--year", "2025",
                  "--format", "md", "--out", out, "--db", db_path).exit_code == 0
    md = (out / "writeup.md").read_text()
    assert "| buckets | all-reduces/step |" in md
    assert re.search(r"^\| bucketed \| 10 \|.*\| 7 \| 7 \|$", md, re.M), md


def test_an_accounting_problem_with_one_of_its_two_plans_is_partly_computed(db_path, tmp_path,
                                                                            monkeypatch):
    """2025's communication_accounting has two plans, FSDP alone and FSDP x TP on a mesh
    (its (c)): with only the first stored it read `computed`, and its writeup had neither
    the mesh table nor a word that it was missing."""
    monkeypatch.setenv("COLUMNS", "200")
    r = invoke("plan", "--size", "xxl", "--hardware", "tpu-v5p", "--strategy", "fsdp", "--n",
               "1,16", "--batch", "64", "--seq", "512", "--label", "communication_accounting",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    out = invoke("handout", "--year", "2025", "--db", db_path).stdout
    assert "partly computed" in out and "not yet: plan (strategy=fsdp-tp)" in out, out
    writeup = tmp_path / "writeup"
    assert invoke("handout", "--year", "2025", "report", "communication_accounting", "--format",
                  "md", "--out", writeup, "--db", db_path).exit_code == 0
    assert ("Not yet computed: plan (strategy=fsdp-tp) (`cs336sys handout run --year 2025 "
            "communication_accounting` computes what is missing)") in (
        writeup / "writeup.md").read_text()


def test_listing_fits_the_terminal_and_keeps_each_command_on_one_line(db_path, monkeypatch):
    """At 60 columns the prose wraps, indented under its problem; a command, after `$` or
    in backquotes inside the prose, is never cut, so that it can be copied whole (the 80
    columns of a terminal soft-wrapped 150-column lines, and a wrapped backquoted command
    would have copied with a line break in it). Only a `$` line is longer than the width:
    an implementation's check stands on one, not in backquotes in its status (84 columns
    of prose at 80)."""
    monkeypatch.setenv("COLUMNS", "60")
    lines = invoke("handout", "--db", db_path).stdout.splitlines()
    assert all(line.count("`") % 2 == 0 for line in lines)  # each backquoted span whole
    assert ("  $ TRITON_INTERPRET=1 cs336sys attention --attention yours-torch,yours-triton "
            f"--pass forward --seq 128 --label flash_forward --db {db_path}") in lines
    long = [x for x in lines if len(x) > 60]
    assert long and all(x.startswith(("  $ cs336sys ", "  $ TRITON_INTERPRET=1 cs336sys "))
                        for x in long)
    for name, _ in PROBLEMS_2026:  # each problem heads a paragraph; the rest is indented
        assert sum(x.startswith(name + " (") for x in lines) == 1


def test_a_listed_command_run_as_printed_counts_for_its_problem(db_path, monkeypatch):
    """The listing's `$ cs336sys precision accumulate` run as printed was stored unlabelled:
    mixed_precision_accumulation still read `not yet measured`, and the head said its runs
    count for no problem. Each listed command carries its problem's --label."""
    import shlex

    line = next(x for x in invoke("handout", "--db", db_path).stdout.splitlines()
                if x.startswith("  $ cs336sys precision accumulate"))
    assert line.endswith(f"--label mixed_precision_accumulation --db {db_path}"), line
    assert invoke(*shlex.split(line.removeprefix("  $ cs336sys "))).exit_code == 0
    out = invoke("handout", "--db", db_path).stdout
    assert "mixed_precision_accumulation (1 pt, §2.1.5): measured" in out, out
    assert "count for no problem" not in out


def test_a_labelled_run_counts_for_the_release_it_ran_under_alone(db_path, monkeypatch):
    """A command the 2025 listing printed, run as printed, recorded no release: it counted
    for 2026's benchmarking_script too (`partly measured ... 8 ok`, from 2025's runs). The
    2025 listing's lines set CS336SYS_HANDOUT, which the run records."""
    import shlex

    monkeypatch.delenv("CS336SYS_HANDOUT", raising=False)
    line = next(x for x in invoke("handout", "--year", "2025", "--db", db_path).stdout
                .splitlines() if x.startswith("  $ ") and "precision accumulate" in x)
    assert line.startswith("  $ CS336SYS_HANDOUT=2025 cs336sys precision accumulate "), line
    env, _, args = line.removeprefix("  $ ").partition(" cs336sys ")
    monkeypatch.setenv(*env.split("="))
    assert invoke(*shlex.split(args)).exit_code == 0
    monkeypatch.delenv("CS336SYS_HANDOUT")
    assert "mixed_precision_accumulation (1 pt, §2.1.5): not yet measured" in invoke(
        "handout", "--db", db_path).stdout
    assert "mixed_precision_accumulation (1 pt, §1.1.5): measured" in invoke(
        "handout", "--year", "2025", "--db", db_path).stdout


def test_listing_runs_your_triton_kernel_in_the_interpreter_only_on_a_cpu(db_path,
                                                                         monkeypatch):
    """On a CPU your Triton kernel runs only in Triton's interpreter: its commands are
    listed with TRITON_INTERPRET=1, so that a copied line runs instead of being refused; on
    a GPU they are not (the interpreter there runs on CPU tensors only)."""
    from cs336sys.cli import handout as cli_handout

    def triton_lines() -> list[str]:
        out = invoke("handout", "--db", db_path).stdout.splitlines()
        return [x for x in out if x.startswith("  $ ") and "yours-triton" in x]

    on_cpu = triton_lines()
    assert on_cpu and all(x.startswith("  $ TRITON_INTERPRET=1 cs336sys attention ")
                          for x in on_cpu)
    monkeypatch.setattr(cli_handout, "_on_gpu", lambda: True)
    on_gpu = triton_lines()
    assert on_gpu and all(x.startswith("  $ cs336sys attention ") for x in on_gpu)


def test_the_listings_commands_go_to_the_store_it_reads(db_path):
    """`cs336sys handout --db X` printed each problem's command without --db X: copied, it
    stored its rows elsewhere than the store the listing reads."""
    r = invoke("handout", "--db", db_path)
    assert r.exit_code == 0, r.output
    commands = [line for line in r.stdout.splitlines() if line.startswith("  $ cs336sys model ")]
    assert commands and all(line.endswith(f" --db {db_path}") for line in commands)


@pytest.mark.parametrize("args, says", [
    (["handout", "run"], "give --all"),
    (["handout", "run", "benchmarking_scrpt"], "did you mean 'benchmarking_script'"),
    (["handout", "run", "flash_forward"], "nothing to run"),
    # a script of the user's that no adapters function holds: how it is checked, not a
    # --yours that runs nothing either
    (["handout", "--year", "2025", "run", "naive_ddp"], "checked by `cs336sys ddp --impl "
     "yours=package.module:Class`, with `--label naive_ddp` to count for it"),
    (["handout", "--year", "2025", "run", "naive_ddp", "--yours"], "--label naive_ddp"),
    (["handout", "--year", "2024"], "--year: unknown handout release"),
    (["handout", "report", "--format", "pdf"], "--format"),
    # a problem of the other release: which one, not only the closest name of this one
    (["handout", "run", "ddp_bucketed_benchmarking"],
     "ddp_bucketed_benchmarking is a problem of the 2025 handout, not of the 2026 one: give "
     "--year 2025"),
])
def test_bad_input_is_one_line(db_path, args, says):
    r = invoke(*args, "--db", db_path)
    assert r.exit_code == 2, r.output
    assert says in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert not db_path.exists()


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_every_command_builds_its_points_at_cpu_size(db_path, year):
    """--dry-run runs every command's own option parsing and builds its points: a command
    the CLI would refuse fails here."""
    r = invoke("handout", "run", "--all", "--dry-run", "--year", year, "--db", db_path)
    assert r.exit_code == 0, r.output
    expected = sum(1 for p in problems(year) for run in p.runs if run.args(False) is not None)
    assert r.stdout.count("dry run: ") + r.stdout.count("arithmetic:") == expected
    assert "Error" not in r.output and not db_path.exists()


def _with_a_triton_kernel(tmp_path, monkeypatch) -> None:
    """In a course checkout whose Triton adapter is written (cs336sys's kernel)."""
    from tests.user_repos import course_repo, edit

    repo = course_repo(tmp_path)
    getter = "def get_flashattention_autograd_function_triton() -> type:\n"
    edit(repo, "tests/adapters.py", getter + "    raise NotImplementedError\n",
         getter + "    from cs336sys.attention import FlashAttention2Triton\n\n"
         "    return FlashAttention2Triton\n")
    monkeypatch.chdir(repo)


def test_run_force_reaches_the_commands_that_estimate_their_points(tmp_path, monkeypatch):
    """flash_backward's check of a Triton kernel on a CPU was skipped as too long for the
    interpreter, and `handout run` had no --force to run it anyway (a deliverable to run by
    hand). Its --force reaches each command that takes one; a dry run counts them as run."""
    from cs336sys.experiments import preflight

    _with_a_triton_kernel(tmp_path, monkeypatch)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    # the course's shape takes about a minute interpreted: a slower machine's limit
    monkeypatch.setattr(preflight, "INTERPRETED_LIMIT_S", 10.0)
    db = tmp_path / "r.db"
    args = ("handout", "run", "flash_backward", "--yours", "--dry-run", "--db", db)
    skipped = invoke(*args)
    assert skipped.exit_code == 0 and "would be skipped" in skipped.stdout, skipped.output
    forced = invoke(*args, "--force")
    assert forced.exit_code == 0 and "would be skipped" not in forced.stdout, forced.output
    assert forced.stdout.count("dry run: ") == 2 and not db.exists()


def test_a_triton_kernel_on_a_cpu_without_the_interpreter_leaves_only_its_points(
        tmp_path, monkeypatch):
    """A student whose Triton adapter is written, on a laptop without TRITON_INTERPRET=1:
    every --yours run ended `nothing was run` (exit 2), the PyTorch kernel's check and the
    other problems' too. The Triton points are left for a host that can run them, said
    once per command; the rest runs."""
    _with_a_triton_kernel(tmp_path, monkeypatch)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    db = tmp_path / "r.db"
    r = invoke("handout", "run", "flash_forward", "--yours", "--db", db)
    assert r.exit_code == 0, r.output
    said = "Left out: flash_forward's yours-triton"
    assert r.stdout.count(said) == 2, r.stdout
    assert "$ cs336sys attention --attention yours-torch --pass forward" in r.stdout
    impls = {row["impl"] for row in query(db, "SELECT impl FROM attention_runs")}
    assert impls == {"yours-torch"}
    dry = invoke("handout", "run", "flash_forward", "--yours", "--dry-run", "--db", db)
    assert dry.exit_code == 0 and dry.stdout.count(said) == 2, dry.output  # as it will run


def test_a_triton_kernel_not_yet_written_is_left_out_as_unwritten_not_for_the_device(
        tmp_path, monkeypatch):
    """The example's Triton getter still raises NotImplementedError: the run left its points
    out with "your Triton kernel needs CUDA, or TRITON_INTERPRET=1", sending the student to
    their environment; rerun so, the points were stored `skipped: ... not implemented`."""
    from tests.user_repos import course_repo

    monkeypatch.chdir(course_repo(tmp_path))
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    r = invoke("handout", "run", "flash_forward", "--yours", "--dry-run", "--db",
               tmp_path / "r.db")
    assert r.exit_code == 0, r.output
    text = " ".join(r.stdout.split())
    assert "(get_flashattention_autograd_function_triton is not implemented in " \
        "tests/adapters.py yet)" in text and "needs CUDA" not in text, r.stdout


def test_an_fsdp_not_yet_written_is_left_out_not_run_and_read_checked(tmp_path, monkeypatch):
    """The example's get_fsdp still raises NotImplementedError: `handout run fsdp --yours`
    ran its check, stored two `skipped` points, and the listing read `checked ... 2
    skipped`, where nothing was checked; the leaderboard's two-rank step with it was stored
    skipped too. Their points are left out, saying why, as an unwritten Triton kernel's are."""
    from types import SimpleNamespace

    from cs336sys.cli.handout_todo import without_unfinished
    from tests.user_repos import course_repo, edit

    monkeypatch.chdir(course_repo(tmp_path))
    db = tmp_path / "r.db"
    r = invoke("handout", "run", "fsdp", "--yours", "--db", db)
    assert r.exit_code == 2, r.output  # nothing left to run: said in one line
    assert "fsdp's yours-fsdp points of `cs336sys ddp --model cs336_basics --impl yours-fsdp" \
        in " ".join(r.output.split()) and not db.exists()
    assert "(get_fsdp is not implemented in tests/adapters.py yet)" in " ".join(r.output.split())
    listed = invoke("handout", "--db", db).stdout
    assert "fsdp (15 pts, §7): your implementation" in listed, listed
    p = SimpleNamespace(name="x")
    beside = ["ddp", "--impl", "naive,yours-fsdp", "--world-size", "2"]
    alone = ["ddp", "--impl", "yours-fsdp", "--world-size", "2"]  # measures nothing else
    # the leaderboard's step keeps cs336sys's FSDP, the default of --ddp
    step = ["step", "--ddp", "yours-fsdp", "--size", "tiny"]
    kept, lines = without_unfinished([(p, beside), (p, alone), (p, step),
                                      (p, ["model", "--size", "tiny"])])
    assert kept == [(p, ["ddp", "--impl", "naive", "--world-size", "2"]),
                    (p, ["step", "--size", "tiny"]), (p, ["model", "--size", "tiny"])]
    assert len(lines) == 3 and all("get_fsdp is not implemented" in x for x in lines)
    # a hook written as `raise NotImplementedError` beside a written getter is unwritten too,
    # and a value leaves its own option only (the sharded optimizer stays)
    from cs336sys import yours

    edit(Path.cwd(), "tests/adapters.py", "    ddp_model.finish_gradient_synchronization()\n",
         "    raise NotImplementedError\n")
    yours.use()  # the file read again
    both = ["ddp", "--impl", "naive,yours", "--shard-optimizer", "yours", "--size", "tiny"]
    kept, (line,) = without_unfinished([(p, both)])
    assert kept == [(p, ["ddp", "--impl", "naive", "--shard-optimizer", "yours", "--size",
                         "tiny"])]
    assert "(ddp_on_after_backward is not implemented in tests/adapters.py yet)" in line


def test_a_command_of_the_triton_kernel_alone_is_left_out_whole(monkeypatch):
    """Without CUDA or the interpreter: `--attention yours-triton` alone would become a
    command with no --attention (cs336sys's default kernels, not the user's); it is left out,
    a line saying so, and one beside other kernels loses that kernel alone."""
    from types import SimpleNamespace

    from cs336sys.cli.handout_todo import without_triton

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    p = SimpleNamespace(name="flash_forward")
    alone = ["attention", "--attention", "yours-triton", "--seq", "128"]
    beside = ["attention", "--attention", "yours-torch,yours-triton", "--seq", "128"]
    kept, lines = without_triton([(p, alone), (p, beside)], on_gpu=False)
    assert kept == [(p, ["attention", "--attention", "yours-torch", "--seq", "128"])]
    assert lines == [f"flash_forward's yours-triton points of `cs336sys {' '.join(a)}` "
                     "(your Triton kernel needs CUDA, or TRITON_INTERPRET=1)"
                     for a in (alone, beside)]
    assert without_triton([(p, alone)], on_gpu=True) == ([(p, alone)], [])
    # a host without the triton package (a GPU host too): that is the reason given, not
    # CUDA or the interpreter the host has
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "triton" else find(name, *a))
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    for on_gpu in (True, False):
        _, (line,) = without_triton([(p, alone)], on_gpu=on_gpu)
        assert line.endswith("(your Triton kernel needs the triton package (pip install "
                             "triton))"), line


def test_yours_measures_the_users_code_where_the_problem_is_about_it():
    """--yours swaps in the user's implementations and model, at the CPU's sizes on a CPU,
    and checks the implementations; the other runs stay as they are."""
    by_name = {p.name: p for p in problems("2026")}
    bench = by_name["flash_benchmarking"].runs[0]
    assert "naive,yours-torch" in " ".join(bench.args(False, yours=True))
    assert "--seq" in bench.args(False, yours=True)
    assert "naive,yours-triton" in " ".join(bench.args(True, yours=True))
    model = by_name["benchmarking_script"].runs[0]
    assert model.args(False, yours=True)[:3] == ["model", "--model", "cs336_basics"]
    assert by_name["mixed_precision_accumulation"].runs[0].args(False, yours=True)[:2] == [
        "precision", "accumulate"]  # whose arithmetic is no user's code
    for p in problems("2026"):
        if p.kind == "implement":
            assert p.checks and all(c.startswith("cs336sys ") and "yours" in c for c in p.checks)
    # the Triton kernel checked with both masks, as the course's tests run it: one that
    # ignores is_causal=False passed a causal check alone
    for name in ("flash_forward", "flash_backward"):
        assert [c.endswith("--no-causal") for c in by_name[name].checks] == [False, True]
    # 2025's naive_ddp is a script with no adapters function: nothing checks it, and saying
    # "checked, ok" after running get_ddp_individual_parameters (2.3.2's class) misled
    from cs336sys.cli.handout import _commands
    from cs336sys.handout.status import UNTESTED, Status

    (naive_2025,) = named(["naive_ddp"], "2025")
    assert not naive_2025.check and _commands(naive_2025, False, yours=True) == []
    assert Status(naive_2025).line() == f"your implementation: {UNTESTED.format(name='naive_ddp')}"
    # which names the command that does check it, and the label that counts it here
    assert "the command in what it asks checks it, with `--label naive_ddp`" in \
        Status(naive_2025).line() and "`cs336sys ddp --impl yours=" in naive_2025.asks
    # the course's FSDP wraps cs336_basics.model's layers, none of which cs336sys's model has;
    # its test runs fp32 and fp16 (an fp16 gradient on an fp32 master read `checked, 1 ok`)
    assert by_name["fsdp"].check == "cs336sys ddp --model cs336_basics --impl yours-fsdp " \
        "--world-size 2 --precision fp32,fp16"
    fp32_only = Status(by_name["fsdp"], stored=[("ddp", {
        "impl": "yours-fsdp", "precision": "fp32", "world_size": 2})])
    assert fp32_only.left() == ["ddp (precision=fp16)"]
    # torch_compile (a) "with the same configuration as the pytorch_attention problem": on a
    # CPU too (it measured 1 of pytorch_attention's 4 cut-down points)
    def sizes(args):
        return [args[args.index(o) + 1] for o in ("--seq", "--d-head")]
    base = by_name["pytorch_attention"].runs[0]
    for run in by_name["torch_compile"].runs[:2]:
        for yours in (False, True):
            if run.args(False, yours=yours) is not None:
                assert sizes(run.args(False, yours=yours)) == sizes(base.args(False, yours=yours))
    # torch_compile (a): the user's assignment-1 attention eager, then compiled (a run of
    # theirs alone: without --yours, `compiled` already measures ours)
    eager, compiled = by_name["torch_compile"].runs[:2]
    assert "--compile" not in eager.args(False, yours=True)
    assert compiled.args(False) is None and compiled.args(True) is None
    assert "--compile" in compiled.args(False, yours=True)
    assert "yours=cs336_basics.model:scaled_dot_product_attention" in compiled.args(True, True)


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_pytorch_attention_times_your_attention_under_yours(year):
    """"Benchmark your attention implementation": --yours times the user's assignment-1
    attention (cs336sys's naive one ran, in both releases); without it, naive attention."""
    (run,) = {p.name: p for p in problems(year)}["pytorch_attention"].runs
    for on_gpu in (False, True):
        yours = run.args(on_gpu, yours=True)
        assert yours[yours.index("--attention") + 1] == (
            "yours=cs336_basics.model:scaled_dot_product_attention")
        assert run.args(on_gpu)[run.args(on_gpu).index("--attention") + 1] == "naive"


def test_pytorch_attentions_tables_hold_yours_and_naive(db_path, tmp_path, monkeypatch):
    """The writeup's pytorch_attention tables took naive rows only: your attention's rows are
    there too, the implementation naming each row where both were measured."""
    from tests.user_repos import course_repo

    monkeypatch.chdir(course_repo(tmp_path))
    for yours in ([], ["--yours"]):
        done = invoke("handout", "run", "pytorch_attention", *yours, "--db", db_path)
        assert done.exit_code == 0, done.output
    out = tmp_path / "w"
    done = invoke("handout", "report", "pytorch_attention", "--format", "md", "--out", out,
                  "--db", db_path)
    assert done.exit_code == 0, done.output
    md = (out / "writeup.md").read_text()
    assert "| d | impl | seq 128 | seq 256 |" in md, md
    assert "| naive |" in md and "| yours |" in md, md


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_nsys_profile_steps_with_your_adamw_under_yours(year, db_path, tmp_path, monkeypatch):
    """nsys_profile (d) profiles "one complete training step with your implementation of
    AdamW": --yours trains with the adapters' get_adamw_cls where the file implements it,
    else the AdamW of cs336_basics/optimizer.py (the course layout's; it ran cs336sys's
    adamw); where neither is found, the run says so and runs ours."""
    from tests.user_repos import course_repo, edit

    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    monkeypatch.delenv("CS336SYS_ADAPTERS", raising=False)
    # where earlier tests' commands put their repositories' cs336-basics/
    monkeypatch.setattr(sys, "path", [p for p in sys.path if not p.endswith("cs336-basics")])
    (run,) = named(["nsys_profile"], year)[0].runs

    def optimizer() -> str | None:
        args = run.args(False, yours=True)
        return args[args.index("--optimizer") + 1] if "--optimizer" in args else None

    assert optimizer() == "yours=cs336_basics.optimizer:AdamW"
    assert "--optimizer" not in run.args(False) and "--optimizer" not in run.args(True)
    with open(repo / "tests" / "adapters.py", "a") as f:
        f.write("\n\ndef get_adamw_cls():\n    raise NotImplementedError\n")
    assert optimizer() == "yours=cs336_basics.optimizer:AdamW"  # a getter left to do
    edit(repo, "tests/adapters.py", "    raise NotImplementedError\n",
         "    from cs336_basics.optimizer import AdamW\n\n    return AdamW\n")
    assert optimizer() == "yours-adamw"
    edit(repo, "tests/adapters.py", "def get_adamw_cls", "def _get_adamw_cls")
    (repo / "cs336-basics" / "cs336_basics" / "optimizer.py").unlink()
    assert optimizer() is None
    if year == "2025":  # the example's adapters are 2026's: a 2025 run refuses them
        return
    r = invoke("handout", "run", "nsys_profile", "--year", year, "--yours", "--dry-run",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    assert "your AdamW was not found" in r.output and "--optimizer" not in r.output.split(
        "[1/1]")[1]


def test_the_example_adamw_passes_the_check_and_names_its_profile(db_path, tmp_path,
                                                                   monkeypatch):
    """The course layout's AdamW (assignment 1's order: the update, then the decay) passes
    the check against torch's before it is timed, and the profile's points name it."""
    from tests.user_repos import course_repo

    monkeypatch.chdir(course_repo(tmp_path))
    r = invoke("profile", "model", "--model", "cs336_basics", *MICRO, "--seq", "16", "--mode",
               "train", "--optimizer", "yours=cs336_basics.optimizer:AdamW", "--db", db_path)
    assert r.exit_code == 0, r.output
    (row,) = query(db_path, "select status, json_extract(settings, '$.optimizer') o from runs")
    assert (row["status"], row["o"]) == ("ok", "yours")
    assert "train fp32 optimizer=yours | optimizer |" in r.output, r.output


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_every_run_of_a_model_measures_theirs_under_yours(year):
    """Each problem that times, profiles or measures the memory of "your model" runs the
    user's assignment-1 model under --yours (nsys_profile, memory_profiling's peaks and
    torch_compile's whole model ran cs336sys's), and ours without it; so does every DDP
    problem's (from 2.3.2 on they ran cs336sys's model, beside naive and flat on theirs)."""
    for p in problems(year):
        for run in p.runs:
            for on_gpu in (False, True):
                ours, yours = run.args(on_gpu), run.args(on_gpu, yours=True)
                if yours and yours[0] in ("model", "memory", "profile", "ddp"):
                    assert yours[yours.index("--model") + 1] == "cs336_basics", (p.name, yours)
                    assert ours[0] == yours[0] and "--model" not in ours, (p.name, ours)


# -- pivots --------------------------------------------------------------------------------------


def _row(**settings):
    metrics = settings.pop("metrics", {})
    return {**metrics, "status": settings.pop("status", "ok"), "gpu": settings.pop("gpu", "cpu"),
            "_settings": settings}


def test_pivot_puts_each_value_under_its_group_and_names_the_groups():
    fwd = Column("forward ms", "fwd_ms", "mean_std")
    rows = [_row(impl="naive", d_head=d, seq=s, metrics={"fwd_ms_mean": d + s / 1000,
                                                        "fwd_ms_std": 0.5})
            for d in (32, 16) for s in (256, 128)]
    rows.append(_row(impl="naive", d_head=16, seq=512, status="oom"))
    t = pivot(Pivot("t", "attention", ("d_head",), (fwd,), across="seq"), rows)
    assert t.headers == ["d", "seq 128", "seq 256", "seq 512"]
    assert t.rows == [["16", "16.1 ± 0.5", "16.3 ± 0.5", "OOM"],
                      ["32", "32.1 ± 0.5", "32.3 ± 0.5", ""]]


def test_pytorch_attentions_accounting_shows_the_size_that_ran_out_of_memory():
    """The handout asks for "the accounting for the memory usage of attention in one of the
    smallest configurations you find that runs out of memory": the estimate made before the
    point ran was stored, and the writeup's table read OOM over it."""
    (p,) = [p for p in problems("2026") if p.name == "pytorch_attention"]
    (table,) = [t for t in p.tables if t.title.startswith("Memory measured against")]
    rows = [_row(impl="naive", d_head=16, seq=1024,
                 metrics={"mem_before_bwd_bytes": 2**20, "saved_bytes": 2**20,
                          "est_peak_bytes": 3 * 2**20}),
            _row(impl="naive", d_head=16, seq=32768, status="oom",
                 metrics={"est_peak_bytes": 105.7 * 2**30})]
    t = pivot(table, rows)
    assert t.rows[-1][-3:] == ["OOM", "OOM", f"{105.7 * 1024:,.1f}"], t.rows


def test_the_ddp_pivot_shows_the_all_reduces_alone_where_the_rows_have_them():
    """minimal_ddp_flat_benchmarking's table: flat's communication ms held its copies into
    and out of one buffer (477 ms of which the all-reduce was 127 on 2 CPU ranks); the
    all-reduce's own time stands beside it, said what it is, and rows stored before it was
    measured get no empty column."""
    from cs336sys.handout.y2026 import DDP_TIME

    table = Pivot("t", "ddp", ("impl",), DDP_TIME)

    def ddp_row(impl, allreduce=None):
        metrics = {"step_ms_mean": 1900.0, "step_ms_std": 400.0, "comm_ms_mean": 477.0,
                   "comm_ms_std": 116.0, "comm_fraction": 0.25}
        if allreduce is not None:
            metrics.update(allreduce_ms_mean=allreduce, allreduce_ms_std=16.0)
        return _row(impl=impl, metrics=metrics)

    t = pivot(table, [ddp_row("flat", 127.0), ddp_row("torch")])
    assert t.headers[-1] == "all-reduce ms" and [r[-1] for r in t.rows] == ["127 ± 16", ""]
    assert "launch to completion" in t.note and "flat's copying" in t.note
    old = pivot(table, [ddp_row("flat"), ddp_row("naive")])
    assert "all-reduce ms" not in old.headers and "launch to completion" not in old.note
    # the user's DDP: its communication ms is what its finish waits, said where it is a row
    # (a DDP that reduced inside its hooks read 0.0 % beside naive's 13.5 %)
    assert "of your code" not in old.note
    theirs = pivot(table, [ddp_row("naive", 168.0), ddp_row("yours")])
    assert "communication ms of your code (yours...): the time in its " \
        "finish_gradient_synchronization alone" in theirs.note


def test_a_setting_the_shape_leaves_out_joins_the_rows():
    """Two precisions the pivot does not name would land in one cell: they become a column."""
    step = Column("step ms", "step_ms", "num")
    rows = [_row(size="tiny", d_model=512, num_layers=4, precision=p, compile=c,
                 metrics={"step_ms": v})
            for p, c, v in (("fp32", False, 1.0), ("fp32", True, 2.0), ("bf16", False, 3.0))]
    t = pivot(Pivot("t", "model", ("size",), (step,), across="compile"), rows)
    assert t.headers == ["size", "precision", "eager", "compiled"]
    assert t.rows == [["tiny (512×4)", "fp32", "1", "2"], ["tiny (512×4)", "bf16", "3", ""]]


@pytest.mark.parametrize("year, modes, phases", [
    ("2026", ("train",), ["forward", "backward", "optimizer"]),
    ("2025", ("forward", "forward-backward"), ["forward", "backward"])])
def test_the_warmup_table_repeats_every_phase_the_handout_times(year, modes, phases):
    """benchmarking_script (c) repeats (b) without warm-up: the 2026 handout times the
    optimizer step too, so the table by warm-up steps has it beside forward and backward.
    The 2025 runs time the forward alone and with backward: both modes are rows (the
    forward-only points, stored, were in no table)."""
    after_five, by_warmup = named(["benchmarking_script"], year)[0].tables
    rows = [_row(size="tiny", d_model=512, num_layers=4, mode=mode, warmup=w,
                 metrics={f"{k}_ms_{stat}": w + 1.0 if stat == "mean" else 0.1
                          for k in ("fwd", "bwd", "opt") for stat in ("mean", "std")})
            for mode in modes for w in (0, 5)]
    t = pivot(by_warmup, rows)
    per_mode = ["mode"] * (len(modes) > 1)
    assert t.headers == ["size", *per_mode,
                         *(f"{w} warm-up: {phase} ms" for w in (0, 5) for phase in phases)]
    assert t.rows == [["tiny (512×4)", *([mode] if per_mode else []),
                       *(f"{w + 1} ± 0.1" for w in (0, 5) for _ in phases)] for mode in modes]
    assert by_warmup.values == after_five.values


def test_a_failed_point_of_a_size_shares_its_row():
    """A point that failed before counting its parameters read `tiny (512×4)`, the others
    `tiny (512×4, 23M)`: one size made two rows of the warm-up table."""
    by_warmup = named(["benchmarking_script"], "2026")[0].tables[1]
    ok = _row(size="tiny", d_model=512, num_layers=4, mode="train", warmup=0,
              metrics={"params": 22_696_448, "fwd_ms_mean": 1.0, "fwd_ms_std": 0.1})
    failed = _row(size="tiny", d_model=512, num_layers=4, mode="train", warmup=5,
                  status="error")
    t = pivot(by_warmup, [ok, failed])
    assert [r[0] for r in t.rows] == ["tiny (512×4, 23M)"]
    assert "error" in t.rows[0]


def test_the_checkpointing_table_tells_the_block_sizes_apart():
    """The step's peak was the only memory column, and where the optimizer step sets it
    every policy read the same (385.5 MiB for every:1 and every:2): the backward peak and
    the bytes saved for backward, which checkpointing changes, stand beside it."""
    (table,) = named(["gradient_checkpointing"])[0].tables
    rows = [_row(size="tiny", mode="train", checkpoint=c, metrics={
        "peak_bytes": 385.5 * 2**20, "opt_peak_bytes": 385.5 * 2**20,
        "bwd_peak_bytes": bwd * 2**20, "saved_bytes": saved * 2**20})
        for c, bwd, saved in (("every:1", 348.4, 26.5), ("every:2", 361.1, 24.5))]
    t = pivot(table, rows)
    assert t.headers[:5] == ["checkpoint", "peak MiB", "backward peak MiB",
                             "saved for backward MiB", "optimizer step peak MiB"]
    assert [r[:4] for r in t.rows] == [["every:1", "385.5", "348.4", "26.5"],
                                       ["every:2", "385.5", "361.1", "24.5"]]


def test_fsdp_rows_say_their_optimizer_state_is_sharded_with_the_parameters():
    """An FSDP point runs no sharded optimizer (its setting is none) yet holds 1/N of the
    state: "not sharded" beside its halved optimizer-state column read as a contradiction."""
    opt = Column("optimizer state MiB", "opt_mib", "num")
    rows = [_row(impl=impl, shard_optimizer=shard, metrics={"opt_mib": mib})
            for impl, shard, mib in (("overlap", "none", 2.0), ("overlap", "ours", 1.0),
                                     ("fsdp", "none", 1.0), ("yours-fsdp", "none", 1.0))]
    t = pivot(Pivot("t", "ddp", ("impl", "shard_optimizer"), (opt,)), rows)
    assert [r[:2] for r in t.rows] == [["overlap", "not sharded"], ["overlap", "sharded (ours)"],
                                       ["fsdp", "sharded (FSDP)"],
                                       ["yours-fsdp", "sharded (FSDP)"]]


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_the_sharding_accounting_table_gives_the_peak_at_each_moment(year):
    """optimizer_state_sharding_accounting (a): "report the peak memory usage after model
    initialization, directly before the optimizer step, and directly after". Its table gave
    the bytes live at each moment (86.6 MiB after init where the peak was 150.1)."""
    from cs336sys.handout import problems

    (problem,) = [p for p in problems(year) if p.name == "optimizer_state_sharding_accounting"]
    table = problem.tables[0]
    moments = ("init", "before_opt", "after_opt")
    metrics = {**{f"mem_{m}_bytes": 86 * 2**20 for m in moments},
               **{f"mem_{m}_peak_bytes": 150 * 2**20 for m in moments}}
    t = pivot(table, [_row(impl="overlap", shard_optimizer="none", metrics=metrics)])
    at = [t.headers.index(h) for h in ("peak after init MiB", "peak before step MiB",
                                        "peak after step MiB")]
    assert [t.rows[0][i] for i in at] == ["150.0"] * 3


def test_a_pivot_names_what_its_rows_share_and_the_sdpa_backend_that_ran():
    """The writeup's tables dropped what every row shared: memory_profiling's never named
    the model (the 2025 xl, 1600×48, under an `Asks` line naming the 2026 one), and
    pytorch_attention's batch 1 with 16 heads stood under `batch 8 without heads`. They get
    the report's `Same in every row` line; an SDPA column is named by the backend that ran
    (`sdpa[cudnn]`), as the report's table names it."""
    peak = Column("peak MiB", "peak_bytes", "mib")
    rows = [_row(size="xl", d_model=1600, num_layers=48, seq=s, batch=4, mode=m,
                 precision="fp32", checkpoint="none", metrics={"peak_bytes": 2**20 * s})
            for s in (128, 256) for m in ("forward", "train")]
    t = pivot(Pivot("t", "memory", ("seq",), (peak,), across="mode",
                    where={"precision": "fp32"}), rows,
              ["size", "seq", "batch", "mode", "precision", "checkpoint", "d_model"])
    assert t.constant == "size=xl (1600×48), batch=4, checkpoint=none"
    fwd = Column("forward ms", "fwd_ms", "num")
    rows = [_row(impl=impl, d_head=64, seq=1024, heads=16, batch=1, sdpa_backend=backend,
                 metrics={"fwd_ms": ms, "sdpa_backend_used": used})
            for impl, backend, used, ms in (("triton", None, None, 1.0),
                                            ("sdpa", "auto", "cudnn", 2.0))]
    t = pivot(Pivot("t", "attention", ("d_head", "seq"), (fwd,), across="impl"), rows,
              ["impl", "d_head", "seq", "heads", "batch"])
    assert t.headers == ["d", "seq", "triton", "sdpa[cudnn]"]
    assert t.constant == "heads=16, batch=1"


def test_pivot_says_a_setting_that_differs_between_rows_and_one_implementations_own():
    """A seq that differed between rows without splitting a cell (32 forward, 64 forward-
    backward) was neither a row key nor shared: unsaid. A second SDPA backend split every
    shape into a triton line and an sdpa line, half empty each: the backend names the
    column group, as the report names the implementation."""
    fwd = Column("forward ms", "fwd_ms", "num")
    rows = [_row(size="tiny", mode=mode, seq=seq, metrics={"fwd_ms": ms})
            for mode, seq, ms in (("forward", 32, 1.0), ("forward-backward", 64, 2.0))]
    t = pivot(Pivot("t", "model", ("size", "mode"), (fwd,)), rows, ["size", "mode", "seq"])
    assert t.headers == ["size", "mode", "seq", "forward ms"]
    assert [r[2] for r in t.rows] == ["32", "64"]
    rows = [_row(impl=impl, d_head=64, seq=seq, sdpa_backend=backend, triton_opt_in=opt_in,
                 metrics={"fwd_ms": ms, "sdpa_backend_used": used})
            for seq in (1024, 2048)
            for impl, backend, opt_in, used, ms in (
                ("triton", None, "default", None, 1.0), ("sdpa", "auto", None, "flash", 2.0),
                ("sdpa", "flash", None, "flash", 3.0), ("sdpa", "cudnn", None, "cudnn", 4.0))]
    t = pivot(Pivot("t", "attention", ("d_head", "seq"), (fwd,), across="impl"), rows,
              ["impl", "d_head", "seq"])
    assert t.headers == ["d", "seq", "triton", "sdpa[flash] (sdpa_backend=auto)",
                         "sdpa[flash] (sdpa_backend=flash)", "sdpa[cudnn]"]
    assert t.rows == [["64", "1024", "1", "2", "3", "4"], ["64", "2048", "1", "2", "3", "4"]]


def test_a_switch_on_for_one_implementation_names_its_column_not_a_row():
    """torch_compile (a): the user's attention compiled (`--compile`, its run alone) made
    `compile` a row key: ours `compiled` stood in rows that read `eager`, and the user's
    compiled timings alone on the other lines."""
    fwd = Column("forward ms", "fwd_ms", "num")
    rows = [_row(impl=impl, d_head=16, seq=128, compile=compile,
                 metrics={"fwd_ms": ms, "sdpa_backend_used": None})  # an attention row
            for impl, compile, ms in (("naive", False, 1.0), ("compiled", False, 2.0),
                                      ("yours", False, 3.0), ("yours", True, 4.0))]
    t = pivot(Pivot("t", "attention", ("d_head", "seq"), (fwd,), across="impl"), rows,
              ["impl", "d_head", "seq"])
    assert t.headers == ["d", "seq", "naive", "compiled", "yours", "yours +compile"]
    assert t.rows == [["16", "128", "1", "2", "3", "4"]]


def test_a_setting_that_goes_with_the_column_group_does_not_split_rows():
    """memory_profiling (b), two numbers per context length: the forward's optimizer (none)
    and the training step's (adamw) made the optimizer a row key, and each length two
    lines, half empty. It is said per column group instead."""
    peak = Column("peak MiB", "peak_bytes", "mib")
    rows = [_row(size="tiny", seq=seq, mode=mode, optimizer=opt,
                 metrics={"peak_bytes": 2**20 * (seq + (mode == "train"))})
            for seq in (64, 128) for mode, opt in (("forward", "none"), ("train", "adamw"))]
    t = pivot(Pivot("t", "memory", ("seq",), (peak,), across="mode"), rows,
              ["size", "seq", "mode", "optimizer"])
    assert t.headers == ["seq", "forward", "train"]
    assert t.rows == [["64", "64.0", "65.0"], ["128", "128.0", "129.0"]]
    assert t.constant.endswith("optimizer=none (forward), adamw (train)"), t.constant
    # with the mode a row key, the optimizer goes with the row: a column, no row split
    rows = [{**r, "_settings": {**r["_settings"], "precision": precision}}
            for r in rows for precision in ("fp32", "bf16")]
    t = pivot(Pivot("t", "memory", ("seq", "mode"), (peak,), across="precision"), rows,
              ["size", "seq", "mode", "optimizer", "precision"])
    assert t.headers == ["seq", "mode", "optimizer", "fp32", "bf16"] and len(t.rows) == 4


def test_a_pivot_marks_the_points_the_report_calls_impossible():
    """A point whose backward, timed apart, took longer than forward and backward together
    (a busy machine) is flagged `impossible` in the report; the writeup's pivot showed its
    times bare, a 50x speed-up beside them. Its first cell says so, the note why."""
    from cs336sys.experiments.attention_section import TABLE

    cols = tuple(Column(h, k, "mean_std") for h, k in (("fwd ms", "fwd_ms"), ("e2e ms", "e2e_ms")))
    times = {"fwd_ms_mean": 1.0, "fwd_ms_std": 0.1, "e2e_ms_mean": 3.0, "e2e_ms_std": 0.1}
    rows = [_row(impl="naive", seq=128, metrics={**times, "bwd_ms_p10": 9.0, "e2e_ms_p90": 3.1}),
            _row(impl="naive", seq=256, metrics={**times, "bwd_ms_p10": 2.0, "e2e_ms_p90": 3.1})]
    flags = [c for c in TABLE.columns if c.flag]
    t = pivot(Pivot("t", "attention", ("seq",), cols), rows, ["impl", "seq"], flags)
    assert t.rows[0][1:] == ["1 ± 0.1 (impossible: bwd > e2e)", "3 ± 0.1"]
    assert t.rows[1][1:] == ["1 ± 0.1", "3 ± 0.1"]
    assert "the machine was busy" in t.note
    assert "busy" not in pivot(Pivot("t", "attention", ("seq",), cols), rows[1:], [], flags).note
    # a table of memory alone: the times' flag marked its cells (`2.8 (impossible: ...)`)
    mib = (Column("memory MiB", "mem_before_bwd_bytes", "mib"),)
    for r in rows:
        r["mem_before_bwd_bytes"] = 2**21
    memory = pivot(Pivot("t", "attention", ("seq",), mib), rows, ["impl", "seq"], flags)
    assert memory.rows[0][1:] == ["2.0"] and "busy" not in memory.note


def test_the_method_line_counts_the_samples_the_tables_come_from():
    """`at least 100 timed samples a point` (the --iters asked) stood above cells marked
    (n=1) of the H100 store: do_bench picks its own count, and a point past its budget
    stops short. The line gives the stored counts' range and what was asked."""
    from cs336sys.handout.writeup import method

    inv = {"id": "i", "_status": "ok", "_n": 2, "gpu": "cpu", "gpu_count": 0,
           "git_commit": "abc", "git_dirty": 0}
    rows = [{"created": "2026-12-06", "_settings": {"iters": 100, "warmup": 10},
             "fwd_ms_mean": 1.0, "fwd_ms_n": n, "bwd_ms_mean": None} for n in (1, 66)]
    line = method([inv], {"attention": rows})
    assert "1 to 66 timed samples a point (--iters 100)" in line
    assert "at least" not in line
    # a step's 3 optimizer calls timed alone (opt_ms) beside its 2 timed steps read "2 to 3
    # timed samples a point (--iters 2)": the compared metric's count is the point's
    step = [{"created": "2026-12-07", "_settings": {"iters": 2, "warmup": 1},
             "step_ms_mean": 5.0, "step_ms_n": 2, "opt_ms_mean": 1.0, "opt_ms_n": 3}]
    line = method([inv], {"step": step}, {"step": "step_ms"})
    assert "2 timed samples a point (--iters 2)" in line and "2 to 3" not in line, line
    # attention under do_bench never ran its --warmup (do_bench warms up itself): the line
    # said "10 warm-up steps"
    benched = [{**r, "_settings": {**r["_settings"], "timer": "do-bench"}} for r in rows]
    line = method([inv], {"attention": benched})
    assert "warm-up step" not in line and "do_bench's own warm-up" in line, line


# -- end to end -------------------------------------------------------------------------------

# One problem of each kind of run that starts no model: precision, attention, ranks (comm),
# arithmetic (plan). The model's runs are the other tests' subject (test_cli.py).
SUBSET = ["mixed_precision_accumulation", "pytorch_attention",
          "distributed_communication_single_node", "data_parallel_calcs"]


@pytest.mark.slow
def test_run_resume_status_and_writeup(db_path, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("COLUMNS", "200")  # a problem's status on one line
    r = invoke("handout", "run", *SUBSET, "--db", db_path)
    assert r.exit_code == 0, r.output
    runs = query(db_path, "SELECT i.label, count(*) AS n FROM runs r JOIN invocations i "
                 "ON i.id = r.invocation_id GROUP BY i.label")
    assert {row["label"] for row in runs} == set(SUBSET)
    # each run records its release, which the listing and the writeup of a year read
    assert query(db_path, "SELECT DISTINCT json_extract(env, '$.CS336SYS_HANDOUT') AS h "
                          "FROM invocations") == [{"h": "2026"}]
    before = sum(row["n"] for row in runs)
    # resumed: every measured point is stored ok under its label, so nothing runs again
    r = invoke("handout", "run", *SUBSET[:-1], "--db", db_path)
    assert r.exit_code == 0, r.output
    assert query(db_path, "SELECT count(*) AS n FROM runs")[0]["n"] == before
    # the status
    r = invoke("handout", "--db", db_path)
    for name in SUBSET[:-1]:
        line = next(x for x in r.stdout.splitlines() if x.startswith(name + " "))
        assert "measured" in line and "on cpu (cs336sys's code)" in line and " ok" in line
    assert "computed" in next(x for x in r.stdout.splitlines()
                              if x.startswith("data_parallel_calcs"))
    # the writeup starter
    out = tmp_path / "writeup"
    # with two implementation problems: their notes hold a long identifier and a command
    r = invoke("handout", "report", *SUBSET, "flash_forward", "naive_ddp", "--format",
               "md,tex,typst", "--out", out, "--db", db_path)
    assert r.exit_code == 0, r.output
    md = (out / "writeup.md").read_text()
    for name in SUBSET:
        assert f"## {name} (" in md
    assert "Method: on CPU, no GPU (" in md and "GPU cpu" not in md and "Asks: " in md
    # measured on a CPU: the head and every measured problem say the handout's sizes are owed
    assert "- **Sizes:** cut down for a CPU: the tiny model" in md
    # not a plan, nor the accumulation, whose loops have no size and give one answer anywhere
    assert md.count("_Measured on a CPU at cut-down sizes") == len(SUBSET) - 2
    accumulation = md.split("## mixed_precision_accumulation (")[1].split("\n## ")[0]
    assert "cut-down sizes" not in accumulation
    # the plan's answers are the handout's own sizes on its hardware: not a CPU's, computed
    calcs = md.split("## data_parallel_calcs (")[1].split("\n## ")[0]
    assert "_Method: computed, not measured (cs336sys plan: the hardware's data sheet)" in calcs
    r = invoke("handout", "report", "data_parallel_calcs", "--format", "md", "--out",
               tmp_path / "calcs", "--db", db_path)
    assert r.exit_code == 0 and "**Sizes:**" not in (tmp_path / "calcs" / "writeup.md").read_text()
    # the forward table of pytorch_attention, cell by cell against the stored rows
    stored = query(db_path, "SELECT v.*, r.settings FROM attention_runs v JOIN runs r "
                   "ON r.id = v.run_id WHERE v.label = 'pytorch_attention'")
    p = named(["pytorch_attention"])[0]
    tex = (out / "writeup_tables" / "pytorch_attention-1.tex").read_text()
    for row in stored:
        row["_settings"] = json.loads(row.pop("settings"))
        cell = mean_std(row, "fwd_ms_mean", "fwd_ms_std").replace("±", r"$\pm$")
        assert cell in tex
    # its first line the mark by which a later run knows it for its own
    assert tex.startswith("% generated by cs336sys\n\\begin{tabular}") and r"\toprule" in tex
    assert p.tables[0].title in md
    # the all-reduce table: bytes down, processes across
    typ = (out / "writeup_tables" / "distributed_communication_single_node-1.typ").read_text()
    assert typ.startswith("// generated by cs336sys\n#table(") and '"2 processes"' in typ
    assert '"1MB"' in typ
    _compiles(out)


def test_a_part_is_owed_until_the_combination_its_command_asks_for_is_stored():
    """torch_compile (b) with a compiled forward and an eager training step stored read
    `measured`: each value of --mode and --compile was in some run, the compiled training
    step in none. Every combination a command asks for counts, a flag it leaves out at its
    default where another run of the experiment gives it."""
    from cs336sys.handout.status import Status

    by_name = {p.name: p for p in problems("2026")}
    attention = [("attention", {"impl": i}) for i in ("naive", "compiled")]
    compile_ = by_name["torch_compile"]

    def left(*model):
        return Status(compile_, stored=attention + [("model", s) for s in model]).left()

    assert left({"mode": "forward", "compile": True}, {"mode": "train", "compile": False}) == [
        "(b) model (mode=forward, compile=False)", "(b) model (mode=train, compile=True)"]
    assert left({"mode": "forward", "compile": False}) == [
        "(b) model (mode=train, compile=False)", "(b) model (compile=True)"]
    assert left(*({"mode": m, "compile": c} for m in ("forward", "train")
                  for c in (False, True))) == []
    assert left() == ["(b) model"]
    # missing combinations that are no product of values: each named (they read `(; ; )`)
    memory = Status(by_name["memory_profiling"], stored=[
        ("memory", {"mode": "forward", "precision": "fp32"}),
        ("memory", {"mode": "train", "precision": "bf16"})])
    assert memory.left()[0] == ("(a)-(c) memory (mode=forward, precision=bf16; mode=train, "
                                "precision=fp32)")
    forward = by_name["flash_forward"]  # a check run causal (the default) and --no-causal
    stored = [("attention", {"impl": i, "causal": True}) for i in ("yours-torch", "yours-triton")]
    assert Status(forward, stored=stored).left() == ["attention (causal=False)"]


def test_a_part_measured_on_your_code_is_not_owed_again():
    """--yours runs answer a problem's parts with the user's code: pytorch_attention timed
    assignment 1's attention (impl `yours`), the overlap DDP benchmark the user's DDP. Each
    read "partly measured, not yet: attention (impl=naive)", and the remedy measured ours."""
    from cs336sys.handout.status import Status

    by_name = {p.name: p for p in problems("2026")}
    attention = by_name["pytorch_attention"]
    for impl in ("yours", "naive"):
        assert Status(attention, stored=[("attention", {"impl": impl})]).left() == []
    overlap = by_name["ddp_overlap_individual_parameters_benchmarking"]
    theirs = [("ddp", {"impl": i, "model": "cs336_basics"}) for i in ("naive", "flat", "yours")]
    assert Status(overlap, stored=theirs).left() == []
    # what is missing is named in the words of the code measured: the user's, under --yours
    assert Status(overlap, stored=theirs[:2]).left() == ["(a) ddp (impl=yours)"]
    assert Status(overlap, stored=[("ddp", {"impl": "naive"})]).left() == [
        "(a) ddp (impl=flat,overlap)"]


def test_a_checks_explanation_is_cut_at_a_clause_not_mid_sentence():
    """A DDP's pass read `... max |p - p_ref| 1.2e-07, which …`: cut at 160 characters, the
    reason it passed (the course's tolerance would pass it) was lost. A detail of up to 240
    characters stands whole; a longer one loses whole clauses."""
    from cs336sys.handout.writeup import _clipped

    ddp = ("per parameter |p - p_ref| / |p_ref - p_0| against single-process training, at "
           "most 0.001: worst 1.5e-05 (layers.0.ln2.weight, max |p - p_ref| 1.2e-07, which "
           "the course's test_ddp.py tolerance (atol=1e-08, rtol=1e-05) would pass)")
    assert _clipped(ddp) == ddp
    two = "a" * 150 + "; " + "b" * 150
    assert _clipped(two) == "a" * 150 + " …"
    words = _clipped("word " * 100)
    assert " … " in words and len(words) <= 240
    # 2025's test name made the same clause 250 characters: cut at its end, the verdict was
    # lost; its middle goes instead
    longer = ddp.replace("test_ddp.py", "test_ddp_individual_parameters.py")
    assert len(longer) > 240 and len(_clipped(longer)) <= 240
    assert _clipped(longer).endswith("tolerance (atol=1e-08, rtol=1e-05) would pass)")
    assert _clipped(longer).startswith("per parameter |p - p_ref| / |p_ref - p_0| against ")


def test_the_backward_problems_check_shows_the_gradients_error():
    """flash_backward's verdicts showed the forward's `max err` alone, the figure of
    flash_forward; the course's backward tests judge dQ, dK and dV."""
    from cs336sys.handout.writeup import checks

    row = {"check": "pass", "code": "[]", "status": "ok", "max_err": 4.2e-7,
           "max_err_grad": 2.8e-6, "check_rtol": 1e-2, "check_atol": 1e-2, "gpu": "cpu",
           "_settings": {"d_head": 32}}
    (line,) = checks({"attention": [row]}).rows
    assert line[4] == "max err 4.2e-07, max grad err 2.8e-06"


def test_a_check_says_which_of_your_code_passed_and_what_its_points_share():
    """flash_forward's verdicts read `d_head=32 pass`, `d_head=64 pass`: which kernel passed
    (yours-torch; yours-triton was skipped) and at which sequence and pass were left out."""
    from cs336sys.handout.writeup import checks

    def row(d):
        return {"check": "pass", "code": "[]", "status": "ok", "max_err": 4.2e-7, "gpu": "cpu",
                "_settings": {"impl": "yours-torch", "seq": 128, "d_head": d, "batch": 4,
                              "causal": True, "passes": "forward", "iters": 3}}

    t = checks({"attention": [row(32), row(64)]})
    assert [line[1] for line in t.rows] == ["impl=yours-torch d_head=32",
                                            "impl=yours-torch d_head=64"]
    assert t.constant == "seq=128, batch=4, causal=yes, passes=forward"


def _compiles(out):
    """writeup.typ through Typst and writeup.tex through pdflatex, where present."""
    try:
        import typst
    except ImportError:
        typst = None
    if typst is not None:
        assert typst.compile(str(out / "writeup.typ"))[:4] == b"%PDF"
    if shutil.which("pdflatex"):
        done = subprocess.run(["pdflatex", "-interaction=nonstopmode", "-halt-on-error",
                               "writeup.tex"], cwd=out, capture_output=True, text=True,
                              timeout=120)
        assert done.returncode == 0, done.stdout[-2000:]
        # nothing runs into the margin (a long identifier, a typewriter command in a note)
        assert "Overfull \\hbox" not in done.stdout, done.stdout[-2000:]
    if typst is None and not shutil.which("pdflatex"):
        pytest.skip("neither Typst nor pdflatex to compile the writeup with")


def test_a_signal_in_one_command_stops_the_run(db_path, monkeypatch):
    """Ctrl-C during a command ends the whole run with 130 and a line that says how to go
    on, never the next command (it would be interrupted at once)."""
    import signal

    from cs336sys.cli import handout as cli_handout
    from cs336sys.sweep import stopping

    ran = []

    def interrupted(root, args):
        if "--dry-run" in args:  # the check of every command before any runs
            return 0
        ran.append(args[0])
        stopping._received.append(signal.SIGINT)  # what the command's handler remembers
        return 130

    monkeypatch.setattr(cli_handout, "_invoke", interrupted)
    r = invoke("handout", "run", "benchmarking_script", "--db", db_path)
    assert r.exit_code == 130 and ran == ["model"]
    assert "handout run stopped at benchmarking_script" in r.stderr


def test_a_signal_after_a_command_ends_the_run_with_what_it_stored(db_path, monkeypatch):
    """Ctrl-C that lands once a command has stored its points (as it prints its tables, or
    between commands): the run's last line counts the points the run stored, and nobody
    else has to say "stored nothing"."""
    import signal

    from cs336sys.cli import handout as cli_handout
    from cs336sys.sweep import stopping

    real = cli_handout._invoke

    def then_interrupted(root, args):
        code = real(root, args)
        if "--dry-run" not in args:
            stopping._received.append(signal.SIGINT)
        return code

    monkeypatch.setattr(cli_handout, "_invoke", then_interrupted)
    r = invoke("handout", "run", "mixed_precision_accumulation", "--db", db_path)
    stored = len(query(db_path, "SELECT id FROM runs"))
    assert r.exit_code == 130 and stored == 4, r.output
    assert r.stderr.strip().splitlines()[-1].startswith(
        f"handout run stopped at mixed_precision_accumulation: 4 point(s) stored in {db_path} "
        "by this run;")
    assert stopping.untold() is None


def test_a_sigterm_that_ends_a_command_is_the_runs_exit_code_not_its_exception():
    """SIGTERM ends a command by raising (the command stores its point, says so and lets it
    through); the run takes it as that command's end, 143, and says what the run stored."""
    import signal

    from cs336sys.cli import handout as cli_handout
    from cs336sys.sweep import stopping

    class Terminated:
        def main(self, **kw):
            stopping._received.append(signal.SIGTERM)
            raise stopping.Terminated("terminated by signal 15 (SIGTERM)")

    assert cli_handout._invoke(Terminated(), ["model"]) == 143


def test_a_command_that_would_refuse_stops_the_run_before_anything_is_measured(
        db_path, tmp_path, monkeypatch):
    """--yours where no adapters file can be found: every command's points are built first,
    so the run ends at once with the refusal's line (exit 2), not after measuring the
    commands before it; nothing is written."""
    monkeypatch.chdir(tmp_path)  # no checkout here, so no tests/adapters.py
    monkeypatch.delenv("CS336SYS_ADAPTERS", raising=False)
    # a dry run too: it printed each command's refusal and went on (4 lines, exit 1)
    for dry in ([], ["--dry-run"]):
        r = invoke("handout", "run", "flash_benchmarking", "--yours", *dry, "--db", db_path)
        assert r.exit_code == 2, r.output
        assert r.stderr.strip().splitlines() == [
            "Error: nothing was run: flash_benchmarking: --attention yours-torch: yours-torch "
            "needs an adapters file: give --adapters PATH, set CS336SYS_ADAPTERS, or run from "
            "a checkout with tests/adapters.py at its top"]
        assert "[1/1]" not in r.stdout and not db_path.exists()


def _gpus(monkeypatch, n: int) -> None:
    """This process sees `n` GPUs: nvidia-smi's answer and torch's count (nothing runs on
    them: the tests below stop at the dry run or at the commands' checks)."""
    import torch

    from cs336sys.cli import handout as cli_handout

    monkeypatch.setattr(cli_handout, "_on_gpu", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: n)


def test_world_sizes_are_cut_to_the_gpus_and_the_rest_named(db_path, monkeypatch):
    """The handout's 2, 4 and 6 processes on a host with 4 GPUs: the all-reduce runs at 2 and
    4, and world size 6 is named as owed. It refused the whole run before."""
    _gpus(monkeypatch, 4)
    r = invoke("handout", "run", "distributed_communication_single_node", "--dry-run",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    assert "$ cs336sys comm --op all-reduce --bytes 1MB,10MB,100MB,1GB --world-size 2,4\n" \
        in r.stdout
    assert " ".join(r.stdout.split()).startswith(
        "Left for a host with more GPUs: distributed_communication_single_node: world size 6 "
        "needs as many GPUs, one per rank; this host has 4 (run at 2,4).")
    assert "dry run: 8 point(s)" in r.stdout and not db_path.exists()


def test_gloo_keeps_its_processes_where_nccl_is_cut_to_the_gpus(db_path, monkeypatch):
    """2025's all-reduce runs Gloo on the CPU and NCCL on the GPUs, at 2, 4 and 6 processes:
    on 4 GPUs Gloo keeps 6 (it was cut with NCCL, and its 6 went unmeasured). A run whose
    every command needs more GPUs is one line, dry or not (a dry one was a traceback)."""
    from cs336sys.cli import handout as cli_handout

    (problem,) = named(["distributed_communication_single_node"], "2025")
    todo = [(problem, a) for a in cli_handout._commands(problem, on_gpu=True)]
    kept, short = fitted(todo, 4)
    assert [(a[a.index("--backend") + 1], a[a.index("--world-size") + 1]) for _, a in kept] \
        == [("gloo", "2,4,6"), ("nccl", "2,4")]
    assert short == ["distributed_communication_single_node: world size 6 needs as many GPUs, "
                     "one per rank; this host has 4 (run at 2,4)"]
    kept, _ = fitted(todo, 1)
    assert [a[a.index("--backend") + 1] for _, a in kept] == ["gloo"]
    _gpus(monkeypatch, 1)
    r = invoke("handout", "run", "distributed_communication_single_node", "--dry-run",
               "--db", db_path)
    assert r.exit_code == 2 and "Traceback" not in r.output
    assert r.stderr.strip().splitlines() == [
        "Error: nothing was run: distributed_communication_single_node: world size 2,4,6 needs "
        "as many GPUs, one per rank; this host has 1"]


def test_a_command_this_host_has_too_few_gpus_for_is_left_out_not_fatal(db_path, monkeypatch):
    """One GPU: the two-GPU DDP step cannot run, and the all-reduce at 2, 4 and 6 processes
    neither; the accumulation problem still runs, and the two left out are named first."""
    from cs336sys.cli import handout as cli_handout

    _gpus(monkeypatch, 1)
    checked, ran = [], []
    real = cli_handout._invoke

    def invoked(root, args):
        if "--dry-run" in args:
            checked.append(args[0])
            return real(root, args)
        ran.append(args[0])
        return 0

    monkeypatch.setattr(cli_handout, "_invoke", invoked)
    r = invoke("handout", "run", "mixed_precision_accumulation", "naive_ddp_benchmarking",
               "distributed_communication_single_node", "--db", db_path)
    assert r.exit_code == 0, r.output
    assert checked == ["precision", "ddp"] and ran == ["precision"]
    said = " ".join(r.stdout.split())
    assert "Left for a host with more GPUs: distributed_communication_single_node: world size " \
        "2,4,6 needs as many GPUs, one per rank; this host has 1." in said
    assert "Left for a host with more GPUs: naive_ddp_benchmarking: --world-size: world size 2 " \
        "needs 2 GPUs for NCCL (one per rank); this host has 1." in said
    # with nothing left that this host runs, nothing runs: one line, exit 2
    r = invoke("handout", "run", "naive_ddp_benchmarking", "distributed_communication_single_node",
               "--db", db_path)
    assert r.exit_code == 2 and ran == ["precision"]
    assert r.stderr.strip().splitlines() == [
        "Error: nothing was run: distributed_communication_single_node: world size 2,4,6 needs "
        "as many GPUs, one per rank; this host has 1 (and 1 more)"]


def test_a_signal_while_the_commands_are_checked_stops_before_any_is_measured(db_path,
                                                                              monkeypatch):
    import signal

    from cs336sys.cli import handout as cli_handout
    from cs336sys.sweep import stopping

    checked = []

    def interrupted(root, args):
        checked.append("--dry-run" in args)
        stopping._received.append(signal.SIGINT)
        return 130

    monkeypatch.setattr(cli_handout, "_invoke", interrupted)
    r = invoke("handout", "run", "benchmarking_script", "--db", db_path)
    assert r.exit_code == 130 and checked == [True]
    assert "while checking the commands: nothing was stored" in r.stderr


@pytest.mark.parametrize("year", ["2026", "2025"])
def test_every_plan_command_computes(db_path, year):
    """--dry-run does not run plan (arithmetic, no estimate): every accounting command of
    the release is run here instead, each ending ok and storing every point it asks for ok
    (2025's communication_accounting asked for FSDP x TP 16x4 at N = 1, 16 and 32 and stored
    three skipped rows, each a row of `skipped` cells in the writeup)."""
    commands = [run.args(False) for p in problems(year) for run in p.runs
                if run.experiment == "plan"]
    assert commands
    for args in commands:
        r = invoke(*args, "--db", db_path)
        assert r.exit_code == 0, (args, r.output)
    statuses = [r["status"] for r in query(db_path, "SELECT status FROM runs")]
    assert statuses and set(statuses) == {"ok"}, statuses


def test_a_writeup_before_any_run_says_what_is_left_and_that_nothing_is_selected(
        db_path, tmp_path):
    """The starter of an empty store: no `Runs by status: (in 0 invocations)`, and each
    measured problem's commands, to copy: code in every format, not escaped backticks
    (markdown), literal ones (HTML) or quotes and en dashes (LaTeX)."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    Store(db_path, EXPERIMENTS).close()
    r = invoke("handout", "report", "benchmarking_script", "--format", "md,html,tex,typst",
               "--out", tmp_path / "w", "--db", db_path)
    assert r.exit_code == 0, r.output
    written = {ext: (tmp_path / "w" / f"writeup.{ext}").read_text() for ext in ("md", "html", "tex", "typ")}
    assert "- **Runs by status:** none selected\n" in written["md"]
    # the commands as handout run runs them, labelled, so that they count for the problem
    assert ("_Not yet measured: `cs336sys handout run benchmarking_script` runs "
            "`cs336sys model --size tiny ") in written["md"]
    assert "(by hand, each with `--label benchmarking_script`)._" in written["md"]
    assert "runs <code>cs336sys model --size tiny " in written["html"]
    assert "{\\raggedright Not yet measured: \\texttt{cs336sys handout run benchmarking" in \
        written["tex"] and " runs \\texttt{cs336sys model --size tiny " in written["tex"]
    assert ('#raw("cs336sys model ")#box(raw("--size"))#raw(" tiny '
            in written["typ"])  # each option a box: Typst breaks after a hyphen
    assert "`" not in written["tex"] and "`" not in written["typ"]
    r = invoke("handout", "report", "data_parallel_calcs", "--format", "md", "--out",
               tmp_path / "c", "--db", db_path)
    assert "_Not yet computed: `cs336sys handout run data_parallel_calcs` runs `cs336sys plan " \
        in (tmp_path / "c" / "writeup.md").read_text()


def test_a_writeup_the_student_has_written_in_is_not_replaced(db_path, tmp_path):
    """The starter is for the student's answers: a second `handout report` replaced a
    writeup.md with an answer appended, and a writeup.tex edited inside, without a word.
    Each document ends with the sha256 of its text; one that no longer matches (or has text
    after it) is refused as a file cs336sys did not write, unless --force; an untouched one,
    and a table file beside it, are replaced as before."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    Store(db_path, EXPERIMENTS).close()
    out = tmp_path / "w"
    args = ["handout", "report", "benchmarking_script", "--format", "md,tex,typst,html",
            "--out", out, "--db", db_path]
    assert invoke(*args).exit_code == 0
    assert invoke(*args).exit_code == 0  # untouched: replaced
    for name, edit in (("writeup.md", lambda t: t + "\nMy answer: the backward is 2x.\n"),
                       ("writeup.tex", lambda t: t.replace("\\maketitle", "\\maketitle\nMine.")),
                       ("writeup.typ", lambda t: t.replace("#set text", "Mine.\n#set text")),
                       ("writeup.html", lambda t: t.replace("<h1>", "<p>Mine.</p><h1>")),
                       # saved by an editor that writes CRLF, or drops the last newline
                       ("writeup.md", lambda t: (t + "Mine.\n").replace("\n", "\r\n")),
                       ("writeup.tex", lambda t: (t + "Mine.").rstrip("\n")),
                       ("writeup.typ", lambda t: t.rstrip("\n") + " Mine.")):
        path = out / name
        before = path.read_text()
        path.write_text(edit(before))
        r = invoke(*args)
        assert r.exit_code == 2, (name, r.output)
        assert r.stderr.strip() == (f"Error: --out: {path} is a file cs336sys wrote and someone "
                                    "has edited since; writing would replace it (--force "
                                    "replaces it)"), r.stderr
        assert path.read_bytes() == edit(before).encode()  # nothing written
        assert invoke(*args, "--force").exit_code == 0 and path.read_text() == before


@pytest.mark.parametrize("year", ["2025", "2026"])
def test_every_problems_notes_fit_the_page_before_any_run(db_path, tmp_path, year):
    """Each problem's commands and the checks of the implementation problems, typeset:
    the 2025 starter's `cs336sys ddp --impl yours-individual --world-size 2` ran 13 pt into
    the margin of an indented paragraph."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    Store(db_path, EXPERIMENTS).close()
    r = invoke("handout", "report", "--year", year, "--format", "tex,typst", "--out",
               tmp_path / "w", "--db", db_path)
    assert r.exit_code == 0, r.output
    assert "--impl yours" in (tmp_path / "w" / "writeup.tex").read_text()
    _compiles(tmp_path / "w")


def test_the_profile_writeup_has_the_attention_parts_and_each_points_top_kernels(
        db_path, tmp_path):
    """nsys_profile asks for the kernels that take the most and the attention's parts: the
    writeup has the tables the report has (kernel_stats included), not only the points'."""
    r = invoke("profile", "attention", "--impl", "naive", "--seq", "16", "--d-head", "16",
               "--batch", "1", "--warmup", "1", "--iters", "1", "--label", "nsys_profile",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    r = invoke("handout", "report", "nsys_profile", "--format", "md", "--out", tmp_path / "w",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    md = (tmp_path / "w" / "writeup.md").read_text()
    top = "Top ops: attention naive seq=16 d=16 fp32 (CPU self time)"
    for title in ("Profiled points", "Attention's parts in the forward", top):
        assert f"**{title}" in md
    assert f"![{top}](writeup_files/nsys_profile-profile-top-0.png)" in md
    assert "| forward | 1 | aten::" in md  # the top kernel's row
    # as the writeup's other tables, no `n` (how often the point was stored)
    head = md.split("**Profiled points", 1)[1].split("\n|", 1)[1].splitlines()[0]
    assert "| n |" not in f"|{head}" and head.count("|") > 2


def test_run_yours_takes_the_adapters_file_for_every_command_it_runs(db_path, tmp_path,
                                                                     monkeypatch):
    """`handout run --yours --adapters PATH` from outside the course checkout: each command
    it runs reads the file as its own --adapters (it said "give --adapters PATH", an option
    handout run did not take); the environment is as it was afterwards."""
    from tests.user_repos import course_repo

    adapters = course_repo(tmp_path / "repo") / "tests" / "adapters.py"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    monkeypatch.delenv("CS336SYS_ADAPTERS", raising=False)
    args = ["handout", "run", "flash_benchmarking", "--yours", "--dry-run", "--db", db_path]
    assert invoke(*args).exit_code != 0  # no adapters file found from here
    r = invoke(*args, "--adapters", adapters)
    assert r.exit_code == 0, r.output
    assert "yours-torch" in r.output and "dry run: 8 point(s)" in r.output
    assert "CS336SYS_ADAPTERS" not in os.environ


def test_an_implementation_problems_writeup_has_the_verdicts_of_your_code(db_path, tmp_path,
                                                                          monkeypatch):
    """flash_forward checked by cs336sys: the writeup shows each checked point, its verdict
    and the figure it was judged by, not only a method line."""
    from tests.user_repos import course_repo

    monkeypatch.chdir(course_repo(tmp_path / "repo"))
    r = invoke("attention", "--impl", "yours-torch,naive", "--pass", "forward", "--seq", "16",
               "--d-head", "16", "--batch", "1", "--warmup", "0", "--iters", "1", "--label",
               "flash_forward", "--db", db_path)
    assert r.exit_code == 0, r.output
    r = invoke("handout", "report", "flash_forward", "--format", "md", "--out", tmp_path / "w",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    md = (tmp_path / "w" / "writeup.md").read_text()
    assert "**Checks of your code**" in md
    (row,) = [ln for ln in md.splitlines() if ln.startswith("| attention |")]
    assert "| ok | pass | max err " in row and "float64 reference" in row
    assert "naive" not in row  # ours is the reference, not a verdict on the user's code


def test_each_release_counts_its_own_runs_of_a_problem_both_name(db_path):
    """benchmarking_script is a problem of 2025 and of 2026: the 2025 listing and writeup
    counted (and tabled) the 2026 runs, and the other way round. A run records its release
    (handout run sets CS336SYS_HANDOUT); one that records none counts for either."""
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.handout.status import statuses
    from cs336sys.report.select import Selection, load
    from cs336sys.store import Store
    from cs336sys.store.db import connect_readonly

    with Store(db_path, EXPERIMENTS) as s:
        for env, seq in (('{"CS336SYS_HANDOUT": "2025"}', 8), ('{"CS336SYS_HANDOUT": "2026"}', 16),
                         (None, 32)):
            inv = s.begin_invocation({"gpu": "cpu", "env": env}, [], "model",
                                     label="benchmarking_script")
            s.add_run(inv, "model", "ok", {"size": "tiny", "seq": seq}, {"fwd_ms_mean": 1.0})
    conn = connect_readonly(db_path, lambda: EXPERIMENTS)
    for year, seqs in (("2025", {8, 32}), ("2026", {16, 32})):
        (status,) = statuses(conn, named(["benchmarking_script"], year), year)
        assert {s["seq"] for _, s in status.stored} == seqs, year
        rows = load(conn, Selection(label="benchmarking_script", handout=year), EXPERIMENTS)
        assert {r["_settings"]["seq"] for r in rows["model"]} == seqs, year


def test_a_2025_adapters_file_under_the_2026_problems_is_told_the_year(db_path, tmp_path,
                                                                       monkeypatch):
    """A 2025 checkout ran `handout run --all --yours` without --year: refused for "has no
    get_ddp()", a function its handout never asked for. It is told to give --year 2025."""
    from tests.user_repos import course_repo

    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    adapters = repo / "tests" / "adapters.py"
    text = adapters.read_text().replace("def get_ddp(", "def get_ddp_individual_parameters(")
    adapters.write_text(text.replace("def get_fsdp(", "def get_fsdp_unused("))
    r = invoke("handout", "run", "--all", "--yours", "--db", db_path)
    assert r.exit_code == 2 and not db_path.exists()
    assert r.stderr.strip().splitlines() == [
        f"Error: --yours: {adapters.resolve()} has the 2025 handout's DDP functions, and these "
        "are the 2026 handout's problems: give --year 2025"]


def test_an_implementation_with_one_check_or_two_says_so_in_the_listing():
    from cs336sys.handout.status import Status

    by_name = {p.name: p for p in problems("2026")}
    assert Status(by_name["naive_ddp"], stored=[]).line() == (
        "your implementation: the course's tests check it; cs336sys checks it with the "
        "command below")
    assert Status(by_name["flash_forward"], stored=[]).line().endswith("with the commands below")


def test_a_run_by_hand_with_handout_2025_counts_for_2025_alone(tmp_path, monkeypatch):
    """`model --handout 2025 --label benchmarking_script`, as the 2025 listing prints it,
    recorded no release: it counted for 2026's benchmarking_script too."""
    monkeypatch.delenv("CS336SYS_HANDOUT", raising=False)
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "8", "--mode", "forward", "--warmup", "0",
                    "--iters", "1", "--handout", "2025", "--label", "benchmarking_script",
                    "--db", db)
    assert result.exit_code == 0, result.output
    assert "CS336SYS_HANDOUT" not in os.environ  # for the command alone
    listing = {year: invoke("handout", "--year", year, "--db", db).stdout
               for year in ("2025", "2026")}
    assert "benchmarking_script (4 pts" in listing["2026"]
    line = next(ln for ln in listing["2026"].splitlines() if ln.startswith("benchmarking_script"))
    assert "not yet measured" in line, line
    line = next(ln for ln in listing["2025"].splitlines() if ln.startswith("benchmarking_script"))
    assert "not yet measured" not in line, line


def test_a_pass_against_non_causal_attention_says_so_in_the_writeup():
    """A PyTorch FlashAttention checked non-causal (the handout lets it ignore is_causal):
    the command's table read `pass (non-causal)`, the writeup a bare `pass` beside "at this
    causal point O off by up to 2.82", its explanation cut at 160 characters."""
    from cs336sys.attention.diagnosis import CHECKED_AS_THE_COURSE
    from cs336sys.handout.writeup import checks

    row = {"status": "ok", "check": "pass", "code": '{"flash.py": "0f"}', "gpu": None,
           "not_compared": CHECKED_AS_THE_COURSE, "max_err": 2.6e-07, "error": None,
           "check_detail": "at this causal point O off by up to 2.82 " + "x" * 200,
           "_settings": {"impl": "yours-torch", "causal": True, "seq": 128}}
    table = checks({"attention": [row]})
    ((_, _, status, verdict, _, what),) = table.rows
    assert (status, verdict) == ("ok", "pass (non-causal)")
    assert what.startswith("checked non-causal, as the course's tests check"), what


def test_an_optimizer_that_shards_nothing_is_not_called_sharded_in_the_writeup():
    """Every rank stepping every parameter passes the course's sharded-optimizer test; ddp's
    table flags it NOT SHARDED, the writeup's accounting row read `sharded (yours)`."""
    from cs336sys.handout.pivot import _row_cell

    row = {"_settings": {"shard_optimizer": "yours", "impl": "overlap"}}
    assert _row_cell("shard_optimizer", row) == "sharded (yours)"
    row["not_sharded"] = "rank 0 holds 100 % of the optimizer state"
    assert _row_cell("shard_optimizer", row) == "sharded (yours): NOT SHARDED"


def test_a_writeup_of_problems_measured_alike_anywhere_says_no_size_was_cut(db_path, tmp_path):
    """mixed_precision_accumulation runs the handout's own four loops, on a CPU as on a GPU:
    its writeup's head said the figures were cut down for a CPU and "answer nothing the
    handout asks"."""
    r = invoke("precision", "accumulate", "--label", "mixed_precision_accumulation",
               "--db", db_path)
    assert r.exit_code == 0, r.output
    out = tmp_path / "w"
    r = invoke("handout", "report", "mixed_precision_accumulation", "--format", "md",
               "--out", out, "--db", db_path)
    assert r.exit_code == 0, r.output
    md = (out / "writeup.md").read_text()
    assert "mixed_precision_accumulation" in md and "cut down for a CPU" not in md, md[:1500]


@pytest.mark.parametrize("year", ["2025", "2026"])
def test_a_command_a_note_prints_counts_for_its_problem(year):
    """docs/handout.md: printed commands carry `--label PROBLEM` "so that run as printed it
    counts for the problem"; 2025's note on the Gloo half of the all-reduce benchmark gave
    one without, whose runs counted for no problem."""
    for problem in problems(year):
        for run in problem.runs:
            for command in re.findall(r"`(cs336sys [^`]+)`", run.cpu_note):
                assert f"--label {problem.name}" in command, (problem.name, command)
