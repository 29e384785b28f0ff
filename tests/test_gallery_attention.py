"""The gallery of attention kernels, right and wrong (tests/gallery/): every right one
passes cs336sys's check, every wrong one is stored `wrong` with what it computes in words,
and a PyTorch FlashAttention that ignores is_causal (as the handout allows) passes against
non-causal attention without being compared with causal points."""

from __future__ import annotations

import pytest

from tests.conftest import invoke, query
from tests.user_repos import course_repo, edit, with_gallery

FLASH = "cs336_systems/flash_attention.py"
# (batch, seq, d) inputs, the course's contract; two sequence lengths, one of them ragged
SMALL = ["--d-head", "16", "--batch", "2", "--warmup", "1", "--iters", "2", "--device", "cpu"]
SEQS = ["--seq", "32,40"]
TORCH = "cs336_systems.gallery_attention"
TRITON = "cs336_systems.gallery_triton_flash"


@pytest.fixture
def repo(tmp_path, monkeypatch):
    repo = with_gallery(course_repo(tmp_path), "attention", "triton_flash")
    monkeypatch.chdir(repo)
    return repo


def attention(db, *args):
    result = invoke("attention", *SMALL, *args, "--db", db)
    assert result.exit_code == 0, result.output
    return result, query(db, "SELECT * FROM attention_runs ORDER BY created")


def by_impl(rows):
    out: dict[str, list[dict]] = {}
    for r in rows:
        out.setdefault(r["impl"], []).append(r)
    return out


def test_torch_kernels_right_and_wrong(repo, tmp_path):
    _, rows = attention(tmp_path / "r.db", "--impl",
                        f"yours-right={TORCH}:Right,yours-nocausal={TORCH}:IgnoresCausal,"
                        f"yours-noscale={TORCH}:NoScale,yours-instance={TORCH}:AnInstance,"
                        f"yours-late={TORCH}:OneKeyLate,yours-bwd={TORCH}:BackwardUnmasked,"
                        f"yours-early={TORCH}:OneKeyEarly",
                        *SEQS)
    got = by_impl(rows)
    assert [(r["status"], r["check"]) for r in got["yours-right"]] == [("ok", "pass")] * 2
    # an instance of the Function: the course's tests call its .apply, which works
    assert [(r["status"], r["check"]) for r in got["yours-instance"]] == [("ok", "pass")] * 2
    # (O, L) where O is due: an error that says so, not "'tuple' has no attribute 'backward'"
    db = tmp_path / "tuple.db"
    assert invoke("attention", *SMALL, "--impl", f"yours-tuple={TORCH}:ReturnsL", "--seq", "32",
                  "--db", db).exit_code == 1
    (row,) = query(db, "SELECT * FROM attention_runs")
    assert row["status"] == "error" and "returned a tuple of 2, not the output O" in row["error"]
    # None: "'NoneType' object has no attribute 'backward'", naming no cause
    db = tmp_path / "none.db"
    assert invoke("attention", *SMALL, "--impl", f"yours-none={TORCH}:ReturnsNothing", "--seq",
                  "32", "--db", db).exit_code == 1
    (row,) = query(db, "SELECT * FROM attention_runs")
    assert "yours-none returned NoneType, not the output O (a tensor)" in row["error"]
    for r in got["yours-nocausal"]:  # a one-off kernel is not the handout's PyTorch part
        assert r["status"] == "wrong"
        assert "it computes non-causal attention: the causal mask is missing" in r["error"]
    for r in got["yours-noscale"]:
        assert r["status"] == "wrong"
        assert "it computes attention without the 1/√d scale" in r["error"]
    for r in got["yours-late"]:  # its figures alone said it was off, not how
        assert r["status"] == "wrong"
        assert "it computes causal attention with the mask one key late" in r["error"]
    for r in got["yours-early"]:  # `q > k` for `q >= k`: figures alone, the detail L's
        assert r["status"] == "wrong"
        assert "it computes causal attention with the mask one key early" in r["error"]
        assert "its gradients match neither" not in r["error"]  # NaN from the empty row
    for r in got["yours-bwd"]:  # exp(S - L) over every key, with the causal L: neither mask's
        assert r["status"] == "wrong"
        assert "its backward recomputes P = exp(S - L) without the causal mask, with the " \
            "causal forward's L: is_causal is not kept for the backward" in r["error"]


@pytest.mark.slow
def test_a_pytorch_flashattention_that_ignores_is_causal_passes_as_the_handout_allows(repo, tmp_path):
    """The README's command, in a repository whose yours-torch ignores is_causal."""
    edit(repo, FLASH, "                if is_causal:\n", "                if False:\n")
    edit(repo, FLASH, "        if ctx.is_causal:\n", "        if False:\n", commit="ignore is_causal")
    result, rows = attention(tmp_path / "r.db", "--impl", "yours-torch,flash-torch,naive",
                              *SEQS)
    got = by_impl(rows)
    for r in got["yours-torch"]:
        assert (r["status"], r["check"]) == ("ok", "pass"), r["error"]
        assert r["not_compared"].startswith("ignores is_causal, as the handout allows")
        assert "--no-causal measures it" in r["check_detail"]
        assert r["computed_causal"] == 0
        # its FLOPs are those of the work done: every score, twice flash-torch's causal half
        assert r["flops_fwd"] == 2 * next(o["flops_fwd"] for o in got["flash-torch"]
                                          if o["seq"] == r["seq"])
    assert "pass (non-causal)" in result.stdout and "not compared" in result.stdout
    said = " ".join(result.stdout.split())  # the note, unwrapped
    assert "pass (non-causal): your PyTorch FlashAttention ignores is_causal" in said
    assert "(wrong)" not in result.stdout and {r["status"] for r in rows} == {"ok"}
    # with --no-causal it is measured as what it is, and compared
    result, rows = attention(tmp_path / "n.db", "--impl", "yours-torch,naive", "--no-causal",
                              *SEQS)
    mine = by_impl(rows)["yours-torch"]
    assert all(r["check"] == "pass" and r["not_compared"] is None for r in mine)
    assert "not compared" not in result.stdout
    # no point passed as non-causal: the note does not explain what the table does not show
    assert "ignores is_causal" not in " ".join(result.stdout.split())


@pytest.mark.parametrize("edits, says", [
    ([("logsumexp[..., i : i + rows] = m + torch.log(row_sum)",
       "logsumexp[..., i : i + rows] = (m + torch.log(row_sum)) * math.log2(math.e)"),
      ("p = torch.exp(s - logsumexp[..., None])",
       "p = torch.exp(s - logsumexp[..., None] / math.log2(math.e))")],
     "L, the logsumexp its forward saves, is in base 2"),
    ([("ctx.save_for_backward(q, k, v, o, logsumexp)",
       "ctx.save_for_backward(q, k, v, o)\n        ctx.lse = logsumexp"),
      ("q, k, v, o, logsumexp = ctx.saved_tensors",
       "q, k, v, o = ctx.saved_tensors\n        logsumexp = ctx.lse")],
     "its forward saves no tensor of L's shape (2, 32) for backward"),
], ids=["base-2", "kept-on-ctx"])
def test_a_flashattention_whose_saved_logsumexp_the_course_fails_is_wrong(repo, tmp_path, edits,
                                                                          says):
    """Its O and gradients are right, but the course's forward test reads L from the saved
    tensors and fails it: a log2 L, or one kept on ctx instead of saved, passed here; so
    did either with the forward timed alone (no input needed a gradient, so nothing was
    saved: where cs336sys sends a kernel whose backward is not written yet), or with heads
    (flattened into the batch, the output shaped back by a view that saves nothing)."""
    for old, new in edits:
        edit(repo, FLASH, old, new)
    for name, more, shape in [("r", [], "(2, 32)"), ("f", ["--pass", "forward"], "(2, 32)"),
                              ("h", ["--heads", "2"], "(2, 2, 32)")]:
        _, rows = attention(tmp_path / f"{name}.db", "--impl", "yours-torch", "--seq", "32", *more)
        (row,) = rows
        assert (row["status"], row["check"]) == ("wrong", "fail"), (more, row["error"])
        assert says.replace("(2, 32)", shape) in row["error"], row["error"]
        assert "O off" not in row["error"], row["error"]
        # what the writeup's checks table shows: L's fault, not O's pass
        assert row["check_detail"].startswith(says.replace("(2, 32)", shape)), row


def test_a_pytorch_flashattention_whose_l_is_off_only_when_causal_passes_as_the_course_does(
        repo, tmp_path):
    """Its O and gradients right at every point and its L right non-causal, the only L the
    course's forward test reads: an L off by 0.5 at causal points alone was `wrong` (only a
    wrong O or gradient sent it to the non-causal run the course checks)."""
    edit(repo, FLASH, "ctx.save_for_backward(q, k, v, o, logsumexp)",
         "ctx.save_for_backward(q, k, v, o, logsumexp + 0.5 * is_causal)")
    edit(repo, FLASH, "q, k, v, o, logsumexp = ctx.saved_tensors",
         "q, k, v, o, logsumexp = ctx.saved_tensors\n        "
         "logsumexp = logsumexp - 0.5 * ctx.is_causal")
    for name, more in (("b", []), ("f", ["--pass", "forward"])):
        _, rows = attention(tmp_path / f"{name}.db", "--impl", "yours-torch", "--seq", "32",
                            *more)
        (row,) = rows
        assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
        assert row["not_compared"].startswith("checked non-causal, as the course's tests check")
        assert row["check_detail"].startswith("at this causal point L, the logsumexp its "
                                              "forward saves"), row["check_detail"]
    # off non-causal too: wrong, as the course finds it
    edit(repo, FLASH, "logsumexp + 0.5 * is_causal)", "logsumexp + 0.5)")
    edit(repo, FLASH, "logsumexp - 0.5 * ctx.is_causal", "logsumexp - 0.5")
    _, rows = attention(tmp_path / "w.db", "--impl", "yours-torch", "--seq", "32")
    (row,) = rows
    assert row["status"] == "wrong" and "L, the logsumexp" in row["error"], row["error"]


def test_a_pytorch_flashattention_off_only_at_causal_points_passes_as_the_course_passes_it(
        repo, tmp_path):
    """The course runs the PyTorch FlashAttention non-causal only: a backward that leaves out
    the mask its forward applies, or a mask one key off, passes its tests and was `wrong`
    here, the first with no word of why. Each now passes as checked non-causal, saying what
    is off at the causal point; a dQ without its 1/√d, off non-causal too, stays wrong and
    says so."""
    edit(repo, FLASH, "        if ctx.is_causal:\n", "        if False:\n", commit="bwd")
    _, rows = attention(tmp_path / "b.db", "--impl", "yours-torch", "--seq", "32")
    (row,) = rows
    assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
    assert row["not_compared"].startswith("checked non-causal, as the course's tests check")
    assert row["check_detail"].startswith("at this causal point its backward recomputes P")
    edit(repo, FLASH, "        if False:\n", "        if ctx.is_causal:\n")
    # a mask one key late in both passes: its causal L is the late mask's, which the course
    # never reads; the L of the non-causal run it checks is right (it read `wrong: L ...`)
    late = [("s.masked_fill(kj > qi,", "s.masked_fill(kj > qi + 1,"),
            ("[None, :] > torch.arange(n_q, device=q.device)[:, None]",
             "[None, :] > torch.arange(n_q, device=q.device)[:, None] + 1")]
    for old, new in late:
        edit(repo, FLASH, old, new)
    _, rows = attention(tmp_path / "l.db", "--impl", "yours-torch", "--seq", "32")
    (row,) = rows
    assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
    assert row["check_detail"].startswith("at this causal point it computes causal attention "
                                          "with the mask one key late")
    for old, new in late:
        edit(repo, FLASH, new, old)
    edit(repo, FLASH, "dq = ds @ kf * scale", "dq = ds @ kf", commit="no dq scale")
    _, rows = attention(tmp_path / "s.db", "--impl", "yours-torch", "--seq", "32")
    (row,) = rows
    assert row["status"] == "wrong", row
    assert row["error"].startswith("wrong: its dQ is √d times the right one"), row["error"]
    assert "non-causal too, as the course's tests run it: dQ off" in row["error"]
    # both scales left out: both named (dQ alone was); a wrong D: named by what it feeds
    edit(repo, FLASH, "dk = ds.transpose(-1, -2) @ qf * scale", "dk = ds.transpose(-1, -2) @ qf",
         commit="no dk scale")
    _, (row,) = attention(tmp_path / "k.db", "--impl", "yours-torch", "--seq", "32")
    assert row["error"].startswith("wrong: its dQ and dK are √d times the right ones"), row
    edit(repo, FLASH, "dk = ds.transpose(-1, -2) @ qf", "dk = ds.transpose(-1, -2) @ qf * scale")
    edit(repo, FLASH, "dq = ds @ kf", "dq = ds @ kf * scale")
    edit(repo, FLASH, "d_row = (of * do).sum(dim=-1, keepdim=True)",
         "d_row = (of * do).sum(dim=-1, keepdim=True) * 0", commit="no D")
    _, (row,) = attention(tmp_path / "d.db", "--impl", "yours-torch", "--seq", "32")
    assert row["error"].startswith("wrong: its dV is right and its dQ and dK are not: what "
                                   "they share is off, dS = P ∘ (dP − D)"), row["error"]


def test_a_pytorch_flashattention_that_refuses_is_causal_is_skipped_not_an_error(repo,
                                                                                  tmp_path):
    """The handout lets the PyTorch FlashAttention ignore is_causal, and the course's tests
    never pass it True: one that asserts it is False passes them, and its causal point was
    an `error` (exit 1, a handout run --yours failed). It is skipped with its reason; its
    non-causal point is measured."""
    edit(repo, FLASH, "        # q: (..., Nq, d); k, v: (..., Nk, d)\n",
         "        assert not is_causal, 'no causal mask yet'\n")
    db = tmp_path / "r.db"
    result = invoke("attention", *SMALL, "--impl", "yours-torch", "--seq", "32", "--db", db)
    assert result.exit_code == 0, result.output
    _, rows = attention(db, "--impl", "yours-torch", "--seq", "32", "--no-causal")
    assert [(r["causal"], r["status"]) for r in rows] == [(1, "skipped"), (0, "ok")]
    assert rows[0]["error"] == (
        "yours-torch raised at is_causal=True (AssertionError: no causal mask yet): the "
        "handout lets the PyTorch FlashAttention ignore is_causal, and the course's tests run "
        "it non-causal; --no-causal measures it")


@pytest.mark.slow  # Triton's interpreter
def test_triton_kernels_right_and_wrong(repo, tmp_path):
    _, rows = attention(tmp_path / "r.db", "--impl",
                        f"yours-ptr={TRITON}:Pointers,yours-nomask={TRITON}:NoCausalMask",
                        "--seq", "32")
    got = by_impl(rows)
    assert [(r["status"], r["check"]) for r in got["yours-ptr"]] == [("ok", "pass")]
    (nomask,) = got["yours-nomask"]
    assert nomask["status"] == "wrong"
    assert "it computes non-causal attention: the causal mask is missing" in nomask["error"]


@pytest.mark.slow  # Triton's interpreter
def test_a_bf16_triton_kernel_in_the_interpreter_is_not_judged(repo, tmp_path, monkeypatch):
    """Triton's interpreter returns garbage from tl.dot on bfloat16 (3.6 and 3.9), so a right
    bf16 kernel of the user's read `wrong: O off by up to 8e+08`; fp16 still judges it."""
    getter = "def get_flashattention_autograd_function_triton() -> type:\n"
    edit(repo, "tests/adapters.py", f"{getter}    raise NotImplementedError\n",
         f"{getter}    from {TRITON} import Pointers\n\n    return Pointers\n", commit="triton")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    _, rows = attention(tmp_path / "r.db", "--impl", "yours-triton", "--seq", "32",
                        "--precision", "bf16,fp16")
    got = {r["precision"]: r for r in rows}
    assert got["bf16"]["status"] == "skipped", got["bf16"]["error"]
    assert got["bf16"]["error"].startswith("not judged: Triton's CPU interpreter computes tl.dot")
    assert (got["fp16"]["status"], got["fp16"]["check"]) == ("ok", "pass"), got["fp16"]["error"]


def _has_block_pointers() -> bool:
    """Whether this Triton still has block pointers (3.9 keeps a stub that raises)."""
    import inspect

    try:
        import triton.language as tl
    except ImportError:
        return False
    make = getattr(tl, "make_block_ptr", None)
    return make is not None and "have been removed" not in inspect.getsource(make)


@pytest.mark.slow  # Triton's interpreter
@pytest.mark.skipif(not _has_block_pointers(), reason="this Triton has no tl.make_block_ptr")
def test_a_triton_kernel_with_block_pointers_passes(repo, tmp_path):
    _, rows = attention(tmp_path / "r.db", "--impl", f"yours-block={TRITON}:BlockPointers",
                        "--seq", "32")
    assert [(r["status"], r["check"]) for r in rows] == [("ok", "pass")], rows[0]["error"]


@pytest.mark.skipif(_has_block_pointers(), reason="this Triton still has tl.make_block_ptr")
def test_a_block_pointer_kernel_where_triton_has_none_is_an_error_that_says_why(repo, tmp_path):
    """Triton 3.9 removed block pointers, which the course teaches: the stored error says
    so and which Triton runs the kernel, not only "removed in favor of the tensor descriptor
    API"."""
    from importlib.metadata import version

    db = tmp_path / "r.db"
    result = invoke("attention", *SMALL, "--impl", f"yours-block={TRITON}:BlockPointers",
                    "--seq", "32", "--db", db)
    assert result.exit_code == 1  # a point failed
    (row,) = query(db, "SELECT status, error FROM attention_runs")
    assert row["status"] == "error" and "gallery_triton_flash.py" in row["error"]
    first = row["error"].splitlines()[0]
    assert first.endswith(f"tl.make_block_ptr is gone from Triton {version('triton')}: a kernel "
                          "built on block pointers runs under Triton 3.6 or older, the course's "
                          "version")


def test_an_unimplemented_triton_adapter_is_not_implemented_before_any_device_question(
        repo, tmp_path, monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # a CPU that could not run a kernel
    result, rows = attention(tmp_path / "r.db", "--impl", "yours-triton", "--seq", "32")
    assert [(r["status"], r["error"]) for r in rows] == [
        ("skipped", "get_flashattention_autograd_function_triton is not implemented in "
                    "tests/adapters.py")]
    assert "needs CUDA" not in result.output


def test_a_backward_that_returns_no_gradient_is_not_told_a_formula():
    """A backward returning None for dV read "its dV alone is off: dV = Pᵀ dO ...; dV has
    shape None": the cause is the missing gradient, said as such."""
    import torch

    from cs336sys.attention.diagnosis import GRADS, backward_diagnosed
    from cs336sys.attention.reference import attention_reference
    from cs336sys.measure.check import check

    g = torch.Generator().manual_seed(0)
    q, k, v, do = (torch.randn(1, 8, 4, generator=g, dtype=torch.float64) for _ in range(4))
    o, grads = attention_reference(q, k, v, True, do=do, dtype=torch.float64)
    want = {"O": o, **dict(zip(GRADS, grads, strict=True))}
    got = {**want, "dV": None}
    verdict = check(got, want, 1e-2, 1e-2)
    said = backward_diagnosed(True, got, q, k, v, do, want, verdict, (1e-2, 1e-2))
    assert "dV has shape None" in said.why and "alone is off" not in said.why


def test_a_failure_nothing_explains_keeps_its_figures_before_ls_reason():
    """A kernel dropping its last partial key tile: O's figures were the error's, and the
    detail (what the writeup shows) held only L's reason, which sent students to their L."""
    from cs336sys.attention.point_check import _also
    from cs336sys.measure.check import Verdict

    o = Verdict(False, {"check": "fail"}, "wrong: O off by up to 0.444 at 790 of 5,120 elements")
    lse = Verdict(False, why="wrong: L, the logsumexp its forward saves, is not m + log l")
    joined = _also(o, lse)
    assert joined.metrics["check_detail"] == (
        "O off by up to 0.444 at 790 of 5,120 elements; L, the logsumexp its forward saves, "
        "is not m + log l")
