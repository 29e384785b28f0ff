"""The Transformer LM, its config, FLOP formula and AdamW, against independent references."""

from __future__ import annotations

import copy
import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch.utils.flop_counter import FlopCounterMode

import cs336sys
from cs336sys.attention.reference import naive_attention, sdpa_attention
from cs336sys.models import (
    PRESETS,
    AdamW,
    ModelConfig,
    TransformerLM,
    forward_flops,
    from_preset,
    param_count,
    step_flops,
)
from cs336sys.models.transformer import RMSNorm, RotaryEmbedding

SMALL = ModelConfig(
    d_model=64, d_ff=96, num_layers=2, num_heads=4, vocab_size=101, context_length=32
)


def make_model(config: ModelConfig = SMALL, seed: int = 0) -> TransformerLM:
    torch.manual_seed(seed)
    return TransformerLM(config)


def random_tokens(batch: int, length: int, vocab: int = SMALL.vocab_size, seed: int = 0):
    return torch.randint(vocab, (batch, length), generator=torch.Generator().manual_seed(seed))


# --- model behaviour -------------------------------------------------------------------------


@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_future_tokens_do_not_change_past_logits(attention):
    model = make_model(dataclasses.replace(SMALL, attention=attention)).eval()
    tokens = random_tokens(2, 20)
    t = 11
    changed = tokens.clone()
    changed[:, t + 1 :] = (changed[:, t + 1 :] + 1) % SMALL.vocab_size
    with torch.no_grad():
        before, after = model(tokens), model(changed)
    assert before.shape == (2, 20, SMALL.vocab_size)
    torch.testing.assert_close(after[:, : t + 1], before[:, : t + 1], rtol=0, atol=1e-6)
    # ...and the test can fail: the changed positions do see the new tokens.
    assert (after[:, t + 1 :] - before[:, t + 1 :]).abs().max() > 1e-2


def test_batched_positions_equal_shared_positions():
    model = make_model().eval()
    tokens = random_tokens(3, 16)
    shared = torch.arange(16)
    with torch.no_grad():
        torch.testing.assert_close(model(tokens, shared.expand(3, 16)), model(tokens, shared))
        # Positions matter: shifting them changes the logits.
        assert not torch.allclose(model(tokens, shared + 5), model(tokens, shared))


def test_sequence_longer_than_context_is_rejected():
    with pytest.raises(ValueError, match="context_length=32"):
        make_model()(random_tokens(1, 33))


def test_naive_and_sdpa_models_agree():
    naive = make_model(dataclasses.replace(SMALL, attention="naive")).eval()
    sdpa = make_model(dataclasses.replace(SMALL, attention="sdpa")).eval()
    sdpa.load_state_dict(naive.state_dict())
    tokens = random_tokens(2, 24)
    with torch.no_grad():
        torch.testing.assert_close(sdpa(tokens), naive(tokens), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("is_causal", [True, False])
def test_naive_and_sdpa_attention_agree_in_float32(is_causal):
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(2, 4, 24, 16, generator=g) for _ in range(3))
    torch.testing.assert_close(
        naive_attention(q, k, v, is_causal=is_causal),
        sdpa_attention(q, k, v, is_causal=is_causal),
        rtol=1e-5,
        atol=1e-5,
    )


# --- RoPE and RMSNorm ------------------------------------------------------------------------


def rotation_matrix(position: int, d: int, theta: float) -> torch.Tensor:
    """Block-diagonal RoPE rotation R(p) in float64 (Su et al. 2021, eq. 15)."""
    r = torch.zeros(d, d, dtype=torch.float64)
    for i in range(d // 2):
        angle = torch.tensor(position * theta ** (-2 * i / d), dtype=torch.float64)
        c, s = torch.cos(angle), torch.sin(angle)
        r[2 * i, 2 * i], r[2 * i, 2 * i + 1] = c, -s
        r[2 * i + 1, 2 * i], r[2 * i + 1, 2 * i + 1] = s, c
    return r


def test_rope_matches_explicit_rotation_matrices():
    d, theta = 8, 10_000.0
    rope = RotaryEmbedding(d, max_seq_len=64, theta=theta)
    x = torch.randn(5, d, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    positions = torch.tensor([0, 1, 7, 30, 63])
    want = torch.stack([rotation_matrix(int(p), d, theta) @ x[i] for i, p in enumerate(positions)])
    # The tables are stored in float32 (as in LLaMA / gpt-fast), hence ~1e-7 relative error.
    torch.testing.assert_close(rope(x, positions), want, rtol=1e-6, atol=1e-6)


def test_rope_scores_depend_only_on_relative_position():
    d = 16
    rope = RotaryEmbedding(d, max_seq_len=128, theta=10_000.0)
    g = torch.Generator().manual_seed(0)
    q, k = (
        torch.randn(d, dtype=torch.float64, generator=g),
        torch.randn(d, dtype=torch.float64, generator=g),
    )

    def score(m: int, n: int) -> torch.Tensor:
        rq = rope(q[None], torch.tensor([m]))[0]
        rk = rope(k[None], torch.tensor([n]))[0]
        return rq @ rk

    for m, n in [(3, 1), (10, 10), (2, 9)]:
        for shift in (1, 17, 60):
            # float32 tables: each cos/sin is off by <= 6e-8, so scores of size ~d agree to ~1e-6.
            torch.testing.assert_close(score(m + shift, n + shift), score(m, n), rtol=0, atol=1e-5)
    assert not torch.isclose(score(3, 1), score(1, 3), atol=1e-3)  # not rotation-invariant


def test_rope_tables_stay_float32_when_model_is_cast():
    model = make_model().to(torch.bfloat16)
    rope = model.layers[0].attn.rope
    assert rope.cos.dtype == torch.float32
    torch.testing.assert_close(rope.cos, RotaryEmbedding(16, 32).cos, rtol=0, atol=0)
    assert model(random_tokens(1, 8)).dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rmsnorm_matches_float64_formula(dtype):
    g = torch.Generator().manual_seed(0)
    norm = RMSNorm(32, eps=1e-5)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32, generator=g))
    x = (3 * torch.randn(4, 7, 32, generator=g)).to(dtype)
    x64, w64 = x.double(), norm.weight.double()
    want = x64 / torch.sqrt((x64 * x64).mean(-1, keepdim=True) + 1e-5) * w64
    out = norm(x)
    assert out.dtype == dtype
    tol = 1e-6 if dtype == torch.float32 else 1e-2  # bf16 output: one rounding, 2^-8 relative
    torch.testing.assert_close(out.double(), want, rtol=tol, atol=tol)


# --- config, parameter count, FLOPs ----------------------------------------------------------


@pytest.mark.parametrize("size", list(PRESETS))
def test_param_count_matches_real_model(size):
    config = from_preset(size, vocab_size=1000, context_length=64)
    with torch.device("meta"):  # shapes only, so even 10B builds instantly
        model = TransformerLM(config)
    assert param_count(config) == sum(p.numel() for p in model.parameters())


def test_param_count_of_small_model_on_cpu():
    assert param_count(SMALL) == sum(p.numel() for p in make_model().parameters())
    # Hand-computed: 2*101*64 + 2*(4*64*64 + 3*64*96 + 2*64) + 64
    assert param_count(SMALL) == 12928 + 2 * (16384 + 18432 + 128) + 64


def test_presets_and_overrides():
    small = from_preset("small")
    assert (small.d_model, small.d_ff, small.num_layers, small.num_heads) == (768, 3072, 12, 12)
    assert small.d_head == 64 and small.vocab_size == 10_000 and small.context_length == 512
    # None means "not given": the preset value stays.
    assert from_preset("small", d_model=None, context_length=128).d_model == 768
    assert from_preset("small", d_model=None, context_length=128).context_length == 128
    assert from_preset("xl", attention="sdpa").attention == "sdpa"
    # the maximum context length is a limit of the config, raised by a library user at will
    assert from_preset("tiny", context_length=65_536).context_length == 65_536
    with pytest.raises(ValueError, match="above the model's maximum context length 65536"):
        from_preset("tiny", context_length=65_537)
    assert from_preset("tiny", context_length=10**5, max_context_length=10**5).context_length == 10**5


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: from_preset("foo"), r"unknown size 'foo'; choose from tiny, small, medium"),
        (lambda: from_preset("small", num_heads=5), r"d_model=768 .* num_heads=5"),
        (
            lambda: from_preset("small", attention="nope"),
            r"unknown attention 'nope'; choose from naive, sdpa",
        ),
        (
            lambda: ModelConfig(60, 96, 2, 4).validate(),
            r"d_head = d_model / num_heads = 15 must be even",
        ),
        (lambda: ModelConfig(64, 96, 0, 4).validate(), r"num_layers must be a positive integer"),
        (lambda: ModelConfig(64, -1, 2, 4).validate(), r"d_ff must be a positive integer"),
        (lambda: TransformerLM(ModelConfig(60, 96, 2, 8)), r"d_model=60 .* num_heads=8"),
    ],
)
def test_invalid_configs_are_rejected(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_unknown_override_field_is_a_type_error():
    with pytest.raises(TypeError, match="d_modle"):
        from_preset("small", d_modle=5)


@pytest.mark.parametrize("batch, length", [(2, 16), (1, 32)])
def test_forward_flops_match_flop_counter(batch, length):
    # FlopCounterMode counts matmuls (mm/bmm) only, as the PaLM formula does: the embedding
    # lookup, norms, RoPE, softmax and SiLU contribute nothing to either side.
    model = make_model()
    tokens = random_tokens(batch, length)
    with FlopCounterMode(display=False) as forward_counter:
        logits = model(tokens)
    assert forward_counter.get_total_flops() == forward_flops(SMALL, batch, length)

    with FlopCounterMode(display=False) as step_counter:
        loss = F.cross_entropy(model(tokens).flatten(0, 1), tokens.flatten())
        loss.backward()
    # Exactly 3x: every matmul's backward is two matmuls of the same size, including the very
    # first projections, whose input gradient is needed for the embedding table.
    assert step_counter.get_total_flops() == step_flops(SMALL, batch, length, "forward-backward")
    assert step_flops(SMALL, batch, length, "forward-backward") == 3 * forward_flops(
        SMALL, batch, length
    )
    assert logits.shape == (batch, length, SMALL.vocab_size)


def test_forward_flops_hand_computed_and_modes():
    cfg = ModelConfig(d_model=4, d_ff=6, num_layers=1, num_heads=2, vocab_size=10)
    # B*T*(L*(8*16 + 6*24) + 2*4*10) + L*B*H*(2*T*T*2)*2 with B=1, T=3
    assert forward_flops(cfg, 1, 3) == 3 * (128 + 144 + 80) + 2 * (2 * 9 * 2) * 2
    assert step_flops(cfg, 1, 3, "forward") == forward_flops(cfg, 1, 3)
    assert step_flops(cfg, 1, 3, "train") == 3 * forward_flops(cfg, 1, 3)
    with pytest.raises(ValueError, match="unknown mode"):
        step_flops(cfg, 1, 3, "backward")


# --- AdamW -----------------------------------------------------------------------------------


def train(model, optimizer, steps=10):
    for step in range(steps):
        tokens = random_tokens(4, 16, seed=100 + step)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(tokens[:, :-1]).flatten(0, 1), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()


def param_groups(model, lr_decay, lr_no_decay):
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    return [
        {"params": decay, "lr": lr_decay, "weight_decay": 0.1},
        {"params": no_decay, "lr": lr_no_decay, "weight_decay": 0.0},
    ]


@pytest.mark.parametrize("grouped", [False, True], ids=["one-group", "two-groups"])
def test_adamw_matches_torch(grouped):
    ours_model = make_model()
    torch_model = copy.deepcopy(ours_model)
    initial = copy.deepcopy(ours_model.state_dict())
    if grouped:
        ours = AdamW(param_groups(ours_model, 3e-3, 1e-2), betas=(0.9, 0.95))
        theirs = torch.optim.AdamW(param_groups(torch_model, 3e-3, 1e-2), betas=(0.9, 0.95))
    else:
        ours = AdamW(ours_model.parameters(), lr=3e-3, weight_decay=0.1)
        theirs = torch.optim.AdamW(torch_model.parameters(), lr=3e-3, weight_decay=0.1)
    train(ours_model, ours)
    train(torch_model, theirs)

    for (name, p_ours), p_torch in zip(
        ours_model.named_parameters(), torch_model.parameters(), strict=True
    ):
        assert (p_ours - p_torch).abs().max() <= 1e-6, name
        assert (p_ours - initial[name]).abs().max() > 1e-3, f"{name} did not move"
    state = ours.state[ours_model.lm_head.weight]
    assert state["step"] == 10 and set(state) == {"step", "exp_avg", "exp_avg_sq"}


def test_adamw_weight_decay_is_decoupled():
    # With a zero gradient Adam's update is 0, so only the decay acts: p *= 1 - lr*wd.
    p = torch.nn.Parameter(torch.ones(3))
    p.grad = torch.zeros(3)
    AdamW([p], lr=0.1, weight_decay=0.5).step()
    torch.testing.assert_close(p.detach(), torch.full((3,), 0.95))


def test_adamw_closure_and_validation():
    p = torch.nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = AdamW([p], lr=0.1, weight_decay=0.0)

    def closure():
        optimizer.zero_grad()
        loss = (p**2).sum()
        loss.backward()
        return loss

    assert optimizer.step(closure).item() == 5.0
    # First Adam step moves each coordinate by lr against the sign of its gradient.
    torch.testing.assert_close(p.detach(), torch.tensor([0.9, -1.9]))
    for bad in (
        {"lr": -1.0},
        {"betas": (1.0, 0.9)},
        {"betas": (0.9, -0.1)},
        {"eps": -1e-8},
        {"weight_decay": -0.1},
    ):
        with pytest.raises(ValueError):
            AdamW([p], **bad)


# --- import hygiene --------------------------------------------------------------------------


def test_config_modules_do_not_import_torch():
    code = (
        "import sys, cs336sys.models, cs336sys.models.config, cs336sys.models.flops, "
        "cs336sys.attention, cs336sys.attention.registry\n"
        "cs336sys.models.from_preset('small')\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    # Run from wherever this checkout's cs336sys lives, installed or not.
    root = str(Path(cs336sys.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_nvtx_ranges_are_a_no_op_switch_on_cpu():
    from cs336sys.measure.nvtx import _NVTX_ENABLED, nvtx_enabled, nvtx_range

    model = make_model().eval()
    tokens = random_tokens(1, 8)
    with torch.no_grad():
        expected = model(tokens)
        with nvtx_enabled(True):
            assert _NVTX_ENABLED.get() is True
            torch.testing.assert_close(model(tokens), expected, rtol=0, atol=0)
            with nvtx_enabled(False), nvtx_range("inner"):
                assert _NVTX_ENABLED.get() is False
            assert _NVTX_ENABLED.get() is True
    assert _NVTX_ENABLED.get() is False


@pytest.mark.parametrize("spec", ["every:1", "every:2", "sqrt", "every:3", "groups:2,1", "groups:1,2"])
def test_checkpointing_keeps_gradients_and_saves_memory(spec):
    """Checkpointed groups of blocks: identical gradients (float64), far fewer saved bytes."""
    import dataclasses

    from cs336sys.measure.memory import saved_tensor_bytes
    from cs336sys.models.config import ModelConfig

    base = ModelConfig(d_model=64, d_ff=128, num_layers=3, num_heads=4, vocab_size=256,
                       context_length=32)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    grads, saved = {}, {}
    for ck in ("none", spec):
        torch.manual_seed(0)
        m = TransformerLM(dataclasses.replace(base, checkpoint=ck)).double()
        loss, saved[ck] = saved_tensor_bytes(lambda m=m: m(x).logsumexp(-1).mean())
        loss.backward()
        grads[ck] = [p.grad for p in m.parameters()]
    for a, b in zip(grads["none"], grads[spec], strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert saved["none"] >= 2 * saved[spec]


@pytest.mark.parametrize(
    "spec, layers, want",
    [("none", 12, None), ("every:1", 12, 1), ("every:4", 12, 4), ("sqrt", 12, 3), ("sqrt", 48, 7),
     ("sqrt", 2, 1)],
)
def test_checkpoint_group_sizes(spec, layers, want):
    from cs336sys.models.config import checkpoint_group

    assert checkpoint_group(spec, layers) == want


@pytest.mark.parametrize(
    "spec",
    ["every:0", "every:13", "every", "all", "every:-1", "groups:", "groups:6,5", "groups:6,6,1",
     "groups:12,0", "groups:a,b", "groups:6,-6,12",
     # digits to str.isdigit: ² fails int() without naming the option, ٢ and ６ were taken
     "every:²", "every:٢", "groups:６,６"],
)
def test_checkpoint_specs_refused(spec):
    from cs336sys.models.config import checkpoint_group, checkpoint_groups

    with pytest.raises(ValueError):
        checkpoint_group(spec, 12)
    with pytest.raises(ValueError):
        checkpoint_groups(spec, 12)


@pytest.mark.parametrize(
    "spec, layers, want",
    [("none", 12, None), ("every:4", 12, [4, 4, 4]), ("every:5", 12, [5, 5, 2]),
     ("sqrt", 34, [6, 6, 6, 6, 6, 4]), ("groups:14,14,6", 34, [14, 14, 6]), ("groups:34", 34, [34])],
)
def test_checkpoint_groups_uneven(spec, layers, want):
    """Each group's block count in order; the largest one is `checkpoint_group`'s K."""
    from cs336sys.models.config import checkpoint_group, checkpoint_groups

    assert checkpoint_groups(spec, layers) == want
    assert checkpoint_group(spec, layers) == (max(want) if want else None)


def test_checkpoint_list_keeps_group_counts_together():
    from cs336sys.sweep.points import checkpoint_list

    assert checkpoint_list(["none,groups:14,14,6", "sqrt"]) == ["none", "groups:14,14,6", "sqrt"]
    assert checkpoint_list(["groups:1,1,groups:2"]) == ["groups:1,1", "groups:2"]
    assert checkpoint_list(None) == ["none"]


def test_adamw_takes_torchs_implementation_switches_and_steps_alike():
    """A sharded optimizer that builds its inner one with foreach=True (torch's AdamW, which
    the course's test uses, takes it) failed on ours: "unexpected keyword argument"."""
    torch.manual_seed(0)
    start = torch.randn(4, 3)
    moved = []
    for kwargs in ({}, {"foreach": True}, {"fused": False}):
        p = torch.nn.Parameter(start.clone())
        optimizer = AdamW([p], lr=0.1, **kwargs)
        p.grad = torch.ones_like(p)
        optimizer.step()
        moved.append(p.detach().clone())
    assert all(torch.equal(m, moved[0]) for m in moved)
