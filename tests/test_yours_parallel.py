"""The user's DDP, FSDP and sharded optimizer, on two Gloo ranks beside ours: from either
generation of the adapters file or a one-off target, checked against single-process
training after the timed steps, unfinished ones skipped, broken ones stored as errors."""

from __future__ import annotations

import json

import pytest

from tests.conftest import invoke, query
from tests.user_repos import ADAPTERS_2025, course_repo, edit, line_of

SMALL = ["--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-layers", "1",
         "--num-heads", "2", "--vocab-size", "64", "--seq", "16", "--batch", "4",
         "--world-size", "2", "--warmup", "1", "--iters", "2", "--device", "cpu"]

# FSDP as a student might start it: every rank keeps the full weights (no sharding yet),
# gradients averaged after backward, the full parameters gathered by name.
FSDP = '''
import torch
import torch.distributed as dist


class ReplicatedFSDP(torch.nn.Module):
    def __init__(self, module, compute_dtype=None):
        super().__init__()
        self.module = module
        for p in module.parameters():
            dist.broadcast(p.data, src=0)

    def forward(self, *args):
        return self.module(*args)

    def finish_gradient_synchronization(self):
        for p in self.module.parameters():
            if p.grad is not None:
                dist.all_reduce(p.grad)
                p.grad /= dist.get_world_size()

    def full_state_dict(self):
        return dict(self.module.named_parameters())
'''
ADAPTERS_FSDP = '''
from cs336_systems.fsdp import ReplicatedFSDP


def get_fsdp(module, compute_dtype=None):
    return ReplicatedFSDP(module, compute_dtype)


def fsdp_on_after_backward(fsdp_model, optimizer):
    fsdp_model.finish_gradient_synchronization()


def fsdp_gather_full_params(fsdp_model):
    return {name: p.detach().clone() for name, p in fsdp_model.module.named_parameters()}
'''


def ddp_runs(db):
    return query(db, "SELECT * FROM ddp_runs ORDER BY created")


@pytest.mark.slow  # starts ranks
def test_your_ddp_and_sharded_optimizer_run_beside_ours_and_are_checked(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("ddp", "--impl", "yours,naive,yours-fsdp", "--shard-optimizer", "yours",
                    *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    assert "implemented: yours-torch, yours, --shard-optimizer yours" in result.stderr
    got = {(r["impl"], r["shard_optimizer"]): r for r in ddp_runs(db)}
    assert set(got) == {("yours", "none"), ("yours", "yours"), ("naive", "none"),
                        ("naive", "yours"), ("yours-fsdp", None)}
    for key in (("yours", "none"), ("yours", "yours"), ("naive", "yours")):
        r = got[key]
        assert r["status"] == "ok" and r["check"] == "pass", key
        assert r["check_worst"] < 1e-3 and "single-process training" in r["check_detail"]
        assert r["step_ms_mean"] > 0 and r["param_max_diff"] == 0
        assert "cs336_systems/ddp.py" in json.loads(r["code"]) or key[0] == "naive"
    assert "cs336_systems/sharded_optimizer.py" in json.loads(got["yours", "yours"]["code"])
    # the sharded state: each rank holds part of AdamW's moments, not all of them
    assert got["yours", "yours"]["mem_after_opt_opt_state_bytes"] < got["yours", "none"]["mem_after_opt_opt_state_bytes"]
    assert got["yours", "none"]["not_sharded"] is None  # not meant to shard: no verdict
    # a replica holds the same bytes on every rank: the check's copy of rank 0's first
    # gradients is the tool's memory, not the user's DDP's (it made rank 0's 86.6 MiB larger)
    ranks = json.loads(got["yours", "none"]["mem_per_rank"])
    for moment in ("init", "before_opt", "after_opt"):
        assert ranks[0][moment] == ranks[1][moment], (moment, ranks)
    assert got["naive", "none"]["check"] is None  # ours: not checked against one process
    skipped = got["yours-fsdp", None]
    assert skipped["status"] == "skipped"
    assert skipped["error"] == "get_fsdp is not implemented in tests/adapters.py"


def _edited_ddp_run(tmp_path, monkeypatch, old: str, new: str) -> tuple:
    """`ddp --impl yours` on the example with its DDP edited (`old` -> `new`): the command's
    result and its one stored row."""
    repo = course_repo(tmp_path)
    edit(repo, "cs336_systems/ddp.py", old, new)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("ddp", "--impl", "yours", *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = ddp_runs(db)
    return result, row


@pytest.mark.slow  # starts ranks
def test_a_ddp_that_does_not_average_gradients_is_wrong(tmp_path, monkeypatch):
    result, row = _edited_ddp_run(
        tmp_path, monkeypatch, "                dist.all_reduce(p.grad)\n                p.grad /= world\n",
        "                pass\n")
    assert row["status"] == "wrong" and row["check"] == "fail" and row["check_worst"] > 0.1
    assert "match rank 0's own slice of the batch: never all-reduced" in row["error"]
    assert "per parameter |p - p_ref| / |p_ref - p_0|" in row["error"]
    # the worst tensor measured by the course's own rule too
    assert ("which the course's test_ddp.py tolerance (atol=1e-08, rtol=1e-05) would fail"
            in row["check_detail"])
    assert row["param_max_diff"] > 0  # the replicas drifted apart too
    assert "wrong" in result.stdout and "(wrong)" in result.stdout


def test_a_getter_that_returns_its_class_uncalled_says_so(tmp_path, monkeypatch):
    """get_ddp returning NaiveDDP instead of NaiveDDP(module) read `Module.parameters()
    missing 1 required positional argument: 'self'`, from deep in torch."""
    repo = course_repo(tmp_path)
    edit(repo, "tests/adapters.py", "    return NaiveDDP(module)\n", "    return NaiveDDP\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    invoke("ddp", "--impl", "yours", *SMALL, "--db", db)
    (row,) = ddp_runs(db)
    assert row["status"] == "error", row
    assert ("get_ddp() of the adapters file gave the class NaiveDDP, not an object made from "
            "it; expected the module wrapped in your DDP") in row["error"]


@pytest.mark.slow  # starts ranks
def test_the_2025_generation_and_a_user_fsdp(tmp_path, monkeypatch):
    repo = course_repo(tmp_path, files={"tests/adapters.py": ADAPTERS_2025 + ADAPTERS_FSDP,
                                        "cs336_systems/fsdp.py": FSDP})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("ddp", "--impl", "yours-individual,yours-bucketed,yours-fsdp",
                    "--bucket-mb", "1,10", "--shard-optimizer", "yours", *SMALL, "--db", db)
    assert result.exit_code == 0, result.output
    rows = ddp_runs(db)
    ok = {(r["impl"], r["bucket_mb"]) for r in rows if r["status"] == "ok" and r["check"] == "pass"}
    assert ok == {("yours-individual", None), ("yours-bucketed", 1.0), ("yours-bucketed", 10.0),
                  ("yours-fsdp", None)}
    skipped = [r for r in rows if r["shard_optimizer"] == "yours"]
    assert len(skipped) == 3 and {r["status"] for r in skipped} == {"skipped"}
    assert skipped[0]["error"] == "get_sharded_optimizer is not implemented in tests/adapters.py"
    fsdp = next(r for r in rows if r["impl"] == "yours-fsdp")
    assert fsdp["expected_params_bytes"] == fsdp["params"] * 4 / 2  # held to the sharded ideal


@pytest.mark.slow  # starts ranks
def test_your_bucketed_ddp_in_the_step_gets_a_bucket_size(tmp_path, monkeypatch):
    """step has no --bucket-mb: it called the 2025 adapters' get_ddp_bucketed(module, None),
    and a DDP the course's tests pass was stored as its own line's TypeError. It takes
    torch's 25 MB buckets, as ours does, checked at the course test's own sizes first."""
    sized = ADAPTERS_2025.replace("    ddp.bucket_size_mb = bucket_size_mb\n",
                                  "    ddp.bucket_bytes = int(bucket_size_mb * 2**20)\n")
    assert sized != ADAPTERS_2025
    repo = course_repo(tmp_path, files={"tests/adapters.py": sized})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("step", *SMALL, "--ddp", "yours-bucketed", "--switches", "none",
                    "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, 'SELECT status, error, "check" FROM step_runs')
    assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]


def _rank_1_runs(tmp_path, monkeypatch, statement: str, impls: str):
    """The example's DDP with `statement` on rank 1 once it has the world size: the repo,
    the result of `ddp --impl impls` in it, and its store."""
    repo = course_repo(tmp_path)
    edit(repo, "cs336_systems/ddp.py", "        world = dist.get_world_size()\n",
         "        world = dist.get_world_size()\n        if dist.get_rank() == 1:\n"
         f"            {statement}\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    return repo, invoke("ddp", "--impl", impls, *SMALL, "--db", db), db


@pytest.mark.slow  # starts ranks
def test_a_one_off_wrapper_and_a_rank_that_raises(tmp_path, monkeypatch):
    repo, result, db = _rank_1_runs(tmp_path, monkeypatch,
                                    "raise RuntimeError('rank 1 lost its gradients')",
                                    "yours=cs336_systems.ddp:NaiveDDP,flat")
    assert result.exit_code == 1  # a point failed; a fresh group ran the next one
    failed, ours = ddp_runs(db)
    assert (failed["impl"], failed["status"]) == ("yours", "error")
    # its first line names the user's file and line, as a point's error in one process
    # does (it was deep in the traceback only)
    line = line_of(repo, "cs336_systems/ddp.py", "raise RuntimeError('rank 1 lost")
    assert failed["error"].startswith(
        f"rank 1 failed: cs336_systems/ddp.py:{line}: RuntimeError: rank 1 lost its gradients")
    assert (ours["impl"], ours["status"]) == ("flat", "ok")
    # one name, two targets: the second replaced the first, which was never measured
    twice = "yours=cs336_systems.ddp:NaiveDDP,yours=cs336_systems.ddp:BucketedDDP"
    result = invoke("ddp", "--impl", twice, *SMALL, "--db", tmp_path / "other.db")
    assert result.exit_code == 2 and "yours is given two targets" in result.stderr, result.output
    assert not (tmp_path / "other.db").exists()


@pytest.mark.slow  # starts ranks
def test_a_rank_whose_code_calls_sys_exit_names_its_file_and_line(tmp_path, monkeypatch):
    """On a rank, sys.exit(3) in the user's code was stored as `rank 1 failed: SystemExit:
    3`, where one process names the file and line and says what it did."""
    repo, result, db = _rank_1_runs(tmp_path, monkeypatch, "raise SystemExit(3)",
                                    "yours=cs336_systems.ddp:NaiveDDP")
    assert result.exit_code == 1
    (failed,) = ddp_runs(db)
    line = line_of(repo, "cs336_systems/ddp.py", "raise SystemExit(3)")
    assert failed["error"].startswith(
        f"rank 1 failed: cs336_systems/ddp.py:{line}: SystemExit: it called sys.exit(3), "
        "which would have ended the command"), failed["error"]


@pytest.mark.slow  # starts ranks
def test_a_switch_a_rank_left_on_is_put_back_for_the_next_point(tmp_path, monkeypatch,
                                                                capfd):
    """A DDP that turns float64 on as it synchronizes (on every rank: the statement after
    the rank-1 branch) left it on for the next point on the same ranks: cs336sys's naive DDP
    then held its parameters in float64 (twice the bytes), stored as fp32 and ok."""
    _, result, db = _rank_1_runs(tmp_path, monkeypatch, "pass\n"
                                 "        torch.set_default_dtype(torch.float64)",
                                 "yours=cs336_systems.ddp:NaiveDDP,naive")
    assert result.exit_code == 0, result.output
    # rank 0's stderr, copied to the command's by the launcher (file descriptor 2)
    assert "cs336sys: the point left default dtype torch.float64 (put back to " \
        "torch.float32)" in capfd.readouterr().err
    naive = next(r for r in ddp_runs(db) if r["impl"] == "naive")
    assert naive["mem_init_params_bytes"] == naive["expected_params_bytes"]


def test_a_wrapper_holding_a_handle_on_a_parameter_keeps_its_models_names():
    """A right DDP that keeps `self.first = next(module.parameters())` (it passes the course's
    tests) was wrong: `0.weight is missing`, since named_parameters() gave that tensor once,
    under the wrapper's name for it."""
    import torch

    from cs336sys.experiments.training_check import (
        by_reference_names,
        every_name,
        first_step_grads,
    )

    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.Linear(2, 1))

    class Handle(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.first = next(module.parameters())
            self.module = module

    wrapper = Handle(model)
    wrapper.module(torch.ones(1, 3)).sum().backward()
    grads: dict = {}
    first_step_grads(wrapper, grads)()
    reference = dict(model.named_parameters())
    assert set(by_reference_names(grads, reference)) == set(reference)
    assert set(by_reference_names(every_name(wrapper), reference)) == set(reference)

    class Plain:  # a wrapper that is no nn.Module: its named_parameters() takes no argument
        def named_parameters(self):
            return model.named_parameters()

    assert set(by_reference_names(every_name(Plain()), reference)) == set(reference)


def test_two_checks_of_one_point_keep_both_details():
    """With --model, the model's check and the training check each said what they compared;
    the stored check_detail kept the model's alone, losing the worst tensor and the course's
    allclose verdict."""
    from cs336sys.experiments.checks import both
    from cs336sys.measure.check import Verdict

    model = Verdict(True, {"check_detail": "the same weights in cs336sys's TransformerLM"})
    training = Verdict(True, {"check_detail": "worst 3.2e-06 (layers.1.w)", "check_worst": 3e-6})
    joined = both(model, training)
    assert joined.passed and joined.metrics["check_worst"] == 3e-6
    assert joined.metrics["check_detail"] == ("the same weights in cs336sys's TransformerLM; "
                                              "worst 3.2e-06 (layers.1.w)")


def test_two_checks_joined_say_the_failing_ones_words_first():
    """A wrong DDP checked with --model: the model check (passed) came first in the joined
    detail, and a writeup, which cuts it at 160 characters, showed only that comparison."""
    from cs336sys.experiments.checks import both
    from cs336sys.measure.check import Verdict

    model = Verdict(True, {"check": "pass", "check_detail": "the same weights: loss 9.27"})
    ddp = Verdict(False, {"check": "fail", "check_detail": "gradients summed, not averaged"},
                  "wrong: summed, not averaged")
    joined = both(model, ddp)
    assert not joined.passed and joined.metrics["check"] == "fail"
    assert joined.metrics["check_detail"] == ("gradients summed, not averaged; the same "
                                              "weights: loss 9.27")
    assert joined.why == "wrong: summed, not averaged"
    assert both(ddp, model).metrics["check_detail"] == joined.metrics["check_detail"]


def test_a_summed_shard_is_found_whatever_its_layout():
    """An FSDP whose rank r holds flat[r::world] and sums its shards' gradients passed: its
    shard matched no contiguous slice, so it was left to the parameters, where AdamW hides
    a sum. Strided and column shards are compared as laid out."""
    import torch

    from cs336sys.experiments.training_check import TrainingReference, gradient_problem

    g = torch.Generator().manual_seed(0)
    mean, local = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    reference = TrainingReference({}, {}, {"w": mean}, {"w": local}, world_size=2)
    for shard in (mean.reshape(-1)[::2], mean[:, :3]):  # rank 0's, strided or by columns
        assert gradient_problem({"w": shard.clone()}, reference, 1e-3) is None
        summed = gradient_problem({"w": 2 * shard}, reference, 1e-3)
        assert summed is not None and "summed, not averaged" in summed
    unreduced = gradient_problem({"w": local.reshape(-1)[::2].clone()}, reference, 1e-3)
    assert unreduced is not None and "never all-reduced" in unreduced
    # a padded shard of 2 of 5 columns at 3 ranks (8 elements) is longer than the strided
    # layout's part (7): that layout is passed over, it raised a size mismatch
    reference = TrainingReference({}, {}, {"w": mean[:, :5]}, {"w": local[:, :5]}, world_size=3)
    assert gradient_problem({"w": mean[:, :2].clone()}, reference, 1e-3) is None


@pytest.mark.slow  # starts ranks
def test_the_toy_model_check_passes_a_right_ddp_where_the_world_size_does_not_divide_20():
    """At 3 ranks each took 20 // 3 = 6 samples, 18 of the 20 the one process trained on,
    and a right DDP was called wrong; the batch is rounded up to a multiple of the ranks. A
    wrong one (frozen weights left unbroadcast) is named, on the rank where it shows; the
    sharded optimizer's toy-model run in the same launch, right and wrong."""
    from cs336sys.parallel import launch
    from tests import ddp_workers

    ranks = launch(ddp_workers.toy_check, 3)
    assert [(ddp, sharded) for ddp, _, sharded, _ in ranks] == [([True, None], [True, None])] * 3
    # cs336sys's model has no parameter that needs no gradient: a DDP broadcasting only those
    # that do, and a sharded optimizer that moves them, passed its check, where the course's
    # test_ddp.py and test_sharded_optimizer.py fail them
    (_, (passed, why), _, (sharded_passed, sharded_why)), *_ = ranks
    assert not passed and why == (
        "wrong: as the course's test_ddp.py runs it, on a model with parameters that need no "
        "gradient (the course's ToyModel): after wrapping, rank 1's fc2.bias (it needs no "
        "gradient) is not rank 0's: rank 0's weights were not broadcast to it"), why
    assert not sharded_passed and sharded_why.startswith(
        "wrong: as the course's test_sharded_optimizer.py runs it, on a model with parameters "
        "that need no gradient (the course's ToyModel): after 10 AdamW steps"), sharded_why


def test_a_ddp_the_course_cannot_read_is_wrong_before_it_trains():
    """A right DDP that keeps the model as `self.inner` passed cs336sys's check and failed the
    course's (`'...' object has no attribute 'module'`: validate_ddp_net_equivalence reads
    ddp_model.module); one whose parameters() start with one of its own fails the course's
    zip of parameters() too. Both are named, in words, before anything trains."""
    import torch

    from cs336sys.experiments.ddp_toy_check import _course_contract

    class Inner(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.inner = module

    class ScaleFirst(torch.nn.Module):  # a module lists its own parameters first
        def __init__(self, module):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.ones(()))
            self.module = module

    class Plain(torch.nn.Module):
        def __init__(self, module):
            super().__init__()
            self.module = module
            self.handles = []

    model = torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.Linear(2, 1))
    assert "no attribute `module`" in _course_contract(Inner(model))
    assert "parameters() do not start with the wrapped model's" in _course_contract(
        ScaleFirst(model))
    assert _course_contract(Plain(model)) is None


def test_the_users_sharded_optimizer_gets_the_parameters_as_the_course_gives_them(monkeypatch):
    """The course's test passes model.parameters(), a generator: a sharded optimizer that
    reads its parameters twice, or takes len() of them, fails there; given a list it passed."""
    import torch
    import torch.distributed as dist

    from cs336sys.experiments import ddp_setup, ddp_yours
    from cs336sys.parallel.launcher import free_port

    given = []

    def optimizer(name, params, cls, **kwargs):
        given.append(params)
        return torch.optim.SGD(list(params), lr=0.1)

    monkeypatch.setattr(ddp_yours, "optimizer", optimizer)
    monkeypatch.setattr(ddp_setup.yours, "is_yours", lambda name: name == "yours")
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}",
                            rank=0, world_size=1)
    try:
        ddp_setup.build("naive", "yours", None, "fp32", torch.nn.Linear(2, 2), "cpu")
    finally:
        dist.destroy_process_group()
    (params,) = given
    assert not isinstance(params, (list, tuple)) and iter(params) is params


def test_an_fsdps_full_parameters_are_named_and_judged_as_the_courses_test_does():
    """test_fsdp.py looks each full parameter up by the model's name (a prefixed one is a
    KeyError there, and passed here by its suffix); a right FSDP's own 16-bit compute is not
    the reference's autocast, and its barely-moving norm weights reached 0.11 against 0.1."""
    import torch

    from cs336sys.experiments.training_check import TrainingReference, training_check

    start = {"w": torch.zeros(4), "ln": torch.ones(4)}
    final = {"w": torch.full((4,), 1.0), "ln": torch.full((4,), 1.1)}
    reference = TrainingReference(start, final, {}, {}, world_size=2)
    prefixed = {f"module.{k}": v.clone() for k, v in final.items()}
    assert training_check(prefixed, reference, "fp32", tests=("test_ddp.py",)).passed
    verdict = training_check(prefixed, reference, "fp32", tests=("test_fsdp.py",))
    assert not verdict.passed and "(module.w for w): the course's test_fsdp.py looks them up by " \
        "the model's names" in verdict.why
    off = {"w": final["w"].clone(), "ln": final["ln"] + 0.015}  # 0.15 of the norm's move
    assert training_check(off, reference, "bf16", tests=("test_fsdp.py",)).passed
    assert not training_check(off, reference, "bf16", tests=("test_ddp.py",)).passed


def test_an_fsdps_gradients_and_full_parameters_are_read_as_the_courses_test_reads_them():
    """test_fsdp.py asserts each gradient in its parameter's dtype and shape (a 16-bit one
    fails there) and compares the full parameters with fp32 ones by torch.allclose, which
    refuses a 16-bit tensor; a right one passes."""
    import torch
    import torch.distributed as dist

    from cs336sys.experiments import fsdp_course_check
    from cs336sys.parallel.launcher import free_port

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Sequential(torch.nn.Linear(2, 2, bias=False),
                                              torch.nn.LayerNorm(2))

    def judged(wrapper, full):
        record = fsdp_course_check.Record(wrapper)
        record()
        whole = {n: p.detach().clone() for n, p in wrapper.module.named_parameters()}
        return fsdp_course_check.verdict(record, full, "cpu", "bf16", whole)

    right = Wrapper()
    right.module(torch.ones(1, 2)).sum().backward()
    full = {n: p.detach().clone() for n, p in right.module.named_parameters()}
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}",
                            rank=0, world_size=1)
    try:
        assert judged(right, full) is None
        # a gather to rank 0 alone that gives the others None, as checkpoint helpers do
        assert "fsdp_gather_full_params() on rank 0 gave NoneType, not the full parameters by " \
            "name" in judged(right, None).why
        half = {**full, "0.weight": full["0.weight"].half()}
        assert "fsdp_gather_full_params() gave 0.weight in float16, the model's parameters in " \
            "float32: the course's test_fsdp.py compares them with torch.allclose" \
            in judged(right, half).why
        norm = right.module[1].weight
        if hasattr(norm, "grad_dtype"):  # torch >= 2.10 refuses another dtype unless told
            norm.grad_dtype = None
        norm.grad = norm.grad.bfloat16()
        right.module[0].weight.grad = None
        why = judged(right, full).why
    finally:
        dist.destroy_process_group()
    assert "after finish_gradient_synchronization() on rank 0, 0.weight has no gradient, " \
        "1.weight's gradient is bfloat16, the parameter float32: the course's test_fsdp.py " \
        "asserts every parameter's gradient has the parameter's shape and dtype" in why, why


def test_a_bucketed_ddp_is_checked_at_the_courses_bucket_sizes(monkeypatch):
    """The course's test_ddp.py trains its toy models with buckets of 0.0016, 0.0001 and 0.01
    MB (two buckets, three, one); the check took the point's 100 or 1,000 MB, one bucket,
    and a DDP that registered its hooks again each step, which the course fails, passed."""
    from cs336sys.experiments import ddp_toy_check as check

    sizes: list = []
    monkeypatch.setattr(check.ddp_yours, "kind_of", lambda impl: "ddp")
    monkeypatch.setattr(check.ddp_yours, "course_tests", lambda impl, _: ["test_ddp.py"])
    monkeypatch.setattr(check, "gather", lambda found: [found])  # one process, no group
    monkeypatch.setattr(check, "_trained", lambda impl, size, toy, *rest: sizes.append(size)
                        or ("gradients off" if size == 0.0001 else None))
    verdict = check.checked("yours-bucketed", 1000.0, 0, 2, "cpu")
    assert sorted(set(sizes)) == [0.0001, 0.0016, 0.01]
    assert not verdict.passed and verdict.why.startswith(
        "wrong: as the course's test_ddp.py runs it with buckets of 0.0001 MB, on a model with")
    sizes.clear()
    assert check.checked("yours-individual", None, 0, 2, "cpu").passed and set(sizes) == {None}


def test_a_gather_is_blamed_only_for_what_it_changed(monkeypatch):
    """fsdp_course_check.gather_changes compared with torch.equal, for which NaN is not NaN:
    a model whose training went NaN read `fsdp_gather_full_params() changed the model ...
    changed its values`, a false cause beside the true one."""
    import torch

    from cs336sys.experiments import fsdp_course_check

    monkeypatch.setattr(fsdp_course_check, "gather", lambda value: [value])  # one rank
    model = torch.nn.Linear(2, 2)
    model.weight.data[0, 0] = float("nan")
    assert fsdp_course_check.gather_changes(model, lambda: {}) is None

    def keeps_full():
        model.weight.data = torch.zeros(4, 2)
        return {}

    said = fsdp_course_check.gather_changes(model, keeps_full)
    assert said == ("fsdp_gather_full_params() changed the model on rank 0 (weight went from "
                    "[2, 2] float32 to [4, 2] float32), where the course's test_fsdp.py gathers "
                    "after every step and trains on")


def test_a_padded_last_chunk_is_compared_without_its_padding():
    """A weight of 5 rows split over 2 ranks pads the last chunk to 3 rows; rank 0 holding
    that chunk (shards reversed) was never compared, so a summed gradient there passed."""
    import torch

    from cs336sys.experiments.training_check import _as_laid_out

    ref = torch.arange(1.0, 11.0).reshape(5, 2)  # the mean gradient
    summed = torch.cat([2 * ref[3:].reshape(-1), torch.zeros(2)])  # rows 3-4 and padding
    found = _as_laid_out(summed, ref, None, 2, 1e-3)
    assert found.summed == 0.0 and found.mean > 0.1
    padded_wrong = torch.cat([ref[3:].reshape(-1), torch.ones(2)])  # padding not empty
    assert _as_laid_out(padded_wrong, ref, None, 2, 1e-3) is None


def test_an_fsdp_that_ignores_its_compute_dtype_passes_and_its_point_says_fp32():
    """An FSDP that never casts to compute_dtype passes the course's test_fsdp.py (its 16-bit
    tolerance holds fp32 too); its bf16 point timed fp32 and was labelled bf16. One that
    computes in bf16 where fp16 is asked fails that test, and here too."""
    import torch
    import torch.distributed as dist

    from cs336sys.experiments import ddp_section, fsdp_course_check
    from cs336sys.parallel.launcher import free_port

    class Wrapper(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.module = torch.nn.Sequential(torch.nn.Embedding(5, 2), torch.nn.Linear(2, 2),
                                              torch.nn.LayerNorm(2))

    def first_step(low, precision="bf16"):
        wrapper = Wrapper()
        record = fsdp_course_check.Record(wrapper)
        with torch.autocast("cpu", dtype=low or torch.bfloat16, enabled=low is not None):
            out = wrapper.module(torch.tensor([[1, 2]]))
        out.float().sum().backward()
        record()
        wrapper.module(torch.tensor([[1, 2]]))  # a timed step: the hooks are gone
        full = {n: p.detach().clone() for n, p in wrapper.module.named_parameters()}
        whole = {n: p.detach().clone() for n, p in wrapper.module.named_parameters()}
        return record, fsdp_course_check.verdict(record, full, "cpu", precision, whole)

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}",
                            rank=0, world_size=1)
    try:
        record, ignored = first_step(None)
        _, cast = first_step(torch.bfloat16)
        _, other = first_step(torch.bfloat16, "fp16")
    finally:
        dist.destroy_process_group()
    assert record.outputs == {"float32"} and not record._hooks
    assert ignored.passed and ignored.metrics["forward_dtype"] == "fp32"
    assert "your FSDP ignores compute_dtype" in ignored.metrics["check_detail"]
    # under autocast the Linear computes in bf16 (the Embedding does not): no note
    assert cast.passed and cast.metrics == {"forward_dtype": "bf16/fp32"}
    # bf16 where fp16 was asked: the course's fp16 test fails it (it passed here, said nowhere)
    assert not other.passed and "computed in bfloat16 at a compute_dtype of float16" in other.why
    assert ddp_section.precision({"precision": "bf16", "forward_dtype": "fp32"}) == "bf16 (ran fp32)"
    assert ddp_section.precision({"precision": "bf16", "forward_dtype": "bf16/fp32"}) == "bf16"
    assert ddp_section.precision({"precision": "fp32", "forward_dtype": "fp32"}) == "fp32"
    assert ddp_section.precision({"forward_dtype": "fp32"}) is None  # a store without one
