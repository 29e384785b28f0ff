"""A user's second hour: what a mistyped or differently spelled option value gets back.

Each bad value is one line on stderr and exit 2 with nothing written; the line names the
option as it was typed (`--impl`, not its other name `--attention`) and, where one allowed
value is close, suggests it. Size presets are read in any case and stored as the preset
table spells them.
"""

from __future__ import annotations

import pytest

from tests.conftest import MICRO, invoke, query


@pytest.mark.parametrize(
    "args, line",
    [
        (["attention", "--impl", "trition"],
         "Error: --impl: unknown value 'trition' (did you mean 'triton'?); choose from naive,"),
        (["attention", "--attention", "trition"],
         "Error: --attention: unknown value 'trition' (did you mean 'triton'?); choose from"),
        (["attention", "--impl=naive,trition"], "Error: --impl: unknown value 'trition'"),
        (["ddp", "--impl", "fdsp"], "Error: --impl: unknown value 'fdsp' (did you mean 'fsdp'?)"),
        (["model", "--size", "smal"], "Error: --size: unknown size 'smal' (did you mean 'small'?)"),
        (["model", "--context-length", "0"], "Error: --context-length must be positive, got 0"),
        (["model", "--seq", "0"], "Error: --seq must be positive, got 0"),
        (["step", "--switches", "fused-adam"],
         "Error: --switches: unknown switch 'fused-adam' (did you mean 'fused-adamw'?)"),
        (["attention", "--pass", "fwd"], "Error: --pass: unknown value 'fwd' (did you mean 'forward'?)"),
        (["attention", "--pass", "sideways"], "Error: --pass: unknown value 'sideways'; choose from"),
    ],
)
def test_a_bad_value_is_named_as_typed_with_the_closest_one(db_path, args, line):
    result = invoke(*args, "--db", db_path)
    assert result.exit_code == 2, result.output
    (got,) = [x for x in result.stderr.splitlines() if not x.startswith("note:")]
    assert got.startswith(line), got
    assert not db_path.exists()


def test_size_presets_in_any_case_are_stored_as_the_table_spells_them(db_path):
    args = [*MICRO, "--seq", "8", "--mode", "forward", "--warmup", "0", "--iters", "1"]
    args[args.index("tiny")] = "TINY"
    result = invoke("model", *args, "--db", db_path)
    assert result.exit_code == 0, result.output
    assert query(db_path, "SELECT size FROM model_runs") == [{"size": "tiny"}]
    lower = invoke("plan", "--size", "2.7b", "--db", db_path)
    upper = invoke("plan", "--size", "2.7B", "--db", db_path)
    assert lower.exit_code == upper.exit_code == 0, lower.output
    assert lower.stdout.replace("2.7b", "2.7B") == upper.stdout


def test_sql_schema_lists_the_views_and_describes_a_views_columns(db_path):
    from cs336sys.experiments import model
    from cs336sys.experiments.catalog import EXPERIMENTS
    from cs336sys.store import Store

    Store(db_path, EXPERIMENTS).close()
    listing = invoke("sql", "--schema", "--db", db_path)
    assert listing.exit_code == 0, listing.output
    names = {line.split()[0] for line in listing.stdout.splitlines()[2:]}
    assert {e.view for e in EXPERIMENTS} | {"runs", "invocations", "kernel_stats"} <= names
    one = invoke("sql", "--schema", "model_runs", "--db", db_path)
    assert one.exit_code == 0, one.output
    described = {line.split()[0]: line for line in one.stdout.splitlines()[2:]}
    view_columns = [r["name"] for r in query(db_path, "PRAGMA table_info(model_runs)")]
    assert list(described) == view_columns  # every column, in the view's order
    median = model.EXPERIMENT.metric("step_ms_median")
    assert described["step_ms_median"].split(None, 2)[1:] == ["ms", median.meaning]
    assert "setting (int)" in described["seq"] and "GPU" in described["gpu"]
    bad = invoke("sql", "--schema", "model_run", "--db", db_path)
    assert bad.exit_code == 2 and "did you mean 'model_runs'?" in bad.stderr
