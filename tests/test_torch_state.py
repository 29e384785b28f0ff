"""torch's process-wide switches a point turns are put back before the next point
(sweep/torch_state.py): a student's `torch.set_default_dtype(torch.float64)` made the next
points, cs336sys's own too, run in float64, stored as fp32 and `ok`."""

import functools

import pytest
import torch
import torch.nn.functional as F

from cs336sys.sweep.result import Result, guarded
from cs336sys.sweep.torch_state import kept
from tests.conftest import MICRO, invoke, query
from tests.user_repos import course_repo


@pytest.fixture(autouse=True)
def _as_before():  # a failing test here must not leave float64 to the next test of its worker
    softmax = F.softmax
    yield
    torch.set_default_dtype(torch.float32)
    torch.set_grad_enabled(True)
    F.softmax = softmax


def test_a_points_switches_and_replaced_functions_are_put_back(capsys):
    softmax = F.softmax

    def careless() -> Result:
        torch.set_default_dtype(torch.float64)
        torch.set_grad_enabled(False)
        F.softmax = lambda *a, **k: None
        return Result("ok")

    assert guarded(careless).status == "ok"
    assert torch.get_default_dtype() == torch.float32 and torch.is_grad_enabled()
    assert F.softmax is softmax
    said = capsys.readouterr().err
    assert "the point left default dtype torch.float64 (put back to torch.float32)" in said
    assert "gradient mode False (put back to True)" in said
    assert "torch.nn.functional.softmax replaced (put back)" in said


def test_a_point_that_raises_is_put_back_too_and_torchs_own_wrappers_are_left():
    def raises() -> Result:
        torch.set_default_dtype(torch.float64)
        raise ValueError("broken")

    assert guarded(raises).status == "error"
    assert torch.get_default_dtype() == torch.float32
    relu = F.relu
    with kept() as changed:  # as importing torch._dynamo wraps torch.manual_seed
        F.relu = functools.wraps(relu)(lambda *a, **k: relu(*a, **k))
    try:
        assert changed == [] and F.relu is not relu
    finally:
        F.relu = relu


FLOAT64 = '''
import torch


def attention(q, k, v, is_causal=False):
    torch.set_default_dtype(torch.float64)  # left on, as a student's debugging line
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
'''


def test_the_points_after_one_that_turned_float64_on_run_in_float32(tmp_path, monkeypatch):
    repo = course_repo(tmp_path, files={"careless/__init__.py": "", "careless/attn.py": FLOAT64})
    monkeypatch.chdir(repo)
    monkeypatch.syspath_prepend(str(repo))
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "16", "--mode", "forward", "--attention",
                    "yours-f64=careless.attn:attention,naive", "--db", db)
    assert result.exit_code == 0, result.output
    dtypes = {r["attention"]: r["logits_dtype"] for r in query(db, "SELECT * FROM model_runs")}
    assert dtypes == {"yours-f64": "float64", "naive": "float32"}, dtypes
