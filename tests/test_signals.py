"""No rank outlives its command: SIGTERM and SIGKILL to `cs336sys comm`, and SIGKILL to
torchrun's agent, end every rank within seconds and free the group's port; a SIGTERM stores
the interrupted point as `error` and the invocation's exit status. (Linux: /proc.)"""

from __future__ import annotations

import os
import random
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import commit_seed, query
from tests.promises import RANKS, SIGNALS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads /proc (Linux)"),
]
PAYLOAD_MB = 256  # each rank's all-reduce buffer in LONG
LONG = ["comm", "--op", "all-reduce", "--bytes", f"{PAYLOAD_MB}MB", "--iters", "100000",
        "--warmup", "0", "--world-size", "2", "--device", "cpu"]


def _parent_of(pid: int) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])


def descendants(root: int) -> set[int]:
    """Every live process below `root`."""
    parents = {int(p.name): _parent_of(int(p.name)) for p in Path("/proc").iterdir() if p.name.isdigit()}
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        kids = {c for c, p in parents.items() if p == pid}
        todo += list(kids - found)
        found |= kids
    return found


def alive(pids: set[int]) -> set[int]:
    out = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":  # a zombie has ended; its parent just has not reaped it
            out.add(pid)
    return out


def _is_rank(pid: int) -> bool:
    """A rank: started by the launcher (named cs336sys-rankN, forked or spawned), or started by
    torchrun (RANK at exec)."""
    try:
        comm = Path(f"/proc/{pid}/comm").read_bytes()
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return False
    return comm.startswith(b"cs336sys-rank") or any(e.startswith(b"RANK=") for e in env)


def listening(pids: set[int]) -> set[int]:
    """TCP ports the processes `pids` listen on (rank 0 holds the group's store)."""
    inodes = set()
    for pid in pids:
        try:
            for fd in Path(f"/proc/{pid}/fd").iterdir():
                target = os.readlink(fd)
                if target.startswith("socket:["):
                    inodes.add(target[8:-1])
        except OSError:
            continue
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            f = line.split()
            if f[3] == "0A" and f[9] in inodes:  # LISTEN
                ports.add(int(f[1].rsplit(":", 1)[1], 16))
    return ports


def _resident_bytes(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        return 0


def _holds_its_payload(pid: int) -> bool:
    """The rank has allocated LONG's buffer (three quarters of it resident at least): it is
    past the group's set-up, in the all-reduces. Measured against its parent (the fork
    server or torchrun's agent), which holds the same imports and no payload."""
    payload = PAYLOAD_MB * 10**6 * 3 // 4
    return _resident_bytes(pid) >= _resident_bytes(_parent_of(pid) or pid) + payload


def ranks(root: int, n: int, timeout: float = 90.0) -> tuple[set[int], set[int]]:
    """Wait until `n` ranks below `root` are in their collectives; their pids and ports."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        found = {pid for pid in descendants(root) if _is_rank(pid)}
        ports = listening(found)
        if len(found) >= n and ports and all(_holds_its_payload(pid) for pid in found):
            time.sleep(0.5)  # into the all-reduces
            return found, ports
        time.sleep(0.1)
    raise AssertionError(f"{n} ranks did not reach their collectives")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def gone_within(pids: set[int], seconds: float) -> float:
    """Seconds until none of `pids` is alive; fails after `seconds`."""
    t0 = time.time()
    while alive(pids):
        assert time.time() - t0 < seconds, f"still alive: {alive(pids)}"
        time.sleep(0.05)
    return time.time() - t0


STARTED: list[subprocess.Popen] = []


def start(args: list[str], db: Path, own_session: bool = False, **popen) -> subprocess.Popen:
    """`cs336sys ARGS --db DB`; `own_session`: in a session and process group of its own, as
    a terminal starts a command."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("CS336SYS_DB", None)
    proc = subprocess.Popen([sys.executable, "-m", "cs336sys", *args, "--db", str(db)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=own_session, **popen)
    STARTED.append(proc)
    return proc


@pytest.fixture(autouse=True)
def _no_command_outlives_its_test():
    """A command a failed test left running (a signal it did not end on) is killed with its
    ranks (they end with it: test_sigkill_of_the_command_ends_every_rank), so that it does
    not take the cores of every test after it."""
    yield
    while STARTED:
        proc = STARTED.pop()
        if proc.poll() is None:
            proc.kill()
            proc.communicate()


def fork_server_below(root: int, timeout: float = 60.0) -> int:
    """The ranks' fork server below `root` (multiprocessing's, started at the first launch)."""
    deadline = time.time() + timeout
    while time.time() < deadline:
        for pid in descendants(root):
            try:
                if b"multiprocessing.forkserver" in Path(f"/proc/{pid}/cmdline").read_bytes():
                    return pid
            except OSError:
                continue
        time.sleep(0.02)
    raise AssertionError("no fork server started")


@pytest.mark.promise(RANKS)
def test_sigterm_ends_every_rank_and_stores_the_interrupted_point(tmp_path):
    db = tmp_path / "r.db"
    proc = start(LONG, db)
    pids, ports = ranks(proc.pid, 2)
    proc.send_signal(signal.SIGTERM)
    took = gone_within(pids, 5.0)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert all(port_free(p) for p in ports)
    assert "Traceback" not in err and "leaked semaphore" not in err
    assert err.strip().splitlines()[-1].startswith("terminated by signal 15")
    (run,) = query(db, "SELECT status, error FROM runs")
    assert run["status"] == "error" and run["error"].startswith("terminated")
    assert query(db, "SELECT exit_status FROM invocations") == [{"exit_status": 143}]
    print(f"SIGTERM to the last rank gone: {took:.2f} s")


@pytest.mark.promise(RANKS)
def test_sigkill_of_the_command_ends_every_rank(tmp_path):
    proc = start(LONG, tmp_path / "r.db")
    pids, ports = ranks(proc.pid, 2)
    proc.kill()
    gone_within(pids, 5.0)
    _, err = proc.communicate(timeout=30)
    assert all(port_free(p) for p in ports)
    assert "leaked semaphore" not in err


@pytest.mark.promise(RANKS)
def test_ranks_end_with_torchruns_agent(tmp_path):
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "cs336sys", *LONG[:-4], "--db", str(tmp_path / "r.db")]  # no --world-size
    agent = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             cwd=tmp_path)
    pids, ports = ranks(agent.pid, 2)
    agent.kill()
    gone_within(pids, 5.0)
    agent.communicate(timeout=30)
    assert all(port_free(p) for p in ports)


def signal_command(proc: subprocess.Popen, sig: int) -> bool:
    """Send `sig` to the command; whether cs336sys's handlers were installed by then
    (stopping.install, its first line: SIGTERM and `sig` caught, per /proc/PID/status). In the
    interpreter's own start, a signal is Python's and ends the process by it (docs/
    bad-input.md); under a loaded `make test` that start took more than 60 ms. SIGHUP goes
    to the command's whole process group, its ranks included, as a closed terminal sends it
    (the command started in a session of its own: start(own_session=True))."""
    caught = 0
    try:
        for line in Path(f"/proc/{proc.pid}/status").read_text().splitlines():
            if line.startswith("SigCgt:"):
                caught = int(line.split()[1], 16)
    except OSError:
        pass
    if sig == signal.SIGHUP:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    # install() sets SIGINT's, SIGTERM's, then SIGHUP's: the one sent must be caught too
    return bool(caught >> (signal.SIGTERM - 1) & 1 and caught >> (sig - 1) & 1)


def before_cs336sys(proc: subprocess.Popen, sig: int, db: Path, again: str, err: str,
                    below: set[int] = frozenset(), had: int = 0) -> None:
    """A signal sent before cs336sys's first line: the process ended by it, nothing stored
    (the store holds the `had` runs it held before: a command that reads one, such as db
    export, is given a full store), nothing left running (`below`: its processes when the
    signal was sent). A Ctrl-C while the interpreter imports its `site` module (the
    editable install's finder, under load at 0.05 s) is Python's own exit 1, "Failed to
    import the site module"."""
    in_site = proc.returncode == 1 and "Failed to import the site module" in err
    assert proc.returncode in (-sig, 128 + sig) or in_site, (again, proc.returncode, err)
    assert len(stored_runs(db)) == had, again
    gone_within(set(below) | descendants(proc.pid), 10.0)


def stored_runs(db: Path) -> list:
    """The runs in `db`: none where there is no file, or only the empty one a store being
    created leaves when a signal stops it before its schema (the next command makes it a
    store: docs/bad-input.md)."""
    if not db.exists():
        return []
    tables = {r["name"] for r in query(db, "SELECT name FROM sqlite_master WHERE type='table'")}
    if not tables:
        return []
    return query(db, "SELECT id FROM runs")


# Each sweep outlasts the latest moment below several times over on this 2-core box.
MODEL_SWEEP = ["model", "--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-layers",
               "2", "--num-heads", "4", "--vocab-size", "256", "--batch", "2", "--iters", "60",
               "--device", "cpu", "--seq", "32,64,96,128,160,192,224,256"]
DDP_SWEEP = ["ddp", "--size", "tiny", "--seq", "16", "--world-size", "2", "--iters", "3"]
STEP_RANKS = ["step", "--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-layers", "2",
              "--num-heads", "4", "--vocab-size", "256", "--seq", "16,32,48", "--batch", "2",
              "--switches", "none", "--world-size", "2", "--iters", "40", "--device", "cpu"]
# One moment drawn in each stratum for each command and signal, so that every run of the
# suite reaches each phase at new moments: typer's start and torch's import, the fork
# server's beside it (on this box about 0 to 1.2 s), the ranks' start (1.2 to 2.2 s on an
# idle box, later under load), the sweep. Ctrl-C to a command that starts ranks in four;
# `model` (one process) and comm's SIGTERM (test_sigterm_ends_every_rank_... holds it in
# the sweep too) in two wider ones, for the suite's time.
STRATA_S = ((0.1, 0.5), (0.5, 1.2), (1.2, 2.2), (2.2, 3.5))
WIDE_STRATA_S = ((0.1, 1.2), (1.2, 3.5))
SIGNALLED = {"model-int": (MODEL_SWEEP, signal.SIGINT, WIDE_STRATA_S),
             "comm-int": (LONG, signal.SIGINT, STRATA_S),
             "comm-term": (LONG, signal.SIGTERM, WIDE_STRATA_S),
             "ddp-int": (DDP_SWEEP, signal.SIGINT, STRATA_S),
             "step-ranks-int": (STEP_RANKS, signal.SIGINT, STRATA_S),
             "ddp-hup": (DDP_SWEEP, signal.SIGHUP, ((0.5, 3.5),))}  # one, for the suite's time


def signal_seed() -> int:
    """CS336SYS_SIGNAL_SEED, else the checked-out commit: the same moments on every xdist
    worker and whenever a commit's failure is rerun, new ones with each commit."""
    if os.environ.get("CS336SYS_SIGNAL_SEED"):
        return int(os.environ["CS336SYS_SIGNAL_SEED"])
    return commit_seed()


def moments(seed: int) -> list[tuple[str, list[str], int, float]]:
    """(id, command, signal, seconds) for every command, signal and stratum: a moment drawn
    uniformly inside each stratum, rounded to 10 ms so that its id reproduces it."""
    rng = random.Random(seed)
    return [(f"{name}-{after_s:.2f}s", args, sig, after_s)
            for name, (args, sig, strata) in SIGNALLED.items()
            for after_s in (round(rng.uniform(lo, hi), 2) for lo, hi in strata)]


SEED = signal_seed()


@pytest.mark.promise(SIGNALS)
@pytest.mark.parametrize("args, sig, after_s",
                         [pytest.param(*m[1:], id=m[0]) for m in moments(SEED)])
def test_a_signal_at_any_moment_ends_the_command_cleanly(tmp_path, args, sig, after_s):
    """Ctrl-C, SIGTERM or SIGHUP while the command starts (typer, torch, the ranks) or
    sweeps: exit 130, 143 or 129, no traceback, no process left, and a last line that says what was stored
    (nothing, or N points and --resume). A Ctrl-C that torch's import swallowed let the
    sweep run to the end with exit 0; one during comm's rank start-up killed it by the
    signal. A SIGHUP (a closed terminal) killed it where it stood, its end unrecorded."""
    db = tmp_path / "r.db"
    proc = start(args, db, own_session=sig == signal.SIGHUP)
    time.sleep(after_s)
    below = descendants(proc.pid)
    ours = signal_command(proc, sig)
    _, err = proc.communicate(timeout=60)
    again = f"at {after_s} s; CS336SYS_SIGNAL_SEED={SEED} draws the same moments"
    if not ours:
        before_cs336sys(proc, sig, db, again, err, below)
        return
    assert proc.returncode == 128 + sig, (again, err)
    assert "Traceback" not in err and "leaked semaphore" not in err, (again, err)
    last = err.strip().splitlines()[-1]
    word = "Interrupted" if sig == signal.SIGINT else f"Terminated ({signal.Signals(sig).name})"
    if last == f"{word}: this command stored nothing":
        assert not stored_runs(db), again
    else:
        # "--resume" for a stopped sweep; "(invocation ID)" for one the signal came after
        assert "point(s) stored in" in last and ("--resume" in last or "(invocation " in last), \
            (again, err)
        stored = int(last.split(": ", 1)[1].split()[0])
        assert len(query(db, "SELECT id FROM runs")) == stored, again
        assert query(db, "SELECT exit_status FROM invocations") == [{"exit_status": 128 + sig}]
    gone_within(below | descendants(proc.pid), 10.0)


# handout run: commands one after another in one process (model's, then profile's)
HANDOUT = ["handout", "run", "benchmarking_script", "nsys_profile"]
HANDOUT_MOMENTS = [(sig, round(random.Random(SEED + k).uniform(lo, hi), 2))
                   for k, (sig, (lo, hi)) in enumerate([(signal.SIGINT, (0.1, 1.5)),
                                                        (signal.SIGTERM, (1.5, 5.0))])]


@pytest.mark.promise(SIGNALS)
@pytest.mark.parametrize("sig, after_s", [pytest.param(*m, id=f"{m[0].name}-{m[1]:.2f}s")
                                          for m in HANDOUT_MOMENTS])
def test_a_signal_at_any_moment_ends_handout_run_with_what_it_stored(tmp_path, sig, after_s):
    """handout run checks its commands, then runs them in this one process: a signal while
    it checks, inside a command or between two ends the run with 130 or 143 and a last
    line that counts every point the run stored."""
    db = tmp_path / "r.db"
    proc = start(HANDOUT, db)
    time.sleep(after_s)
    ours = signal_command(proc, sig)
    _, err = proc.communicate(timeout=60)
    again = f"at {after_s} s; CS336SYS_SIGNAL_SEED={SEED} draws the same moments"
    if not ours:
        before_cs336sys(proc, sig, db, again, err)
        return
    assert proc.returncode == 128 + sig, (again, err)
    assert "Traceback" not in err, (again, err)
    last = err.strip().splitlines()[-1]
    stored = len(stored_runs(db))
    if last.endswith("nothing was stored") or last.endswith("this command stored nothing"):
        assert stored == 0, (again, err)
    elif "handout run stored " in last:  # a signal after the run's last command
        assert int(last.split("handout run stored ", 1)[1].split()[0]) == stored, (again, err)
    else:
        assert last.startswith("handout run stopped at ") and "by this run" in last, (again, err)
        assert int(last.split(": ", 1)[1].split()[0]) == stored, (again, err)


def test_a_signal_is_told_apart_before_and_after_cs336sys_installs_its_handlers():
    """The moments' tests excuse a signal that came before cs336sys's first line: the excuse
    must hold only there. A process that catches nothing reads as before; one past
    stopping.install(), cs336sys's first line, as after."""
    def ready(code: str) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", code + "\nprint('ready', flush=True)"
                                 "\nimport time; time.sleep(30)"], stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL,
                                text=True)
        assert proc.stdout.readline() == "ready\n"
        return proc

    plain = ready("")
    assert signal_command(plain, signal.SIGTERM) is False
    assert plain.wait(timeout=10) == -signal.SIGTERM
    ours = ready("from cs336sys.sweep import stopping; stopping.install()")
    assert signal_command(ours, signal.SIGTERM) is True
    assert ours.wait(timeout=10) != 0  # Terminated raised (no command line around it)


def test_the_moments_fall_in_their_strata_and_come_again_from_their_seed():
    drawn = moments(7)
    assert drawn == moments(7) and drawn != moments(8)
    strata = [stratum for _, _, command_strata in SIGNALLED.values() for stratum in command_strata]
    assert len(drawn) == len(strata)
    for (_, _, _, after_s), (lo, hi) in zip(drawn, strata, strict=True):
        assert lo <= after_s <= hi


@pytest.mark.promise(SIGNALS)
@pytest.mark.parametrize("to", ["command", "group"])
def test_ctrl_c_while_the_fork_server_imports_ends_the_server_with_the_command(tmp_path, to):
    """Ctrl-C while the ranks' fork server still imports torch (seconds, from its start):
    sent by a terminal to the whole process group, or to the command alone. Exit 130, no
    traceback, and the server is gone by the time the command has exited. A server that
    took the group's Ctrl-C would end with a traceback out of torch's import; one left
    importing would hold the command's stderr for seconds after the command had ended."""
    proc = start(LONG, tmp_path / "r.db", own_session=True)  # a group of its own
    server = fork_server_below(proc.pid)
    if to == "group":
        os.killpg(proc.pid, signal.SIGINT)
    else:
        proc.send_signal(signal.SIGINT)
    proc.wait(timeout=60)
    assert not alive({server})
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err


def test_a_signal_during_torchs_import_is_remembered_not_raised(monkeypatch):
    """Raised inside torch's or Triton's import, a KeyboardInterrupt can cross pybind11 and
    abort the process (exit -6): the handler only remembers it there, and check() raises it
    at the next point boundary. Anywhere else it raises at once."""
    from types import SimpleNamespace

    from cs336sys.sweep import stopping

    def frame(name, filename, back=None):
        return SimpleNamespace(f_code=SimpleNamespace(co_name=name, co_filename=filename),
                               f_back=back)

    ours = frame("run", "/x/cs336sys/sweep/runner.py")
    importing = frame("_init", "/x/torch/_C/helper.py",
                      frame("<module>", os.path.join(os.sep, "x", "torch", "__init__.py"), ours))
    calling = frame("forward", "/x/torch/nn/modules/module.py", ours)  # torch, not importing
    assert stopping.importing_native(importing) and not stopping.importing_native(calling)
    stopping._handler(signal.SIGINT, importing)  # remembered only
    assert stopping.pending() == signal.SIGINT
    with pytest.raises(KeyboardInterrupt):
        stopping.check()
    with pytest.raises(KeyboardInterrupt):
        stopping._handler(signal.SIGINT, calling)


@pytest.mark.parametrize("closed", [1, 2], ids=["stdout", "stderr"])
def test_a_command_started_with_its_output_closed_runs_and_stores(tmp_path, closed):
    """A daemon or `2>&-` starts the command with stderr (or stdout) closed: Python holds
    None there, and every command exited 1 before it ran (faulthandler, the progress bar)."""
    from tests.conftest import MICRO

    db = tmp_path / "r.db"
    r = subprocess.run([sys.executable, "-m", "cs336sys", "model", *MICRO, "--db", str(db)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300,
                       preexec_fn=lambda: os.close(closed))
    assert r.returncode == 0
    assert [row["status"] for row in query(db, "SELECT status FROM runs")] == ["ok"]


@pytest.mark.parametrize("raised", ["KeyboardInterrupt", "asyncio.CancelledError"])
def test_an_interrupt_the_users_code_raises_is_its_error_not_a_stop(tmp_path, raised):
    """With no key pressed, a KeyboardInterrupt from the user's code read as Ctrl-C (exit
    130, "run the same command with --resume", which stopped at the same point again), and
    a BaseException that is not an Exception (asyncio's CancelledError) ended the sweep with
    a traceback. Each is its point's error, and the sweep goes on."""
    from tests.user_repos import course_repo, edit

    repo = course_repo(tmp_path)
    edit(repo, "cs336_systems/flash_attention.py", "        scale = 1.0 / math.sqrt(d)\n",
         "        if n_q == 64:\n            import asyncio\n\n"
         f"            raise {raised}\n        scale = 1.0 / math.sqrt(d)\n")
    db = tmp_path / "r.db"
    r = subprocess.run([sys.executable, "-m", "cs336sys", "attention", "--impl", "yours-torch",
                        "--seq", "32,64,128", "--d-head", "16", "--batch", "1", "--warmup", "1",
                        "--iters", "2", "--pass", "forward", "--device", "cpu", "--db", str(db)],
                       cwd=repo, capture_output=True, text=True, timeout=300)
    assert r.returncode == 1, r.stderr  # a point's error, not 130
    got = query(db, "SELECT seq, status, error FROM attention_runs ORDER BY seq")
    assert [(x["seq"], x["status"]) for x in got] == [(32, "ok"), (64, "error"), (128, "ok")]
    assert got[1]["error"].startswith("cs336_systems/flash_attention.py:"), got[1]["error"]
    assert raised.split(".")[-1] in got[1]["error"].splitlines()[0]
    assert "--resume" not in r.stderr


def test_a_stop_while_another_program_holds_the_store_lock_ends_in_seconds(tmp_path):
    """Ctrl-C while a SQLite browser held the store's write lock printed the stop line, then
    waited the store's 60 s busy timeout to record the invocation's end, signals held."""
    import sqlite3

    from tests.conftest import MICRO

    db = tmp_path / "r.db"
    proc = subprocess.Popen([sys.executable, "-m", "cs336sys", "model", *MICRO, "--seq",
                             "8,16,24,32", "--db", str(db)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        while "point(s)" not in (line := proc.stderr.readline()):  # the sweep has begun
            assert line, "the command ended before its sweep began"
        browser = sqlite3.connect(db, timeout=60, isolation_level=None)
        browser.execute("BEGIN IMMEDIATE")  # (waits for a write in progress, if any)
        time.sleep(3)  # the next point is measured and waits for the lock
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        rc = proc.wait(timeout=60)
        took = time.monotonic() - t0
    finally:
        proc.kill()
        proc.wait()
    browser.execute("ROLLBACK")
    browser.close()
    assert rc == 130
    assert took < 20, took  # the 2 s it waits for the lock, on a loaded machine
