"""The launcher: ranks meet and compute, a failing or dying rank fails the run fast with its
error, a hung collective hits the group timeout, and no worker outlives the run."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch
import torch.distributed as dist

from cs336sys.parallel import fork_server
from cs336sys.parallel.launcher import check_world_size, launch
from cs336sys.parallel.rank_results import WorkerError
from tests.conftest import invoke


def _sum_ranks(ctx, scale):
    t = torch.full((3,), float(ctx.rank + 1))
    dist.all_reduce(t)
    ctx.emit(("from", ctx.rank))
    return ctx.rank, ctx.world_size, (t * scale).tolist()


def _raise_on_rank1(ctx):
    if ctx.rank == 1:
        raise ValueError("rank one is broken")
    t = torch.ones(1)
    dist.all_reduce(t)  # rank 0 blocks here until it is killed
    return "unreachable"


def _secondary_first(ctx):
    """Rank 1 fails first with what rank 0's failure does to a peer; rank 0 then reports
    the cause, raised in the user's code (sweep/ranks marks its file and line so)."""
    if ctx.rank == 1:
        raise RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:4242")
    time.sleep(0.3)
    exc = TimeoutError("Timed out waiting 20000ms for send")
    exc.cs336sys_where = "brk/shard.py:22"
    raise exc


def _both_in_users_code(ctx):
    """Both ranks fail in the user's code: rank 1 first, with what rank 0's timeout (its
    broadcast, which rank 1 never joined) did to its own wait."""
    if ctx.rank == 1:
        exc = RuntimeError("[pair.cc:553] Connection closed by peer [127.0.0.1]:7040")
        exc.cs336sys_where = "cs336_systems/ddp.py:38"
        raise exc
    time.sleep(0.3)
    exc = RuntimeError("[pair.cc:589] Timed out waiting 300000ms for send operation")
    exc.cs336sys_where = "cs336_systems/ddp.py:21"
    raise exc


def _segv_on_rank1(ctx):
    if ctx.rank == 1:
        import ctypes

        ctypes.string_at(0)  # a wild read, as a C extension's
    dist.barrier()


def _die_on_rank1(ctx, killed=False):
    if ctx.rank == 1:
        if killed:  # as the kernel's OOM killer ends a process
            os.kill(os.getpid(), signal.SIGKILL)
        os._exit(3)
    dist.barrier()


# What Gloo writes before it aborts a rank whose peer sent a tensor of another size.
GLOO_ABORT = (b"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n"
              b"  what():  [enforce fail at pair.cc:456] op.preamble.length <= op.nbytes. 500 "
              b"vs 4. Received data size doesn't match expected size. Is there a distributed "
              b"collective mismatch in your code?\n")


def _abort_on_rank1(ctx):
    if ctx.rank == 1:
        print("a warning of the user's code", file=sys.stderr, flush=True)
        os.write(2, GLOO_ABORT)
        os.abort()
    dist.barrier()


def _hang_on_rank1(ctx):
    if ctx.rank == 1:
        time.sleep(600)
    t = torch.ones(1)
    dist.all_reduce(t)  # times out: rank 1 never joins


def _imported(ctx, name):
    return name in sys.modules


def test_forked_ranks_start_with_dynamo_imported(monkeypatch):
    """The fork server imports torch._dynamo once (fork_server.TRAINING_PRELOAD): a rank that
    trains would import it (optimizers and FSDP wrap their steps in torch._disable_dynamo),
    2 s of CPU per rank."""
    monkeypatch.delenv("CS336SYS_START_METHOD", raising=False)
    assert launch(_imported, 2, args=("torch._dynamo",)) == [True, True]


@pytest.mark.slow  # starts two fork servers
def test_a_launch_preloads_what_its_ranks_need_and_replaces_a_server_without_it(monkeypatch):
    """Ranks that only communicate (comm) ask the fork server for torch alone; a later
    launch that needs dynamo replaces that server with one importing both, which a launch
    asking for less then keeps."""
    monkeypatch.delenv("CS336SYS_START_METHOD", raising=False)
    fork_server.stop()  # this process's server, if an earlier test started one
    monkeypatch.setattr(fork_server, "preloaded", ())
    assert launch(_imported, 2, args=("torch._dynamo",), preload=("torch",)) == [False, False]
    assert launch(_imported, 2, args=("torch._dynamo",)) == [True, True]
    assert launch(_imported, 2, args=("torch._dynamo",), preload=("torch",)) == [True, True]


def _with_the_server_seen(monkeypatch, seen: list, torch_ahead: bool = True) -> None:
    """Record this process's fork server as the command builds its points; the command
    runs as in a process of its own, with torch still to import (launcher._torch_ahead),
    unless `torch_ahead` is False."""
    from cs336sys.cli import common
    from cs336sys.parallel import launcher

    monkeypatch.setattr(launcher, "_torch_ahead", lambda: torch_ahead)

    build = common.with_handout

    def with_handout(specs, options):
        seen.append(fork_server.server_pid())
        return build(specs, options)

    monkeypatch.setattr(common, "with_handout", with_handout)


@pytest.mark.slow  # starts a fork server and two ranks
def test_comm_starts_its_fork_server_before_it_builds_its_points(monkeypatch, db_path):
    """comm and ddp start ranks at once: their fork server starts first thing, so that its
    import of torch runs beside the command's own, and the launch uses that server. Where
    every point is resumed, nothing launches, and the server is stopped again."""
    monkeypatch.delenv("CS336SYS_START_METHOD", raising=False)
    fork_server.stop()  # this process's server, if an earlier test started one
    seen: list = []
    _with_the_server_seen(monkeypatch, seen)
    args = ("comm", "--op", "all-reduce", "--bytes", "1KB", "--world-size", "2", "--warmup",
            "0", "--iters", "1", "--device", "cpu", "--db", db_path)
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert seen[0] is not None and seen[0] == fork_server.server_pid()
    fork_server.stop()
    resumed = invoke(*args, "--resume")
    assert resumed.exit_code == 0 and "skipping 1 point(s)" in resumed.output, resumed.output
    assert seen[1] is not None and fork_server.server_pid() is None


def test_no_server_starts_early_where_torch_is_imported_already(monkeypatch, db_path):
    """A command run in a process that has imported torch (in-process after another, as
    handout run does) has no import to overlap: nothing starts before its points."""
    monkeypatch.delenv("CS336SYS_START_METHOD", raising=False)
    fork_server.stop()
    seen: list = []
    _with_the_server_seen(monkeypatch, seen, torch_ahead=False)
    refused = invoke("comm", "--bytes", "0", "--world-size", "2", "--db", db_path)
    assert refused.exit_code == 2 and seen == [None] and fork_server.server_pid() is None


def test_a_refusal_or_a_dry_run_leaves_no_fork_server(monkeypatch, db_path):
    """Bad input stops the server the command had started (none is left importing torch
    behind it); a dry run, which launches nothing, starts none."""
    monkeypatch.delenv("CS336SYS_START_METHOD", raising=False)
    fork_server.stop()
    seen: list = []
    _with_the_server_seen(monkeypatch, seen)
    refused = invoke("comm", "--bytes", "0", "--world-size", "2", "--db", db_path)
    assert refused.exit_code == 2 and "less than one byte" in refused.output
    assert seen[0] is not None and fork_server.server_pid() is None and not db_path.exists()
    dry = invoke("ddp", "--dry-run", "--size", "tiny", "--world-size", "2", "--db", db_path)
    assert dry.exit_code == 0, dry.output
    assert seen[1] is None and fork_server.server_pid() is None


def test_step_starts_its_fork_server_first_only_where_its_points_start_ranks(monkeypatch,
                                                                             db_path):
    """step starts ranks only with a world size above 1 (or the leaderboard preset's 2), read
    from its options before its points are built; one rank starts no server."""
    from cs336sys.experiments.step_command import starts_ranks

    assert starts_ranks({"world_size": ["1,2"]}) and starts_ranks({"preset": "leaderboard"})
    assert not starts_ranks({"world_size": ["1"], "preset": "leaderboard"})
    assert not starts_ranks({}) and not starts_ranks({"world_size": ["two"]})
    monkeypatch.delenv("CS336SYS_START_METHOD", raising=False)
    fork_server.stop()
    seen: list = []
    _with_the_server_seen(monkeypatch, seen)
    tiny = ["--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-layers", "1",
            "--num-heads", "2", "--vocab-size", "64", "--seq", "8", "--batch", "2", "--warmup",
            "0", "--iters", "1", "--device", "cpu", "--db", db_path]
    for ranks in ("1", "2"):  # refused once its points are built: nothing runs
        refused = invoke("step", *tiny, "--world-size", ranks, "--switches", "bogus")
        assert refused.exit_code == 2 and "--switches" in refused.stderr
    assert seen[0] is None and seen[1] is not None and fork_server.server_pid() is None


def _pids_gone(pids):
    for pid in pids:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.mark.slow
def test_ranks_compute_and_rank0_streams():
    got = []
    values = launch(_sum_ranks, 2, args=(10.0,), on_emit=got.append)
    assert values == [(0, 2, [30.0] * 3), (1, 2, [30.0] * 3)]
    assert got == [("from", 0)]  # only rank 0's messages reach the caller


@pytest.mark.slow
def test_a_rank_that_raises_fails_the_run_with_its_traceback():
    t0 = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        launch(_raise_on_rank1, 2)
    err = info.value
    assert err.rank == 1 and "rank one is broken" in str(err)
    assert "_raise_on_rank1" in err.traceback  # the failing rank's own traceback
    assert time.perf_counter() - t0 < 30  # rank 0 was killed, not left to time out
    assert len(err.pids) == 2 and _pids_gone(err.pids)


@pytest.mark.slow
def test_a_rank_that_crashes_says_where_in_its_last_words():
    """A segfault on a rank was stored as `killed by SIGSEGV without reporting`, no more:
    the fault handler's stack is on the rank's stderr, the crashing frame in its last words."""
    with pytest.raises(WorkerError) as info:
        launch(_segv_on_rank1, 2)
    said = str(info.value)
    assert info.value.rank == 1 and "was killed by SIGSEGV without reporting" in said
    assert "its last words on stderr: Fatal Python error: Segmentation fault (File " in said
    assert 'test_launcher.py", line ' in said and " in _segv_on_rank1)" in said, said


@pytest.mark.slow
def test_the_rank_whose_error_names_the_users_code_is_blamed_over_an_earlier_one():
    """Which of two ranks' errors was stored depended on which pipe was read first: often
    rank 1's `Connection closed by peer`, raised in cs336sys's own collective, over rank 0's
    timeout in the student's file."""
    with pytest.raises(WorkerError) as info:
        launch(_secondary_first, 2)
    assert info.value.rank == 0
    assert str(info.value).startswith("rank 0 failed: brk/shard.py:22: TimeoutError: Timed "
                                      "out waiting 20000ms for send (a collective waited")


def test_a_timeout_is_blamed_over_the_peers_lost_connection_and_explained():
    """A DDP that broadcast on rank 0 alone was stored as rank 1's `Connection closed by
    peer` in its wait, the consequence, after 300 s, with no word of the timeout."""
    with pytest.raises(WorkerError) as info:
        launch(_both_in_users_code, 2)
    assert info.value.rank == 0
    assert str(info.value).startswith(
        "rank 0 failed: cs336_systems/ddp.py:21: RuntimeError: [pair.cc:589] Timed out "
        "waiting 300000ms for send operation (a collective waited the process group's "
        "timeout, CS336SYS_DIST_TIMEOUT seconds, 300 by default, for a rank that never joined "
        "it: do all ranks call the same collectives, in the same order?)"), str(info.value)


@pytest.mark.slow
@pytest.mark.parametrize("killed, said", [
    (False, "exited with code 3"),
    # the ranks share the host's memory: SIGKILL is most often the OOM killer, said so
    (True, "was killed by SIGKILL, most often the operating system's OOM killer")])
def test_a_rank_that_dies_silently_is_reported(killed, said):
    with pytest.raises(WorkerError, match=said) as info:
        launch(_die_on_rank1, 2, args=(killed,))
    assert info.value.rank == 1 and _pids_gone(info.value.pids)


def test_a_rank_that_aborts_is_reported_with_its_last_words_on_stderr(capfd):
    """A rank Gloo aborted (a collective mismatch in the user's DDP) was stored as `process
    exited with code -6 without reporting`: why was only on the terminal. Its stderr's
    telling line is now in the failure, its last lines in the traceback, and what it
    wrote still reaches the command's stderr."""
    with pytest.raises(WorkerError) as info:
        launch(_abort_on_rank1, 2)
    err = info.value
    assert err.rank == 1 and _pids_gone(err.pids)
    assert str(err).startswith(
        "rank 1 failed: process aborted (SIGABRT: a C++ exception nothing caught, or a failed "
        "check) without reporting; its last words on stderr: [enforce fail at pair.cc:456] "
        "op.preamble.length <= op.nbytes. 500 vs 4. Received data size doesn't match "
        "expected size. Is there a distributed collective mismatch in your code?"), str(err)
    assert err.traceback.startswith("a warning of the user's code\nterminate called after")
    shown = capfd.readouterr().err
    assert "a warning of the user's code" in shown and "collective mismatch" in shown


@pytest.mark.slow
def test_a_hung_collective_hits_the_group_timeout(monkeypatch):
    monkeypatch.setenv("CS336SYS_DIST_TIMEOUT", "2")  # spawned ranks inherit the environment
    t0 = time.perf_counter()
    with pytest.raises(WorkerError) as info:
        launch(_hang_on_rank1, 2)
    assert info.value.rank == 0  # the rank that waited reports; the sleeper is killed
    assert time.perf_counter() - t0 < 40
    assert _pids_gone(info.value.pids)


@pytest.mark.slow
def test_ctrl_c_leaves_no_worker_behind(tmp_path):
    script = textwrap.dedent(
        f"""
        import os, signal, sys, time
        # Ctrl-C as a terminal delivers it: a shell without job control (CI's `cmd &`) starts
        # its background commands with SIGINT ignored, and Python keeps that disposition.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        sys.path.insert(0, {os.getcwd()!r})
        from cs336sys.parallel.launcher import launch
        from tests.test_launcher import _sleep_and_report

        if __name__ == "__main__":
            # the ranks only sleep: a fork server without dynamo (2 s less)
            launch(_sleep_and_report, 2, args=({str(tmp_path)!r},), preload=("torch",))
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script])
    deadline = time.time() + 60
    while len(list(tmp_path.glob("*.pid"))) < 2:
        assert time.time() < deadline and proc.poll() is None, "workers did not start"
        time.sleep(0.2)
    pids = [int(p.read_text()) for p in tmp_path.glob("*.pid")]
    proc.send_signal(signal.SIGINT)
    assert proc.wait(timeout=30) != 0
    deadline = time.time() + 10
    while not _pids_gone(pids) and time.time() < deadline:
        time.sleep(0.2)
    assert _pids_gone(pids)


def _sleep_and_report(ctx, folder):
    # Only the parent gets the signal, as when Ctrl-C hits a launcher run in the background.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    with open(os.path.join(folder, f"{ctx.rank}.pid"), "w") as f:
        f.write(str(os.getpid()))
    time.sleep(600)


def test_nccl_world_larger_than_the_gpus_is_refused():
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    with pytest.raises(ValueError, match=f"needs {gpus + 1} GPUs"):
        check_world_size(gpus + 1, "nccl")


def test_a_folder_whose_launcher_is_gone_is_removed_by_the_next_launch(tmp_path, monkeypatch):
    """A command killed by SIGKILL never removed its ranks' stderr folder: one stayed in
    /tmp for each. The next launch removes those whose process is gone, and no other."""
    import subprocess
    import tempfile

    from cs336sys.parallel.rank_stderr import RankStderr

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    gone = subprocess.Popen(["true"])
    gone.wait()
    orphan = tmp_path / f"cs336sys-ranks-{gone.pid}-abc"
    alive = tmp_path / f"cs336sys-ranks-{os.getppid()}-def"
    older = tmp_path / "cs336sys-ranks-xyz"  # an older release's: whose, it does not say
    for folder in (orphan, alive, older):
        folder.mkdir()
    (orphan / ".cs336sys-lock").touch()  # as its maker left it, no longer locked
    mine = RankStderr(2)
    try:
        assert not orphan.exists() and alive.exists() and older.exists()
        assert os.path.basename(mine.folder).startswith(f"cs336sys-ranks-{os.getpid()}-")
    finally:
        mine.close()
    assert not os.path.exists(mine.folder)
