"""`cs336sys precision`: accumulation results against independent float arithmetic, and the
dtypes autocast produces against torch's own autocast op lists."""

import ast
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from cs336sys.experiments import precision as exp
from tests.conftest import invoke, query, view_rows

rows = view_rows('precision_runs')




# -- accumulate --------------------------------------------------------------------------------


def numpy_sum(acc, val, upcast, n=1000, value=0.01):
    """The assignment's loops in numpy scalars: every addition rounds to the sum's dtype."""
    s = acc(0)
    for _ in range(n):
        x = val(value)
        s = acc(s + (np.float32(x) if upcast else x))
    return float(s)


def round_to(fmt, x):
    """Round a Python float to IEEE binary32 ('f') or binary16 ('e'), nearest-even."""
    return struct.unpack(fmt, struct.pack(fmt, x))[0]


def struct_sum(acc_fmt, val_fmt, n=1000, value=0.01):
    """Second, numpy-free reference: the exact sum of two such floats fits a double (their
    exponents differ by < 29 here), so rounding that double once is the IEEE addition."""
    s, x = 0.0, round_to(val_fmt, value)
    for _ in range(n):
        s = round_to(acc_fmt, s + x)
    return s


# variant -> (numpy reference, struct reference, value worked out by hand below)
#   fp32: float32(0.01) = 0.009999999776482582; 1000 rounded float32 additions -> 10.0001335...
#   fp16: float16(0.01) = 0.01000213623046875 (= 1311 / 2**17); each step is rounded to the
#         sum's spacing (one step adds 5·2**-9 from 0.5 to 4, 3·2**-8 to 8, 2**-7 above):
#         9.953125 = 10 - 3/64
#   fp16 values into float32: 1000 · 1311 / 2**17 needs only 21 significant bits, so float32
#         adds them exactly: 10.00213623046875, the whole error is 0.01's rounding to float16
EXPECTED = {
    "fp32": (numpy_sum(np.float32, np.float32, False), struct_sum("f", "f"), 10.000133514404297),
    "fp16": (numpy_sum(np.float16, np.float16, False), struct_sum("e", "e"), 9.953125),
    "fp16-into-fp32": (
        numpy_sum(np.float32, np.float16, False),
        struct_sum("f", "e"),
        1000 * 1311 / 2**17,
    ),
    "fp16-upcast": (
        numpy_sum(np.float32, np.float16, True),
        struct_sum("f", "e"),
        1000 * 1311 / 2**17,
    ),
}


def test_accumulate_rows_equal_independent_float_arithmetic(db_path):
    result = invoke("precision", "accumulate", "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    got = rows(db_path)
    assert [r["variant"] for r in got] == ["fp32", "fp16", "fp16-into-fp32", "fp16-upcast"]
    dtypes = {
        "fp32": ("float32", "float32", 0),
        "fp16": ("float16", "float16", 0),
        "fp16-into-fp32": ("float32", "float16", 0),
        "fp16-upcast": ("float32", "float16", 1),
    }
    for r in got:
        by_numpy, by_struct, by_hand = EXPECTED[r["variant"]]
        assert by_numpy == by_struct == by_hand  # the three references agree exactly
        assert r["status"] == "ok" and r["kind"] == "accumulate" and r["device"] == "cpu"
        assert (r["accumulator_dtype"], r["value_dtype"], r["upcast"]) == dtypes[r["variant"]]
        assert r["result_dtype"] == r["accumulator_dtype"]
        assert (r["additions"], r["value"], r["target"]) == (1000, 0.01, 10.0)
        assert r["result"] == by_hand  # exact: the stored float is the tensor's value
        assert r["error_vs_target"] == by_hand - 10.0
        assert r["abs_error"] == abs(by_hand - 10.0)
        assert r["rel_error"] == pytest.approx(abs(by_hand - 10.0) / 10.0, rel=1e-15)
    fp16_addend = 1311 / 2**17
    assert float(np.float16(0.01)) == fp16_addend
    mixed = {r["variant"]: r for r in got}
    for v in ("fp16-into-fp32", "fp16-upcast"):
        assert mixed[v]["addend"] == fp16_addend
        assert mixed[v]["addend_error_total"] == 1000 * fp16_addend - 10.0
        assert mixed[v]["sum_rounding_error"] == 0.0  # float32 added them without rounding
    assert mixed["fp32"]["addend"] == float(np.float32(0.01))
    # errors, ordered as the assignment discusses them: fp16 sum worst, fp32 sum best
    errs = {v: abs(r["error_vs_target"]) for v, r in mixed.items()}
    assert errs["fp32"] < errs["fp16-into-fp32"] == errs["fp16-upcast"] < errs["fp16"]
    assert "9.953125" in result.stdout and "10.000133514404297" in result.stdout


def test_accumulate_other_counts_and_values_match_numpy():
    spec = exp.AccumulateSpec.of("fp16", additions=300, value=0.1, device="cpu")
    m = exp.run(spec).metrics
    assert m["result"] == numpy_sum(np.float16, np.float16, False, n=300, value=0.1)
    assert (
        m["target"] == 30.0 and exp.exact_target(3, 0.1) == 0.3
    )  # decimal, not 0.30000000000000004


def test_accumulate_errors_are_exact_and_an_overflow_is_kept(db_path):
    """0.1 x 3 in float32 is 0.300000011920928955078125: its error is 2^-23 x 0.1 exactly,
    not result - 0.3 in float64 (1.1920928966e-08). A float16 sum past 65504 is inf: it
    was stored as NULL, losing the overflow; it is kept, and reads back as inf."""
    from fractions import Fraction

    from cs336sys.report.select import Selection, load
    from cs336sys.store.db import connect_readonly

    m = exp.run(exp.AccumulateSpec.of("fp32", additions=3, value=0.1, device="cpu")).metrics
    exact = Fraction(m["result"]) - Fraction(3, 10)
    assert m["error_vs_target"] == float(exact) and m["abs_error"] == float(exact)
    # past float64's range the exact difference is an infinity, not an OverflowError
    m = exp.run(exp.AccumulateSpec.of("fp32", additions=1000, value=1e308, device="cpu")).metrics
    assert m["result"] == m["error_vs_target"] == float("inf")
    result = invoke("precision", "accumulate", "--value", "100", "--variant", "fp16,fp32",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    conn = connect_readonly(db_path)
    try:
        rows = load(conn, Selection(), [exp.EXPERIMENT])["precision"]
    finally:
        conn.close()
    by = {r["variant"]: r for r in rows}
    assert by["fp16"]["result"] == float("inf") and by["fp16"]["abs_error"] == float("inf")
    assert by["fp32"]["result"] == 100000.0
    (stored,) = query(db_path, "SELECT result FROM precision_runs WHERE variant = 'fp16'")
    assert stored["result"] is None  # the column stays a number: the value is kept apart


def test_the_accumulation_plot_names_each_sums_value():
    """Runs with --value 0.01 and --value 100 in one report: the bars read `fp32 (1000
    additions)` twice, and the note said fp16 overflowed beside the 0.01 run's fp16 bar."""
    from cs336sys.report.sections import Section

    rows = []
    for value, errors in ((0.01, {"fp32": 1.3e-4, "fp16": 0.047}),
                          (100.0, {"fp32": 0.0, "fp16": float("inf")})):
        for variant, error in errors.items():
            spec = exp.AccumulateSpec.of(variant, additions=1000, value=value, device="cpu")
            settings = spec.settings()
            rows.append({**settings, "_settings": settings, "status": "ok", "abs_error": error})
    sec = Section("precision", "Precision")
    exp.section(sec, rows)
    (fig,) = sec.figures
    assert [label for label, *_ in fig.plot.items] == ["fp32 (1000 × 0.01)", "fp16 (1000 × 0.01)"]
    assert fig.note == ("Exact, so not drawn: fp32 (1000 × 100.0). Overflowed to inf, so not "
                        "drawn: fp16 (1000 × 100.0).")


# -- autocast -----------------------------------------------------------------------------


def autocast_op_lists(class_name):
    """Op names in torch's own autocast test lists (torch/testing/_internal), read with ast so
    that the module (which needs test-only packages) is not imported."""
    path = Path(torch.__file__).parent / "testing" / "_internal" / "autocast_test_lists.py"
    if not path.exists():
        pytest.skip("this torch ships no autocast_test_lists.py")
    tree = ast.parse(path.read_text())
    cls = next(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef) and n.name == class_name)
    lists = {}
    for node in ast.walk(cls):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.targets[0], ast.Attribute)
            and isinstance(node.value, ast.List)
        ):
            lists[node.targets[0].attr] = {
                e.elts[0].value
                for e in node.value.elts
                if isinstance(e, ast.Tuple) and isinstance(e.elts[0], ast.Constant)
            }
    return lists


def expected_dtypes(class_name, low, device):
    """What the op lists predict for the toy model, low = the autocast dtype's name."""
    lists = autocast_op_lists(class_name)
    lower = set().union(*(v for k, v in lists.items() if k.endswith(("_16", "_fp16"))))
    fp32 = set().union(*(v for k, v in lists.items() if k.endswith("_fp32")))
    assert "linear" in lower and "nll_loss" in fp32  # the lists still say what we rely on
    fc1 = low  # linear: lower-precision list
    relu = fc1  # pointwise, in no list: runs in its input's dtype
    if "layer_norm" in fp32:
        ln = "float32"
    else:  # in no list: mixed inputs (low input, float32 weight) keep the input's dtype
        x = torch.randn(4, 10, device=device).to(getattr(torch, low))
        w, b = torch.ones(10, device=device), torch.zeros(10, device=device)
        ln = str(torch.nn.functional.layer_norm(x, (10,), w, b).dtype).removeprefix("torch.")
    # cross_entropy = log_softmax + nll_loss; nll_loss is in the float32 list
    return dict(param_dtype="float32", fc1_dtype=fc1, relu_dtype=relu, ln_dtype=ln,
                logits_dtype=low, loss_dtype="float32", grad_dtype="float32")


OBSERVED_COLUMNS = ("param_dtype", "fc1_dtype", "relu_dtype", "ln_dtype", "logits_dtype",
                    "loss_dtype", "grad_dtype")


def test_autocast_bf16_on_cpu_matches_torch_op_lists(db_path):
    result = invoke("precision", "autocast", "--precision", "bf16", "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    [r] = rows(db_path)
    assert (r["status"], r["kind"], r["precision"], r["device"]) == ("ok", "autocast", "bf16", "cpu")
    assert (r["in_features"], r["out_features"], r["batch"]) == (16, 4, 8)
    assert r["autocast_enabled"] == 1
    observed = {c: r[c] for c in OBSERVED_COLUMNS}
    # The observed truth with torch 2.13 on CPU. Unlike CUDA, CPU autocast does not list
    # layer_norm as float32, so the LayerNorm output stays bfloat16 here.
    assert observed == dict(
        param_dtype="float32", fc1_dtype="bfloat16", relu_dtype="bfloat16",
        ln_dtype="bfloat16", logits_dtype="bfloat16", loss_dtype="float32",
        grad_dtype="float32",
    )
    assert observed == expected_dtypes("AutocastCPUTestLists", "bfloat16", "cpu")
    assert r["loss"] > 0
    flags = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else None
    if flags is not None and "flags" in flags:
        has = any(f in flags.split() for f in ("avx512_bf16", "amx_bf16"))
        assert r["native"] == int(has), r["native_basis"]


def test_autocast_fp16_on_cpu_is_observed_not_crashed(db_path):
    result = invoke("precision", "autocast", "--precision", "fp16", "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    [r] = rows(db_path)
    if r["status"] == "skipped":  # an older torch may not autocast float16 on CPU
        assert r["autocast_enabled"] == 0 and "autocast" in r["error"]
        return
    # torch 2.13: CPU autocast accepts float16, with the same op lists as bfloat16
    assert r["status"] == "ok" and r["autocast_enabled"] == 1
    assert {c: r[c] for c in OBSERVED_COLUMNS} == expected_dtypes(
        "AutocastCPUTestLists", "float16", "cpu"
    )
    assert r["fc1_dtype"] == "float16" and r["loss_dtype"] == "float32"


def test_autocast_that_disables_itself_is_a_stored_skip(db_path, monkeypatch):
    # float64 is no autocast dtype on CPU: torch warns and disables autocast. The row must say
    # so rather than record float32 dtypes as if autocast had run.
    monkeypatch.setitem(exp._TORCH_DTYPE, "fp16", "float64")
    result = invoke("precision", "autocast", "--precision", "bf16,fp16", "--device", "cpu",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    ok, skipped = rows(db_path)
    assert ok["status"] == "ok" and ok["precision"] == "bf16"
    assert (skipped["status"], skipped["autocast_enabled"], skipped["fc1_dtype"]) == (
        "skipped",
        0,
        None,
    )
    assert "disabled itself" in skipped["error"] and "not supported" in skipped["error"]
    assert "fp16 on cpu: torch.autocast" in result.stderr
    assert not torch.is_autocast_enabled("cpu")


@pytest.mark.gpu
def test_autocast_on_cuda_matches_torch_op_lists(db_path):
    result = invoke("precision", "autocast", "--precision", "bf16,fp16", "--device", "cuda",
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    assert sorted(r["precision"] for r in rows(db_path)) == ["bf16", "fp16"]
    assert any(r["status"] == "ok" for r in rows(db_path))  # fp16 runs on every CUDA GPU
    for r in rows(db_path):
        low = {"bf16": "bfloat16", "fp16": "float16"}[r["precision"]]
        if r["status"] == "skipped":  # bfloat16 before Ampere
            assert r["precision"] == "bf16" and not torch.cuda.is_bf16_supported()
            continue
        observed = {c: r[c] for c in OBSERVED_COLUMNS}
        assert observed["ln_dtype"] == "float32"  # layer_norm is in CUDA's float32 list
        assert observed == expected_dtypes("AutocastTestLists", low, "cuda")
        assert r["native"] == 1


@pytest.mark.gpu
def test_accumulate_on_cuda_equals_cpu_arithmetic(db_path):
    result = invoke("precision", "accumulate", "--device", "cuda", "--db", db_path)
    assert result.exit_code == 0, result.output
    assert sorted(r["variant"] for r in rows(db_path)) == sorted(EXPECTED)
    for r in rows(db_path):
        assert r["result"] == EXPECTED[r["variant"]][2]


# -- the CLI ------------------------------------------------------------------------------


@pytest.mark.parametrize("command, first", [(["autocast", "--precision", "bf16,fp16"], 2),
                                            (["accumulate", "--variant", "fp32,fp16"], 2)])
def test_resume_skips_the_cases_already_stored(db_path, command, first):
    args = ["precision", *command, "--device", "cpu", "--resume", "--db", db_path]
    out = invoke(*args)
    assert out.exit_code == 0, out.output
    assert f"{first} point(s) stored" in out.stderr
    again = invoke(*args)
    assert again.exit_code == 0, again.output
    assert f"--resume: skipping {first} point(s)" in again.stderr
    assert "0 point(s) stored" in again.stderr
    assert len(rows(db_path)) == first


def test_help_of_the_group_and_each_subcommand_has_an_example():
    for args in (["precision"], ["precision", "accumulate"], ["precision", "autocast"]):
        result = invoke(*args, "--help")
        assert result.exit_code == 0, args
        assert "Example" in result.stdout and f"cs336sys {' '.join(args)}" in result.stdout


BAD = [
    (["accumulate", "--variant", "fp8"], "--variant: unknown value 'fp8'"),
    (["accumulate", "--additions", "0"], "--additions must be positive"),
    (["accumulate", "--value", "nan"], "--value must be a finite number"),
    (["accumulate", "--device", "tpu"], "unknown device"),
    (["autocast", "--precision", "fp8"], "--precision: unknown value 'fp8'"),
    (["autocast", "--precision", "fp32"], "--precision: unknown value 'fp32'"),
    (["autocast", "--in-features", "0"], "--in-features must be positive"),
    (["autocast", "--batch", "-1"], "--batch must be positive"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(db_path, args, message):
    result = invoke("precision", *args, "--db", db_path)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], result.stderr
    assert not db_path.exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_bad_input(db_path):
    for sub in ("accumulate", "autocast"):
        result = invoke("precision", sub, "--device", "cuda", "--db", db_path)
        assert result.exit_code == 2 and "CUDA is not available" in result.stderr
    assert not db_path.exists()


def test_db_that_is_not_sqlite_is_bad_input_and_untouched(tmp_path):
    path = tmp_path / "results.db"
    path.write_bytes(b"precious\n")
    for sub in ("accumulate", "autocast"):
        result = invoke("precision", sub, "--device", "cpu", "--db", path)
        assert result.exit_code == 2 and "not a SQLite database" in result.stderr
    assert path.read_bytes() == b"precious\n"


def test_a_16_bit_layernorm_says_a_gpu_gives_float32():
    """On a CPU autocast returns LayerNorm's output in float16, where the handout's question
    (a GPU) expects float32: the table says so beside it, and only then."""
    from cs336sys.experiments.precision import AUTOCAST
    from cs336sys.report.tables import point_table

    def row(ln):
        s = {"kind": "autocast", "precision": "fp16", "device": "cpu"}
        return {**s, "_settings": s, "status": "ok", "gpu": "cpu", "ln_dtype": ln}

    assert "returns float32, what the handout" in point_table(AUTOCAST, [row("float16")]).note
    assert "layernorm in a 16-bit" not in point_table(AUTOCAST, [row("float32")]).note
