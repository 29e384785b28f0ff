"""The gallery of data-parallel code, right and wrong (tests/gallery/): every right one
passes cs336sys's check, every wrong one is stored `wrong` with what it does in words.

The right ones include an FSDP that passes the course's tests/test_fsdp.py and broadcasts
nothing (the handout does not ask an FSDP to): it is checked from the same weights on every
rank, as the course builds them. Each is run as a one-off target (`--impl NAME=module:Class`)
in a course-layout repository, on two Gloo ranks."""

from __future__ import annotations

import json

import pytest

from tests.conftest import invoke, query
from tests.test_yours_parallel import SMALL
from tests.user_repos import course_repo, edit, with_gallery


@pytest.fixture
def repo(tmp_path, monkeypatch):
    repo = with_gallery(course_repo(tmp_path), "ddp", "fsdp")
    monkeypatch.chdir(repo)
    return repo


def verdicts(db):
    """{implementation label: row} of the stored ddp points."""
    rows = query(db, "SELECT * FROM ddp_runs ORDER BY created")
    return {(r["impl"], r["shard_optimizer"]): r for r in rows}


def ddp(db, *args):
    result = invoke("ddp", *SMALL, *args, "--db", db)
    assert result.exit_code == 0, result.output
    return verdicts(db)


DDP = "cs336_systems.gallery_ddp"
FSDP = "cs336_systems.gallery_fsdp"


@pytest.mark.slow  # starts ranks
def test_ddps_right_and_wrong(repo, tmp_path):
    got = ddp(tmp_path / "r.db", "--impl",
              f"yours-hooks={DDP}:AverageInHooks,yours-after={DDP}:AverageAfter,"
              f"yours-copy={DDP}:TrainsACopy,yours-count={DDP}:CountsBuckets,"
              f"yours-summed={DDP}:Summed,yours-early={DDP}:EarlyBucket,"
              f"yours-twice={DDP}:DividedTwice,"
              f"yours-alone={DDP}:NeverBroadcasts,yours-stub={DDP}:FinishNotWritten,"
              f"yours-nowait={DDP}:NeverWaits,yours-once={DDP}:SyncsOnce")
    # a copy of the module trained (its parameters were not the optimizer's), a count of
    # buckets (read as a list of them, after every step was timed) passed the course, too
    for name in ("yours-hooks", "yours-after", "yours-copy", "yours-count"):
        row = got[name, "none"]
        assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
    assert got["yours-count", "none"]["buckets"] == 1
    summed = got["yours-summed", "none"]
    assert summed["status"] == "wrong"
    assert "match world_size (2) x the reference: summed, not averaged" in summed["error"]
    # AdamW moves the parameters alike for a gradient twice as large: only the gradients tell
    assert summed["check_worst"] < 1e-3
    twice = got["yours-twice", "none"]  # it read `they match neither the sum nor ...`
    assert twice["status"] == "wrong" and "match the reference / world_size (2): divided " \
        "by the world size twice" in twice["error"], twice["error"]
    early = got["yours-early", "none"]
    assert early["status"] == "wrong"
    assert "differ from the mean over the global batch" in early["error"]
    # a hook left as the stub: skipped, as in one process, not a rank's error (exit 1)
    row = got["yours-stub", "none"]
    assert row["status"] == "skipped" and row["error"].startswith("not implemented: "), row
    assert "gallery_ddp.py" in row["error"] and "NotImplementedError" in row["error"]
    alone = got["yours-alone", "none"]  # said as what it does, not only as gradients off
    assert alone["status"] == "wrong" and alone["error"].startswith(
        "wrong: the ranks ended with different parameters (largest difference ")
    assert "rank 0's weights never broadcast to the others at the start" in alone["error"]
    # the first step's gradients right, the later ones not averaged: not read as a broadcast
    once = got["yours-once", "none"]
    assert once["status"] == "wrong" and "rank 0's first-step gradients were the mean, so its " \
        "weights reached the others, but their updates differ" in once["error"], once["error"]
    assert "or not at a later step (a bucket or counter never reset?)" in once["error"]
    assert "never broadcast" not in once["error"]
    # all-reduces never waited for: said first, not read as weights never broadcast
    nowait = got["yours-nowait", "none"]
    assert nowait["status"] == "wrong" and nowait["error"].startswith(
        "wrong: its finish_gradient_synchronization returned while its all-reduces were "
        "still running"), nowait["error"]


@pytest.mark.slow  # starts ranks
def test_sharded_optimizers_right_and_wrong(repo, tmp_path):
    # two layers and a large vocabulary: the example's round robin by count (`yours`) gives
    # rank 0 both the embedding and the LM head, most of the state
    got = ddp(tmp_path / "r.db", "--impl", "naive", "--shard-optimizer",
              f"yours,yours-count={DDP}:ShardedByCount,yours-lazy={DDP}:NeverStepsLastShard,"
              f"yours-own={DDP}:ZeroGradOfItsOwn,yours-duck={DDP}:NoTorchOptimizer,"
              f"yours-alone={DDP}:ZeroesItsShardAlone",
              "--num-layers", "2", "--vocab-size", "4096")
    # zero_grad(self) alone, and no torch Optimizer (its inner one in a list), as the
    # course's tests allow: they ended as errors, and the list's state counted 0 bytes
    for name in ("yours-own", "yours-duck"):
        row = got["naive", name]
        assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
        assert row["opt_state_rank0_share"] > 0.3, name
    robin = got["naive", "yours"]
    assert (robin["status"], robin["check"]) == ("ok", "pass"), robin["error"]
    assert robin["opt_state_rank0_share"] > 0.9
    # split, if unevenly: uneven, not "not sharded"
    assert robin["uneven"].startswith("rank 0 holds optimizer state 9")
    assert robin["uneven"].endswith("; the other ranks the rest") and not robin["not_sharded"]
    row = got["naive", "yours-count"]
    assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
    # split by element count: rank 0 holds about half of AdamW's state, and it says so
    assert 0.4 < row["opt_state_rank0_share"] < 0.6
    assert row["not_sharded"] is None and row["uneven"] is None
    assert row["param_rank0_share"] == 1.0  # a sharded optimizer leaves the weights whole
    # zero_grad of its own shard alone: the course's test passes it (it trains without DDP),
    # so it passes, with a note of what a DDP loop that trusts its zero_grad would see (it
    # read `wrong`, and before that `worst 0.047 (...)` and no cause)
    alone = got["naive", "yours-alone"]
    assert (alone["status"], alone["check"]) == ("ok", "pass"), alone["error"]
    assert "note: your sharded optimizer's zero_grad() leaves the gradients of " in \
        alone["check_detail"], alone["check_detail"]
    lazy = got["naive", "yours-lazy"]
    assert lazy["status"] == "wrong"
    assert "never left their initial values" in lazy["error"]
    assert "their optimizer step never ran" in lazy["error"]


@pytest.mark.slow  # starts ranks
@pytest.mark.parametrize("model", ["cs336_basics", None], ids=["basics-model", "our-model"])
def test_an_fsdp_that_passes_the_course_passes_here(repo, tmp_path, model):
    """With the course's model it shards Linear and Embedding and replicates the norms;
    with cs336sys's it shards nothing (none of its modules are cs336_basics classes). One
    that sums its shards' gradients is wrong where it shards: AdamW hid it in the
    parameters, and the shards' gradients were not compared."""
    more = ["--model", model] if model else []
    stale = (f",yours-fsdp-stale={FSDP}:StaleShards,yours-fsdp-rev={FSDP}:Reversed,"
             f"yours-fsdp-revsums={FSDP}:ReversedSums") if model else ""
    got = ddp(tmp_path / "r.db", "--impl",
              f"yours-fsdp-basics={FSDP}:FSDP,yours-fsdp-forgets={FSDP}:ForgetsReplicated,"
              f"yours-fsdp-sums={FSDP}:SumsShards{stale}", *more)
    sums = got["yours-fsdp-sums", None]
    if model:
        assert sums["status"] == "wrong"
        assert "match world_size (2) x the reference: summed, not averaged" in sums["error"]
        # rank 0 holding each weight's last chunk: right, and summed (which passed, unseen)
        rev = got["yours-fsdp-rev", None]
        assert (rev["status"], rev["check"]) == ("ok", "pass"), rev["error"]
        revsums = got["yours-fsdp-revsums", None]
        assert revsums["status"] == "wrong" and "summed, not averaged" in revsums["error"]
    else:  # nothing sharded: nothing summed
        assert (sums["status"], sums["check"]) == ("ok", "pass"), sums["error"]
    row = got["yours-fsdp-basics", None]
    assert (row["status"], row["check"]) == ("ok", "pass"), row["error"]
    assert row["check_worst"] < 1e-3
    if model:  # Linear and Embedding sharded: half of everything but the norms
        assert 0.45 < row["param_rank0_share"] < 0.55 and row["not_sharded"] is None
        # the FSDP's own comparison before the model's check, which a writeup cut it for
        assert row["check_detail"].startswith("per parameter"), row["check_detail"]
        assert "the same weights in cs336sys's TransformerLM" in row["check_detail"]
    else:  # right, but it shards nothing, and the row says so
        assert row["param_rank0_share"] == 1.0
        assert row["not_sharded"] == (
            "rank 0 holds parameters 100%, optimizer state 100% of the whole, more than 1/2 + "
            "10%; the ranks hold 2.0 copies of the parameters, 2.0 copies of the optimizer state"
            "; your FSDP sharded no weight of cs336sys's model, which is built of "
            "torch.nn.Linear and torch.nn.Embedding: an FSDP that wraps cs336_basics.model's "
            "Linear and Embedding, as the course's tests do, shards on your model (--model "
            "cs336_basics)")
        assert row["uneven"] is None
    forgets = got["yours-fsdp-forgets", None]
    assert forgets["status"] == "wrong"
    assert "match rank 0's own slice of the batch: never all-reduced" in forgets["error"]
    assert ".ln1.weight" in forgets["error"]
    if model:  # zero gradients on every shard at the first step: said, not only figures
        late = got["yours-fsdp-stale", None]
        assert late["status"] == "wrong"
        assert "gradient tensors rank 0 holds after the first step's finish_gradient_" \
            "synchronization() are all zero (" in late["error"]
        assert "no gradient had reached them yet (reduced a step late" in late["error"]


@pytest.mark.slow  # starts ranks
def test_an_fsdp_the_course_fails_besides_training_is_wrong_here(repo, tmp_path):
    """Three FSDPs that train right, which the course's test_fsdp.py fails: one keeps its
    model as `.model`, one shards the norms (their gradients differ between ranks), one
    gathers the full parameters to rank 0 alone. Each is wrong here, its cause in words.
    One whose gather keeps the full weights passed, gathering once, last; the course's
    test gathers after every step and trains on, as the point now does: its error says so."""
    # (the full-gradient one last: its rank's error ends the launch, the others stored)
    out = invoke("ddp", *SMALL, "--model", "cs336_basics", "--impl",
                 f"yours-fsdp-elsewhere={FSDP}:KeepsModelElsewhere,"
                 f"yours-fsdp-norms={FSDP}:ShardsNorms,yours-fsdp-rank0={FSDP}:GathersToRankZero,"
                 f"yours-fsdp-keeps={FSDP}:GatherKeepsFull,"
                 f"yours-fsdp-full={FSDP}:LeavesGradFull", "--db", tmp_path / "r.db")
    assert out.exit_code == 1, out.output  # the error row
    got = verdicts(tmp_path / "r.db")
    rows = {impl: got[impl, None] for impl in ("elsewhere", "norms", "rank0")
            for impl in [f"yours-fsdp-{impl}"]}
    assert all(r["status"] == "wrong" and r["check"] == "fail" for r in rows.values()), rows
    assert all(r["check_worst"] < 1e-3 for r in rows.values())  # each trains right
    assert "your FSDP keeps no `.module` (the model it wraps): the course's test_fsdp.py " \
        "reads fsdp_model.module" in rows["yours-fsdp-elsewhere"]["error"]
    # a full-size gradient left on the shard: AdamW failed on it with a bare size mismatch;
    # the error says first what the course's test says
    full = got["yours-fsdp-full", None]
    assert full["status"] == "error" and "after the first step's finish_gradient_" \
        "synchronization(), " in full["error"], full["error"]
    assert "'s gradient is shaped (" in full["error"] and "the course's test_fsdp.py asserts " \
        "every parameter's gradient has the parameter's shape" in full["error"]
    norms = rows["yours-fsdp-norms"]["error"]
    assert "(no Linear's or Embedding's) differ between the ranks after " \
        "finish_gradient_synchronization() (largest difference" in norms
    assert "; rank 0 holds (16,) of layers.0.ln1.weight's (32,): sharded, where the handout " \
        "asks the norms left whole" in norms, norms
    assert "fsdp_gather_full_params() on rank 1 gave " in rows["yours-fsdp-rank0"]["error"]
    keeps = got["yours-fsdp-keeps", None]
    assert keeps["status"] == "error" and "fsdp_gather_full_params() changed the model on " \
        "rank 0 (module.token_embeddings.weight went from [" in keeps["error"], keeps["error"]
    assert "where the course's test_fsdp.py gathers after every step and trains on; the next " \
        "step failed: " in keeps["error"]
    assert "shaped" in rows["yours-fsdp-rank0"]["error"]


@pytest.mark.slow  # starts ranks
def test_your_adapters_fsdp_computing_in_bf16_and_fp16_shards_and_passes(repo, tmp_path):
    """An FSDP computing in 16 bits, through the adapters file, passes. Its first point
    (bf16) once failed: the model was built before the adapters file was imported, and that
    import forgot the repository's modules, so the FSDP tested isinstance against a second
    copy of cs336_basics' Linear: it sharded nothing (params 100 %) and cast nothing."""
    for function, body in (("get_fsdp", "    from cs336_systems.gallery_fsdp import FSDP\n\n"
                                        "    return FSDP(module, compute_dtype=compute_dtype)"),
                           ("fsdp_on_after_backward",
                            "    fsdp_model.finish_gradient_synchronization()"),
                           ("fsdp_gather_full_params", "    return fsdp_model.full_state_dict()")):
        text = (repo / "tests" / "adapters.py").read_text()
        start = text.index(f"def {function}(")
        old = text[start:text.index("    raise NotImplementedError", start)]
        edit(repo, "tests/adapters.py", old + "    raise NotImplementedError", old + body)
    db = tmp_path / "r.db"
    ddp(db, "--impl", "yours-fsdp", "--model", "cs336_basics", "--precision", "bf16,fp16")
    rows = query(db, "SELECT * FROM ddp_runs ORDER BY created")
    assert [(r["precision"], r["status"], r["check"]) for r in rows] == [
        ("bf16", "ok", "pass"), ("fp16", "ok", "pass")], [r["error"] for r in rows]
    assert all(0.45 < r["param_rank0_share"] < 0.55 for r in rows)
    # the course's 16-bit reference casts the weights, ours autocasts: its tolerance said of
    # ours read `would fail` on every right FSDP, which passes the course's test
    assert not any("test_fsdp.py" in r["check_detail"] for r in rows), rows[0]["check_detail"]


def test_fp16_is_refused_for_replicas_in_one_line(repo, tmp_path):
    result = invoke("ddp", *SMALL, "--impl", "naive,fsdp", "--precision", "fp16",
                    "--db", tmp_path / "r.db")
    assert result.exit_code == 2
    assert "--precision fp16 is an FSDP's compute dtype" in result.output
    assert not (tmp_path / "r.db").exists()


STEP = ["--model", "cs336_basics", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
        "--num-layers", "1", "--num-heads", "2", "--vocab-size", "64", "--seq", "16",
        "--batch", "2", "--world-size", "2", "--warmup", "0", "--iters", "2", "--device", "cpu"]


@pytest.mark.slow  # starts ranks, compiles
def test_the_leaderboard_step_compiles_under_your_fsdp_or_says_why_not(repo, tmp_path,
                                                                     monkeypatch):
    """Compiled blocks under the user's FSDP: hooks run eager (torch.compiler.disable) train
    as the plain step does; hooks traced into the block's graph fail, and the stored error
    says so in words. What is checked is tracing, not generated code: aot_eager traces as
    inductor does, in 14 s of this test where inductor took 33."""
    monkeypatch.setenv("CS336SYS_COMPILE_BACKEND", "aot_eager")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "warm"))
    # each rank records the inductor cache it builds under: the leaderboard's empty one
    (repo / "cs336_systems" / "probe.py").write_text(
        f"import os\nfrom {FSDP} import CompileReady\n\n\nclass Probe(CompileReady):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        super().__init__(*args, **kwargs)\n"
        f"        with open({str(tmp_path / 'caches')!r}, 'a') as f:\n"
        "            print(os.environ['TORCHINDUCTOR_CACHE_DIR'], file=f)\n")
    db = tmp_path / "r.db"
    for name, target, switches, exit_code in [
            ("yours-fsdp", f"{FSDP}:FSDP", "compile", 1),
            ("yours-fsdp-ready", "cs336_systems.probe:Probe", "none,compile", 0)]:
        out = invoke("step", *STEP, "--ddp", f"{name}={target}", "--switches", switches,
                     "--db", db)
        assert out.exit_code == exit_code, out.output
    rows = query(db, "SELECT json_extract(settings, '$.switches') AS switches, status, error, "
                     "json_extract(samples, '$.loss') AS loss FROM runs ORDER BY created")
    traced, plain, ready = rows
    assert traced["status"] == "error"
    assert "compile under --ddp yours-fsdp: the compiled step failed" in traced["error"]
    assert "torch.compiler.disable" in traced["error"]
    assert [(r["switches"], r["status"]) for r in (plain, ready)] == [("none", "ok"),
                                                                      ("compile", "ok")]
    assert json.loads(ready["loss"]) == pytest.approx(json.loads(plain["loss"]), rel=1e-5)
    (env,) = {r["env"] for r in query(db, "SELECT env FROM invocations")}
    assert json.loads(env)["CS336SYS_COMPILE_BACKEND"] == "aot_eager"  # stored with the runs
    # the plain point builds under the user's caches, the compiled one under each rank's own
    plain_caches, compiled_caches = (tmp_path / "caches").read_text().split()[:2], \
        (tmp_path / "caches").read_text().split()[2:]
    assert set(plain_caches) == {str(tmp_path / "warm")}, plain_caches
    assert len(set(compiled_caches)) == 2, compiled_caches
    assert all("cs336sys-compile-" in c for c in compiled_caches), compiled_caches
    (compile_s,) = query(db, "SELECT compile_s FROM step_runs WHERE switches = 'compile' "
                             "AND status = 'ok'")
    assert compile_s["compile_s"] is not None


@pytest.mark.slow  # starts ranks
def test_the_leaderboard_step_says_where_your_fsdp_shards_nothing(repo, tmp_path):
    """handout run leaderboard --yours runs the user's FSDP on cs336sys's model, of which a
    course FSDP (it wraps cs336_basics' Linear and Embedding) shards nothing: each rank held
    it whole and the step was stored ok without a word (ddp said NOT SHARDED). The step
    stores what rank 0 holds, as ddp does, and the table flags it."""
    from cs336sys.experiments.ddp_setup import NOT_OUR_LAYERS
    from cs336sys.experiments.step import TABLE
    from cs336sys.report.tables import point_table

    db = tmp_path / "r.db"
    ours = STEP[2:]  # (STEP starts with --model cs336_basics)
    for more in (STEP[:2], []):
        out = invoke("step", *ours, *more, "--ddp", f"yours-fsdp={FSDP}:FSDP", "--switches",
                     "none", "--db", db)
        assert out.exit_code == 0, out.output
    basics, mine = query(db, "SELECT * FROM step_runs ORDER BY created")
    assert 0.45 < basics["param_rank0_share"] < 0.55 and basics["not_sharded"] is None
    assert mine["status"] == "ok" and mine["param_rank0_share"] == 1.0
    assert mine["not_sharded"].endswith(NOT_OUR_LAYERS)
    rows = query(db, "SELECT r.*, r.ddp AS ddp FROM step_runs r ORDER BY created")
    t = point_table(TABLE, [{**r, "_settings": {"ddp": r["ddp"], "model": r["model"]}}
                            for r in rows])
    held = [line[t.headers.index("rank 0 holds")] for line in t.rows]
    assert held[1] == "params 100%, opt 100% NOT SHARDED" and "NOT" not in held[0], held


@pytest.mark.slow  # starts ranks
def test_a_leaderboard_step_whose_fsdp_turns_the_loss_nan_is_wrong(repo, tmp_path):
    """The user's FSDP is checked by `ddp` alone, not in the step: one whose shards turn NaN
    after its first step was stored ok, its losses [5.7, null, null], timed and compared,
    on cs336sys's model and AdamW (on the user's model, their model's check covered it)."""
    db = tmp_path / "r.db"
    for name, target in (("yours-fsdp-nan", "NaNGradients"), ("yours-fsdp-right", "FSDP")):
        out = invoke("step", *STEP[2:], "--iters", "3", "--ddp", f"{name}={FSDP}:{target}",
                     "--switches", "none", "--db", db)
        assert out.exit_code == 0, out.output
    rows = {r["ddp"]: r for r in query(db, "SELECT * FROM step_runs")}
    assert rows["yours-fsdp-nan"]["status"] == "wrong"
    assert rows["yours-fsdp-nan"]["error"].startswith(
        "wrong: a non-finite loss (nan) at step 3 of the 4 it ran"), rows["yours-fsdp-nan"]
    assert rows["yours-fsdp-right"]["status"] == "ok"


def test_your_ddp_in_the_leaderboard_step_is_checked_as_the_course_checks_it(repo, tmp_path):
    """step --ddp yours ran the user's DDP unchecked: one that sums its gradients was timed
    ok (one that never all-reduces, faster for the work it skips). The course's test_ddp.py
    runs on it first, as in ddp; a right one passes."""
    db = tmp_path / "r.db"
    for name, target in (("yours-right", "AverageInHooks"), ("yours-sums", "Summed")):
        out = invoke("step", *STEP, "--ddp", f"{name}={DDP}:{target}", "--switches", "none",
                     "--db", db)
        assert out.exit_code == 0, out.output
    rows = {r["ddp"]: r for r in query(db, "SELECT * FROM step_runs")}
    assert (rows["yours-right"]["status"], rows["yours-right"]["check"]) == ("ok", "pass")
    assert rows["yours-sums"]["status"] == "wrong"
    assert rows["yours-sums"]["error"].startswith("wrong: as the course's test_ddp.py runs it")
    # a right DDP whose forward takes x alone, under the fused loss (computed in cs336sys's
    # LM head, called with targets=): a rank's TypeError was stored as error; skipped, why
    out = invoke("step", *STEP[2:], "--ddp", f"yours-x={DDP}:TakesX", "--switches",
                 "fused-ce", "--db", db)
    assert out.exit_code == 0, out.output
    (x,) = query(db, "SELECT status, error FROM step_runs WHERE ddp = 'yours-x'")
    assert x["status"] == "skipped" and "TakesX.forward takes no keywords to pass on to the " \
        "model (targets=, ce_impl=)" in x["error"], x["error"]
    # an adapters getter not written yet: skipped as ddp skips it, not a rank's traceback
    edit(repo, "tests/adapters.py", "    from cs336_systems.ddp import NaiveDDP\n",
         "    raise NotImplementedError\n    from cs336_systems.ddp import NaiveDDP\n")
    out = invoke("step", *STEP, "--ddp", "yours", "--switches", "none", "--db", db)
    assert out.exit_code == 0, out.output
    (unwritten,) = query(db, "SELECT status, error FROM step_runs WHERE ddp = 'yours'")
    assert (unwritten["status"], unwritten["error"]) == (
        "skipped", "get_ddp is not implemented in tests/adapters.py")
