"""The user's own code, found through a course-layout adapters file and measured beside ours:
the adapters file read and imported, attention kernels checked against float64 and timed,
wrong / raising / unfinished code stored as such, provenance of the user's repository."""

from __future__ import annotations

import hashlib
import json

import pytest

from cs336sys import yours
from tests.conftest import invoke, query
from tests.user_repos import ADAPTERS_2025, course_repo, edit, git, line_of

FLASH = "cs336_systems/flash_attention.py"
SMALL = ["--seq", "32,64", "--d-head", "16", "--batch", "1", "--heads", "2", "--warmup", "1",
         "--iters", "2", "--device", "cpu"]


def runs(db):
    return query(db, "SELECT * FROM attention_runs ORDER BY created")


# -- the adapters file --------------------------------------------------------------------


def test_what_an_adapters_file_implements_is_read_without_importing_it():
    source = '''
def done():
    return 1

def todo():
    """Docstring."""
    raise NotImplementedError

def todo_with_message():
    raise NotImplementedError("next week")

def started():
    x = 1
    raise NotImplementedError

def no_op_hook(model, optimizer):
    pass

def raises_something_else():
    raise ValueError
'''
    found = yours.adapters.implemented_functions(source)
    assert found == {"done": True, "todo": False, "todo_with_message": False, "started": True,
                     "no_op_hook": True, "raises_something_else": True}


def test_the_adapters_file_at_the_top_of_the_checkout_is_found_and_summarised(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo / "cs336_systems")  # anywhere inside the checkout
    found = yours.use()
    assert found.path == (repo / "tests" / "adapters.py").resolve()
    assert found.generation == "2026"
    summary = found.summary()
    assert "found at the top of this checkout" in summary
    assert "implemented: yours-torch, yours, --shard-optimizer yours" in summary
    assert "not implemented: yours-triton, yours-fsdp" in summary
    monkeypatch.chdir(tmp_path)  # outside any checkout: nothing
    assert yours.use() is None


def test_the_2025_generation_is_understood(tmp_path):
    repo = course_repo(tmp_path, files={"tests/adapters.py": ADAPTERS_2025})
    found = yours.use(repo / "tests" / "adapters.py")
    assert found.generation == "2025"
    assert "implemented: yours-torch, yours-individual, yours-bucketed;" in found.summary()
    assert "not implemented: yours-triton, --shard-optimizer yours" in found.summary()


@pytest.mark.parametrize(
    "source, expected",
    [
        ("def get_ddp(module:\n    pass\n", "tests/adapters.py:1: SyntaxError"),
        ("import cs336_nothing_here\n", "ModuleNotFoundError: No module named 'cs336_nothing_here'"),
        ("x = 1\nraise RuntimeError('half-saved file')\n",
         "tests/adapters.py:2: RuntimeError: half-saved file"),
    ],
    ids=["syntax-error", "import-error", "raises-at-import"],
)
def test_an_adapters_file_that_does_not_import_is_one_line_and_exit_2(tmp_path, monkeypatch, source, expected):
    repo = course_repo(tmp_path, files={"tests/adapters.py": source})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and expected in lines[0], result.stderr
    assert not db.exists()
    # found, not named, it stops only what asks for its implementations: a student halfway
    # through editing it still measures cs336sys's (the syntax error stopped every command)
    yours.forget()  # as a new process: the refused command named it for its ranks
    result = invoke("attention", "--impl", "naive", *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    # named with --adapters, it is refused whatever the command measures (it was ignored,
    # the point stored ok, the adapters column empty)
    yours.forget()
    result = invoke("attention", "--impl", "naive", *SMALL, "--db", tmp_path / "named.db",
                    "--adapters", repo / "tests" / "adapters.py")
    assert result.exit_code == 2 and expected in result.stderr, result.output
    assert not (tmp_path / "named.db").exists()


def test_a_missing_adapters_path_and_a_missing_function_are_refused(tmp_path, monkeypatch):
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db,
                    "--adapters", tmp_path / "nope.py")
    assert result.exit_code == 2 and "--adapters " in result.stderr \
        and "nope.py: no such file" in result.stderr
    # set in the environment, the variable is named: the user may not know it is set
    monkeypatch.setenv("CS336SYS_ADAPTERS", str(tmp_path / "nope.py"))
    result = invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert result.exit_code == 2 and f"CS336SYS_ADAPTERS={tmp_path / 'nope.py'}: no such file" \
        in result.stderr, result.stderr
    monkeypatch.delenv("CS336SYS_ADAPTERS")
    monkeypatch.chdir(tmp_path)  # no checkout, no adapters: the name cannot run
    result = invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert result.exit_code == 2 and "needs an adapters file" in result.stderr
    repo = course_repo(tmp_path, files={"tests/adapters.py": "def get_ddp(module):\n    return module\n"})
    monkeypatch.chdir(repo)
    result = invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert result.exit_code == 2
    assert "has no get_flashattention_autograd_function_pytorch()" in result.stderr
    assert not db.exists()


# -- attention: checked, then timed ---------------------------------------------------------


def test_your_kernel_is_measured_beside_ours_with_its_provenance(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch,naive,yours-triton", *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    assert "adapters: tests/adapters.py (found at the top of this checkout" in result.stderr
    rows = runs(db)
    by = {(r["impl"], r["seq"]): r for r in rows}
    for seq in (32, 64):
        mine = by["yours-torch", seq]
        assert mine["status"] == "ok" and mine["check"] == "pass"
        assert mine["max_err"] < 1e-5 and mine["max_err_grad"] < 1e-5  # fp32 against float64
        assert mine["e2e_ms_mean"] > 0
        code = json.loads(mine["code"])
        for path in ("tests/adapters.py", FLASH):
            assert code[path] == hashlib.sha256((repo / path).read_bytes()).hexdigest()
        skipped = by["yours-triton", seq]
        assert skipped["status"] == "skipped"
        assert skipped["error"] == ("get_flashattention_autograd_function_triton is not "
                                    "implemented in tests/adapters.py")
    assert "skipped: impl=yours-triton seq=32: get_flashattention_autograd_function_triton" in result.stdout
    inv = query(db, "SELECT * FROM invocations")[0]
    assert inv["user_commit"] == git(repo, "rev-parse", "HEAD") and inv["user_dirty"] == 0
    assert inv["user_repo"] == str(repo.resolve())
    assert inv["adapters_sha256"] == hashlib.sha256((repo / "tests/adapters.py").read_bytes()).hexdigest()
    assert "CS336SYS_ADAPTERS" not in (inv["env"] or "")  # a path, recorded in its own column
    # ours, in the same run, records no user code
    assert by["naive", 32]["code"] is None and by["naive", 32]["check"] == "pass"


def test_a_dirty_tree_is_recorded(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "TILE_Q = 32", "TILE_Q = 16")  # not committed
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    assert invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db).exit_code == 0
    assert query(db, "SELECT user_dirty FROM invocations")[0]["user_dirty"] == 1
    assert {r["user_dirty"] for r in runs(db)} == {1}


def test_resume_measures_again_after_an_edit_not_committed(tmp_path, monkeypatch):
    """`handout run` always resumes: a kernel edited and not committed kept its earlier `ok`
    (a scale of 1/d read "4 ok" while the course's test failed it). The uncommitted Python
    code's sha256 is part of what --resume matches; the same edit again is skipped, and a
    store or report written inside the checkout changes nothing."""
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = repo / "db" / "results.db"  # inside the checkout, untracked: not code
    args = ["attention", "--impl", "yours-torch", *SMALL, "--pass", "forward", "--resume",
            "--db", db]
    assert invoke(*args).exit_code == 0
    assert "skipping 2 point(s)" in invoke(*args).stderr
    edit(repo, FLASH, "scale = 1.0 / math.sqrt(d)", "scale = 1.0 / d")  # not committed
    result = invoke(*args)
    assert "skipping" not in result.stderr, result.stderr
    assert [r["status"] for r in runs(db)][-2:] == ["wrong", "wrong"]
    # put back: its ok rows match the code again, but the latest rows, which `handout` and
    # the writeup show, are the edit's `wrong`: measured again, not left reading them
    edit(repo, FLASH, "scale = 1.0 / d", "scale = 1.0 / math.sqrt(d)")
    assert "skipping" not in invoke(*args).stderr
    assert [r["status"] for r in runs(db)][-2:] == ["ok", "ok"]
    assert "skipping 2 point(s)" in invoke(*args).stderr
    edit(repo, FLASH, "scale = 1.0 / math.sqrt(d)\n", "scale = 1.0 / math.sqrt(d) + 0.0\n")
    assert "skipping" not in invoke(*args).stderr
    assert "skipping 2 point(s)" in invoke(*args).stderr  # the same uncommitted code
    (repo / "notes.py").write_text("x = 1\n")  # a new file of code, not committed
    assert "skipping" not in invoke(*args).stderr
    changes = [i["user_changes"] for i in query(
        db, "SELECT user_changes FROM invocations ORDER BY started")]
    assert changes[0] is None and len({c for c in changes[2:] if c}) == 3, changes


@pytest.mark.parametrize("where", ["no git", "no commit"])
def test_resume_measures_again_after_an_edit_without_a_commit_to_compare(tmp_path, monkeypatch,
                                                                       where):
    """Outside git, or in a checkout with no commit yet, there is no diff to fingerprint:
    each stored point's files (its `code`, with their sha256) are read again, and a point
    whose kernel file changed is measured again (it kept its `ok`)."""
    import shutil

    from tests.user_repos import EXAMPLE

    repo = tmp_path / "repo"
    shutil.copytree(EXAMPLE, repo, ignore=shutil.ignore_patterns("__pycache__"))
    if where == "no commit":
        git(repo, "init", "-q")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    args = ["attention", "--impl", "yours-torch", *SMALL, "--pass", "forward", "--resume",
            "--adapters", repo / "tests" / "adapters.py", "--db", db]
    assert invoke(*args).exit_code == 0
    assert "skipping 2 point(s)" in invoke(*args).stderr
    edit(repo, FLASH, "scale = 1.0 / math.sqrt(d)", "scale = 1.0 / d")
    assert "skipping" not in invoke(*args).stderr
    assert [r["status"] for r in runs(db)][-2:] == ["wrong", "wrong"]
    # the report's header says the code had no commit, not "at (no git)"
    assert invoke("report", "--db", db, "--out", tmp_path / "rep").exit_code == 0
    header = (tmp_path / "rep" / "report.md").read_text()
    assert f"{repo}, not committed, adapters adapters.py" in header, header[:2000]


def test_a_mask_on_whole_tiles_is_named_and_its_consistent_l_not_blamed():
    """A Triton kernel that walks the key tiles up to the diagonal and never masks inside
    the diagonal one failed with figures alone, and its L, right for the mask it used, was
    said not to be m + log l (as if L's formula were wrong). The mask is named, L is not;
    an L wrong besides still is."""
    verdict = _a_triton_kernels_verdict(tile=32)
    assert not verdict.passed
    assert verdict.why.startswith("wrong: it computes causal attention masked by whole tiles "
                                  "of 32 keys: the tile on the diagonal is not masked inside"
                                  ), verdict.why
    assert "m + log l" not in verdict.why
    verdict = _a_triton_kernels_verdict(tile=32, l_off=1.0)
    assert "L, the logsumexp its forward saves for backward, is not m + log l" in verdict.why


def _a_triton_kernels_verdict(l_off: float = 0.0, **computes):
    """The check of a causal Triton FlashAttention of yours (2 x 64 x 16, fp32) whose O and
    L are the float64 reference's with `computes` (attention_reference's mistake switches:
    tile, scale), its L off by `l_off`."""
    from types import SimpleNamespace

    import torch

    from cs336sys.attention.point_check import checked
    from cs336sys.attention.reference import attention_reference, logsumexp_reference

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 64, 16, generator=gen) for _ in range(3))
    o, _ = attention_reference(q, k, v, True, **computes)  # what the kernel computes
    lse = logsumexp_reference(q, k, True, **computes).float() + l_off
    spec = SimpleNamespace(impl="yours-triton", causal=True, precision="fp32", check_round=True)
    return checked(spec, o, q, k, v, None, {}, [lse])


def test_a_wrong_kernel_is_stored_wrong_and_never_wins(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "scale = 1.0 / math.sqrt(d)", "scale = 1.0")  # forgets 1/sqrt(d)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "naive,yours-torch", *SMALL, "--db", db, "--wide")
    assert result.exit_code == 0, result.output  # a wrong point is a finding, not a failure
    wrong = [r for r in runs(db) if r["impl"] == "yours-torch"]
    assert {r["status"] for r in wrong} == {"wrong"}
    for r in wrong:
        assert r["check"] == "fail" and r["max_err"] > 0.05
        # what it computes, then by how much it is off
        assert r["error"].startswith("wrong: it computes attention without the 1/√d scale in "
                                     "the forward (its gradients match neither); O off by up to")
        assert r["e2e_ms_mean"] > 0  # timed all the same
    table = [line for line in result.stdout.splitlines() if line.startswith("yours-torch")]
    # every cell of it marked, its status with why (shortened; the whole line is under it)
    assert table and all("(wrong)" in line and "wrong: it computes" in line for line in table)
    assert "wrong: impl=yours-torch seq=32: it computes attention without" in result.stdout
    # the report: red cells, the reason listed, no speed-up
    out = tmp_path / "report"
    assert invoke("report", "--db", db, "--out", out).exit_code == 0
    html = (out / "report.html").read_text()
    assert 'class="wrong"' in html and "Not measured, or measured wrong" in html
    md = (out / "report.md").read_text()
    rows = [line for line in md.splitlines() if line.startswith("| yours-torch")]
    assert rows and all(line.count("wrong") >= 2 and "×" not in line for line in rows)


def _failing_forward(tmp_path, monkeypatch, statement: str):
    """`statement` in the example's forward, run beside naive: its line, the command's
    result (exit 1: a point failed, the sweep went on) and the stored yours-torch rows."""
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "        o = torch.empty_like(q)\n",
         f"        o = torch.empty_like(q)\n        {statement}\n")
    line = line_of(repo, FLASH, statement)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch,naive", *SMALL, "--db", db)
    assert result.exit_code == 1, result.output
    rows = runs(db)
    assert [r["status"] for r in rows if r["impl"] == "naive"] == ["ok", "ok"]
    return line, result, db, [r for r in rows if r["impl"] == "yours-torch"]


def test_a_kernel_that_raises_is_an_error_row_with_its_file_and_line(tmp_path, monkeypatch):
    line, result, db, errors = _failing_forward(tmp_path, monkeypatch, "ratio = 1 / (n_q - n_q)")
    assert len(errors) == 2 and {r["status"] for r in errors} == {"error"}
    first, _, traceback = errors[0]["error"].partition("\n")
    assert first == f"{FLASH}:{line}: ZeroDivisionError: division by zero"
    assert "Traceback (most recent call last)" in traceback  # kept in the store
    assert f"error: impl=yours-torch seq=32: {FLASH}:{line}: ZeroDivisionError" in result.stdout
    out = tmp_path / "report"
    assert invoke("report", "--db", db, "--out", out).exit_code == 0
    html = (out / "report.html").read_text()
    assert "<details><summary><strong>error</strong>" in html and "Traceback" in html


def test_a_kernel_that_calls_sys_exit_is_an_error_row_not_the_commands_end(tmp_path,
                                                                         monkeypatch):
    """sys.exit(3) in the user's forward ended the command with 3, its points unstored and
    no line; it is that point's error, and the sweep goes on."""
    line, _, _, rows = _failing_forward(tmp_path, monkeypatch, "import sys; sys.exit(3)")
    assert [r["error"] for r in rows] == [f"{FLASH}:{line}: SystemExit: it called sys.exit(3), which would have "
                      "ended the command"] * 2


def test_an_exit_from_the_standard_library_under_the_users_code_is_theirs(tmp_path,
                                                                           monkeypatch):
    """argparse's parse_args() in the user's forward (as benchmarking files have at their
    top) exits from the standard library: it was taken for cs336sys's own exit and ended
    the command with argparse's usage line as if cs336sys's."""
    statement = "import argparse; argparse.ArgumentParser().parse_args(['--bogus'])"
    line, _, _, rows = _failing_forward(tmp_path, monkeypatch, statement)
    assert [r["error"] for r in rows] == [f"{FLASH}:{line}: SystemExit: it called sys.exit(2), "
                                          "which would have ended the command"] * 2


def test_an_exit_at_the_top_of_the_adapters_file_is_one_line_and_exit_2(tmp_path, monkeypatch):
    """exit() where the adapters file is imported ended the command with 0 and not a word."""
    repo = course_repo(tmp_path)
    (repo / "tests" / "adapters.py").write_text(
        (repo / "tests" / "adapters.py").read_text() + "\nexit()\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip().endswith(": SystemExit: None") and not db.exists()
    assert "cannot import tests/adapters.py: tests/adapters.py:" in result.stderr


def test_a_getter_that_returns_an_nn_module_class_says_so(tmp_path, monkeypatch):
    """Every nn.Module class has an .apply, so one was taken for an autograd.Function and
    failed with `Module.apply() takes 2 positional arguments but 4 were given`."""
    repo = course_repo(tmp_path)
    getter = "def get_flashattention_autograd_function_pytorch() -> type:\n"
    edit(repo, "tests/adapters.py", getter, f"{getter}    return torch.nn.Linear\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert {r["status"] for r in runs(db)} == {"error"}
    assert ("get_flashattention_autograd_function_pytorch() of the adapters file gave the "
            "nn.Module class Linear; expected an autograd.Function subclass") in runs(db)[0]["error"]
    # an instance of one has that .apply too: the course's tests fail it, it passed here
    edit(repo, "tests/adapters.py", "    return torch.nn.Linear\n", "    return torch.nn.Linear(2, 2)\n")
    invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert ("get_flashattention_autograd_function_pytorch() of the adapters file gave an "
            "instance of the nn.Module Linear; expected an autograd.Function subclass") \
        in runs(db)[-1]["error"]
    # a one-off NAME that is not yours or yours-...: refused, not stored as errors
    result = invoke("attention", "--impl", "yours2=cs336_systems.flash_attention:"
                    "FlashAttentionPytorch", *SMALL, "--db", tmp_path / "n.db")
    assert result.exit_code == 2 and "are named yours or yours-..." in result.stderr
    assert not (tmp_path / "n.db").exists()


def test_a_getter_that_returns_the_functions_apply_fails_as_the_course_does(tmp_path,
                                                                            monkeypatch):
    """`return FlashAttentionPytorch.apply` runs here as a function and passed, while the
    course's tests call .apply on it and fail (AttributeError). An adapters getter must give
    something with .apply; a one-off target may still be a plain function."""
    repo = course_repo(tmp_path)
    edit(repo, "tests/adapters.py", "    return FlashAttentionPytorch\n",
         "    return FlashAttentionPytorch.apply\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db)
    assert {r["status"] for r in runs(db)} == {"error"}
    assert ("get_flashattention_autograd_function_pytorch() of the adapters file gave "
            "FlashAttentionPytorch.apply, which has no .apply: the course's tests call "
            "get_flashattention_autograd_function_pytorch().apply(q, k, v, is_causal), so "
            "return the autograd.Function class itself") in runs(db)[0]["error"]


def test_a_one_off_target_needs_no_adapters_file(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    (repo / "tests" / "adapters.py").unlink()
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    target = "yours=cs336_systems.flash_attention:FlashAttentionPytorch"
    result = invoke("attention", "--impl", target, *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    rows = runs(db)
    assert {(r["impl"], r["status"], r["check"]) for r in rows} == {("yours", "ok", "pass")}
    assert FLASH in json.loads(rows[0]["code"])
    inv = query(db, "SELECT * FROM invocations")[0]
    assert inv["user_commit"] == git(repo, "rev-parse", "HEAD") and inv["adapters"] is None
    for bad, why in (("mine=cs336_systems.flash_attention:F", "named yours or yours-"),
                     ("yours=cs336_systems.flash_attention", "package.module:Object"),
                     ("yours=cs336_systems.nothing:F", "No module named 'cs336_systems.nothing'"),
                     # the second replaced the first, which was never measured
                     (f"{target},yours=cs336_systems.flash_attention:FlashAttentionTriton",
                      "yours is given two targets")):
        result = invoke("attention", "--impl", bad, *SMALL, "--db", tmp_path / "other.db")
        assert result.exit_code == 2 and why in result.stderr, (bad, result.stderr)
    assert not (tmp_path / "other.db").exists()


def test_run_sweep_takes_your_implementations_from_python(tmp_path):
    from cs336sys.experiments import attention
    from cs336sys.sweep.runner import run_sweep

    repo = course_repo(tmp_path)
    yours.use(repo / "tests" / "adapters.py")
    specs = attention.specs(impl=["yours-torch", "sdpa"], seq=[32], d_head=[16], batch=[1],
                            warmup=1, iters=2, device="cpu")
    points = run_sweep(attention.EXPERIMENT, specs)
    assert [(p.spec.impl, p.result.status) for p in points] == [("yours-torch", "ok"), ("sdpa", "ok")]
    assert points[0].result.metrics["check"] == "pass"


@pytest.mark.slow
def test_compare_and_since_take_git_refs_of_your_repository(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    assert invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db).exit_code == 0
    first = git(repo, "rev-parse", "HEAD")
    edit(repo, FLASH, "TILE_Q = 32", "TILE_Q = 16", commit="smaller query tiles")
    assert invoke("attention", "--impl", "yours-torch", *SMALL, "--db", db).exit_code == 0
    second = git(repo, "rev-parse", "HEAD")
    assert [r["user_commit"] for r in runs(db)] == [first, first, second, second]

    result = invoke("report", "--compare", "HEAD~1", "HEAD", "--db", db, "--out", tmp_path / "c")
    assert result.exit_code == 0, result.output
    assert f"Comparison by commit: HEAD~1 ({first[:10]}) (A) against HEAD ({second[:10]}) (B)" in result.stdout
    assert "2 points compared" in result.stdout
    result = invoke("report", "--since", "HEAD", "--db", db, "--out", tmp_path / "s")
    assert result.exit_code == 0, result.output
    assert "**Runs by status:** ok 2 (in 1 invocation)" in (tmp_path / "s" / "report.md").read_text()
    assert second[:10] in (tmp_path / "s" / "report.md").read_text()  # the runs of HEAD
    assert first[:10] not in (tmp_path / "s" / "report.md").read_text()
    result = invoke("report", "--commit", "HEAD~1", "--db", db, "--out", tmp_path / "h")
    assert result.exit_code == 0
    assert "**Runs by status:** ok 2 (in 1 invocation)" in (tmp_path / "h" / "report.md").read_text()
    assert first[:10] in (tmp_path / "h" / "report.md").read_text()  # the runs of HEAD~1
    assert second[:10] not in (tmp_path / "h" / "report.md").read_text()
    result = invoke("report", "--since", "no-such-ref", "--db", db, "--out", tmp_path / "x")
    assert result.exit_code == 2 and "nor is it a git ref" in result.stderr
    # db export selects as report does
    result = invoke("db", "export", "--since", "HEAD", "--format", "jsonl", "--db", db)
    assert result.exit_code == 0 and "exported 2 runs" in result.stderr, result.output
    assert {r["invocation_id"] for r in map(json.loads, result.stdout.splitlines())} == {
        r["invocation_id"] for r in runs(db)[2:]}
    result = invoke("db", "export", "--since", "no-such-ref", "--db", db)
    assert result.exit_code == 2 and "nor is it a git ref" in result.stderr


STRICT_3D = '''
import math

import torch


def attention(q, k, v, causal):
    """The course's contract only: (batch, seq, d)."""
    assert q.dim() == 3, f"(batch, seq, d) inputs only, got {tuple(q.shape)}"
    s = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if causal:
        s = s.masked_fill(torch.ones(s.shape[-2:], dtype=torch.bool, device=q.device).triu(1), float("-inf"))
    return torch.softmax(s, dim=-1) @ v
'''


def test_a_kernel_of_the_courses_3d_contract_runs_on_heads_and_in_our_model(tmp_path, monkeypatch):
    from tests.conftest import MICRO

    repo = course_repo(tmp_path, files={"strict/__init__.py": "", "strict/attn.py": STRICT_3D})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    target = "yours-plain=strict.attn:attention"
    assert invoke("attention", "--impl", target, *SMALL, "--db", db).exit_code == 0  # --heads 2
    assert {(r["impl"], r["heads"], r["status"]) for r in runs(db)} == {("yours-plain", 2, "ok")}
    result = invoke("model", *MICRO, "--seq", "16", "--attention", target, "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT * FROM model_runs")
    assert (row["attention"], row["status"], row["check"]) == ("yours-plain", "ok", "pass")


TRITON_ADAPTERS = '''
def get_flashattention_autograd_function_triton():
    from cs336sys.attention import FlashAttention2Triton  # a stand-in for a student's kernel

    return FlashAttention2Triton
'''


@pytest.mark.slow  # interpreted Triton through the CLI on a CPU
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_yours_triton_runs_compiled_on_a_gpu_and_interpreted_on_a_cpu(tmp_path, monkeypatch, device):
    repo = course_repo(tmp_path, files={"tests/adapters.py": TRITON_ADAPTERS})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    # both precisions where compiled; the interpreter (seconds a call) checks fp32 alone
    precisions = "fp32,bf16" if device == "cuda" else "fp32"
    args = ["--seq", "32", "--d-head", "16", "--batch", "1", "--heads", "2", "--warmup", "1",
            "--iters", "2", "--device", device, "--precision", precisions]
    result = invoke("attention", "--impl", "yours-triton", *args, "--db", db)
    assert result.exit_code == 0, result.output
    rows = runs(db)
    assert [(r["status"], r["check"]) for r in rows] == [("ok", "pass")] * len(precisions.split(","))
    assert {bool(r["interpreted"]) for r in rows} == {device == "cpu"}


@pytest.mark.slow  # interpreted Triton through the CLI on a CPU
def test_a_one_off_triton_kernel_is_marked_interpreted_and_its_bf16_not_judged(tmp_path,
                                                                               monkeypatch):
    """A one-off target that is Triton ran in the interpreter stored as native (no mark, in
    the compiled table, a `vs naive`), and its bf16 failure from the interpreter's tl.dot
    was `wrong`; as yours-triton, it is interpreted, and that failure not judged. Triton is
    what its code launches: a PyTorch kernel in a file that also holds a Triton one is not,
    a Triton kernel re-exported from another module is."""
    from types import SimpleNamespace

    from cs336sys.attention.diagnosis import status_of
    from cs336sys.measure.check import Verdict
    from cs336sys.yours.implementations import _runs_triton
    from tests.user_repos import with_gallery

    beside = ("import triton\n\n\n@triton.jit\ndef _unused(x):\n    return x\n\n\n"
              "from cs336_systems.flash_attention import FlashAttentionPytorch  # noqa: E402\n"
              "class Beside(FlashAttentionPytorch):\n    pass\n")
    repo = with_gallery(course_repo(tmp_path, files={
        "cs336_systems/beside.py": beside,
        "cs336_systems/api.py": "from cs336_systems.gallery_triton_flash import Pointers\n"}),
        "attention", "triton_flash")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-tri=cs336_systems.api:Pointers,"
                    "yours-beside=cs336_systems.beside:Beside",
                    "--seq", "32", "--d-head", "16", "--batch", "1", "--heads", "2",
                    "--warmup", "1", "--iters", "2", "--device", "cpu", "--db", db)
    assert result.exit_code == 0, result.output
    assert [(r["impl"], r["status"], r["interpreted"]) for r in runs(db)] == [
        ("yours-tri", "ok", 1), ("yours-beside", "ok", 0)]
    # at a size the handout never tests, the one-off Triton kernel is not started, as
    # yours-triton is not (one without masks aborted the process: "malloc(): unaligned
    # tcache chunk"); the PyTorch one runs
    result = invoke("attention", "--impl", "yours-tri=cs336_systems.api:Pointers,"
                    "yours-beside=cs336_systems.beside:Beside",
                    "--seq", "40", "--d-head", "16", "--batch", "1", "--warmup", "0",
                    "--iters", "1", "--device", "cpu", "--db", db)
    assert result.exit_code == 0, result.output
    tri, beside_40 = runs(db)[-2:]
    assert tri["status"] == "skipped" and "need not handle seq 40" in tri["error"]
    assert "without masks a kernel reads and writes past its tensors" in tri["error"]
    assert beside_40["status"] == "ok"
    monkeypatch.syspath_prepend(str(repo))
    from cs336_systems.beside import Beside

    assert not _runs_triton(Beside)  # its forward is the PyTorch one: nothing of Triton
    # a kernel launched as a module's attribute (`kernels._fwd[grid](...)`) is Triton too; a
    # library module's attribute (F.scaled_dot_product_attention) is not
    (repo / "cs336_systems" / "via.py").write_text(
        "import torch.nn.functional as F\n\n"
        "from cs336_systems import gallery_triton_flash as kernels\n\n\n"
        "def launch(q):\n    return kernels._fwd\n\n\n"
        "def plain(q):\n    return F.scaled_dot_product_attention(q, q, q)\n")
    from cs336_systems.via import launch, plain

    assert _runs_triton(launch) and not _runs_triton(plain)
    failed = Verdict(False, {}, "wrong: O off by up to 8e+08")
    bf16 = SimpleNamespace(precision="bf16", impl="yours-tri", seq=32, d_head=16)
    assert status_of(bf16, True, failed)[0] == "skipped"
    assert status_of(bf16, False, failed)[0] == "wrong"  # compiled: judged
    # Triton's launcher without a GPU (outside the interpreter, or @triton.autotune inside)
    from cs336sys.sweep.result import cause

    assert cause("RuntimeError: 0 active drivers ([]). There should only be one.").endswith(
        "; Triton found no GPU: on a CPU its kernels run only in its interpreter "
        "(TRITON_INTERPRET=1), and @triton.autotune, which times its configs on a GPU, not "
        "even there (give the kernel one config on a CPU)")


@pytest.mark.slow  # Dynamo's attempt, then the kernel interpreted
def test_a_triton_kernel_of_yours_compiled_in_the_interpreter_is_skipped_not_blamed(
        tmp_path, monkeypatch):
    """`--compile` of a student's Triton kernel on a CPU failed inside Triton's interpreter
    (Dynamo traced its uint64 pointer arithmetic) and was stored as an error at the
    student's launch line, though the same call uncompiled runs; a kernel that fails
    uncompiled too is still its error."""
    from tests.user_repos import with_gallery

    repo = with_gallery(course_repo(tmp_path), "attention", "triton_flash")
    monkeypatch.chdir(repo)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    db = tmp_path / "r.db"
    args = ("attention", "--impl", "yours-tri=cs336_systems.gallery_triton_flash:Pointers",
            "--compile", "--seq", "32", "--d-head", "16", "--batch", "1", "--heads", "2",
            "--warmup", "1", "--iters", "2", "--device", "cpu", "--db", db)
    assert invoke(*args).exit_code == 0
    (row,) = runs(db)
    assert row["status"] == "skipped" and row["error"] == (
        "torch.compile cannot trace a Triton kernel that Triton's CPU interpreter runs "
        "(TRITON_INTERPRET=1): it failed inside the interpreter (InterpreterError), while the "
        "same call without --compile runs; compiling a Triton kernel needs a GPU"), row["error"]
    edit(repo, "cs336_systems/gallery_triton_flash.py", "            o = torch.empty_like(q)\n",
         "            o = torch.empty_like(q)\n            raise ValueError('broken')\n")
    assert invoke(*args).exit_code == 1
    assert "ValueError: broken" in runs(db)[-1]["error"]


ASSIGNMENT_1 = '''
import math

import torch


def scaled_dot_product_attention(Q, K, V, mask=None):
    """Assignment 1's attention: mask True where a query may attend."""
    scores = Q @ K.transpose(-2, -1) / math.sqrt(Q.shape[-1])
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    return torch.softmax(scores, dim=-1) @ V
'''


@pytest.mark.parametrize("causal", ["--causal", "--no-causal"])
def test_assignment_1s_attention_with_a_mask_is_measured_as_it_is(tmp_path, monkeypatch, causal):
    """fn(Q, K, V, mask): the causal mask built for it (True on and below the diagonal), or
    None; it passes the float64 check either way, no wrapper of the student's."""
    repo = course_repo(tmp_path, files={"a1/__init__.py": "", "a1/attn.py": ASSIGNMENT_1})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours=a1.attn:scaled_dot_product_attention", causal,
                    *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    assert {(r["impl"], r["status"], r["check"]) for r in runs(db)} == {("yours", "ok", "pass")}


def test_an_assignment_1_attention_without_a_default_mask_gets_one_without_a_mask():
    """The preset's non-causal points gave a function that must be given a mask None, and
    the example's `~mask` raised; one whose mask defaults to None still gets None."""
    import torch

    from cs336sys.yours.implementations import _with_mask

    given = []

    def required(q, k, v, mask):
        given.append(mask)
        return v

    def optional(q, k, v, mask=None):
        given.append(mask)
        return v

    def other_default(q, k, v, mask=True):  # its own default: not None, which it cannot take
        given.append(mask)
        return v

    def keyword_only(q, k, v, *, mask=None):
        given.append(mask)
        return v

    q = torch.zeros(2, 3, 4)
    _with_mask(required)(q, q, q, False)
    _with_mask(optional)(q, q, q, False)
    _with_mask(optional)(q, q, q, True)
    _with_mask(other_default)(q, q, q, False)
    _with_mask(keyword_only)(q, q, q, True)
    assert given[0].all() and given[0].shape == (3, 3) and given[1] is None
    assert torch.equal(given[2], torch.ones(3, 3, dtype=torch.bool).tril())
    assert given[3] is True and torch.equal(given[4], given[2])


def test_compile_wraps_the_users_attention_and_is_stored_as_its_own_setting(tmp_path,
                                                                           monkeypatch):
    """--compile: the student's assignment-1 attention under torch.compile, checked against
    float64 like any other point, its setting stored apart from the eager one's. Its mask
    comes in as an input, as their model gives it: built inside the graph, inductor failed
    on `mask == False` (stored `error`, its reason `InductorError: TypeError: `)."""
    import torch

    compares = ASSIGNMENT_1.replace("~mask", "mask == False")
    repo = course_repo(tmp_path, files={"a1/__init__.py": "", "a1/attn.py": compares})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    calls = []
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: calls.append(fn) or real(fn, **kw))
    target = "yours=a1.attn:scaled_dot_product_attention"
    result = invoke("attention", "--impl", target, "--compile", "--pass", "forward",
                    "--seq", "16", "--d-head", "16", "--batch", "1", "--warmup", "0",
                    "--iters", "1", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = runs(db)
    assert (row["impl"], row["status"], row["check"], row["compile"]) == ("yours", "ok", "pass", 1)
    # what was compiled is the student's function (seen through the mask adapter), once
    assert len(calls) == 1 and "a1/attn.py" in row["code"]
    refused = invoke("attention", "--impl", "compiled", "--compile", "--db", tmp_path / "no.db")
    assert refused.exit_code == 2 and "list naive" in refused.output
    assert not (tmp_path / "no.db").exists()


FORWARD_ONLY = '''
import torch


class Flash(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, is_causal=False):
        s = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
        if is_causal:
            n = q.shape[-2]
            s = s.masked_fill(torch.ones(n, n, dtype=torch.bool).triu(1), float("-inf"))
        return s.softmax(-1) @ v

    @staticmethod
    def backward(ctx, do):
        raise NotImplementedError
'''


def test_a_forward_without_its_backward_is_skipped_with_the_way_to_time_it(tmp_path,
                                                                         monkeypatch):
    """The handout's order: the forward first, the backward later. Under --pass both the
    point is skipped, and the reason says the backward raised and --pass forward times the
    forward alone; with it the forward is timed and checked."""
    (tmp_path / "forward_only.py").write_text(FORWARD_ONLY)
    monkeypatch.syspath_prepend(str(tmp_path))
    db = tmp_path / "r.db"
    args = ["attention", "--impl", "yours=forward_only:Flash", *SMALL, "--seq", "32"]
    result = invoke(*args, "--db", db)
    assert result.exit_code == 0, result.output
    ((status, error),) = {(r["status"], r["error"]) for r in runs(db)}
    assert status == "skipped" and error.startswith("not implemented: "), error
    line = FORWARD_ONLY.splitlines().index("        raise NotImplementedError") + 1
    assert f"forward_only.py:{line}: NotImplementedError; raised in the backward: " in error
    assert "--pass forward times the forward alone" in error
    result = invoke(*args, "--pass", "forward", "--db", db)
    assert result.exit_code == 0, result.output
    forward = runs(db)[-1]
    assert (forward["status"], forward["check"]) == ("ok", "pass") and forward["fwd_ms_median"] > 0


def test_an_output_in_another_dtype_than_the_inputs_is_wrong_as_the_course_says(tmp_path,
                                                                                monkeypatch):
    """A FlashAttention returning O in float64 for float32 inputs passed: the check cast O
    to the reference's dtype first. The course's forward test fails it (assert_close checks
    the dtype); it says so. Where the course's test runs no such dtype (bf16) it stands."""
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "        ctx.is_causal = is_causal\n        return o\n",
         "        ctx.is_causal = is_causal\n        return o.double()\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", "--precision", "fp32,bf16",
                    "--no-causal", *SMALL[:2], *SMALL[4:], "--db", db)
    assert result.exit_code == 0, result.output
    by = {r["precision"]: r for r in runs(db)}
    assert by["fp32"]["status"] == "wrong"
    assert "O is float64 for float32 inputs: the course's forward test compares them with " \
        "torch.testing.assert_close, which checks the dtype" in by["fp32"]["error"]
    assert by["bf16"]["status"] == "ok", by["bf16"]["error"]


def test_a_backward_that_refuses_is_causal_is_skipped_where_it_runs_without(tmp_path,
                                                                           monkeypatch):
    """The handout lets the PyTorch FlashAttention ignore is_causal, and the course's tests
    never pass it True: one whose backward asserts it off passes them. Its causal point was
    an error (exit 1), as a forward that refuses it is not."""
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "        q, k, v, o, logsumexp = ctx.saved_tensors\n",
         "        assert not ctx.is_causal, 'causal backward not supported'\n"
         "        q, k, v, o, logsumexp = ctx.saved_tensors\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", *SMALL[:2], *SMALL[4:], "--db", db)
    assert result.exit_code == 0, result.output
    for row in runs(db):
        assert row["status"] == "skipped", row["error"]
        assert row["error"].startswith("yours-torch's backward raised at is_causal=True "
                                       "(AssertionError: causal backward not supported)")
    result = invoke("attention", "--impl", "yours-torch", "--no-causal", *SMALL[:2], *SMALL[4:],
                    "--db", db)
    assert result.exit_code == 0, result.output
    statuses = [r["status"] for r in runs(db) if not r["causal"]]
    assert statuses and set(statuses) == {"ok"}


def test_a_forward_that_saves_none_is_wrong_in_the_courses_words(tmp_path, monkeypatch):
    """ctx.save_for_backward(..., None): the course's forward test reads each saved tensor's
    shape and fails; cs336sys's own reader of L failed on it too, an error naming nobody's
    file."""
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "ctx.save_for_backward(q, k, v, o, logsumexp)",
         "ctx.save_for_backward(q, k, v, o, logsumexp, None)")
    edit(repo, FLASH, "q, k, v, o, logsumexp = ctx.saved_tensors",
         "q, k, v, o, logsumexp, _ = ctx.saved_tensors")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", "--no-causal", *SMALL[:2], *SMALL[4:],
                    "--db", db)
    assert result.exit_code == 0, result.output
    for row in runs(db):
        assert row["status"] == "wrong"
        assert "its forward saves None among its tensors for backward" in row["error"]


def test_model_points_with_an_interpreted_triton_kernel_stand_apart(monkeypatch):
    """`model --attention naive,yours-triton` under TRITON_INTERPRET=1 set the emulator's
    1,892 ms beside naive's 22 ms as tokens/s and bars, unmarked (attention and step keep
    them apart). They now stand in a table of their own and out of the charts."""
    from types import SimpleNamespace

    from cs336sys.experiments import model_section
    from cs336sys.experiments.model import EXPERIMENT
    from cs336sys.experiments.training_step import interpreted
    from cs336sys.report.experiment_section import build_section

    monkeypatch.setenv("TRITON_INTERPRET", "1")
    model_spec = SimpleNamespace(optimizer="adamw", attention="triton")  # no `loss`: model's
    assert interpreted(model_spec)
    assert not interpreted(SimpleNamespace(optimizer="adamw", attention=None))  # their model

    def row(attention, ms, run):
        s = {"size": "tiny", "seq": 32, "batch": 1, "mode": "forward", "precision": "fp32",
             "warmup": 1, "compile": False, "checkpoint": "none", "attention": attention,
             "optimizer": "none"}
        return {**s, "status": "ok", "step_ms_mean": ms, "step_ms_std": 0.1, "fwd_ms_mean": ms,
                "tokens_per_s": 32e3 / ms, "gpu": None, "interpreted": run, "_settings": s,
                "created": "2026-12-07", "run_id": attention, "invocation_id": "i",
                "_samples": json.dumps({"step_ms": [ms] * 2, "warmup": {"step_ms": [ms]}})}

    sec = build_section(EXPERIMENT, [row("naive", 22.0, False), row("triton", 1892.0, True)])
    native, apart = sec.tables[:2]
    assert apart.title.endswith(model_section.APART[1]) and len(apart.rows) == 1
    assert len(native.rows) == 1
    for figure in sec.figures:  # no chart draws the emulator's time
        assert "triton" not in json.dumps([getattr(b, "label", "") for b in
                                           getattr(figure.plot, "bars", [])])


CRASHES = '''
import ctypes


def attention(q, k, v, is_causal=False):
    ctypes.string_at(0)  # a wild read, as a C extension's or the Triton interpreter's
'''


def test_code_that_crashes_the_process_leaves_its_file_and_line_on_stderr(tmp_path):
    """A segfault in the user's code ended the command with nothing after `attention: 1
    point(s)`: Python's fault handler now prints the stack on the way down."""
    import subprocess
    import sys

    repo = course_repo(tmp_path, files={"wild/__init__.py": "", "wild/attn.py": CRASHES})
    proc = subprocess.run([sys.executable, "-m", "cs336sys", "attention", "--impl",
                           "yours-wild=wild.attn:attention", *SMALL, "--db",
                           str(tmp_path / "r.db")], cwd=repo, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == -11, proc.stderr  # SIGSEGV: nothing could store the point
    assert "Fatal Python error: Segmentation fault" in proc.stderr
    assert f'File "{repo / "wild" / "attn.py"}", line 6 in attention' in proc.stderr


def test_a_kernel_that_raises_at_a_size_the_handout_never_tests_is_not_judged(tmp_path,
                                                                             monkeypatch):
    """A FlashAttention that reshapes by whole tiles passes the course's tests and raised
    at seq 48 ("shape '[...]' is invalid"): stored `error`, the command exiting 1. Raising
    there is as good as any answer: not judged."""
    repo = course_repo(tmp_path)
    edit(repo, FLASH, "        scale = 1.0 / math.sqrt(d)\n",
         "        if n_q % 32:\n            raise RuntimeError(\"shape '[1, 32]' is invalid\")\n"
         "        scale = 1.0 / math.sqrt(d)\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", "--seq", "48,64", *SMALL[2:],
                    "--db", db)
    assert result.exit_code == 0, result.output
    by = {r["seq"]: r for r in runs(db)}
    assert by[64]["status"] == "ok" and by[48]["status"] == "skipped"
    assert by[48]["error"].endswith("so it need not handle seq 48; yours-torch raised "
                                    "RuntimeError: shape '[1, 32]' is invalid"), by[48]["error"]


@pytest.mark.slow  # interpreted Triton through the CLI on a CPU
def test_your_triton_kernel_is_not_started_at_a_size_the_handout_never_tests(tmp_path,
                                                                           monkeypatch):
    """A kernel without bounds checks, as the handout allows, passed the course's tests and
    at seq 48 wrote past its tensors in Triton's interpreter: "double free or corruption",
    and the sweep ended with the points after it unmeasured. It is not started there;
    --force runs it (ours, standing in for the student's, has masks: ok)."""
    repo = course_repo(tmp_path, files={"tests/adapters.py": TRITON_ADAPTERS})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    args = ["attention", "--impl", "yours-triton", "--d-head", "16", "--batch", "1",
            "--warmup", "1", "--iters", "2", "--pass", "forward", "--device", "cpu", "--db", db]
    assert invoke(*args, "--seq", "32,48").exit_code == 0
    by = {r["seq"]: r for r in runs(db)}
    assert by[32]["status"] == "ok" and by[48]["status"] == "skipped"
    assert by[48]["error"].startswith("skipped: not judged: the handout tests your "
                                      "FlashAttention only with dimensions that are powers "
                                      "of 2 and at least 16, so it need not handle seq 48, "
                                      "and without masks")
    assert by[48]["error"].endswith("--force runs it")
    assert invoke(*args, "--seq", "48", "--force").exit_code == 0
    assert runs(db)[-1]["status"] == "ok"
    # in cs336sys's model too (`model --attention yours-triton --seq 48` aborted the
    # process: "free(): invalid size", nothing stored)
    model = invoke("model", "--size", "tiny", "--d-model", "64", "--num-heads", "4",
                   "--num-layers", "1", "--vocab-size", "64", "--batch", "1", "--seq", "48",
                   "--mode", "forward", "--attention", "yours-triton", "--warmup", "0",
                   "--iters", "1", "--device", "cpu", "--db", db)
    assert model.exit_code == 0, model.output
    (row,) = query(db, "SELECT status, error FROM model_runs")
    assert row["status"] == "skipped" and "without masks a kernel reads and writes past" in \
        row["error"], row


def test_a_kernel_off_at_a_size_the_handout_never_tests_is_not_judged(tmp_path, monkeypatch):
    """"We will always test your code with dimensions that are powers of 2 and at least 16,
    so you don't need to worry about out-of-bounds accesses": a FlashAttention that drops
    the last partial tile passes the course's tests and was `wrong` at seq 48. It is not
    judged there, with what it read; at powers of 2 it is judged as ever."""
    repo = course_repo(tmp_path)
    # the key loop stops at the last whole tile, as a kernel without bounds checks does
    edit(repo, FLASH, "for j in range(0, n_k, TILE_K)",
         "for j in range(0, n_k - n_k % TILE_K, TILE_K)")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("attention", "--impl", "yours-torch", "--seq", "48,64", "--no-causal",
                    *SMALL[2:], "--db", db)
    assert result.exit_code == 0, result.output
    by = {r["seq"]: r for r in runs(db)}
    assert by[64]["status"] == "ok"
    assert by[48]["status"] == "skipped"
    assert by[48]["error"].startswith(
        "not judged: the handout tests your FlashAttention only with dimensions that are "
        "powers of 2 and at least 16, so it need not handle seq 48; it read O off by up to ")


def test_a_mask_read_the_wrong_way_round_is_named():
    """Assignment 1's attention with masked_fill(mask, -inf), its mask True where a key may
    be seen: each query saw only the later keys, the last none, and the check said "O off by
    up to nan" with no cause."""
    import math
    from types import SimpleNamespace

    import torch

    from cs336sys.attention.point_check import checked

    gen = torch.Generator().manual_seed(0)
    q, k, v, dout = (torch.randn(2, 32, 16, generator=gen, dtype=torch.float64,
                                 requires_grad=True) for _ in range(4))
    mask = torch.ones(32, 32, dtype=torch.bool).tril()  # True: may be seen
    s = (q @ k.transpose(-1, -2) / math.sqrt(16)).masked_fill(mask, float("-inf"))
    o = torch.softmax(s, -1) @ v  # (2, 32, 16); the last row NaN
    o.backward(dout)
    spec = SimpleNamespace(impl="yours", causal=True, precision="fp32", check_round=True)
    verdict = checked(spec, o.detach().float(), q.detach().float(), k.detach().float(),
                      v.detach().float(), dout.detach().float(), {}, None)
    assert not verdict.passed
    assert verdict.why.startswith("wrong: it computes causal attention with the mask inverted: "
                                  "each query sees only the later keys"), verdict.why


def test_nan_outputs_are_counted_not_read_as_the_largest_error():
    """A causal loop that stops a tile short leaves the first queries no key (0/0): the
    check said "O off by up to nan" and not how many were NaN."""
    import torch

    from cs336sys.measure.check import check

    want = torch.zeros(4, 8, dtype=torch.float64)
    got = want.clone()
    got[0] = float("nan")  # one row that saw no key
    got[1, 0] = 0.5
    verdict = check({"O": got}, {"O": want}, 1e-2, 1e-2)
    assert not verdict.passed
    assert "O off by up to 0.5 at 9 of 32 elements, 8 of them NaN" in verdict.why, verdict.why


def test_an_unscaled_kernels_unscaled_l_is_not_blamed_besides():
    """docs/yours.md: an L right for what its O computes is not blamed besides. A kernel
    without the 1/√d scale had its L named too ("L ... is the logsumexp of scores without
    the 1/√d scale"), where one scaled by 1/d had not: the scale check came first."""
    verdict = _a_triton_kernels_verdict(scale=1.0)
    assert verdict.why.startswith("wrong: it computes attention without the 1/√d scale"), \
        verdict.why
    assert "L, the logsumexp" not in verdict.why, verdict.why


def test_a_mask_saved_beside_l_is_not_l_where_batch_equals_the_sequence():
    """A correct FlashAttention saving its boolean (queries, keys) mask beside L passes the
    course's test at batch 4 and 128 queries, where only L has the shape (batch, queries);
    at batch 32 and 32 queries the mask has it too, and the point was `wrong` ("saves 2
    tensors of L's shape"). There the one that is the logsumexp is L."""
    import torch

    from cs336sys.attention.reference import logsumexp_reference
    from cs336sys.attention.saved_lse import lse_checked

    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(32, 32, 16, generator=g) for _ in range(2))
    lse = logsumexp_reference(q, k, True).float()
    mask = torch.ones(32, 32, dtype=torch.bool).triu(1)
    tol = (1e-2, 1e-2)
    assert lse_checked("yours-torch", True, [mask, lse], q, k, tol).passed
    assert lse_checked("yours-triton", True, [lse, mask.float()], q, k, tol).passed
    # two of L's shape where neither is the mask of a square point: as the course says
    q2, k2 = q[:4], k
    two = lse_checked("yours-triton", True, [lse[:4], lse[:4].clone()], q2, k2, tol)
    assert not two.passed and "saves 2 tensors of L's shape (4, 32)" in two.why
    additive = torch.zeros(32, 32).masked_fill(mask, float("-inf"))  # a float mask, 0 / -inf
    assert lse_checked("yours-torch", True, [additive, lse], q, k, tol).passed
    # the running max m saved beside L: two of L's shape, as the course counts them, whichever
    # is the logsumexp (a false pass where only L's values were looked at)
    m = lse - 0.5
    two_here = lse_checked("yours-torch", True, [lse, m], q, k, tol)
    assert not two_here.passed and "saves 2 tensors of L's shape (32, 32)" in two_here.why
    wrong = lse_checked("yours-triton", True, [mask.float(), lse + 1], q, k, tol)
    assert not wrong.passed and "is not m + log l" in wrong.why  # the one that is not a mask
