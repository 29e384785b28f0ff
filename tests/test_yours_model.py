"""The user's Transformer LM (`--model`) and the user's attention kernel inside ours
(`--attention yours-...`): built from the size presets, checked against cs336sys's model
before they are timed, their FLOPs right for them, in model, step, memory and profile."""

from __future__ import annotations

import json
import math
import pathlib
import re

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from tests.conftest import MICRO, invoke, micro, query
from tests.user_repos import EXAMPLE, course_repo, edit

MODEL = "cs336-basics/cs336_basics/model.py"  # the example's assignment-1 model

SHAPE = dict(vocab_size=256, context_length=16, d_model=64, num_layers=2, num_heads=4, d_ff=128,
             rope_theta=10000.0)
BATCH = 2

# An architecture that is not ours: a GELU MLP with two matrices, a learned position table.
OTHER_MODEL = '''
import torch
from torch import nn


class GeluLM(nn.Module):
    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.pos = nn.Parameter(torch.zeros(context_length, d_model))
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(d_model, d_ff), nn.GELU(), nn.Linear(d_ff, d_model))
            for _ in range(num_layers)
        )
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = h + block(h)
        return self.head(h)


class FlatLM(nn.Module):
    """Blocks that are not in a ModuleList: nothing for --checkpoint to group."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, d_model)
        self.mix = nn.Linear(d_model, d_model)
        self.head = nn.Linear(d_model, vocab_size, bias=False)

    def forward(self, x):
        return self.head(self.mix(self.embed(x)))


class NestedLM(GeluLM):
    """GPT-2's layout: the blocks at transformer.h, beside a second list of as many heads."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.transformer = nn.Module()
        self.transformer.h = self.blocks
        del self.blocks
        self.probes = nn.ModuleList(nn.Identity() for _ in range(num_layers))

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.transformer.h:
            h = h + block(h)
        return self.head(h)


class HeadInAList(GeluLM):
    """A head kept in a one-module ModuleList, a final norm and head in a list of two: a
    model of one layer, or of two, has two lists of its blocks' length."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.heads = nn.ModuleList([self.head])
        self.out = nn.ModuleList([nn.LayerNorm(d_model), self.head])


class WrongVocab(GeluLM):
    """A head of 7 outputs where the vocabulary is larger."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.head = nn.Linear(d_model, 7, bias=False)


class Residual(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class ChainLM(GeluLM):
    """The course's layout: each block adds its own residual, the forward chains them."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.blocks = nn.ModuleList(Residual(block) for block in self.blocks)

    def forward(self, x):
        h = self.embed(x) + self.pos[: x.shape[1]]
        for block in self.blocks:
            h = block(h)
        return self.head(h)


class TableBlock(nn.Module):
    """Handed the model's rotation table, (x, cos, sin); returns (x, None), as Hugging Face's
    blocks return (hidden, cache)."""

    def __init__(self, d_model, d_ff):
        super().__init__()
        self.up, self.down = nn.Linear(d_model, d_ff), nn.Linear(d_ff, d_model)

    def forward(self, x, cos, sin):
        return x + self.down(torch.relu(self.up(x * cos + x.roll(1, -1) * sin))), None


class TableLM(GeluLM):
    """The rotation table kept by the model and its slice handed to each block."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.blocks = nn.ModuleList(TableBlock(d_model, d_ff) for _ in range(num_layers))
        self.register_buffer("angle", torch.arange(context_length)[:, None] * 0.01,
                             persistent=False)

    def forward(self, x):
        h, angle = self.embed(x), self.angle[: x.shape[1]]
        for block in self.blocks:
            h, _ = block(h, angle.cos(), angle.sin())
        return self.head(h)


class KeywordLM(TableLM):
    """Its blocks called with keywords only, the residual stream too."""

    def forward(self, x):
        h, angle = self.embed(x), self.angle[: x.shape[1]]
        for block in self.blocks:
            h, _ = block(x=h, cos=angle.cos(), sin=angle.sin())
        return self.head(h)


class FrozenPositions(GeluLM):
    """A position table that takes no gradient (a fixed RoPE table kept as a parameter)."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.pos.requires_grad_(False)


class NanLM(GeluLM):
    def forward(self, x):
        return super().forward(x) * float("nan")


class Asserting(GeluLM):
    """Checks its tokens' values, as a careful model does: it cannot run on meta tensors."""

    def forward(self, x):
        assert bool((x < self.head.out_features).all()), "a token id past the vocabulary"
        return super().forward(x)


class NanLater(GeluLM):
    """Finite in its first forward (the check's copy has one), NaN after: a blow-up."""

    def forward(self, x):
        self.calls = getattr(self, "calls", 0) + 1
        return super().forward(x) * (float("nan") if self.calls > 1 else 1.0)


class LazyHead(GeluLM):
    """Its head made lazily: no shape until the first forward."""

    def __init__(self, vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta):
        super().__init__(vocab_size, context_length, d_model, num_layers, num_heads, d_ff, rope_theta)
        self.head = nn.LazyLinear(vocab_size, bias=False)
'''


def model_runs(db):
    return query(db, "SELECT * FROM model_runs ORDER BY created")


def counted_train_flops(model_class) -> int:
    """3x the forward matmul FLOPs torch's FlopCounterMode counts on a real instance."""
    torch.manual_seed(0)
    model = model_class(**SHAPE)
    tokens = torch.zeros(BATCH, SHAPE["context_length"], dtype=torch.long)
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        model(tokens)
    return 3 * counter.get_total_flops()


def test_the_course_model_is_measured_checked_and_its_flops_are_right(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "16", "--model", "cs336_basics", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = model_runs(db)
    assert row["status"] == "ok" and row["model"] == "cs336_basics" and row["attention"] is None
    assert row["check"] == "pass"
    assert row["check_detail"].startswith("the same weights in cs336sys's TransformerLM: loss")
    assert abs(row["check_loss"] - row["check_loss_ours"]) <= 1e-4 * row["check_loss_ours"]
    monkeypatch.syspath_prepend(str(repo / "cs336-basics"))
    from cs336_basics.model import BasicsTransformerLM

    assert row["flops_per_step"] == counted_train_flops(BasicsTransformerLM)
    assert row["flops_basis"] == "formula"  # the same architecture: our formula is its count
    assert "cs336-basics/cs336_basics/model.py" in json.loads(row["code"])
    assert query(db, "SELECT user_commit FROM invocations")[0]["user_commit"]


def test_a_model_of_another_vocabulary_is_an_error_that_says_so(tmp_path, monkeypatch):
    """Logits (B, T, 7) against targets of a vocabulary of 256 read `Target 141 is out of
    bounds` (on CUDA a device-side assert): the stored error names the shape and the size."""
    monkeypatch.chdir(course_repo(tmp_path, files={"my_models/__init__.py": "",
                                                   "my_models/lm.py": OTHER_MODEL}))
    db = tmp_path / "r.db"
    invoke("model", *MICRO, "--seq", "16", "--model", "my_models.lm:WrongVocab", "--db", db)
    (row,) = model_runs(db)
    assert row["status"] == "error"
    assert ("the model's forward returned logits of shape (2, 16, 7); cs336sys needs (batch, "
            "seq, vocab) with the vocabulary of 256 tokens") in row["error"], row["error"]


def test_another_architecture_gets_counted_flops_and_a_finite_loss_check(tmp_path, monkeypatch):
    repo = course_repo(tmp_path, files={"my_models/__init__.py": "", "my_models/lm.py": OTHER_MODEL})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "16", "--model", "my_models.lm:GeluLM", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = model_runs(db)
    assert row["status"] == "ok" and row["check"] == "pass"
    assert row["check_detail"].startswith("architecture differs from cs336sys's TransformerLM")
    monkeypatch.syspath_prepend(str(repo))
    from my_models.lm import GeluLM

    assert row["flops_basis"] == "counted"
    assert row["flops_per_step"] == counted_train_flops(GeluLM)
    # one that cannot run on the meta device is counted on its own, not given our formula
    result = invoke("model", *MICRO, "--seq", "16", "--model", "my_models.lm:Asserting",
                    "--db", db)
    assert result.exit_code == 0, result.output
    asserting = model_runs(db)[-1]
    assert (asserting["flops_basis"], asserting["flops_per_step"]) == (
        "counted", counted_train_flops(GeluLM))

    result = invoke("model", *MICRO, "--seq", "16", "--model", "my_models.lm:NanLM", "--db", db)
    assert result.exit_code == 0
    wrong = model_runs(db)[-1]
    assert wrong["status"] == "wrong" and wrong["check"] == "fail"
    assert wrong["error"] == "wrong: the loss of my_models.lm:NanLM is nan"


UNSEEN_ATTENTION = '''
import types

import torch
from cs336_basics import model as M


def _attend(self, x):  # the course's, its attention in products FlopCounterMode cannot see
    b, t, d = x.shape
    heads = lambda y: y.view(b, t, self.num_heads, d // self.num_heads).transpose(1, 2)
    q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
    positions = torch.arange(t, device=x.device)
    q, k = self.positional_encoder(q, positions), self.positional_encoder(k, positions)
    scores = (q[..., :, None, :] * k[..., None, :, :]).sum(-1) / q.shape[-1] ** 0.5
    mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
    p = torch.softmax(scores.masked_fill(~mask, float("-inf")), dim=-1)
    y = (p[..., :, :, None] * v[..., None, :, :]).sum(-2)
    return self.output_proj(y.transpose(1, 2).reshape(b, t, d))


class UnseenAttention(M.BasicsTransformerLM):
    """As a Triton attention kernel: no FLOPs to count, and no run on meta tensors."""

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        for layer in self.layers:
            layer.attn.forward = types.MethodType(_attend, layer.attn)

    def forward(self, x):
        assert bool((x >= 0).all()), "a negative token id"
        return super().forward(x)
'''


def test_a_model_whose_attention_torch_cannot_count_keeps_the_formula(tmp_path, monkeypatch):
    """Its matmuls but the attention's counted on the model itself read as `counted` FLOPs
    short of the attention term (MFU understated most at long sequences): a count that is
    the formula less its attention is our architecture with an unseen kernel."""
    repo = course_repo(tmp_path, files={"my_models/__init__.py": "",
                                        "my_models/unseen.py": UNSEEN_ATTENTION})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    for model in ("cs336_basics", "my_models.unseen:UnseenAttention"):
        result = invoke("model", *MICRO, "--seq", "16", "--model", model, "--db", db)
        assert result.exit_code == 0, result.output
    ours, unseen = model_runs(db)
    assert unseen["check"] == "pass", unseen["error"]
    assert (unseen["flops_basis"], unseen["flops_per_step"]) == (
        "formula", ours["flops_per_step"])


@pytest.mark.parametrize(
    "args, why",
    [
        (["--model", "cs336_basics", "--attention", "sdpa"], "brings its own attention"),
        (["--model", "nowhere.at_all:LM"], "No module named 'nowhere'"),
        (["--model", "just_a_name"], "give cs336_basics or package.module:Class"),
        # a class that takes the keywords but is no Module: with --checkpoint a traceback
        (["--model", "types:SimpleNamespace", "--checkpoint", "every:1"],
         "types:SimpleNamespace is a class but not a torch.nn.Module"),
        # a constructor of other keywords: refused at once, not an error stored at each point
        (["--model", "cs336_basics.model:Linear"],
         "is built with the course's keywords (vocab_size, context_length, d_model, num_layers, "
         "num_heads, d_ff, rope_theta), and its constructor says: missing a required argument: "
         "'d_in'; a subclass"),
    ],
)
def test_a_model_that_cannot_run_is_refused_before_anything_is_written(tmp_path, monkeypatch, args, why):
    monkeypatch.chdir(course_repo(tmp_path))
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "16", *args, "--db", db)
    assert result.exit_code == 2 and why in result.stderr, result.stderr
    assert not db.exists()


def test_the_course_model_from_outside_the_checkout_says_where_to_run(tmp_path):
    """A newcomer's first mistake: `--model cs336_basics` from another folder read only
    "No module named 'cs336_basics'"; the line says where to run, or what to give."""
    import os
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if k not in ("CS336SYS_ADAPTERS", "PYTHONPATH")}
    proc = subprocess.run([sys.executable, "-m", "cs336sys", "model", "--model", "cs336_basics",
                           "--db", str(tmp_path / "r.db")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert line.endswith("No module named 'cs336_basics'; run from your assignment checkout "
                         "(the one with cs336-basics/), or give --adapters PATH of its "
                         "tests/adapters.py"), line
    assert not (tmp_path / "r.db").exists()


def test_a_switch_your_model_cannot_take_is_quoted_as_typed(tmp_path, monkeypatch):
    """`step --model cs336_basics --switches ablation` was refused as "--switches flash
    changes cs336sys's model": an option nobody typed. It names the preset that holds it."""
    monkeypatch.chdir(course_repo(tmp_path))
    db = tmp_path / "r.db"
    result = invoke("step", *MICRO, "--seq", "16", "--model", "cs336_basics", "--switches",
                    "ablation", "--db", db)
    assert result.exit_code == 2 and not db.exists(), result.output
    assert "--switches ablation (it holds flash) changes cs336sys's model" in result.stderr, \
        result.stderr


def test_your_attention_kernel_in_our_model_gives_naive_attentions_loss(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "16", "--attention", "yours-torch,naive", "--db", db)
    assert result.exit_code == 0, result.output
    mine, ours = model_runs(db)
    assert (mine["attention"], mine["status"], mine["check"]) == ("yours-torch", "ok", "pass")
    assert mine["check_detail"].startswith(
        "yours-torch in cs336sys's model, naive attention in its place: loss ")
    assert ours["check"] is None  # ours is the reference, not checked
    # a kernel that drops the causal mask: the model's loss is not naive attention's
    edit(repo, "cs336_systems/flash_attention.py", "                if is_causal:\n                    qi",
         "                if False:\n                    qi")
    result = invoke("model", *MICRO, "--seq", "16", "--attention", "yours-torch", "--db", db)
    assert result.exit_code == 0, result.output
    wrong = model_runs(db)[-1]
    assert wrong["status"] == "wrong"
    assert wrong["error"].startswith(  # its cause in words, found on the kernel alone
        "wrong: yours-torch computes non-causal attention: the causal mask is missing "
        "(is_causal ignored) (the handout lets the PyTorch FlashAttention ignore it in its "
        "tests; a language model needs the mask); yours-torch in cs336sys's model, naive "
        "attention in its place"), wrong["error"]
    # a backward with a wrong D, its forward right: the loss alone passed it, timed ok
    edit(repo, "cs336_systems/flash_attention.py", "                if False:\n                    qi",
         "                if is_causal:\n                    qi")
    edit(repo, "cs336_systems/flash_attention.py", "d_row = (of * do).sum(dim=-1, keepdim=True)",
         "d_row = (of * do).sum(dim=-1, keepdim=True) * 0")
    result = invoke("model", *MICRO, "--seq", "16", "--attention", "yours-torch", "--db", db)
    assert result.exit_code == 0, result.output
    late = model_runs(db)[-1]
    assert late["status"] == "wrong", late["error"]
    assert late["error"].startswith("wrong: yours-torch's backward: the gradients of "), late
    assert "differ from naive attention's with the same weights, the loss the same" in \
        late["error"]


@pytest.mark.slow
def test_the_other_model_commands_take_your_model_and_your_kernel(tmp_path, monkeypatch):
    repo = course_repo(tmp_path)
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    small = [*MICRO, "--seq", "16"]
    for args in (
        ["memory", *small, "--model", "cs336_basics"],
        ["profile", "model", *small, "--model", "cs336_basics", "--top", "3"],
        ["step", *small, "--model", "cs336_basics", "--switches", "none,fused-adamw"],
        ["step", *small, "--attention", "yours-torch", "--switches", "none"],
    ):
        result = invoke(*args, "--db", db)
        assert result.exit_code == 0, (args, result.output)
    rows = query(db, "SELECT experiment, status, settings, metrics FROM runs ORDER BY created")
    got = [(r["experiment"], r["status"], json.loads(r["settings"]).get("model")) for r in rows]
    assert got == [("memory", "ok", "cs336_basics"), ("profile", "ok", "cs336_basics"),
                   ("step", "ok", "cs336_basics"), ("step", "ok", "cs336_basics"),
                   ("step", "ok", None)]
    # each checked before it is measured, memory and profile as the step is, and each
    # records the code it measured: the model's file, or the kernel's
    assert [json.loads(r["metrics"]).get("check") for r in rows] == ["pass"] * 5
    codes = [json.loads(r["metrics"]).get("code") or {} for r in rows]
    assert all("cs336-basics/cs336_basics/model.py" in c for c in codes[:4]), codes
    assert "cs336_systems/flash_attention.py" in codes[4], codes[4]
    # the profile splits the course's attention function into QKᵀ, softmax and PV, with the
    # FLOPs of naive attention over both layers
    profiled = json.loads(rows[1]["metrics"])
    assert all(profiled[f"{part}_ms_mean"] > 0 for part in ("qk", "softmax", "pv"))
    assert profiled["qk_flops"] == 2 * (2 * 4 * 16 * 16 * 16) * 2  # 2·B·H·T²·d, 2 layers
    result = invoke("step", *small, "--model", "cs336_basics", "--switches", "fused-ce", "--db", db)
    assert result.exit_code == 2 and "takes fused-adamw and compile" in result.stderr
    # the default switches, less those that change cs336sys's model, were refused as asked
    result = invoke("step", *small, "--model", "cs336_basics", "--dry-run", "--db", db)
    assert result.exit_code == 0, result.output
    assert result.output.startswith("dry run: 2 point(s)"), result.output  # none, fused-adamw


@pytest.mark.slow
def test_a_loss_that_turns_nan_while_timed_is_wrong_in_every_command(tmp_path, monkeypatch):
    """Past the check's one forward, a NaN in the timed steps was ok and pass for memory,
    profile and step (model alone looked). A lazily made head is counted once made."""
    repo = course_repo(tmp_path, files={"my_models/__init__.py": "",
                                        "my_models/lm.py": OTHER_MODEL})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    small = [*MICRO, "--seq", "16", "--warmup", "1", "--iters", "2", "--db", db]
    for args in (["memory", "--model", "my_models.lm:NanLater"],
                 ["profile", "model", "--model", "my_models.lm:NanLater", "--top", "1"],
                 ["step", "--model", "my_models.lm:NanLater", "--switches", "none"],
                 ["memory", "--model", "my_models.lm:LazyHead"],
                 ["ddp", "--model", "my_models.lm:NanLater", "--impl", "naive",
                  "--world-size", "2"]):
        result = invoke(*args, *small)
        assert result.exit_code == 0, (args, result.output)
    rows = query(db, "SELECT experiment, status, error, metrics FROM runs ORDER BY created")
    assert [(r["experiment"], r["status"]) for r in rows] == [
        ("memory", "wrong"), ("profile", "wrong"), ("step", "wrong"), ("memory", "ok"),
        ("ddp", "wrong")], rows
    assert all(r["error"].startswith("wrong: a non-finite loss (nan) at step 2 of the ")
               for r in [*rows[:3], rows[4]]), [r["error"] for r in rows]
    lazy, eager = json.loads(rows[3]["metrics"]), json.loads(rows[0]["metrics"])
    assert lazy["params"] == eager["params"] > 0  # the same shapes, its head made late
    # each row records the model's file, ddp's too (it kept the wrapper's alone)
    assert all("my_models/lm.py" in json.loads(r["metrics"])["code"] for r in rows), rows


def test_a_later_round_times_your_model_unchecked_but_not_its_nan(tmp_path, monkeypatch):
    """`model --rounds`: the user's model is checked in a point's first round; a later round
    builds it again and times it without the check, and a NaN in its steps is still wrong."""
    from cs336sys.experiments import model

    repo = course_repo(tmp_path, files={"my_models/__init__.py": "",
                                        "my_models/lm.py": OTHER_MODEL})
    monkeypatch.chdir(repo)
    (spec,) = model.specs(model="my_models.lm:NanLater", size=["tiny"], d_model=64, d_ff=128,
                          num_layers=1, num_heads=4, vocab_size=256, seq=[16], batch=[2],
                          warmup=1, iters=4, rounds=2, device="cpu")
    first, later = model.EXPERIMENT.split(spec)
    assert (first.check_round, later.check_round, later.iters) == (True, False, 2)
    result = model.run(later)
    assert result.status == "wrong" and result.metrics["check"] == "fail"
    assert result.error.startswith("wrong: a non-finite loss (nan) at step 2 of the 3"), result.error


def test_the_profile_splits_your_attention_around_your_own_softmax(tmp_path, monkeypatch):
    """Assignment 1 has students write their softmax (max, sub, exp, sum, div): with no op
    named softmax in its calls, the attention was left unsplit without a word."""
    repo = course_repo(tmp_path)
    edit(repo, MODEL, "    return torch.softmax(scores, dim=-1) @ v\n",
         "    return softmax(scores, dim=-1) @ v\n\n\n"
         "def softmax(x, dim):\n"
         "    e = torch.exp(x - x.amax(dim=dim, keepdim=True))\n"
         "    return e / e.sum(dim=dim, keepdim=True)\n", commit="own softmax")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("profile", "model", *MICRO, "--seq", "16", "--model", "cs336_basics",
                    "--top", "3", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT metrics FROM runs")
    profiled = json.loads(row["metrics"])
    assert all(profiled[f"{part}_ms_mean"] > 0 for part in ("qk", "softmax", "pv")), profiled


def test_checkpointing_groups_your_blocks_and_keeps_your_loss(tmp_path, monkeypatch):
    """--checkpoint on the user's model: the course's `layers` (and another model's one
    ModuleList of blocks, or the list --blocks names) grouped as ours are. The loss is the
    same; the bytes saved for backward fall to each group's input; a model with no list of
    blocks, two candidate lists, or a residual added between blocks that a group would skip
    is refused before anything runs, in one line that says what to do."""
    repo = course_repo(tmp_path, files={"my_models/__init__.py": "", "my_models/lm.py": OTHER_MODEL})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("memory", *MICRO, "--seq", "16", "--model", "cs336_basics", "--checkpoint",
                    "none,every:2", "--db", db)
    assert result.exit_code == 0, result.output
    plain, grouped = query(db, "SELECT status, saved_bytes, loss FROM memory_runs "
                           "ORDER BY checkpoint = 'every:2'")
    assert plain["status"] == grouped["status"] == "ok"
    assert grouped["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert grouped["saved_bytes"] < plain["saved_bytes"]
    # another architecture's one ModuleList of blocks (`blocks`), trained a few steps
    result = invoke("model", *MICRO, "--seq", "16", "--model", "my_models.lm:GeluLM",
                    "--checkpoint", "none,every:1", "--db", db)
    assert result.exit_code == 0, result.output
    plain, grouped = query(db, "SELECT status, loss_first, loss_last FROM model_runs "
                           "ORDER BY checkpoint = 'every:1'")
    assert plain["status"] == grouped["status"] == "ok"
    assert (grouped["loss_first"], grouped["loss_last"]) == pytest.approx(
        (plain["loss_first"], plain["loss_last"]), rel=1e-5)
    # a model with no list of blocks, or two lists that could be them: refused before
    # anything runs, in one line that says what to do
    for model, why in (("FlatLM", "found 0 such lists"),
                       ("NestedLM", "(transformer.h, probes): name one with --blocks")):
        result = invoke("memory", *MICRO, "--seq", "16", "--model", f"my_models.lm:{model}",
                        "--checkpoint", "every:1", "--db", db)
        assert result.exit_code == 2 and why in result.stderr, result.output
        assert len(result.stderr.strip().splitlines()) == 1
    assert len(query(db, "SELECT * FROM runs")) == 4  # the four above, nothing more
    # named with --blocks: GPT-2's nested list, checkpointed, the same loss
    result = invoke("memory", *MICRO, "--seq", "16", "--model", "my_models.lm:NestedLM",
                    "--blocks", "transformer.h", "--checkpoint", "none,every:1", "--db", db)
    assert result.exit_code == 0, result.output
    plain, grouped = query(db, "SELECT status, loss, saved_bytes, blocks FROM memory_runs "
                           "WHERE model LIKE '%NestedLM' ORDER BY checkpoint = 'every:1'")
    assert plain["status"] == grouped["status"] == "ok"
    assert grouped["blocks"] == "transformer.h"
    assert grouped["loss"] == pytest.approx(plain["loss"], rel=1e-6)
    assert grouped["saved_bytes"] < plain["saved_bytes"]
    for args, why in ((("--model", "my_models.lm:NestedLM", "--blocks", "head"),
                       "NestedLM.head is a Linear, not the nn.ModuleList"),
                      (("--model", "my_models.lm:NestedLM", "--blocks", "transformer.x"),
                       "has no submodule 'transformer.x'"),
                      (("--blocks", "layers"), "give it with --model")):
        result = invoke("memory", *MICRO, "--seq", "16", *args, "--checkpoint", "every:1",
                        "--db", db)
        assert result.exit_code == 2 and why in result.stderr, result.output
    # groups of several blocks where the forward adds the residual between them: refused
    for args, why in ((("--blocks", "transformer.h", "--checkpoint", "every:2"),
                       "one by one with every:1"),):
        result = invoke("memory", *MICRO, "--seq", "16", "--model", "my_models.lm:NestedLM",
                        *args, "--db", db)
        assert result.exit_code == 2 and why in result.stderr, result.output
    assert len(query(db, "SELECT * FROM runs")) == 6


def test_checkpointed_blocks_give_the_same_loss_and_gradients():
    """checkpoint_blocks on float64 models: every policy it accepts gives the loss and
    gradients of the model left alone (recomputation changes no number); a group of blocks
    whose forward adds the residual between them is refused, not run as something else."""
    import copy

    from cs336sys.models.checkpointing import NotChained, blocks_of, checkpoint_blocks

    namespace: dict = {}
    exec(OTHER_MODEL, namespace)
    x = torch.randint(0, SHAPE["vocab_size"], (BATCH, 16))

    def loss_and_grads(model):
        loss = model(x).logsumexp(-1).mean()
        loss.backward()
        return loss.item(), {n: p.grad for n, p in model.named_parameters()}

    for name, where, policies in (("ChainLM", None, ([1, 1], [2])),
                                  ("NestedLM", "transformer.h", ([1, 1],))):
        torch.manual_seed(0)
        reference = namespace[name](**SHAPE).double()
        want_loss, want_grads = loss_and_grads(copy.deepcopy(reference))
        for groups in policies:
            model = checkpoint_blocks(copy.deepcopy(reference), 2, groups, where)
            loss, grads = loss_and_grads(model)
            assert loss == pytest.approx(want_loss, rel=1e-14), (name, groups)
            assert grads.keys() == want_grads.keys()
            for key, grad in grads.items():
                torch.testing.assert_close(grad, want_grads[key], rtol=1e-12, atol=1e-14)
    with pytest.raises(NotChained, match="one by one with every:1"):
        checkpoint_blocks(copy.deepcopy(reference), 2, [2], "transformer.h")
    with pytest.raises(ValueError, match=r"\(transformer.h, probes\): name one with --blocks"):
        blocks_of(reference, 2)
    assert blocks_of(reference, 2, "probes") is reference.probes


def test_groups_that_would_change_what_the_model_computes_are_refused():
    """every:2 ran a group's blocks with its first block's arguments and each block's
    output handed to the next only: a model that gives each block a window of its own,
    sums every layer's output, or calls its blocks in reverse was stored ok with another
    loss (6.2873 against 6.2619). Each is refused, saying why; one by one they run, the
    same. A model the probe refuses is left as it was."""
    from torch import nn

    from cs336sys.models.checkpointing import NotChained, checkpoint_blocks

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ffn = nn.Linear(4, 4)

        def forward(self, h, scale=1.0):
            return h + scale * torch.tanh(self.ffn(h))

    class Stack(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10)
            self.layers = nn.ModuleList(Block() for _ in range(4))

        def forward(self, x):
            h = self.emb(x)
            for layer in self.layers:
                h = layer(h)
            return self.head(h)

    class Windowed(Stack):  # each block its own argument
        def forward(self, x):
            h = self.emb(x)
            for i, layer in enumerate(self.layers):
                h = layer(h, 1.0 + i)
            return self.head(h)

    class Reversed(Stack):
        def forward(self, x):
            h = self.emb(x)
            for layer in reversed(self.layers):
                h = layer(h)
            return self.head(h)

    class Summed(Stack):  # every layer's output used beyond the next block
        def forward(self, x):
            h, outs = self.emb(x), []
            for layer in self.layers:
                h = layer(h)
                outs.append(h)
            return self.head(sum(outs))

    class PairBlock(Block):  # Hugging Face's (hidden, cache)
        def forward(self, h, scale=1.0):
            return super().forward(h, scale), None

    class Tupled(Stack):
        def __init__(self):
            super().__init__()
            self.layers = nn.ModuleList(PairBlock() for _ in range(4))

        def forward(self, x):
            h = self.emb(x)
            for layer in self.layers:
                h = layer(h)[0]
            return self.head(h)

    class Keyword(Stack):
        def forward(self, x):
            h = self.emb(x)
            for layer in self.layers:
                h = layer(h=h)
            return self.head(h)

    x = torch.randint(0, 10, (2, 6))
    for model, why in ((Windowed, "hands block 1 arguments of its own"),
                       (Reversed, "calls its blocks in another order"),
                       (Summed, "grouping its blocks changed its output"),
                       (Tupled, "unpacks each block's output, a tuple"),
                       (Keyword, "calls block 0 with its input by keyword (h=...)")):
        torch.manual_seed(0)
        built = model()
        want = built(x)
        with pytest.raises(NotChained, match=re.escape(why)):
            checkpoint_blocks(built, 4, [2, 2])
        assert torch.equal(built(x), want), model  # as it was
        one_by_one = checkpoint_blocks(built, 4, [1, 1, 1, 1])
        assert torch.equal(one_by_one(x), want), model
    torch.manual_seed(0)
    chained = Stack()
    want = chained(x)
    assert torch.equal(checkpoint_blocks(chained, 4, [2, 2])(x), want)
    # built on the meta device (to count its FLOPs) there is nothing to compare: the probe
    # is not run there (torch.equal has no meta kernel, and every grouped policy failed)
    with torch.device("meta"):
        on_meta = Stack()
    assert checkpoint_blocks(on_meta, 4, [2, 2]) is on_meta


def test_blocks_whose_forward_is_never_called_are_refused_even_one_by_one():
    """A model that calls its blocks' parts itself (`l["ffn"](h)` on a ModuleDict) never runs a
    block's forward, which is what is wrapped: every:1 measured nothing checkpointed, stored
    ok at 1.00x. It is refused, saying why, for every policy."""
    from torch import nn

    from cs336sys.models.checkpointing import NotChained, checkpoint_blocks

    class Parts(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb, self.head = nn.Embedding(10, 4), nn.Linear(4, 10)
            self.layers = nn.ModuleList(nn.ModuleDict({"ffn": nn.Linear(4, 4)}) for _ in range(2))

        def forward(self, x):
            h = self.emb(x)
            for layer in self.layers:
                h = h + layer["ffn"](h)
            return self.head(h)

    for groups in ([1, 1], [2]):
        with pytest.raises(NotChained, match=r"called its 2 blocks' forward 0 times, not once "
                                             r"each \(it calls their parts itself\?\)"):
            checkpoint_blocks(Parts(), 2, groups)

    class Chained(nn.Module):  # blocks in an nn.Sequential: taken when named, and said so
        def __init__(self):
            super().__init__()
            self.stack = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 2))

    with pytest.raises(ValueError, match=r"found 0 such lists; an nn.Sequential of 2 \(stack\) "
                                         r"is taken when named: --blocks stack"):
        checkpoint_blocks(Chained(), 2, [1, 1])


def test_found_blocks_are_the_units_that_compile_and_torch_fsdp_take():
    """found_blocks: what --checkpoint finds (or --blocks names), as a list; none where no
    list of blocks exists, so that compile takes the whole model and torch-fsdp makes the
    whole model one unit instead of failing."""
    from cs336sys.models.checkpointing import found_blocks

    namespace: dict = {}
    exec(OTHER_MODEL, namespace)
    gelu, nested, flat = (namespace[n](**SHAPE) for n in ("GeluLM", "NestedLM", "FlatLM"))
    assert found_blocks(gelu, 2) == list(gelu.blocks)
    assert found_blocks(nested, 2, "transformer.h") == list(nested.transformer.h)
    assert found_blocks(nested, 2) == []  # two lists of two: ambiguous without --blocks
    assert found_blocks(flat, 2) == []


# The course's AdamW (assignment 1's algorithm: bias correction folded into the step size,
# eps outside it, decoupled weight decay after the update), and one that forgot the bias
# correction.
USER_ADAMW = '''
import math

import torch


class CourseAdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                t = state.get("t", 0) + 1
                m = state.get("m", torch.zeros_like(p))
                v = state.get("v", torch.zeros_like(p))
                m = b1 * m + (1 - b1) * p.grad
                v = b2 * v + (1 - b2) * p.grad ** 2
                lr_t = group["lr"] * math.sqrt(1 - b2 ** t) / (1 - b1 ** t)
                p -= lr_t * m / (torch.sqrt(v) + group["eps"])
                p -= group["lr"] * group["weight_decay"] * p
                state.update(t=t, m=m, v=v)


class NoBiasCorrection(CourseAdamW):
    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            b1, b2 = group["betas"]
            for p in group["params"]:
                state = self.state[p]
                m = b1 * state.get("m", torch.zeros_like(p)) + (1 - b1) * p.grad
                v = b2 * state.get("v", torch.zeros_like(p)) + (1 - b2) * p.grad ** 2
                p -= group["lr"] * m / (torch.sqrt(v) + group["eps"])
                state.update(m=m, v=v)
'''


def test_a_persistent_rope_table_keeps_the_loss_comparison():
    """A RoPE table registered persistent (register_buffer's default) is in the user's
    state_dict and not ours: the whole load failed, and the model lost its loss comparison
    (a RoPE bug then passed). Buffers are no weights; a parameter or shape that differs is
    said in words."""
    from torch import nn

    from cs336sys.experiments.checks import _loaded

    class Ours(nn.Module):
        def __init__(self, out=2, extra=False):
            super().__init__()
            self.lin = nn.Linear(2, out)
            self.register_buffer("cos", torch.zeros(2), persistent=False)
            if extra:
                self.gain = nn.Parameter(torch.ones(2))

    class Theirs(Ours):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.register_buffer("rope_cos", torch.ones(3))  # persistent

    ours, theirs = Ours(), Theirs()
    assert _loaded(ours, theirs) is None

    class Shared(nn.Module):  # one persistent RoPE module in every block, as the course's
        def __init__(self, rope_cls):
            super().__init__()
            rope = rope_cls()
            self.blocks = nn.ModuleList(nn.Module() for _ in range(2))
            for block in self.blocks:
                block.lin, block.rope = nn.Linear(2, 2), rope

    class Rope(nn.Module):
        def __init__(self, persistent=True):
            super().__init__()
            self.register_buffer("cos", torch.ones(3), persistent=persistent)

    # state_dict() names the shared table under each block; named_buffers() once
    assert _loaded(Shared(lambda: Rope(persistent=False)), Shared(Rope)) is None
    assert torch.equal(ours.lin.weight, theirs.lin.weight)
    assert _loaded(Ours(), Theirs(extra=True)) == "ours lacks: gain"
    assert _loaded(Ours(extra=True), Theirs()) == "theirs lacks: gain"
    assert _loaded(Ours(), Theirs(out=3)).startswith("size mismatch for lin.weight")


def test_a_model_with_dropout_is_checked_in_eval_mode(monkeypatch):
    """A dropout of the user's drew masks ours (none) never does: its loss and logits were
    apart, and a right model was wrong. The check's copy runs in eval mode (the model, not
    what its eval() returns)."""
    import dataclasses

    from cs336sys.experiments import checks
    from cs336sys.models.config import ModelConfig
    from cs336sys.models.transformer import TransformerLM

    class Dropping(TransformerLM):
        def __init__(self, config):
            super().__init__(config)
            self.drop = torch.nn.Dropout(0.5)

        def forward(self, x):
            return self.drop(super().forward(x))  # (B, T, V)

        def train(self, mode=True):  # a model's own, returning nothing: eval() gives None
            super().train(mode)

    built = checks.make_model

    def make_model(config, device, seed):
        if config.model is None:
            return built(config, device, seed)
        torch.manual_seed(seed)
        return Dropping(dataclasses.replace(config, model=None))

    monkeypatch.setattr(checks, "make_model", make_model)
    config = ModelConfig(d_model=32, d_ff=64, num_layers=1, num_heads=2, vocab_size=64,
                         context_length=16, model="my_models.lm:Dropping")
    verdict = checks.model_check(config, "cpu", 0, 2)
    assert verdict.passed, verdict.why
    assert verdict.metrics["check_detail"].startswith("the same weights in cs336sys's")


def test_a_forward_that_returns_no_logits_tensor_is_told_what_is_needed():
    """A model returning (logits, loss) was stored as "AttributeError: 'tuple' object has no
    attribute 'flatten'", cs336sys's line, with nothing to change named."""
    from cs336sys.experiments.training_step import cross_entropy

    logits, y = torch.zeros(2, 3, 5), torch.zeros(2, 3, dtype=torch.long)
    assert float(cross_entropy(logits, y)) == pytest.approx(math.log(5))
    with pytest.raises(TypeError, match=r"^the model's forward returned a tuple of 2, not the "
                                        r"logits: cs336sys needs forward\(x\) to return the "
                                        r"logits \(batch, seq, vocab\) alone$"):
        cross_entropy((logits, None), y)
    with pytest.raises(ValueError, match=r"returned a tensor of shape \(6, 5\); cs336sys needs "
                                         r"the logits \(batch, seq, vocab\) for tokens \(2, 3\)"):
        cross_entropy(logits.flatten(0, 1), y)


def test_logits_apart_fail_the_model_check_where_the_loss_hides_it():
    """Near ln V, a narrow model with a RoPE rotating the wrong pairs kept its loss within
    1e-4 (|Δ| 5.5e-4 of 9.2) while its logits were 0.26 off: the logits are compared too."""
    from cs336sys.experiments.checks import _same_output

    g = torch.Generator().manual_seed(0)
    reference = 0.1 * torch.randn(2, 16, 1000, generator=g)
    y = torch.randint(0, 1000, (2, 16), generator=g)
    assert _same_output(reference + 1e-6, reference, y, "same").passed  # sums in another order
    off = reference.clone()
    order = [i for i in torch.argsort(off[0, 3]).tolist() if i != int(y[0, 3])]
    a, b = order[0], order[-1]  # the lowest and highest logits but the target's, swapped:
    off[0, 3, [a, b]] = off[0, 3, [b, a]]  # the same loss, logits 0.6 apart
    verdict = _same_output(off, reference, y, "the same weights")
    assert verdict.metrics["check_loss"] == pytest.approx(verdict.metrics["check_loss_ours"],
                                                          rel=1e-6)
    assert not verdict.passed and "logits at most" in verdict.why


class SlipAdamW(torch.optim.Optimizer):
    """The course's AdamW, written out, with one of the slips students make switched on."""

    slip = None

    def __init__(self, params, slip=None, lr=1e-4, betas=(0.9, 0.999), eps=1e-8,
                 weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.slip = slip

    def betas(self, group):
        return group["betas"]

    @torch.no_grad()
    def step(self, closure=None):
        slip = self.slip
        for group in self.param_groups:
            b1, b2 = self.betas(group)[::-1] if slip == "swapped" else self.betas(group)
            lr, wd = group["lr"], group["weight_decay"]
            for p in group["params"]:
                state = self.state[p]
                t = state.get("t", 0) + 1
                m = b1 * state.get("m", torch.zeros_like(p)) + (1 - b1) * p.grad
                v = b2 * state.get("v", torch.zeros_like(p)) + (1 - b2) * p.grad ** 2
                c1 = 1.0 if slip == "uncorrected" else 1 - b1 ** t
                c2 = 1.0 if slip in ("uncorrected", "v uncorrected") else 1 - b2 ** t
                root = v if slip == "no sqrt" else torch.sqrt(v)
                update = lr * math.sqrt(c2) / c1 * m / (root + group["eps"])
                p += update if slip == "sign" else -update
                if slip != "no decay":
                    p -= (wd if slip == "decay without lr" else lr * wd) * p
                state.update(t=t, m=m, v=v)


class Beta1Beta2AdamW(SlipAdamW):
    """Assignment 1's AdamW keeping beta1 and beta2 in its group, beta2 0.95 by default."""

    def __init__(self, params, lr=1e-3, beta1=0.9, beta2=0.95, eps=1e-8, weight_decay=0.01):
        torch.optim.Optimizer.__init__(self, params, dict(lr=lr, beta1=beta1, beta2=beta2,
                                                          eps=eps, weight_decay=weight_decay))

    def betas(self, group):
        return group["beta1"], group["beta2"]


@pytest.mark.parametrize("slip, named", [
    ("uncorrected", "no bias correction"),
    ("v uncorrected", "first moment alone is bias-corrected"),
    ("no decay", "with no weight decay"),
    ("decay without lr", "weight decay is not scaled by the learning rate"),
    ("swapped", "beta1 and beta2 swapped"),
    ("no sqrt", "dividing by v, not by its square root"),
    ("sign", "adding the update instead of subtracting it"),
])
def test_a_wrong_adamw_is_told_what_it_does(monkeypatch, slip, named):
    """Only Adam with L2 was named; the other slips of a written-out AdamW got a figure (a
    missing bias correction "moves the parameters 3.08 of the largest move away") and no
    cause. Each is named; the right one passes."""
    from cs336sys.experiments import checks

    monkeypatch.setattr(checks, "make_optimizer", lambda name, params: SlipAdamW(params, slip))
    verdict = checks.optimizer_check("yours=my_opt:SlipAdamW")
    cause = verdict.why.partition("; it moves as AdamW ")[2]
    assert not verdict.passed and named in cause, verdict.why
    # the table's check column says what was compared (it was empty for a failed AdamW)
    assert verdict.metrics["check_detail"].startswith(
        "its AdamW against torch.optim.AdamW after 3 steps: ")
    monkeypatch.setattr(checks, "make_optimizer", lambda name, params: SlipAdamW(params))
    assert checks.optimizer_check("yours=my_opt:SlipAdamW").passed


def test_an_adamw_keeping_beta1_and_beta2_is_checked_with_its_own(monkeypatch):
    """Its betas are not torch's `betas` key: the check read torch's defaults (0.9, 0.999) in
    their place and called this right AdamW wrong (0.0088 of the largest move off)."""
    from cs336sys.experiments import checks

    monkeypatch.setattr(checks, "make_optimizer",
                        lambda name, params: Beta1Beta2AdamW(params, lr=1e-4))
    verdict = checks.optimizer_check("yours=my_opt:Beta1Beta2AdamW")
    assert verdict.passed, verdict.why
    assert verdict.metrics["check_optimizer_err"] < 1e-5
    hyper, unread = checks.their_hyperparameters(Beta1Beta2AdamW([torch.zeros(1)], lr=1e-4))
    assert (hyper, unread) == ({"lr": 1e-4, "betas": (0.9, 0.95), "eps": 1e-8,
                                "weight_decay": 0.01}, [])

    class Unreadable(Beta1Beta2AdamW):  # betas kept under names no one guesses: said
        def __init__(self, params, lr=1e-4):
            torch.optim.Optimizer.__init__(self, params, dict(lr=lr, beta1=0.9, beta2=0.95,
                                                              epsilon=1e-8, weight_decay=0.01))
            for group in self.param_groups:
                group["momentum_decay"] = (group.pop("beta1"), group.pop("beta2"))

        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                group["beta1"], group["beta2"] = group["momentum_decay"]
                group["eps"] = group["epsilon"]
            super().step()

    class AdamL2(Beta1Beta2AdamW):  # the decay in the gradient: Adam with L2, named
        @torch.no_grad()
        def step(self, closure=None):
            for group in self.param_groups:
                for p in group["params"]:
                    p.grad = p.grad + group["weight_decay"] * p
                decay, group["weight_decay"] = group["weight_decay"], 0.0
                super().step()
                group["weight_decay"] = decay

    monkeypatch.setattr(checks, "make_optimizer", lambda name, params: AdamL2(params, lr=1e-4,
                                                                              beta2=0.999))
    verdict = checks.optimizer_check("yours=my_opt:AdamL2")
    assert not verdict.passed and verdict.why.endswith(
        "it moves as torch.optim.Adam with weight_decay does: the decay added to the gradient "
        "(L2), not subtracted from the parameters apart as AdamW does")
    monkeypatch.setattr(checks, "make_optimizer", lambda name, params: Unreadable(params))
    verdict = checks.optimizer_check("yours=my_opt:Unreadable")
    assert not verdict.passed
    assert verdict.why.endswith("its betas could not be read from its param_groups or "
                                "constructor, so torch's defaults stood in")


class HandoutNamesAdamW(SlipAdamW):
    """Assignment 1's AdamW keeping the handout's names (alpha, lambda) in its group, with
    defaults unlike cs336sys's lr and weight decay: only the build says what it steps with."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0):
        torch.optim.Optimizer.__init__(self, params, dict(alpha=lr, betas=betas, eps=eps,
                                                          lam=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:  # SlipAdamW's step reads torch's names
            group["lr"], group["weight_decay"] = group["alpha"], group["lam"]
        super().step()
        for group in self.param_groups:
            del group["lr"], group["weight_decay"]


def test_an_adamw_with_its_own_names_is_checked_with_what_it_was_built_with(monkeypatch):
    """A group keeping `alpha` and `lam` was compared with torch's AdamW at the constructor's
    defaults (lr 1e-3, weight decay 0), not at the lr 1e-4 and weight decay 0.01 it was built
    with, and this right AdamW was stored wrong (0.9 of the largest move off)."""
    from cs336sys.experiments import checks
    from cs336sys.experiments.training_step import adamw_kwargs

    def build(params):
        return HandoutNamesAdamW(params, **adamw_kwargs(HandoutNamesAdamW))

    monkeypatch.setattr(checks, "make_optimizer", lambda name, params: build(params))
    verdict = checks.optimizer_check("yours=my_opt:HandoutNamesAdamW")
    assert verdict.passed, verdict.why
    assert verdict.metrics["check_optimizer_err"] < 1e-5
    hyper, unread = checks.their_hyperparameters(build([torch.zeros(1)]))
    assert (hyper["lr"], hyper["weight_decay"], unread) == (1e-4, 0.01, [])


class NoDefaultsAdamW(Beta1Beta2AdamW):
    """The course's AdamW built as assignment 1's test_adamw builds it: lr, weight_decay,
    betas and eps all given, none with a default."""

    def __init__(self, params, lr, weight_decay, betas, eps):
        super().__init__(params, lr=lr, beta1=betas[0], beta2=betas[1], eps=eps,
                         weight_decay=weight_decay)


def test_an_adamw_without_defaults_is_built_as_the_course_builds_it(monkeypatch):
    """Built with lr and weight_decay alone, it was stored `error` (missing 'betas' and
    'eps'), where the course's test passes it; a class naming them beta1 and beta2 is
    still built without them."""
    from cs336sys.experiments import checks, training_step

    monkeypatch.setattr(training_step, "optimizer_class", lambda name: NoDefaultsAdamW)
    verdict = checks.optimizer_check("adamw")  # the name is looked up by optimizer_class
    assert verdict.passed, verdict.why
    assert verdict.metrics["check_optimizer_err"] < 1e-5
    assert training_step.adamw_kwargs(Beta1Beta2AdamW) == {"lr": 1e-4, "weight_decay": 0.01,
                                                            "eps": 1e-8}


def test_your_adamw_is_checked_against_torchs_then_timed(tmp_path, monkeypatch):
    """--optimizer yours=package.module:Class: the course's algorithm passes (its eps and
    weight decay placed otherwise than torch's), one without bias correction is wrong; in
    model, memory and profile alike."""
    repo = course_repo(tmp_path, files={"my_opt/__init__.py": "", "my_opt/adamw.py": USER_ADAMW})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    for cls in ("CourseAdamW", "NoBiasCorrection"):
        result = invoke("model", *MICRO, "--seq", "16", "--optimizer",
                        f"adamw,yours=my_opt.adamw:{cls}", "--db", db)
        assert result.exit_code == 0, result.output
    rows = query(db, "SELECT optimizer, status, check_optimizer_err, error FROM model_runs "
                 "ORDER BY created")
    assert [(r["optimizer"], r["status"]) for r in rows] == [
        ("adamw", "ok"), ("yours", "ok"), ("adamw", "ok"), ("yours", "wrong")]
    assert rows[1]["check_optimizer_err"] < 1e-5  # the tolerance is 1e-3
    assert rows[3]["check_optimizer_err"] > 1 and "torch.optim.AdamW" in rows[3]["error"]
    nobias = ["--seq", "16", "--mode", "train", "--optimizer",
              "yours=my_opt.adamw:NoBiasCorrection", "--db", db]
    for command in (["memory", "--warmup", "0", "--iters", "1"], ["profile", "model", "--top", "2"]):
        result = invoke(*command, *MICRO, *nobias)
        assert result.exit_code == 0, result.output
        (row,) = query(db, f"SELECT status, check_optimizer_err, error FROM {command[0]}_runs")
        assert row["status"] == "wrong" and row["check_optimizer_err"] > 1, (command, row)
        assert "torch.optim.AdamW" in row["error"]
    result = invoke("model", *MICRO, "--optimizer", "yours-unregistered", "--db", db)
    assert result.exit_code == 2 and "--optimizer" in result.stderr
    # a class that imports but is no optimizer: refused before it runs (every point was an
    # error row, "unexpected keyword argument 'lr'")
    runs = len(query(db, "SELECT id FROM runs"))
    result = invoke("model", *MICRO, "--optimizer", "yours=json:JSONDecoder", "--db", db)
    assert result.exit_code == 2 and "json:JSONDecoder is a class, not a torch.optim." \
        "Optimizer" in result.stderr, result.output
    assert len(query(db, "SELECT id FROM runs")) == runs
    # assignment 1's adapters getter: --optimizer yours-adamw is the class get_adamw_cls() gives
    result = invoke("model", *MICRO, "--optimizer", "yours-adamw", "--db", db)
    assert result.exit_code == 2 and "has no get_adamw_cls()" in result.stderr
    with (repo / "tests" / "adapters.py").open("a") as adapters:
        adapters.write("\n\ndef get_adamw_cls():\n    from my_opt.adamw import CourseAdamW\n\n"
                       "    return CourseAdamW\n")
    result = invoke("model", *MICRO, "--seq", "16", "--optimizer", "yours-adamw", "--db", db)
    assert result.exit_code == 0, result.output
    last = query(db, "SELECT optimizer, status, check_optimizer_err FROM model_runs "
                 "ORDER BY created DESC LIMIT 1")[0]
    assert (last["optimizer"], last["status"]) == ("yours-adamw", "ok")
    assert last["check_optimizer_err"] < 1e-5


def test_assignment_1s_adapters_leave_this_checkouts_own_code_importable(tmp_path,
                                                                         monkeypatch):
    """docs/yours.md gives `--adapters ../assignment1-basics/tests/adapters.py` for
    yours-adamw; with it, a model or one-off target of the current checkout stopped with
    "No module named 'my_models'": only the adapters' repository was on the path."""
    first = course_repo(tmp_path, "assignment1-basics", files={
        "my_opt/__init__.py": "", "my_opt/adamw.py": USER_ADAMW,
        "tests/adapters.py": "def get_adamw_cls():\n    from my_opt.adamw import CourseAdamW"
                             "\n\n    return CourseAdamW\n"})
    repo = course_repo(tmp_path, files={"my_models/__init__.py": "",
                                        "my_models/lm.py": OTHER_MODEL})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("model", *MICRO, "--seq", "16", "--mode", "train", "--model",
                    "my_models.lm:GeluLM", "--optimizer", "yours-adamw", "--adapters",
                    first / "tests" / "adapters.py", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT status, error, optimizer, model FROM model_runs")
    assert (row["status"], row["optimizer"], row["model"]) == (
        "ok", "yours-adamw", "my_models.lm:GeluLM"), row["error"]


@pytest.mark.parametrize("device", [pytest.param("cuda", marks=pytest.mark.gpu)])
def test_on_the_device_your_model_and_adamw_are_checked_before_they_are_timed(
        tmp_path, monkeypatch, device):
    """The checks before timing on a GPU (the CPU's are the tests above): the course's model
    computes our model's loss there too, within the check's tolerance; the course's AdamW
    passes and one without bias correction is wrong."""
    repo = course_repo(tmp_path, files={"my_opt/__init__.py": "", "my_opt/adamw.py": USER_ADAMW})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    on_device = [a if a != "cpu" else device for a in MICRO]
    result = invoke("model", *on_device, "--seq", "16", "--model", "cs336_basics", "--optimizer",
                    "yours=my_opt.adamw:CourseAdamW,yours-nobias=my_opt.adamw:NoBiasCorrection",
                    "--db", db)
    assert result.exit_code == 0, result.output
    rows = query(db, "SELECT optimizer, status, check_loss, check_loss_ours, "
                 "check_optimizer_err FROM model_runs ORDER BY created")
    assert [(r["optimizer"], r["status"]) for r in rows] == [("yours", "ok"),
                                                             ("yours-nobias", "wrong")]
    for r in rows:
        assert abs(r["check_loss"] - r["check_loss_ours"]) <= 1e-4 * r["check_loss_ours"]
    assert rows[0]["check_optimizer_err"] < 1e-5 < 1 < rows[1]["check_optimizer_err"]


@pytest.mark.slow  # starts ranks
def test_step_and_ddp_take_your_adamw_checked_on_one_rank_and_two(tmp_path, monkeypatch):
    """step --optimizer yours=...: the optimizer fused-adamw replaces; ddp --optimizer: every
    rank's; each checked against torch's AdamW before it is timed, on ranks as on one
    process, and so is the user's model (--model)."""
    repo = course_repo(tmp_path, files={"my_opt/__init__.py": "", "my_opt/adamw.py": USER_ADAMW,
                                        "my_models/__init__.py": "", "my_models/lm.py": OTHER_MODEL})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    step = ["step", *MICRO, "--seq", "16", "--warmup", "0", "--iters", "1", "--db", db]
    result = invoke(*step, "--optimizer", "yours=my_opt.adamw:CourseAdamW",
                    "--switches", "none,fused-adamw")
    assert result.exit_code == 0, result.output
    result = invoke(*step, "--optimizer", "yours-nobias=my_opt.adamw:NoBiasCorrection",
                    "--switches", "none", "--world-size", "2", "--model", "my_models.lm:NanLM")
    assert result.exit_code == 0, result.output
    rows = query(db, 'SELECT switches, optimizer, world_size, status, "check", '
                 "check_optimizer_err, error FROM step_runs ORDER BY created")
    assert [(r["switches"], r["optimizer"], r["world_size"], r["status"]) for r in rows] == [
        ("none", "yours", 1, "ok"), ("fused-adamw", "adamw-foreach", 1, "ok"),
        ("none", "yours-nobias", 2, "wrong")]
    assert rows[0]["check"] == "pass" and rows[0]["check_optimizer_err"] < 1e-5
    assert rows[1]["check"] is None  # ours: nothing of the user's to check
    # both checks ran on the ranks, and each names its cause, the model's first
    assert rows[2]["check_optimizer_err"] > 1 and rows[2]["check"] == "fail"
    assert rows[2]["error"].startswith("wrong: the loss of my_models.lm:NanLM is nan; "
                                       "yours-nobias moves the parameters ")
    # ddp: every rank's AdamW, replicated or sharded by ours, is the user's class
    result = invoke("ddp", *MICRO, "--seq", "16", "--batch", "2", "--warmup", "0", "--iters",
                    "1", "--impl", "naive", "--shard-optimizer", "--optimizer",
                    "yours-nobias=my_opt.adamw:NoBiasCorrection", "--db", db)
    assert result.exit_code == 0, result.output
    rows = query(db, "SELECT shard_optimizer, optimizer, status, check_optimizer_err, code "
                 "FROM ddp_runs ORDER BY created")
    assert [(r["shard_optimizer"], r["optimizer"], r["status"]) for r in rows] == [
        ("none", "yours-nobias", "wrong"), ("ours", "yours-nobias", "wrong")]
    assert all(r["check_optimizer_err"] > 1 for r in rows)
    assert "my_opt/adamw.py" in rows[0]["code"]  # what the ranks stepped


def test_memory_residuals_of_your_block(tmp_path, monkeypatch):
    """`memory residuals --model cs336_basics`: one block of the course's model (forward(x),
    no positions) measured as ours is; no analytic count, which is ours alone."""
    monkeypatch.chdir(course_repo(tmp_path))
    db = tmp_path / "r.db"
    shape = ["--size", "tiny", "--d-model", "64", "--d-ff", "128", "--num-heads", "4",
             "--seq", "16", "--batch", "2", "--no-compile", "--device", "cpu"]
    for extra in ([], ["--model", "cs336_basics"]):
        result = invoke("memory", "residuals", *shape, *extra, "--db", db)
        assert result.exit_code == 0, result.output
    ours, theirs = query(db, "SELECT model, status, saved_bytes, analytic_bytes, residual_bytes, "
                         "top1_op FROM memory_residuals_runs ORDER BY created")
    assert ours["model"] is None and theirs["model"] == "cs336_basics"
    assert theirs["status"] == "ok" and theirs["analytic_bytes"] is None
    assert theirs["residual_bytes"] == ours["residual_bytes"] == 2 * 16 * 64 * 4
    # the same kind of block (pre-norm attention + SwiGLU): several residuals' worth saved
    assert theirs["saved_bytes"] > 4 * theirs["residual_bytes"] and theirs["top1_op"]


def test_memory_measures_your_block_as_your_model_calls_it(tmp_path, monkeypatch):
    """A block that takes the model's rotation table (x, cos, sin) and returns (x, None):
    `memory residuals` called it with (x, positions), and `memory`'s hook read the tuple's
    dtype, each an error blamed on the user's file. The block gets what the model's forward
    hands it, and is measured on its output's first element."""
    monkeypatch.chdir(course_repo(tmp_path, files={"my_models/__init__.py": "",
                                                   "my_models/lm.py": OTHER_MODEL}))
    db = tmp_path / "r.db"
    shape = ["--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "4",
             "--seq", "16", "--batch", "2", "--device", "cpu", "--db", db]
    for model in ("TableLM", "KeywordLM"):  # (x, cos, sin), then x=, cos=, sin=
        result = invoke("memory", "residuals", *shape, "--no-compile", "--model",
                        f"my_models.lm:{model}")
        assert result.exit_code == 0, result.output
    rows = query(db, "SELECT status, error, saved_bytes FROM memory_residuals_runs")
    assert [r["status"] for r in rows] == ["ok", "ok"], [r["error"] for r in rows]
    # relu's output, the two linears' inputs, and x·cos, x·sin's operands: several (B, T, d)
    assert rows[0]["saved_bytes"] == rows[1]["saved_bytes"] > 2 * 2 * 16 * 32 * 4
    result = invoke("memory", *shape, "--num-layers", "2", "--warmup", "0", "--iters", "1",
                    "--model", "my_models.lm:TableLM")
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT status, error, residual_dtype FROM memory_runs")
    assert (row["status"], row["residual_dtype"]) == ("ok", "float32"), row["error"]


def test_residuals_of_a_model_with_bf16_weights_take_its_streams_dtype(tmp_path, monkeypatch):
    """memory residuals handed the user's block a float32 residual stream where the model
    hands it bfloat16: the block's matmul failed, stored as an error at the student's line,
    and the residual's bytes were counted at 4 a value; memory counted its parameters at 4
    bytes too."""
    bf16 = ("import torch\nfrom cs336_basics.model import BasicsTransformerLM\n\n\n"
            "class Bf16LM(BasicsTransformerLM):\n"
            "    def __init__(self, *args, **kwargs):\n"
            "        super().__init__(*args, **kwargs)\n"
            "        self.to(torch.bfloat16)\n")
    monkeypatch.chdir(course_repo(tmp_path, files={"my_models/__init__.py": "",
                                                   "my_models/bf16.py": bf16}))
    db = tmp_path / "r.db"
    result = invoke("memory", "residuals", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
                    "--num-heads", "4", "--seq", "16", "--batch", "2", "--no-compile",
                    "--model", "my_models.bf16:Bf16LM", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT status, error, residual_bytes, saved_bytes "
                       "FROM memory_residuals_runs")
    assert row["status"] == "ok", row["error"]
    assert row["residual_bytes"] == 2 * 16 * 32 * 2  # (B, T, d) in bf16
    assert row["saved_bytes"] > row["residual_bytes"]
    # memory's accounting of its parameters and gradients: 2 bytes each, as measured (4P read
    # twice the bytes the model holds)
    result = invoke("memory", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
                    "--num-heads", "4", "--num-layers", "2", "--seq", "16", "--batch", "2",
                    "--warmup", "0", "--iters", "1", "--model", "my_models.bf16:Bf16LM",
                    "--optimizer", "adamw,torch-adamw", "--db", db)
    assert result.exit_code == 0, result.output
    rows = query(db, "SELECT optimizer, params, param_bytes, grad_bytes, optim_bytes, "
                     "before_opt_params_bytes, after_opt_opt_state_bytes FROM memory_runs")
    for row in rows:
        assert row["param_bytes"] == row["grad_bytes"] == 2 * row["params"]
        assert row["param_bytes"] == row["before_opt_params_bytes"]
        # ours keeps fp32 moments, torch's the parameter's bf16: as held
        assert row["optim_bytes"] == {"adamw": 8, "torch-adamw": 4}[row["optimizer"]] * \
            row["params"] == row["after_opt_opt_state_bytes"], row


def test_profile_says_where_your_models_attention_is_not_split(tmp_path, monkeypatch):
    """nsys_profile (e)'s QKᵀ, softmax and PV split needs the course's attention function in
    a module of the model's classes: where none is called, the command says so (the columns
    were left empty without a word); the course's model is split."""
    monkeypatch.chdir(course_repo(tmp_path, files={"my_models/__init__.py": "",
                                                   "my_models/lm.py": OTHER_MODEL}))
    db = tmp_path / "r.db"
    args = ["profile", "model", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
            "--num-heads", "4", "--num-layers", "2", "--seq", "16", "--batch", "2", "--mode",
            "forward", "--warmup", "0", "--iters", "1", "--device", "cpu", "--db", db]
    said = "no call of scaled_dot_product_attention was seen in the modules of your model's"
    result = invoke(*args, "--model", "my_models.lm:GeluLM")
    assert result.exit_code == 0 and said in result.output, result.output
    result = invoke(*args, "--model", "cs336_basics")
    assert result.exit_code == 0 and said not in result.output, result.output
    assert [r["qk"] is None for r in query(
        db, "SELECT qk_ms_mean AS qk FROM profile_runs ORDER BY created")] == [True, False]


def test_profile_says_your_attention_ran_fused_with_no_softmax_to_split_at(tmp_path,
                                                                         monkeypatch):
    """A scaled_dot_product_attention of yours that calls torch's fused one ran in every
    layer, but with no softmax op to split at: the command said it was never seen."""
    model = (EXAMPLE / "cs336-basics" / "cs336_basics" / "model.py").read_text()
    naive = model[model.index("    scores = q @ k"):model.index("@ v\n") + len("@ v\n")]
    fused = "    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)\n"
    monkeypatch.chdir(course_repo(tmp_path, files={
        "cs336-basics/cs336_basics/model.py": model.replace(naive, fused)}))
    db = tmp_path / "r.db"
    result = invoke("profile", "model", "--model", "cs336_basics", "--size", "tiny",
                    "--d-model", "32", "--d-ff", "64", "--num-heads", "4", "--num-layers", "2",
                    "--seq", "16", "--batch", "2", "--mode", "forward", "--warmup", "0",
                    "--iters", "1", "--device", "cpu", "--db", db)
    assert result.exit_code == 0, result.output
    assert "your scaled_dot_product_attention ran, but no softmax op ran inside it" in \
        result.output and "no call of" not in result.output, result.output
    (row,) = query(db, "SELECT qk_ms_mean, attention_calls FROM profile_runs")
    assert row["qk_ms_mean"] is None and row["attention_calls"] == 2  # a layer each


def test_memorys_analytic_gradients_and_state_leave_out_frozen_parameters(tmp_path,
                                                                         monkeypatch):
    """A parameter that takes no gradient has neither a gradient nor AdamW state: the
    analytic 4P and 8P counted it, above what the step held by inspection."""
    monkeypatch.chdir(course_repo(tmp_path, files={"my_models/__init__.py": "",
                                                   "my_models/lm.py": OTHER_MODEL}))
    db = tmp_path / "r.db"
    result = invoke("memory", "--size", "tiny", "--d-model", "32", "--d-ff", "64",
                    "--num-heads", "4", "--num-layers", "2", "--seq", "16", "--batch", "2",
                    "--warmup", "0", "--iters", "1", "--device", "cpu", "--model",
                    "my_models.lm:FrozenPositions", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT status, params, grad_bytes, optim_bytes, before_opt_grads_bytes, "
                   "after_opt_opt_state_bytes FROM memory_runs")
    assert row["status"] == "ok"
    assert row["grad_bytes"] == row["before_opt_grads_bytes"] < 4 * row["params"]
    assert row["optim_bytes"] == row["after_opt_opt_state_bytes"] == 2 * row["grad_bytes"]


def test_memory_residuals_finds_your_block_beside_a_list_of_one_or_refuses_first(tmp_path,
                                                                               monkeypatch):
    """Its block came from the model built with one layer, where a head kept in a list of one
    is a second candidate: an error row that spoke of --checkpoint, never given. The blocks
    are the list whose length follows the layer count (a final norm and head in a list of
    two do not); a model without a list of blocks is refused before anything runs, in one
    line naming the command."""
    monkeypatch.chdir(course_repo(tmp_path, files={"my_models/__init__.py": "",
                                                   "my_models/lm.py": OTHER_MODEL}))
    db = tmp_path / "r.db"
    shape = ["--size", "tiny", "--d-model", "32", "--d-ff", "64", "--num-heads", "4",
             "--seq", "16", "--batch", "2", "--no-compile", "--device", "cpu", "--db", db]
    result = invoke("memory", "residuals", *shape, "--model", "my_models.lm:HeadInAList")
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT status, saved_bytes FROM memory_residuals_runs")
    assert row["status"] == "ok" and row["saved_bytes"] > 0
    result = invoke("memory", "residuals", *shape, "--model", "my_models.lm:FlatLM")
    assert result.exit_code == 2, result.output
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("Error: memory residuals --model: measuring one block of FlatLM "
                           "(built with 2 layers) needs its 2 blocks in one nn.ModuleList"), line
    # a forward that calls its blocks' parts itself: refused before it runs too (it was an
    # error row and exit 1)
    parts = ("import torch\nfrom torch import nn\n\n\nclass PartsLM(nn.Module):\n"
             "    def __init__(self, vocab_size, d_model, num_layers, **_):\n"
             "        super().__init__()\n"
             "        self.emb, self.head = nn.Embedding(vocab_size, d_model), "
             "nn.Linear(d_model, vocab_size)\n"
             "        self.layers = nn.ModuleList(nn.ModuleDict({'ffn': nn.Linear(d_model, "
             "d_model)}) for _ in range(num_layers))\n\n"
             "    def forward(self, x):\n"
             "        h = self.emb(x)\n"
             "        for layer in self.layers:\n"
             "            h = h + layer['ffn'](h)\n"
             "        return self.head(h)\n")
    (pathlib.Path.cwd() / "my_models" / "parts.py").write_text(parts)
    result = invoke("memory", "residuals", *shape, "--model", "my_models.parts:PartsLM")
    assert result.exit_code == 2, result.output
    assert "PartsLM's forward did not call its first block's forward (it calls the block's " \
        "parts itself?)" in result.stderr, result.stderr
    assert len(query(db, "SELECT * FROM runs")) == 1


@pytest.mark.slow
def test_a_model_that_builds_bf16_weights_is_not_stored_as_fp32(tmp_path, monkeypatch):
    """The 2026 leaderboard's Config builds the model in bf16: `step` without --param-dtype
    stored its row as param_dtype fp32 (its MFU against the fp32 peak). It is an error that
    says which option to give; with --param-dtype bf16 it runs."""
    bf16 = ("import torch\n\nfrom cs336_basics.model import BasicsTransformerLM\n\n\n"
            "class Bf16(BasicsTransformerLM):\n"
            "    def __init__(self, *args, **kwargs):\n"
            "        super().__init__(*args, **kwargs)\n"
            "        self.to(torch.bfloat16)\n")
    repo = course_repo(tmp_path, files={"my_models/__init__.py": "",
                                        "my_models/bf16.py": bf16})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    args = ["step", *MICRO, "--seq", "16", "--model", "my_models.bf16:Bf16", "--switches",
            "none", "--warmup", "0", "--iters", "1", "--db", db]
    for extra, code in (([], 1), (["--param-dtype", "bf16"], 0)):  # 1: a point failed
        result = invoke(*args, *extra)
        assert result.exit_code == code, result.output
    rows = query(db, "SELECT status, error FROM step_runs ORDER BY created")
    assert [r["status"] for r in rows] == ["error", "ok"], rows
    assert rows[0]["error"].startswith(
        "ValueError: your model builds its weights in bfloat16, where this point's "
        "--param-dtype is fp32 (the default): give --param-dtype bf16"), rows[0]["error"]


def test_your_flashattention_at_a_size_the_handout_never_tests_is_not_judged(tmp_path,
                                                                            monkeypatch):
    """A FlashAttention that asserts whole tiles passes the course's tests; at seq 48 it was
    an `error` in `model` and `memory` (and `profile model`), where `attention` skips it:
    "We will always test your code with dimensions that are powers of 2 and at least 16"."""
    repo = course_repo(tmp_path)
    edit(repo, "cs336_systems/flash_attention.py", "        scale = 1.0 / math.sqrt(d)\n",
         "        assert n_q % 32 == 0, 'seq must be a multiple of the tile'\n"
         "        scale = 1.0 / math.sqrt(d)\n")
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    for command in ("model", "memory"):
        result = invoke(command, *micro(warmup=0, iters=1), "--seq", "48,64", "--attention",
                        "yours-torch", "--db", db)
        assert result.exit_code == 0, result.output
    rows = query(db, "SELECT experiment, status, error, settings FROM runs ORDER BY created")
    got = {(r["experiment"], json.loads(r["settings"])["seq"], r["status"]) for r in rows}
    assert got == {("model", 48, "skipped"), ("model", 64, "ok"),
                   ("memory", 48, "skipped"), ("memory", 64, "ok")}, rows
    assert rows[0]["error"] == (
        "not judged: the handout tests your FlashAttention only with dimensions that are "
        "powers of 2 and at least 16, so it need not handle seq 48; yours-torch raised "
        "AssertionError: seq must be a multiple of the tile")
    # its backward alone asserting: the check's gradient comparison read that as no
    # verdict, and the timed step stored an error
    edit(repo, "cs336_systems/flash_attention.py",
         "        assert n_q % 32 == 0, 'seq must be a multiple of the tile'\n", "")
    edit(repo, "cs336_systems/flash_attention.py",
         "        q, k, v, o, logsumexp = ctx.saved_tensors\n",
         "        q, k, v, o, logsumexp = ctx.saved_tensors\n"
         "        assert q.shape[-2] % 32 == 0, 'backward needs whole tiles'\n")
    result = invoke("step", *micro(warmup=0, iters=1), "--seq", "48", "--attention",
                    "yours-torch", "--switches", "none", "--db", db)
    assert result.exit_code == 0, result.output
    (row,) = query(db, "SELECT status, error FROM step_runs")
    assert row["status"] == "skipped" and row["error"].endswith(
        "yours-torch raised AssertionError: backward needs whole tiles"), row


def test_your_attention_of_the_wrong_shape_is_said_so_in_the_model(tmp_path, monkeypatch):
    """An attention returning O one column short failed deep in the model's reshape:
    "shape '[2, 16, 64]' is invalid for input of size 1920", the kernel never named."""
    repo = course_repo(tmp_path, files={
        "my_models/__init__.py": "",
        "my_models/short.py": "def attention(q, k, v, is_causal=False):\n"
                              "    return q[..., :-1]\n"})
    monkeypatch.chdir(repo)
    db = tmp_path / "r.db"
    result = invoke("model", *micro(warmup=0, iters=1), "--seq", "16", "--mode", "forward",
                    "--attention", "yours-short=my_models.short:attention", "--db", db)
    assert result.exit_code == 1, result.output
    (row,) = query(db, "SELECT status, error FROM model_runs")
    assert row["status"] == "error" and row["error"].startswith(
        "ValueError: yours-short returned O of shape (2, 4, 16, 15), expected (B, H, T, D) = "
        "(2, 4, 16, 16)"), row["error"]
