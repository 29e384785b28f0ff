"""`cs336sys memory` and its parts: the live-tensor tracker, saved-bytes accounting, the
timeline, the CLI's rows and its refusals. Expected bytes are counted by hand from shapes."""

import json
from pathlib import Path

import pytest
import torch

from cs336sys.measure.live_tensors import LiveTensorTracker
from cs336sys.measure.saved_tensors import saved_by_node, saved_bytes_excluding, saving_nodes
from cs336sys.models.config import ModelConfig, param_count
from cs336sys.models.saved import block_saved_bytes
from cs336sys.models.transformer import TransformerBlock, TransformerLM
from tests.conftest import MICRO, invoke, view_rows

# What is measured and stored is the subject; timelines' pixels are not (conftest).
pytestmark = pytest.mark.unrasterized

rows = view_rows('memory_runs')


# -- the tracker ---------------------------------------------------------------------------


def test_tracker_counts_a_hand_computed_allocation_pattern():
    tracker = LiveTensorTracker(record=True)
    with tracker:
        a = torch.empty(1000)  # 4000 B
        b = torch.empty(250, dtype=torch.float64)  # 2000 B -> 6000
        v = a[10:]  # a view: same storage, nothing new
        b.add_(1)  # in place: nothing new
        assert tracker.current == 6000
        c = a + 1  # 4000 B -> 10000 (the peak)
        del a
        assert tracker.current == 10000  # the view v keeps a's storage alive
        del v
        assert tracker.current == 6000
        del c
        d = torch.empty(3000, dtype=torch.uint8)  # 3000 B -> 5000
        out = torch.empty(0)
        torch.add(torch.ones(10), 1, out=out)  # ones: 40 B, freed; out resized 0 -> 40 B
    assert (tracker.current, tracker.peak) == (5040, 10000)
    deltas = [e.delta for e in tracker.events]
    assert deltas == [4000, 2000, 4000, -4000, -4000, 3000, 40, 40, -40]
    assert [e.live for e in tracker.events][-1] == 5040
    del b, d, out
    assert tracker.current == 0  # frees are counted outside the `with` block too


def test_tracker_counts_no_memory_for_meta_tensors():
    """A meta tensor's storage reports its size but holds nothing (FSDP keeps shape-only
    placeholders of its weights between forwards)."""
    tracker = LiveTensorTracker()
    with tracker:
        placeholder = torch.empty(1000, 1000, device="meta")
        real = torch.empty(10)
        assert (tracker.current, placeholder.untyped_storage().nbytes()) == (40, 4_000_000)
    del real
    assert tracker.current == 0


def test_tracker_sees_backward_and_adopted_tensors():
    """y = relu(x @ w).sum(); every step of forward and backward counted by hand."""
    w = torch.randn(64, 64, requires_grad=True)  # 16384 B, made before the tracker
    x = torch.randn(8, 64)  # 2048 B
    tracker = LiveTensorTracker()
    assert tracker.adopt([w, x, x[1:]]) == 16384 + 2048  # a view of x is not counted again
    with tracker:
        with tracker.phase("forward"):
            y = (x @ w).relu().sum()  # mm output freed once relu made its own: +2048 +4
        assert tracker.current == 18432 + 2048 + 4
        assert tracker.peak == 18432 + 2048 + 2048  # mm and relu outputs both alive
        tracker.reset_peak()
        y.backward()
    # backward: ones (4) and threshold_backward (2048) alive when w.grad (16384) is made
    assert tracker.peak == 18432 + 4 + 4 + 2048 + 16384
    del y
    assert tracker.current == 18432 + 16384  # w, x and w.grad
    w.grad = None
    assert tracker.current == 18432
    assert tracker.phases[0][0] == "forward"


def test_model_init_is_parameters_plus_rope_tables():
    cfg = ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
                      context_length=32)
    tracker = LiveTensorTracker()
    with tracker:
        model = TransformerLM(cfg)
    rope = cfg.num_layers * 2 * cfg.context_length * (cfg.d_head // 2) * 4  # cos, sin fp32
    assert tracker.current == 4 * param_count(cfg) + rope
    del model
    assert tracker.current == 0


# -- saved bytes ---------------------------------------------------------------------------


def test_block_saved_bytes_match_the_analytic_count():
    B, T, d, d_ff, H = 2, 32, 64, 128, 4
    cfg = ModelConfig(d_model=d, d_ff=d_ff, num_layers=1, num_heads=H, context_length=T)
    block = TransformerBlock(cfg)
    x = torch.randn(B, T, d, requires_grad=True)
    params = list(block.parameters())
    out, saved = saved_bytes_excluding(lambda: block(x, torch.arange(T)), exclude=params)
    analytic = block_saved_bytes(B, T, d, d_ff, H)
    # by hand: 10 B·T·d + 4 B·T·d_ff + B·H·T² + 2 B·T + 2 T·d_head floats, and the T² mask
    assert analytic == 4 * (10 * 4096 + 4 * 8192 + 8192 + 128 + 1024) + 1024
    assert saved == pytest.approx(analytic, rel=0.10)
    by_node = saved_by_node(out, exclude=params)
    assert sum(by_node.values()) == pytest.approx(saved, abs=16)  # + the scale's fp64 scalar
    assert by_node["SoftmaxBackward0"] == pytest.approx(B * H * T * T * 4 / 2)  # shared with bmm
    assert by_node["SiluBackward0"] == B * T * d_ff * 4
    # a name's bytes are every node's of that name: the seven projections, the two bmms
    nodes = saving_nodes(out, exclude=params)
    assert (nodes["MmBackward0"], nodes["BmmBackward0"], nodes["SiluBackward0"]) == (7, 2, 1)


# -- the command -----------------------------------------------------------------------------


def _memory(db, *args):
    return invoke("memory", *MICRO, "--db", db, *args)


@pytest.mark.slow
def test_memory_sweep_rows_and_lowest_peak(db_path, tmp_path):
    snap = tmp_path / "snap"
    result = _memory(db_path, "--seq", "64", "--mode", "forward,train",
                     "--checkpoint", "none,every:1", "--snapshot", snap, "--wide")
    assert result.exit_code == 0, result.output
    got = rows(db_path, "SELECT * FROM memory_runs ORDER BY created")
    assert [(r["mode"], r["checkpoint"]) for r in got] == [
        ("forward", "none"),
        ("train", "none"),
        ("train", "every:1"),
    ]
    cfg = ModelConfig(d_model=64, d_ff=128, num_layers=2, num_heads=4, vocab_size=256,
                      context_length=64)
    P, B, T = param_count(cfg), 2, 64
    rope = 2 * 2 * T * 8 * 4
    for r in got:
        assert r["status"] == "ok" and r["peak_source"] == "live_tensors"
        assert r["params"] == P and r["param_bytes"] == 4 * P
        assert r["init_bytes"] == 4 * P + rope
        assert r["residual_bytes"] == B * T * 64 * 4 and r["residual_dtype"] == "float32"
        phases = [r[k] for k in ("fwd_peak_bytes", "bwd_peak_bytes", "opt_peak_bytes")]
        assert r["peak_bytes"] == max(p for p in phases if p is not None)
        assert r["peak_bytes"] >= r["init_bytes"] + r["saved_bytes"]
        assert r["snapshot_png"].endswith(".png") and r["snapshot_pickle"] is None
        assert Path(r["snapshot_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    fwd, none, every1 = got
    assert fwd["saved_bytes"] == 0 and fwd["before_opt_bytes"] is None
    assert fwd["grad_bytes"] == 0 and fwd["lowest_peak"] is None  # nothing to compare with
    assert fwd["after_opt_params_bytes"] is None  # no optimizer step in a forward
    for r in (none, every1):
        # params, grads, AdamW's two moments, RoPE tables, token ids and targets, the loss
        assert r["before_opt_bytes"] == 16 * P + rope + 2 * B * T * 8 + 4
        assert r["after_opt_bytes"] == r["before_opt_bytes"]  # AdamW updates in place
        assert (r["grad_bytes"], r["optim_bytes"]) == (4 * P, 8 * P)
        # the parts held at the two moments, by inspection: the accounting's bytes exactly
        # (AdamW's state exists only once it has stepped: a warm-up step came before)
        for when in ("before_opt", "after_opt"):
            held = [r[f"{when}_{part}_bytes"] for part in ("params", "grads", "opt_state")]
            assert held == [4 * P, 4 * P, 8 * P], when
        assert r["saved_bytes"] == r["act_bytes_analytic"]  # fp32, naive: counted exactly
        assert r["peak_bytes"] >= r["before_opt_bytes"]
    assert none["checkpoint_group"] is None and every1["checkpoint_group"] == 1
    assert none["saved_bytes"] >= 2 * every1["saved_bytes"]
    # the same updates with and without recomputation: the measured step's loss agrees
    assert every1["loss"] == pytest.approx(none["loss"], rel=1e-6)
    lowest = min(none["peak_bytes"], every1["peak_bytes"])
    assert none["peak_bytes"] != every1["peak_bytes"]  # activations, not AdamW, set the peak
    for r in (none, every1):
        assert r["lowest_peak"] == (r["peak_bytes"] == lowest)
    # the printed table compares what checkpointing changes against `none`
    table = result.stdout.splitlines()
    head = next(line for line in table if "bwd peak vs none" in line)
    assert "saved vs none" in head and "peak MiB" in head
    # the attention kernel and the residual-stream tensor (memory_profiling (d)) are said
    assert "attention" in head and "residual MiB" in head
    assert any(line.split()[-1:] == ["naive"] or " naive " in line for line in table[2:])
    ratio = every1["saved_bytes"] / none["saved_bytes"]
    assert any(f"{ratio:.2f}×" in line and "every:1" in line for line in table)
    inv = rows(db_path, "SELECT command, exit_status FROM invocations")
    assert inv == [{"command": "memory", "exit_status": 0}]


def test_oom_is_a_row_and_does_not_compete_for_lowest(db_path, monkeypatch):
    original = TransformerLM.forward

    def forward(self, token_ids, *a, **kw):
        if self.config.checkpoint == "every:2":
            raise torch.cuda.OutOfMemoryError("CUDA out of memory. Tried to allocate 9 GiB")
        return original(self, token_ids, *a, **kw)

    monkeypatch.setattr(TransformerLM, "forward", forward)
    result = _memory(db_path, "--seq", "16", "--checkpoint", "none,every:2,every:1")
    assert result.exit_code == 0, result.output
    got = rows(db_path, "SELECT checkpoint, status, lowest_peak FROM memory_runs ORDER BY created")
    assert [(r["checkpoint"], r["status"]) for r in got] == [
        ("none", "ok"), ("every:2", "oom"), ("every:1", "ok")]
    assert got[1]["lowest_peak"] is None and got[0]["lowest_peak"] + got[2]["lowest_peak"] >= 1


def test_residuals_rows(db_path):
    result = invoke("memory", "residuals", "--size", "tiny", "--d-model", "64", "--d-ff", "128",
                    "--num-heads", "4", "--seq", "32", "--batch", "2",
                    "--no-compile", "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    (r,) = rows(db_path, "SELECT * FROM memory_residuals_runs")
    assert (r["compile"], r["status"], r["d_model"], r["batch"]) == (0, "ok", 64, 2)
    assert r["analytic_bytes"] == block_saved_bytes(2, 32, 64, 128, 4)
    assert r["saved_bytes"] == pytest.approx(r["analytic_bytes"], rel=0.10)
    assert r["residual_bytes"] == 2 * 32 * 64 * 4
    assert r["saved_per_residual"] == pytest.approx(r["saved_bytes"] / r["residual_bytes"])
    tops = [(r[f"top{i}_op"], r[f"top{i}_bytes"], r[f"top{i}_share"]) for i in range(1, 6)]
    assert all(op and op.endswith("Backward0") for op, _, _ in tops)
    assert [b for _, b, _ in tops] == sorted((b for _, b, _ in tops), reverse=True)
    for _, nbytes, share in tops:
        assert share == pytest.approx(nbytes / r["walked_bytes"], rel=1e-3)
    samples = json.loads(rows(db_path, "SELECT samples FROM runs")[0]["samples"])
    assert sum(samples["saved_by_node"].values()) == pytest.approx(r["walked_bytes"], abs=8)
    assert "MulBackward0 ×" in result.stdout  # the multiplications' count beside their share
    assert {r[f"top{i}_op"]: r[f"top{i}_nodes"] for i in range(1, 6)}.get("MmBackward0") == 7
    # memory_profiling (f): the gradients a block's backward produces, by hand: two norms (d),
    # q, k, v, o (d x d) and SwiGLU's three (d x d_ff), fp32; and the input's, B·T·d
    params = 2 * 64 + 4 * 64 * 64 + 3 * 64 * 128
    assert r["param_bytes"] == r["grad_bytes"] == 4 * params
    assert r["input_grad_bytes"] == 2 * 32 * 64 * 4


@pytest.mark.slow
def test_residuals_compiled_is_one_node(db_path, monkeypatch):
    # AOTAutograd makes the compiled block one autograd node, whatever generates its code
    monkeypatch.setenv("CS336SYS_COMPILE_BACKEND", "aot_eager")
    result = invoke("memory", "residuals", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
                    "--num-heads", "2", "--seq", "16",
                    "--device", "cpu", "--db", db_path)
    assert result.exit_code == 0, result.output
    eager, compiled = rows(db_path, "SELECT * FROM memory_residuals_runs ORDER BY created")
    assert eager["batch"] == compiled["batch"] == 4  # the handout's batch (it was 1)
    assert compiled["status"] == "ok" and compiled["top1_op"] == "CompiledFunctionBackward"
    assert compiled["top1_share"] == 1.0 and compiled["top2_op"] is None
    assert compiled["analytic_bytes"] is None and compiled["compile_s"] > 0
    assert 0 < compiled["saved_bytes"] <= eager["saved_bytes"]


@pytest.mark.gpu
def test_memory_on_cuda_uses_the_allocator_and_writes_the_pickle(db_path, tmp_path):
    args = [a if a != "cpu" else "cuda" for a in MICRO]
    result = invoke("memory", *args, "--seq", "64", "--snapshot", tmp_path,
                    "--db", db_path)
    assert result.exit_code == 0, result.output
    (r,) = rows(db_path, "SELECT * FROM memory_runs")
    assert r["peak_source"] == "cuda_allocator" and r["peak_reserved_bytes"] is not None
    assert r["peak_bytes"] >= r["before_opt_bytes"] >= 16 * r["params"]
    # the parts by inspection on the GPU too: fp32 weights and gradients, AdamW's two moments
    assert (r["after_opt_params_bytes"], r["after_opt_grads_bytes"],
            r["after_opt_opt_state_bytes"]) == (4 * r["params"], 4 * r["params"], 8 * r["params"])
    assert r["snapshot_pickle"].endswith(".pickle") and r["snapshot_png"].endswith(".png")
    with open(r["snapshot_pickle"], "rb") as f:
        assert f.read(1) == b"\x80"  # a pickle


# -- help and bad input ----------------------------------------------------------------------


def test_help_has_examples():
    for cmd in (["memory"], ["memory", "residuals"]):
        result = invoke(*cmd, "--help")
        assert result.exit_code == 0
        assert "Example" in result.stdout and f"cs336sys {' '.join(cmd)}" in result.stdout


BAD = [
    (["memory", *MICRO, "--checkpoint", "every:3"], "larger than num_layers"),
    (["memory", *MICRO, "--mode", "forward-backward"], "--mode"),
    # a forward saves nothing for backward: every point was stored `none`, the option dropped
    (["memory", *MICRO, "--mode", "forward", "--checkpoint", "every:1"],
     "--checkpoint trades what a forward saves for backward, which --mode forward leaves out"),
    (["memory", *MICRO, "--checkpoint", "all"], "--checkpoint"),
    # the tracker's dispatch mode runs compiled code uncompiled: naive's bytes, to the byte
    (["memory", *MICRO, "--attention", "naive,compiled"],
     "--attention compiled: memory counts tensors with a dispatch mode on a CPU"),
    (["memory", *MICRO, "--snapshot", "{file}"], "not a directory"),
    (["memory", *MICRO, "--snapshot", "{file}/sub"], "not a directory"),
    # the folder made through a link that leads nowhere failed once the point had run
    (["memory", *MICRO, "--snapshot", "{loop}"], "is a symbolic link to a missing path or a loop"),
    (["memory", *MICRO, "--snapshot", "{loop}/sub"], "symbolic link to a missing path or a loop"),
    (["memory", *MICRO, "--snapshot", "{dangling}"], "symbolic link to a missing path"),
    # os.access says yes to root here; the write is tried
    (["memory", *MICRO, "--snapshot", "/proc/cs336sys-snapshot"], "cannot write in /proc"),
    (["memory", "--size", "tiny", "--seq", "100000"], "maximum context length"),
    (["memory", "residuals", "--size", "tiny", "--seq", "100000"], "--seq 100000 is above"),
    (["memory", "--size", "xl", "residuals"],
     "--size belongs after the subcommand: cs336sys memory residuals --size ..."),
    (["memory", "residuals", "--impl", "eager"], "No such option: --impl"),
    (["memory", "residuals", "--size", "huge"], "unknown size"),
]


@pytest.mark.parametrize("args,message", BAD)
def test_bad_input_exits_2_with_one_line_and_writes_nothing(db_path, tmp_path, args, message):
    afile = tmp_path / "a-file"
    afile.write_text("x")
    (tmp_path / "loop1").symlink_to(tmp_path / "loop2")
    (tmp_path / "loop2").symlink_to(tmp_path / "loop1")
    (tmp_path / "dangling").symlink_to(tmp_path / "missing")
    args = [a.replace("{file}", str(afile)).replace("{loop}", str(tmp_path / "loop1"))
            .replace("{dangling}", str(tmp_path / "dangling")) for a in args]
    result = invoke(*args, "--db", db_path)
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error:") and message in lines[0], result.stderr
    assert not db_path.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a-file", "dangling", "loop1", "loop2"]
    assert not (tmp_path / "missing").exists()


def test_points_of_one_size_name_but_other_shapes_draw_their_own_timelines(tmp_path):
    """The file name named the size alone: `--d-model 64` and `--d-model 32` (or 2025's and
    2026's xl) wrote one PNG, and the report showed the last run's under the other's
    caption. Each shape has its own file."""
    from cs336sys.experiments import memory as memory_exp

    a, b = (memory_exp.specs(size=["tiny"], d_model=d, seq=[32], snapshot=tmp_path,
                             device="cpu")[0] for d in (64, 32))
    assert a.label() != b.label() and "d64-" in a.label() and "d32-" in b.label()


def test_a_later_run_of_the_same_point_keeps_the_earlier_runs_timeline(tmp_path):
    """Two runs of one point into one --snapshot folder (before and after a change, --label):
    the second wrote over the first's PNG, which the first's row still named, and the report
    showed the second's timeline under the first's numbers. Each row names its own file."""
    db = tmp_path / "r.db"
    for label in ("before", "after"):
        result = invoke("memory", *MICRO, "--seq", "8", "--mode", "forward", "--iters", "1",
                        "--snapshot", tmp_path / "snap", "--label", label, "--db", db)
        assert result.exit_code == 0, result.output
    first, second = rows(db)
    assert first["snapshot_png"] != second["snapshot_png"]
    assert second["snapshot_png"] == first["snapshot_png"].replace(".png", "-2.png")
    for r in (first, second):
        assert Path(r["snapshot_png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert Path(first["snapshot_png"]).stat().st_mtime_ns < Path(
        second["snapshot_png"]).stat().st_mtime_ns


def test_runs_started_together_hold_a_timeline_name_each(tmp_path):
    """Two memory runs of one point started together into one --snapshot folder: both chose
    the first free name (nothing was written yet) and wrote one file that both rows named.
    A name is held from the moment it is chosen; one that a failed run held is let go."""
    from cs336sys.experiments.memory import unused_name

    with unused_name(tmp_path, "point") as first, unused_name(tmp_path, "point") as second:
        assert (first, second) == ("point", "point-2")
        (tmp_path / f"{second}.png").write_bytes(b"\x89PNG drawn")  # the second one drew
    assert sorted(p.name for p in tmp_path.iterdir()) == ["point-2.png"]  # the first failed
    with unused_name(tmp_path, "point") as third:
        assert third == "point"


def test_timelines_of_relative_snapshot_folders_show_from_any_folder(tmp_path, monkeypatch):
    """`--snapshot link` (a symlink to scratch space), `.` and `../x`: each run's timeline
    is in the report made from another folder; the stored path was resolved through the
    link (no longer ending with the folder given), and `.` or `..` were read against the
    report's folder."""
    run = tmp_path / "run"
    (tmp_path / "scratch").mkdir()
    run.mkdir()
    (run / "link").symlink_to(tmp_path / "scratch")
    monkeypatch.chdir(run)
    db = tmp_path / "r.db"
    for i, folder in enumerate(("link", ".", "../x")):
        result = invoke("memory", *MICRO, "--seq", str(8 * (i + 1)), "--mode", "forward",
                        "--iters", "1", "--snapshot", folder, "--db", db)
        assert result.exit_code == 0, result.output
    monkeypatch.chdir(tmp_path)
    result = invoke("report", "--db", db, "--format", "md", "--out", tmp_path / "out")
    assert result.exit_code == 0, result.output
    md = (tmp_path / "out" / "report.md").read_text()
    assert md.count("![Memory timeline:") == 3 and "left out" not in md


def test_a_late_peaks_label_stays_inside_the_timeline(tmp_path, monkeypatch):
    """The peak's label sat right of the peak: a peak near the last event ran it past the
    axes' right edge, across the spike it named."""
    import matplotlib.pyplot as plt

    from cs336sys.measure.live_tensors import Event
    from cs336sys.measure.timeline import draw_timeline

    kept, close = [], plt.close
    monkeypatch.setattr(plt, "close", lambda fig: kept.append(fig))
    live = [10, 20, 30, 25, 40, 35, 45, 60]  # the peak the last event
    events = [Event(i, i * 0.1, 1, v * 2**20, "backward", "aten::mm", None)
              for i, v in enumerate(live)]
    draw_timeline(events, [("backward", 0, 7)], tmp_path / "t.png", "late peak")
    (fig,) = kept
    ax = fig.axes[0]
    (label,) = [t for t in ax.texts if t.get_text().startswith("peak 60.00 MiB")]
    box, axes_box = label.get_window_extent(), ax.get_window_extent()
    assert axes_box.x0 <= box.x0 and box.x1 <= axes_box.x1, (box, axes_box)
    close(fig)
