"""The CLI through typer's CliRunner against a temporary database."""

import json
import re
import sqlite3
import subprocess
import sys

import pytest
import torch

from cs336sys import __version__
from cs336sys.cli import app
from cs336sys.models.flops import step_flops
from cs336sys.models.transformer import TransformerLM
from tests.conftest import MICRO, invoke, micro, query, view_rows

# Commands and what they store are the subject; the report's pixels are not (conftest).
pytestmark = pytest.mark.unrasterized

rows = view_rows('model_runs')


def test_version():
    result = invoke("--version")
    assert result.exit_code == 0 and result.stdout.strip() == f"cs336sys {__version__}"


def _command_paths():
    """Every command and subcommand, as argv paths: ['model'], ['precision', 'autocast'], ..."""
    import typer.main

    def walk(cmd, path):
        yield path
        if hasattr(cmd, "commands"):  # a group (typer vendors click, so no isinstance)
            for name, sub in cmd.commands.items():
                yield from walk(sub, [*path, name])

    root = typer.main.get_command(app)
    return [p for p in walk(root, []) if p]


def test_every_command_has_help_with_an_example():
    paths = _command_paths()
    assert {("env",), ("sql",), ("model",), ("comm",), ("ddp",)} <= {tuple(p) for p in paths}
    for path in paths:
        result = invoke(*path, "--help")
        name = " ".join(path)
        assert result.exit_code == 0, name
        assert "Example" in result.stdout, name
        # the example shows this command (for a group: one of its subcommands)
        assert f"cs336sys {name}" in " ".join(result.stdout.split()), name
        # one default per option: a help text's own "[default: 80]" beside Typer's 80.0
        for option in re.split(r"\n\s{0,4}(?=-)", result.stdout):
            assert option.count("[default:") <= 1, (name, " ".join(option.split()))


def test_every_command_that_measures_takes_resume():
    """What a Ctrl-C or SIGTERM leaves, the same command with --resume finishes."""
    stores_no_measurement = {("env",), ("sql",), ("report",), ("browse",), ("plan",), ("db",),
                             ("db", "export"), ("db", "merge"), ("precision",), ("profile",),
                             ("handout",), ("handout", "report")}
    measuring = [p for p in _command_paths() if tuple(p) not in stores_no_measurement]
    assert {("precision", "autocast"), ("memory",), ("comm",)} <= {tuple(p) for p in measuring}
    for path in measuring:
        assert "--resume" in invoke(*path, "--help").stdout, path


def test_every_command_that_can_run_your_code_takes_adapters():
    """An --attention or --impl may name yours-torch (your adapters'), and `handout run
    --yours` runs them: the command takes the --adapters that the refusal of a missing
    adapters file tells the user to give. `memory residuals` and `handout run` did not."""
    import typer.main

    root = typer.main.get_command(app)
    lacking = []
    for path in _command_paths():
        cmd = root
        for name in path:
            cmd = cmd.commands[name]
        opts = {o for param in cmd.params for o in getattr(param, "opts", [])}
        if opts & {"--attention", "--impl", "--yours"} and "--adapters" not in opts:
            lacking.append(" ".join(path))
    assert lacking == []


def test_hand_written_defaults_reach_the_help():
    """A default written into a help text survives rendering (Rich markup used to eat
    "[default: ...]" as a style tag)."""
    for path, default in (
        (["model"], "[default: small on CUDA, tiny on CPU]"),
        (["attention"], "[default: 256,1024,4096,8192,16384 on CUDA, 128,256,512,1024 on CPU]"),
        (["report"], "[default: html,md]"),
    ):
        result = invoke(*path, "--help")
        assert default in " ".join(result.stdout.split()), path


def test_tiny_sweep_writes_exactly_the_expected_rows(db_path):
    result = invoke(
        "model", *MICRO, "--seq", "16,32", "--mode", "forward,train", "--db", db_path
    )
    assert result.exit_code == 0, result.output
    got = rows(db_path)
    assert [(r["seq"], r["mode"]) for r in got] == [
        (16, "forward"),
        (16, "train"),
        (32, "forward"),
        (32, "train"),
    ]
    for r in got:
        assert r["status"] == "ok" and r["error"] is None
        assert (r["size"], r["d_model"], r["d_ff"], r["num_layers"], r["num_heads"]) == (
            "tiny",
            64,
            128,
            2,
            4,
        )
        assert (r["batch"], r["precision"], r["attention"], r["compile"]) == (
            2,
            "fp32",
            "naive",
            0,
        )
        assert (r["warmup"], r["iters"], r["device"], r["gpu"]) == (1, 3, "cpu", "cpu")
        assert r["tokens_per_step"] == 2 * r["seq"]
        assert r["tokens_per_s"] == pytest.approx(r["tokens_per_step"] / (r["step_ms_mean"] / 1e3))
        assert r["tflops"] == pytest.approx(r["flops_per_step"] / (r["step_ms_mean"] / 1e3) / 1e12)
        assert r["mfu"] is None  # no known peak for a CPU
        assert r["peak_allocated_mb"] is None  # CUDA only
        if r["mode"] == "forward":
            assert (
                r["bwd_ms_mean"] is None and r["opt_ms_mean"] is None and r["optimizer"] == "none"
            )
        else:
            assert r["bwd_ms_mean"] > 0 and r["opt_ms_mean"] > 0 and r["optimizer"] == "adamw"
    # Raw samples: exactly `steps` timed and `warmup` untimed; the summary is their mean.
    raw = rows(
        db_path, "SELECT samples, metrics FROM runs WHERE json_extract(settings,'$.mode')='train'"
    )
    samples, metrics = json.loads(raw[0]["samples"]), json.loads(raw[0]["metrics"])
    assert len(samples["step_ms"]) == 3 and len(samples["warmup"]["step_ms"]) == 1
    assert metrics["step_ms_mean"] == pytest.approx(sum(samples["step_ms"]) / 3)
    assert metrics["step_ms_min"] == min(samples["step_ms"])
    # Derived figures are computed from the shapes.
    from cs336sys.models.config import from_preset

    cfg = from_preset(
        "tiny", d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256, context_length=16
    )
    assert metrics["flops_per_step"] == step_flops(cfg, 2, 16, "train")
    assert metrics["params"] == sum(p.numel() for p in TransformerLM(cfg).parameters())
    inv = rows(db_path, "SELECT * FROM invocations")
    assert len(inv) == 1 and inv[0]["exit_status"] == 0 and inv[0]["command"] == "model"
    assert inv[0]["torch_version"] == torch.__version__
    assert "train" in result.stdout and "step ms" in result.stdout  # the sweep table


def test_list_options_accept_commas_and_repetition(db_path):
    result = invoke(
        "model",
        *MICRO,
        "--seq",
        "16",
        "--precision",
        "fp32",
        "--precision",
        "bf16,fp32",
        "--mode",
        "forward",
        "--db",
        db_path,
    )
    assert result.exit_code == 0, result.output
    assert [r["precision"] for r in rows(db_path)] == ["fp32", "bf16"]
    assert {r["logits_dtype"] for r in rows(db_path)} == {"float32", "bfloat16"}


def test_db_from_environment_variable(tmp_path, monkeypatch):
    path = tmp_path / "from-env.db"
    monkeypatch.setenv("CS336SYS_DB", str(path))
    result = invoke("model", *MICRO, "--seq", "8", "--mode", "forward")
    assert result.exit_code == 0, result.output
    assert len(rows(path)) == 1


def _fail_at(monkeypatch, context_length, exc):
    original = TransformerLM.forward

    def forward(self, token_ids, *a, **kw):
        if token_ids.shape[1] == context_length:
            raise exc
        return original(self, token_ids, *a, **kw)

    monkeypatch.setattr(TransformerLM, "forward", forward)


def test_simulated_oom_is_a_row_and_the_sweep_goes_on(db_path, monkeypatch):
    _fail_at(
        monkeypatch,
        16,
        torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 80.00 GiB"),
    )
    result = invoke(
        "model", *MICRO, "--seq", "8,16,32", "--mode", "train", "--db", db_path
    )
    assert result.exit_code == 0, result.output
    got = rows(db_path)
    assert [(r["seq"], r["status"]) for r in got] == [(8, "ok"), (16, "oom"), (32, "ok")]
    assert "out of memory" in got[1]["error"] and got[1]["step_ms_mean"] is None
    # the printed table's status cell says why, shortened; the whole reason is under it
    assert "oom: CUDA out of memory. Tried" in result.stdout
    assert "oom: " in result.stdout and "Tried to allocate 80.00 GiB" in result.stdout


def test_other_exceptions_are_error_rows(db_path, monkeypatch):
    _fail_at(monkeypatch, 8, ValueError("boom"))
    result = invoke(
        "model", *MICRO, "--seq", "8,16", "--mode", "forward", "--db", db_path
    )
    assert result.exit_code == 1  # the sweep finished, but a point failed
    got = rows(db_path)
    assert [(r["seq"], r["status"]) for r in got] == [(8, "error"), (16, "ok")]
    # raised outside cs336sys (here, in this file), so the line names where
    first = got[0]["error"].splitlines()[0]
    assert first.endswith("ValueError: boom") and first.startswith("tests/test_cli.py:")
    assert rows(db_path, "SELECT exit_status FROM invocations")[0]["exit_status"] == 1


BAD_INPUTS = [
    (["--size", "huge"], "unknown size"),
    (["--attention", "magic"], "unknown value 'magic'"),
    (["--d-model", "66", "--num-heads", "4"], "--d-model 66 is not divisible by --num-heads 4"),
    (["--iters", "0"], "--iters must be positive"),
    (["--iters", "-3"], "--iters must be positive"),
    (["--warmup", "-1"], "--warmup"),
    (["--mode", "inference"], "--mode"),
    (["--precision", "fp8"], "--precision"),
    (["--seq", "abc"], "not an integer"),
    (["--seq", "0"], "must be positive"),
    (["--seq", "65537"], "--seq 65537 is above the model's maximum context length 65536"),
    (["--batch", "-2"], "must be positive"),
    (["--device", "tpu"], "unknown device"),
    # measured, and stored as a device of its own, which --resume and the report kept apart
    (["--device", "cpu:0"], "unknown device 'cpu:0'; choose from auto, cpu, cuda, cuda:N"),
    (["--mode", "forward,forward-backward", "--optimizer", "torch-adamw"],
     "--optimizer is the training step's, which --mode forward,forward-backward leaves out"),
]


@pytest.mark.parametrize("args,message", BAD_INPUTS)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(db_path, args, message):
    result = invoke("model", *MICRO, "--seq", "8", *args, "--db", db_path)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], result.stderr
    assert not db_path.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_device_cuda_without_cuda_is_bad_input(db_path):
    result = invoke("model", *MICRO, "--device", "cuda", "--db", db_path)
    assert result.exit_code == 2 and "CUDA is not available" in result.stderr
    assert not db_path.exists()


def test_triton_attention_without_cuda_or_interpreter_is_bad_input(db_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    result = invoke(
        "model", *MICRO, "--seq", "8", "--attention", "triton", "--db", db_path
    )
    assert (
        result.exit_code == 2
        and "--attention triton needs CUDA, or TRITON_INTERPRET=1" in result.stderr
    )
    assert not db_path.exists()


def test_db_that_is_not_sqlite_is_bad_input_and_untouched(tmp_path):
    path = tmp_path / "results.db"
    path.write_bytes(b"not a database, but something precious\n")
    for args in (["model", *MICRO, "--seq", "8"], ["sql", "SELECT 1"]):
        result = invoke(*args, "--db", path)
        assert result.exit_code == 2 and "not a SQLite database" in result.stderr
    assert path.read_bytes() == b"not a database, but something precious\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["results.db"]


def test_resume_skips_points_stored_ok_for_this_commit(db_path, monkeypatch):
    from cs336sys.measure import provenance

    monkeypatch.setattr(provenance, "git_info", lambda *a: {"git_commit": "c" * 40, "git_dirty": 0})
    assert (
        invoke(
            "model", *MICRO, "--seq", "8", "--mode", "forward", "--db", db_path
        ).exit_code
        == 0
    )
    result = invoke(
        "model",
        *MICRO,
        "--seq",
        "8,16",
        "--mode",
        "forward",
        "--resume",
        "--db",
        db_path,
    )
    assert result.exit_code == 0 and "skipping 1 point" in result.stderr
    assert [r["seq"] for r in rows(db_path)] == [8, 16]


def test_resume_outside_a_checkout_skips_by_the_installed_version(db_path, monkeypatch):
    """A package installed from a wheel has no commit: its version stands for the code, so
    --resume skips what this version stored, and runs again what another one did."""
    import cs336sys
    from cs336sys.measure import provenance

    monkeypatch.setattr(provenance, "git_info", lambda *a: {"git_commit": None, "git_dirty": None})
    real = cs336sys.__version__
    args = ["model", *MICRO, "--seq", "8", "--mode", "forward", "--db", db_path]
    assert invoke(*args).exit_code == 0
    result = invoke(*args, "--resume")
    assert result.exit_code == 0 and "skipping 1 point" in result.stderr
    monkeypatch.setattr(cs336sys, "__version__", "9.9.9")
    result = invoke(*args, "--resume")
    assert result.exit_code == 0 and "skipping" not in result.stderr
    conn = sqlite3.connect(db_path)
    stored = conn.execute("SELECT i.cs336sys_version FROM runs r JOIN invocations i "
                          "ON i.id = r.invocation_id ORDER BY r.started").fetchall()
    conn.close()
    assert stored == [(real,), ("9.9.9",)]  # run here, skipped, run again by 9.9.9


def test_resume_does_not_skip_points_measured_on_another_machine(db_path, tmp_path, monkeypatch):
    from cs336sys.measure import provenance

    monkeypatch.setattr(provenance, "git_info", lambda *a: {"git_commit": "c" * 40, "git_dirty": 0})
    args = ["model", *MICRO, "--seq", "8", "--mode", "forward"]
    other = tmp_path / "h100.db"  # the same commit and point, measured on another box
    assert invoke(*args, "--db", other).exit_code == 0
    conn = sqlite3.connect(other)
    conn.execute("UPDATE invocations SET host = 'gpu-box', gpu = 'NVIDIA H100 80GB HBM3', "
                 "gpu_count = 1")
    conn.commit()
    conn.close()
    assert invoke("db", "merge", other, "--db", db_path).exit_code == 0
    result = invoke(*args, "--resume", "--db", db_path)
    assert result.exit_code == 0 and "skipping" not in result.stderr
    assert len(rows(db_path)) == 2  # measured here too
    result = invoke(*args, "--resume", "--db", db_path)  # and now stored here: skipped
    assert "skipping 1 point" in result.stderr and len(rows(db_path)) == 2


def test_resume_runs_again_a_point_measured_with_other_switches(db_path, monkeypatch):
    """The environment variables that change what runs (provenance.measurement_env) are
    stored with the invocation, and a point measured under others is another measurement."""
    from cs336sys.measure import provenance

    monkeypatch.setattr(provenance, "git_info", lambda *a: {"git_commit": "c" * 40, "git_dirty": 0})
    monkeypatch.setenv("CS336SYS_TRITON_TMA", "1")
    args = ["model", *MICRO, "--seq", "8", "--mode", "forward", "--resume", "--db", db_path]
    assert invoke(*args).exit_code == 0
    monkeypatch.delenv("CS336SYS_TRITON_TMA")
    result = invoke(*args)
    assert result.exit_code == 0 and "skipping" not in result.stderr
    result = invoke(*args)
    assert "skipping 1 point" in result.stderr
    envs = [json.loads(r["env"] or "{}") for r in rows(db_path)]
    assert [e.get("CS336SYS_TRITON_TMA") for e in envs] == ["1", None]


def test_measurement_env_keeps_the_switches_and_drops_paths():
    from cs336sys.measure.provenance import measurement_env

    env = {"CS336SYS_TRITON_ATOMIC_DQ": "1", "CS336SYS_DB": "/x.db", "TRITON_CACHE_DIR": "/c",
           "NCCL_P2P_DISABLE": "1", "OMP_NUM_THREADS": "4", "HOME": "/root",
           "TORCHINDUCTOR_CACHE_DIR": "/t", "PATH": "/bin"}
    assert json.loads(measurement_env(env)) == {
        "CS336SYS_TRITON_ATOMIC_DQ": "1", "NCCL_P2P_DISABLE": "1", "OMP_NUM_THREADS": "4"}
    assert measurement_env({"HOME": "/root"}) is None


@pytest.fixture
def filled_db(db_path):
    assert (
        invoke(
            "model", *MICRO, "--seq", "8,16", "--mode", "forward", "--db", db_path
        ).exit_code
        == 0
    )
    return db_path


def test_sql_prints_table_json_and_csv(filled_db):
    q = "SELECT seq, mode FROM model_runs ORDER BY seq"
    table = invoke("sql", q, "--db", filled_db)
    assert table.exit_code == 0
    assert table.stdout.split("\n")[0].split() == ["seq", "mode"]
    assert table.stdout.split("\n")[2].split() == ["8", "forward"]
    as_json = invoke("sql", q, "--json", "--db", filled_db)
    assert json.loads(as_json.stdout) == [
        {"seq": 8, "mode": "forward"},
        {"seq": 16, "mode": "forward"},
    ]
    as_csv = invoke("sql", q, "--csv", "--db", filled_db)
    assert as_csv.stdout == "seq,mode\n8,forward\n16,forward\n"
    param = invoke(
        "sql",
        "SELECT count(*) AS n FROM model_runs WHERE seq = ?",
        "-p",
        "16",
        "--json",
        "--db",
        filled_db,
    )
    assert json.loads(param.stdout) == [{"n": 1}]
    # a join's two `mode` columns are two keys (one was lost), an infinity is text (JSON has
    # none), and a parameter that is not written as a number binds as text ('007' bound 7)
    joined = invoke("sql", "SELECT a.mode, b.mode, 1e308 * 10 AS big, ? AS label, ? AS n "
                    "FROM model_runs a JOIN model_runs b ON a.seq = 8 AND b.seq = 16",
                    "-p", "007", "-p", "16", "--json", "--db", filled_db)
    assert json.loads(joined.stdout) == [{"mode": "forward", "mode_2": "forward", "big": "inf",
                                          "label": "007", "n": 16}]
    # a real column keeps its name: the second `a` takes one no column has
    named = invoke("sql", "SELECT 1 AS a, 2 AS a, 3 AS a_2", "--json", "--db", filled_db)
    assert json.loads(named.stdout) == [{"a": 1, "a_3": 2, "a_2": 3}]
    # the table shows what is stored: text that reads as a number kept as it is ('1.10' was
    # 1.1, '1e3' 1000), a float whole (10.000133514404297 was 10.0001)
    exact = invoke("sql", "SELECT '1.10' AS label, 10.000133514404297 AS w, '1e3' AS y",
                   "--db", filled_db)
    assert exact.stdout.split("\n")[2].split() == ["1.10", "10.000133514404297", "1e3"]


@pytest.mark.parametrize(
    "statement",
    [
        "DELETE FROM runs",
        "INSERT INTO invocations (id) VALUES ('x')",
        "DROP TABLE runs",
        "CREATE TABLE t (x)",
        "UPDATE runs SET status = 'error'",
        "PRAGMA user_version = 7",
    ],
)
def test_sql_refuses_writes(filled_db, statement):
    before = rows(filled_db, "SELECT id, status FROM runs")
    result = invoke("sql", statement, "--db", filled_db)
    assert result.exit_code == 2 and "read-only" in result.stderr, result.output
    assert rows(filled_db, "SELECT id, status FROM runs") == before
    from cs336sys.store.schema import SCHEMA_VERSION

    version = sqlite3.connect(filled_db).execute("PRAGMA user_version").fetchone()[0]
    assert version == SCHEMA_VERSION  # not changed by `PRAGMA user_version = 7`


def test_sql_errors_and_missing_store(filled_db, tmp_path):
    result = invoke("sql", "SELEC nonsense", "--db", filled_db)
    assert result.exit_code == 2 and "SQL error" in result.stderr
    missing = tmp_path / "nowhere.db"
    result = invoke("sql", "SELECT 1", "--db", missing)
    assert result.exit_code == 2 and "no results store" in result.stderr
    assert not missing.exists()


def test_an_unknown_column_or_table_says_where_it_is(filled_db):
    """A setting asked of the runs table (which keeps settings as JSON) names the views that
    have it; a misspelt view gets the closest name; anything else is the error alone."""
    def said(query: str) -> str:
        result = invoke("sql", query, "--db", filled_db)
        assert result.exit_code == 2 and result.stdout == "", result.output
        (line,) = result.stderr.strip().splitlines()
        return line

    assert said("SELECT r.mode FROM runs r") == (
        "Error: SQL error: no such column: r.mode (mode is a column of memory_runs, model_runs, "
        "profile_runs; the runs table keeps settings and metrics as JSON)")
    assert said("SELECT world_size FROM attention_runs") == (
        "Error: SQL error: no such column: world_size (world_size is a column of comm_runs, "
        "ddp_runs, step_runs)")
    assert said("SELECT * FROM model_run") == (
        "Error: SQL error: no such table: model_run (did you mean 'model_runs'? "
        "cs336sys sql --schema lists them)")
    assert said("SELECT nothing_like_it FROM runs") == (
        "Error: SQL error: no such column: nothing_like_it")
    # a column named like a refusal is a typo, not a refused write
    assert said("SELECT readonly FROM model_runs") == (
        "Error: SQL error: no such column: readonly")


def test_env_prints_what_would_be_recorded():
    result = invoke("env", "--json", "--device", "cpu")
    assert result.exit_code == 0
    info = json.loads(result.stdout)
    assert info["gpu"] == "cpu" and info["torch_version"] == torch.__version__
    assert {"git_commit", "git_dirty", "cpu", "host", "python_version"} <= set(info)


def test_help_and_sql_do_not_import_torch(filled_db):
    code = (
        "import sys; from cs336sys.cli import app\n"
        "for args in (['--help'], ['sql', 'SELECT count(*) FROM model_runs', '--db', sys.argv[1]]):\n"
        "    try: app(args)\n"
        "    except SystemExit as e: assert e.code == 0, e.code\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(filled_db)], capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    "args, heavy",
    [
        (["--help"], ("torch", "numpy", "sqlite_utils")),
        (["sql", "SELECT count(*) FROM model_runs", "--db", "{db}"], ("torch", "numpy")),
    ],
)
def test_help_and_sql_import_nothing_heavy(filled_db, args, heavy):
    """--help and sql answer at once: sqlite-utils imports numpy, torch takes seconds."""
    code = (
        "import json, sys; from cs336sys.cli import app\n"
        "try: app(json.loads(sys.argv[1]))\n"
        "except SystemExit as e: assert e.code == 0, e.code\n"
        "print(json.dumps(sorted(m for m in json.loads(sys.argv[2]) if m in sys.modules)))\n"
    )
    argv = [a.format(db=filled_db) for a in args]
    out = subprocess.run([sys.executable, "-c", code, json.dumps(argv), json.dumps(heavy)],
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == []


@pytest.mark.slow
def test_compiled_model_runs_and_is_recorded(db_path):
    result = invoke(  # one block: inductor's build is most of the time
        "model", *micro(num_layers=1), "--seq", "16", "--mode", "forward", "--compile",
        "--db", db_path,
    )
    assert result.exit_code == 0, result.output
    (row,) = rows(db_path)
    assert row["status"] == "ok" and row["compile"] == 1 and row["step_ms_mean"] > 0


@pytest.mark.parametrize(
    "attention",
    ["naive", "sdpa", "flash-torch", pytest.param("triton", marks=pytest.mark.slow)],  # interpreted
)
def test_model_trains_with_each_attention(db_path, attention, monkeypatch):
    # The same random batch every step: a working attention (forward and backward) makes the
    # loss fall; a wrong gradient would not. Triton runs interpreted here (conftest).
    # flash-torch's backward runs eagerly: compiled, it is a C++ build by inductor (most of
    # the time); tests/test_flash_torch.py checks the compiled backward against it.
    from cs336sys.attention import flash_torch

    monkeypatch.setenv(flash_torch.COMPILE_ENV, "0")
    result = invoke(
        "model",
        *micro(num_layers=1, batch=1, warmup=0),  # one block, one sequence: interpreted Triton
        "--seq",
        "24",
        "--mode",
        "train",
        "--attention",
        attention,
        "--iters",
        "4",
        "--db",
        db_path,
    )
    assert result.exit_code == 0, result.output
    (row,) = rows(db_path)
    losses = json.loads(rows(db_path, "SELECT samples FROM runs")[0]["samples"])["loss"]
    assert row["status"] == "ok" and len(losses) == 4
    assert all(map(lambda x: x == x and abs(x) != float("inf"), losses))
    assert all(b < a for a, b in zip(losses, losses[1:], strict=False)), losses


def test_a_kind_without_a_command_and_a_name_taken_twice_are_said_in_words():
    """The two ways to get the declared commands wrong (cli/declared.py): a kind of the
    catalog that declares no command and is not written in cli/, and a name both."""
    from cs336sys.cli.declared import Commands, command_of

    with pytest.raises(ValueError, match="experiments/memory.py declares no command"):
        command_of("memory")  # written in cli/ (WRITTEN_HERE), so it declares none
    with pytest.raises(ValueError, match="plan: a command written in cli/ and declared"):
        Commands({"plan": object()}, {"plan": "plan"}, before="plan", prepare=lambda c: c)


def test_profile_takes_every_option_of_the_command_it_profiles():
    """Declared once (experiments/model_command.py, attention_command.py): profile model has
    model's options, with its own help where it counts steps differently, and profile
    attention attention's less the timer's (its --rounds and --min-time too); the profiler
    records its steps in one round (no --rounds on either)."""
    import typer.main

    from cs336sys.cli.profile import profile_attention, profile_model

    root = typer.main.get_command(app)

    def names(command):
        return {p.name for p in command.params}

    def arguments(function):
        import inspect

        return set(inspect.signature(function).parameters)

    assert names(root.commands["model"]) - {"rounds"} <= arguments(profile_model)
    assert names(root.commands["attention"]) - {"timer", "skip_after_oom", "rounds",
                                                "min_time"} <= arguments(profile_attention)
    assert {"top", "trace", "nsys", "exec_", "nvtx"} <= \
        arguments(profile_model) & arguments(profile_attention)
    import inspect

    warmup = inspect.signature(profile_model).parameters["warmup"].annotation
    assert "before the profiler" in warmup.__metadata__[0].help


def test_dry_run_says_the_points_and_writes_nothing(db_path):
    result = invoke("model", *micro(), "--seq", "8,16", "--mode", "forward", "--dry-run",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dry run: 2 point(s), estimated ")
    assert "nothing measured" in result.stdout and not db_path.exists()
    # one the memory estimate refuses is said to be skipped, not timed (28 days of it)
    result = invoke("model", "--size", "xl", "--seq", "32768", "--batch", "64", "--dry-run",
                    "--device", "cpu", "--db", db_path)
    said = " ".join(result.stdout.split())
    assert said.startswith("dry run: 1 point(s); 1 would be skipped (the first needs ~"), said
    assert not db_path.exists()


@pytest.mark.parametrize("args", [
    ["attention", "--attention", "naive", "--seq", "128,0128", "--d-head", "16", "--pass",
     "forward"],
    ["ddp", "--impl", "bucketed", "--bucket-mb", "1,1.0", "--world-size", "2"],
    ["ddp", "--impl", "naive", "--batch", "4,04", "--world-size", "2"],
])
def test_two_spellings_of_one_value_are_one_point(db_path, args):
    """`--bucket-mb 1,1.0` ran the same point twice: two rows under one heading whose step
    times differed 2x for no reason the table said. Values are compared as parsed."""
    result = invoke(*args, "--dry-run", "--db", db_path)
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("dry run: 1 point(s)"), result.stdout


def test_a_dry_run_with_resume_counts_only_what_is_left(db_path):
    """--resume --dry-run estimated every point, stored or not: a resumed sweep's (or a
    handout run's) time was its whole time. It counts those --resume would measure, and
    writes nothing."""
    args = ["model", *micro(), "--mode", "forward", "--iters", "1", "--db", db_path]
    assert invoke(*args, "--seq", "8,16").exit_code == 0
    before = db_path.read_bytes()
    result = invoke(*args, "--seq", "8,16,32", "--resume", "--dry-run")
    assert result.exit_code == 0, result.output
    assert result.stdout.startswith("--resume: skipping 2/3 point(s) stored ok\n"
                                    "dry run: 1 point(s), estimated ")
    result = invoke(*args, "--seq", "8,16", "--resume", "--dry-run")
    assert "dry run: every point is stored ok already; nothing to measure" in result.stdout
    assert db_path.read_bytes() == before


def test_a_warmup_list_is_a_point_per_count_and_a_column(db_path):
    """The warm-up study in one run: the counts are points of their own, never merged."""
    result = invoke("model", *micro(warmup=0), "--seq", "8", "--mode", "forward", "--warmup",
                    "0,2", "--iters", "2", "--db", db_path)
    assert result.exit_code == 0, result.output
    assert rows(db_path, "SELECT warmup FROM model_runs ORDER BY warmup") == [
        {"warmup": 0}, {"warmup": 2}]
    samples = [json.loads(r["samples"]) for r in rows(db_path, "SELECT samples FROM runs")]
    assert sorted(max(map(len, s["warmup"].values()), default=0) for s in samples) == [0, 2]
    assert "warmup" in result.stdout


def test_resume_under_a_label_skips_only_that_labels_points(db_path):
    args = ["model", *micro(warmup=0), "--seq", "8", "--mode", "forward", "--iters", "1",
            "--db", db_path]
    assert invoke(*args, "--label", "a").exit_code == 0
    assert invoke(*args, "--label", "a", "--resume").exit_code == 0  # stored under a: skipped
    assert invoke(*args, "--label", "b", "--resume").exit_code == 0  # not under b: measured
    assert invoke(*args, "--resume").exit_code == 0  # no label: any stored point counts
    assert rows(db_path, "SELECT label, count(*) AS n FROM model_runs GROUP BY label") == [
        {"label": "a", "n": 1}, {"label": "b", "n": 1}]


def test_a_store_that_cannot_be_written_mid_sweep_is_one_line_and_keeps_what_it_has(
        db_path, monkeypatch):
    """A full disk after the first point ended in a 30-line traceback ("disk I/O error"),
    with no count and no way on; it is one line, exit 1, and the invocation's end recorded."""
    from cs336sys.store.db import Store

    real, calls = Store.add_run, []

    def full(self, *args, **kwargs):
        calls.append(1)
        if len(calls) > 1:
            raise sqlite3.OperationalError("database or disk is full")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(Store, "add_run", full)
    result = invoke("model", *MICRO, "--seq", "8,16", "--mode", "forward", "--db", db_path)
    assert result.exit_code == 1, result.output
    (line,) = [x for x in result.stderr.splitlines() if x.startswith("Error")]
    assert line == (f"Error: cannot write to {db_path}: database or disk is full (is its disk "
                    "full?); 1 point(s) stored before; run the same command with --resume to "
                    "measure the rest")
    assert "Traceback" not in result.output
    (inv,) = query(db_path, "SELECT exit_status FROM invocations")
    assert inv["exit_status"] == 1 and len(rows(db_path)) == 1


def test_tf32_set_the_new_way_by_your_code_is_measured(db_path):
    """torch 2.9's `fp32_precision = "tf32"`, set by the user's code (their adapters, say):
    the legacy `allow_tf32` getter cs336sys read raises once the new setting is used, and
    every model point was an error, its timings lost."""
    import torch

    from cs336sys.measure.device import tf32_matmuls

    matmul = torch.backends.cuda.matmul
    assert not tf32_matmuls()
    matmul.fp32_precision = "tf32"
    try:
        assert tf32_matmuls()
        result = invoke("model", *micro(iters=1, warmup=0, num_layers=1), "--seq", "16",
                        "--db", db_path)
    finally:
        matmul.fp32_precision = "none"
    assert result.exit_code == 0, result.output
    assert [r["status"] for r in query(db_path, "SELECT status FROM runs")] == ["ok"]
    assert not tf32_matmuls() and matmul.allow_tf32 is False  # the legacy getter again


@pytest.mark.parametrize("args", [
    ["sql", "select 1", "--db", "{long}.db"],
    ["report", "--db", "{db}", "--out", "{long}"],
    ["model", "--size", "tiny", "--seq", "16", "--db", "{long}.db"],
    ["attention", "--impl", "naive", "--adapters", "{long}.py", "--db", "{db}"],
])
def test_a_file_name_past_255_bytes_is_one_line_and_exit_2(tmp_path, db_path, args):
    """Path.exists() raises ENAMETOOLONG (Python 3.11): every path option gave a traceback
    and exit 1."""
    long = str(tmp_path / ("a" * 300))
    given = [a.format(long=long, db=db_path) for a in args]
    result = invoke(*given)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: File name too long: ")
    assert not db_path.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args", [
    ["model", "--size", "tiny", "--seq", "16", "--optimizer", "yours=os:path"],
    ["attention", "--impl", "yours-x=os:path", "--seq", "16"],
])
def test_a_one_off_target_that_is_no_class_or_function_is_refused(db_path, args):
    """`--optimizer yours=os:path` (a module) was stored as an error that said only
    "'module' object is not callable"; `--model os:path` was refused."""
    result = invoke(*args, "--db", db_path)
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.endswith(": os:path is a module, not a class or function"), line
    assert not db_path.exists()


@pytest.mark.parametrize("variable", ["CS336SYS_TRITON_TMA", "CS336SYS_FLASH_TORCH_COMPILE",
                                      "CS336SYS_TRITON_AUTOTUNE",
                                      "CS336SYS_TRITON_DIRECT_LAUNCH"])
def test_a_switch_in_the_environment_that_is_no_0_or_1_is_refused(db_path, monkeypatch,
                                                                   variable):
    """CS336SYS_TRITON_TMA=yes read as on, without a word; CS336SYS_FLASH_TORCH_COMPILE=yes
    made every flash-torch point an error. Both are one line, exit 2, nothing written."""
    monkeypatch.setenv(variable, "yes")
    result = invoke("attention", "--impl", "naive", "--seq", "16", "--db", db_path)
    assert result.exit_code == 2, result.output
    assert result.stderr.strip() == f"Error: {variable} must be 0 or 1 (or unset), got 'yes'"
    assert not db_path.exists()
