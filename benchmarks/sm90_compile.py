"""Compile every Triton kernel of cs336sys for sm_90 (H100) offline, without a GPU, and print
what the build says about each: registers, spills, shared memory, how wide its global loads
and stores are, and the Hopper instructions in it.

    python benchmarks/sm90_compile.py [--only attention,atomic-dq,forward,warp-specialize,
                                       adamw,ce] [--json]
                                      [--head-dims 64,128]   # atomic-dq's, warp-specialize's
                                      [--rotate N]   # atomic-dq: a variant per config;
                                                     # warp-specialize: a config per kernel
    PYTHONPATH=<a Triton 3.6 install> python benchmarks/sm90_compile.py   # the GPU hosts'

Each kernel is specialised as its launcher would be at a large shape (pointers and the
integer sizes Triton sees 16-byte aligned / divisible by 16 where the launch would make them
so), and compiled by Triton's CUDA backend for GPUTarget("cuda", 90, 32); `cuobjdump
-res-usage` (shipped with Triton) reads the cubin. No speed figure: registers and spills say
whether a config can run at full occupancy, and `ld/st 16B` whether a memory-bound kernel
moves 16 bytes per instruction (AdamW's multi-tensor kernel did not, before its
alignment hint moved onto the pointer). Needs no GPU; the tests use `compile_sm90`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cs336sys.attention import flash_triton_backward as attention_backward
from cs336sys.attention import flash_triton_kernels as attention
from cs336sys.models import adamw_kernels as adamw
from cs336sys.models import fused_ce_triton as ce

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
TARGET = GPUTarget("cuda", 90, 32)


@dataclass
class Build:
    registers: int
    stack: int  # bytes of spilled registers per thread
    shared: int  # bytes of shared memory
    wide_loads: int  # ld.global.v4 in the PTX: 16 bytes per thread and instruction
    narrow_loads: int  # every other ld.global
    wide_stores: int
    narrow_stores: int
    tma_copies: int
    wgmma: int
    atomics: int  # red/atom.global instructions (the atomic dQ's additions)
    wide_atomics: int  # of which .v4: 16 bytes per thread and instruction
    tma_reductions: int  # cp.reduce.async.bulk.tensor (the atomic dQ's TMA additions)
    warps: int  # as launched: more than asked where Triton split the kernel into warp groups
    setmaxnreg: int  # register moves between warp groups (setmaxnreg): a split kernel has them

    def __str__(self) -> str:
        return (f"REG {self.registers} STACK {self.stack} | smem {self.shared} B | "
                f"ld 16B {self.wide_loads}/{self.wide_loads + self.narrow_loads}, "
                f"st 16B {self.wide_stores}/{self.wide_stores + self.narrow_stores} | "
                f"{self.tma_copies} TMA copies, {self.wgmma} wgmma, {self.atomics} atomics, "
                f"{self.tma_reductions} TMA reductions | {self.warps} warps"
                + (f", {self.setmaxnreg} setmaxnreg" if self.setmaxnreg else ""))


def compile_sm90(kernel, types: dict[str, str], constexprs: dict, aligned: set[str],
                 warps: int, stages: int = 3) -> Build:
    """Compile `kernel` for sm_90. types: argument -> Triton type ("*bf16", "i32", "fp32")
    for every argument that is not in constexprs; aligned: the arguments a launch would see
    16-byte aligned (pointers) or divisible by 16 (integers)."""
    signature = {n: "constexpr" if n in constexprs else types[n] for n in kernel.arg_names}
    hints = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
             if n in aligned}
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, hints), target=TARGET,
                              options={"num_warps": warps, "num_stages": stages})
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        usage = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True,
                               text=True, check=True).stdout
    resources = dict(re.findall(r"(REG|STACK):(\d+)", usage))
    ptx = compiled.asm["ptx"]
    loads, stores = re.findall(r"ld\.global(\S*)", ptx), re.findall(r"st\.global(\S*)", ptx)
    return Build(
        registers=int(resources.get("REG", 0)), stack=int(resources.get("STACK", 0)),
        shared=compiled.metadata.shared,
        wide_loads=sum(".v4" in x for x in loads), narrow_loads=sum(".v4" not in x for x in loads),
        wide_stores=sum(".v4" in x for x in stores),
        narrow_stores=sum(".v4" not in x for x in stores),
        tma_copies=ptx.count("cp.async.bulk.tensor"), wgmma=ptx.count("wgmma.mma_async"),
        atomics=len(re.findall(r"\b(?:red|atom)\.global", ptx)),
        wide_atomics=len(re.findall(r"\b(?:red|atom)\.global\S*\.v4\.", ptx)),
        tma_reductions=ptx.count("cp.reduce.async.bulk.tensor"),
        warps=compiled.metadata.num_warps, setmaxnreg=ptx.count("setmaxnreg"),
    )


# --------------------------------------------------------------------------------------------
# FlashAttention-2: each kernel's pointer and TMA builds (constexpr TMA), configs the tile
# pruner keeps.

BF16, FP32 = "*bf16", "*fp32"
ATTENTION_KERNELS = {
    "fwd": attention._attn_fwd_kernel,
    "dkdv": attention_backward._attn_bwd_dkdv_kernel,
    "dq": attention_backward._attn_bwd_dq_kernel,
    "dkdv+dq": attention_backward._attn_bwd_dkdv_kernel,  # ATOMIC_DQ (opt-in)
}
VARIANTS = (("pointer", False), ("tma", True))  # label, TMA
FWD, DQ = [BF16] * 4 + [FP32], [BF16] * 5 + [FP32] * 2 + [BF16]
DKDV, DKDV_DQ = [BF16] * 4 + [FP32] * 2 + [BF16] * 3, [BF16] * 4 + [FP32] * 2 + [BF16] * 2 + [FP32]
# (kernel, pointer types, constexprs, warps, stages)
ATTENTION_CASES = [
    ("fwd", FWD, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=128, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("fwd", FWD, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=128, K_TILE=64, IS_CAUSAL=True), 8, 3),
    ("fwd", FWD, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=256, K_TILE=64, IS_CAUSAL=True), 8, 2),
    ("fwd", FWD, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=128, K_TILE=64, IS_CAUSAL=True), 8, 3),
    ("fwd", FWD, dict(HEAD_DIM=80, BLOCK_D=128, Q_TILE=128, K_TILE=64, IS_CAUSAL=False), 8, 3),
    ("dkdv", DKDV, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=64, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("dkdv", DKDV, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=32, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("dq", DQ, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=128, K_TILE=64, IS_CAUSAL=True), 8, 2),
    ("dq", DQ, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=128, K_TILE=32, IS_CAUSAL=True), 8, 2),
    ("dkdv+dq", DKDV_DQ, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=64, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("dkdv+dq", DKDV_DQ, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=64, K_TILE=64, IS_CAUSAL=True), 8, 3),
    ("dkdv+dq", DKDV_DQ, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=32, K_TILE=64, IS_CAUSAL=True), 8, 2),
    ("dkdv+dq", DKDV_DQ, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=16, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("fwd", [FP32] * 5, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=32, K_TILE=32, IS_CAUSAL=True), 4, 2),
    ("dkdv", [FP32] * 9, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=16, K_TILE=16, IS_CAUSAL=False), 4, 2),
]
ATTENTION_SCALARS = ("qk_scale", "sm_scale")


def attention_builds():
    """(label, Build or exception) per attention config and kernel variant."""
    for name, pointers, constexprs, warps, stages in ATTENTION_CASES:
        precision = "ieee" if pointers[0] == FP32 else "tf32"
        c = {**constexprs, "PRECISION": precision, "UPCAST_DOT": False, "ROUND_BF16": False}
        if name == "dkdv+dq":
            c["ATOMIC_DQ"] = True
        for variant, tma in VARIANTS:
            label = (f"{variant:7s} {name:7s} {pointers[0]} d{c['HEAD_DIM']} "
                     f"{c['Q_TILE']}x{c['K_TILE']} w{warps} s{stages} causal={c['IS_CAUSAL']}")
            yield label, _attention(ATTENTION_KERNELS[name], pointers, {**c, "TMA": tma}, warps,
                                    stages)


# The kernels' opt-in constexprs, off in a build that does not set them.
OPT_INS = ("HEAVY_FIRST", "LAZY_RESCALE", "WARP_SPECIALIZE", "ATOMIC_DQ", "DQ_TMA")


def _attention(kernel, pointers: list[str], constexprs: dict, warps: int, stages: int):
    """An attention kernel's build (or the exception): its tensors typed by `pointers` in
    order, then float32 scales and int32 strides and sizes, all but the scales aligned; the
    opt-ins it takes and `constexprs` does not set, off."""
    constexprs = {**{n: False for n in OPT_INS if n in kernel.arg_names}, **constexprs}
    args = [n for n in kernel.arg_names if n not in constexprs]
    types = {n: (pointers[i] if i < len(pointers) else "fp32" if n in ATTENTION_SCALARS else "i32")
             for i, n in enumerate(args)}
    aligned = {n for n in args if n not in ATTENTION_SCALARS}
    return _try(kernel, types, constexprs, aligned, warps, stages)


def atomic_dq_builds(head_dims=(64, 128), rotate: int | None = None):
    """The dK/dV kernels with ATOMIC_DQ at every 16-bit config their pruner keeps (bf16,
    causal, long sequences), pointer and TMA variants, the TMA one with pointer atomics and
    with TMA reductions (DQ_TMA): the list is meant to be spill-free. With `rotate`, each
    config in one variant only, the n-th config in variant (n + rotate) mod 3: every config
    and every variant compiles, a third of the builds, the pairs changing with `rotate`."""
    from cs336sys.attention import flash_triton_tuning as tuning

    variants = (*((v, t, False) for v, t in VARIANTS), ("tma-reduce", True, True))
    n = 0
    for d in head_dims:
        for cfg in tuning.kept_configs("dkdv_atomic", tuning.call_args(d, 16384)):
            tiles = cfg.kwargs
            c = dict(HEAD_DIM=d, BLOCK_D=d, IS_CAUSAL=True, PRECISION="tf32", UPCAST_DOT=False,
                     ROUND_BF16=False, ATOMIC_DQ=True, **tiles)
            chosen = variants if rotate is None else (variants[(n + rotate) % len(variants)],)
            n += 1
            for variant, tma, dq_tma in chosen:
                label = (f"{variant} d{d} {tiles['Q_TILE']}x{tiles['K_TILE']} w{cfg.num_warps} "
                         f"s{cfg.num_stages}")
                yield label, _attention(ATTENTION_KERNELS["dkdv+dq"], DKDV_DQ,
                                        {**c, "TMA": tma, "DQ_TMA": dq_tma},
                                        cfg.num_warps, cfg.num_stages)


def forward_opt_in_builds():
    """The 16-bit forward's TMA build at each of its sampled configs, default and with each
    forward opt-in (heavy-first, lazy-rescale), side by side."""
    for name, pointers, constexprs, warps, stages in ATTENTION_CASES:
        if name != "fwd" or pointers[0] != BF16:
            continue
        c = {**constexprs, "PRECISION": "tf32", "UPCAST_DOT": False, "ROUND_BF16": False,
             "TMA": True}
        for label, heavy, lazy in (("default", False, False), ("heavy-first", True, False),
                                   ("lazy-rescale", False, True)):
            yield (f"{label:12s} d{c['HEAD_DIM']} {c['Q_TILE']}x{c['K_TILE']} w{warps} "
                   f"s{stages} causal={c['IS_CAUSAL']}",
                   _attention(ATTENTION_KERNELS["fwd"], pointers,
                              {**c, "HEAVY_FIRST": heavy and c["IS_CAUSAL"], "LAZY_RESCALE": lazy},
                              warps, stages))


def warp_specialize_builds(head_dims=(64, 128), rotate: int | None = None):
    """The warp-specialised kernels (WARP_SPECIALIZE, TMA build: forward, dK/dV) at every
    config their pruners keep (bf16, causal, long sequences): meant to split into warp groups
    (more warps than asked, setmaxnreg) without a spill. With `rotate`, one config of each
    kernel and head dim, the n-th kept one for n = rotate (modulo their number)."""
    from cs336sys.attention import flash_triton_tuning as tuning

    for name, pointers in (("fwd", FWD), ("dkdv", DKDV)):
        for d in head_dims:
            kept = list(tuning.kept_configs(f"{name}_ws_tma", tuning.call_args(d, 16384)))
            for cfg in kept if rotate is None else kept[rotate % len(kept):][:1]:
                tiles = cfg.kwargs
                c = dict(HEAD_DIM=d, BLOCK_D=d, IS_CAUSAL=True, PRECISION="tf32",
                         UPCAST_DOT=False, ROUND_BF16=False, TMA=True, WARP_SPECIALIZE=True,
                         **tiles)
                yield (f"ws {name} d{d} {tiles['Q_TILE']}x{tiles['K_TILE']} w{cfg.num_warps} "
                       f"s{cfg.num_stages}",
                       _attention(ATTENTION_KERNELS[name], pointers, c, cfg.num_warps,
                                  cfg.num_stages))


# --------------------------------------------------------------------------------------------
# AdamW (models/adamw_kernels.py) and the cross-entropy step (models/fused_ce_triton.py).

ADAMW_SCALARS = ("decay", "one_minus_beta1", "beta2", "one_minus_beta2",
                 "bias_correction2_sqrt", "eps", "neg_step_size")
PARAM_TYPES = {"fp32": ("*fp32", tl.float32), "bf16": ("*bf16", tl.bfloat16)}


def adamw_multi(param: str) -> Build:
    """The multi-tensor kernel as adamw_update_many launches it: tables of addresses."""
    kernel = adamw._adamw_multi_kernel
    types = {"addresses": "*i64", "numels": "*i64", "chunk_tensor": "*i32",
             "chunk_start": "*i64", "n_tensors": "i32", **dict.fromkeys(ADAMW_SCALARS, "fp32")}
    constexprs = dict(P_DTYPE=PARAM_TYPES[param][1], CHUNK_SIZE=adamw.CHUNK,
                      BLOCK_SIZE=adamw.BLOCK, LERP_SMALL=True, ROUND_BF16=False)
    aligned = {"addresses", "numels", "chunk_tensor", "chunk_start"}
    return compile_sm90(kernel, types, constexprs, aligned, adamw.NUM_WARPS)


def adamw_single(param: str) -> Build:
    """The one-tensor kernel, for a tensor whose element count is a multiple of 16."""
    kernel = adamw._adamw_kernel
    p = PARAM_TYPES[param][0]
    types = {"p_ptr": p, "g_ptr": p, "m_ptr": "*fp32", "v_ptr": "*fp32", "n_elements": "i64",
             **dict.fromkeys(ADAMW_SCALARS, "fp32")}
    constexprs = dict(BLOCK_SIZE=adamw.BLOCK, LERP_SMALL=True, ROUND_BF16=False)
    aligned = {"p_ptr", "g_ptr", "m_ptr", "v_ptr", "n_elements"}
    return compile_sm90(kernel, types, constexprs, aligned, adamw.NUM_WARPS)


def cross_entropy(dtype: str) -> Build:
    """The softmax/gradient step over a row of 151,936 logits, as launched on a GPU."""
    kernel = ce._softmax_ce_kernel
    types = {"logits_ptr": f"*{dtype}", "targets_ptr": "*i64", "loss_ptr": "*fp32",
             "scale_ptr": "*fp32", "stride_row": "i64", "n_cols": "i32", "ignore_index": "i32"}
    constexprs = dict(BLOCK_V=ce.GPU_BLOCK_V, WRITE_GRAD=True, ROUND_BF16=False)
    aligned = {"logits_ptr", "targets_ptr", "loss_ptr", "scale_ptr", "stride_row", "n_cols"}
    return compile_sm90(kernel, types, constexprs, aligned, ce.GPU_WARPS)


def _try(*args) -> Build | Exception:
    try:
        return compile_sm90(*args)
    except Exception as exc:  # a config that does not compile is a finding
        return exc


def _call(fn, arg) -> Build | Exception:
    try:
        return fn(arg)
    except Exception as exc:
        return exc


GROUPS = {
    "attention": attention_builds,
    "atomic-dq": atomic_dq_builds,
    "forward": forward_opt_in_builds,
    "warp-specialize": warp_specialize_builds,
    "adamw": lambda: ((f"{kind:6s} {p}", _call(fn, p)) for kind, fn in
                      (("multi", adamw_multi), ("single", adamw_single)) for p in PARAM_TYPES),
    "ce": lambda: ((f"softmax-ce {d}", _call(cross_entropy, d)) for d in ("bf16", "fp32")),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", default=",".join(GROUPS), help="comma list of " + ", ".join(GROUPS))
    parser.add_argument("--json", action="store_true", help="one JSON object per kernel build")
    parser.add_argument("--head-dims", default="64,128",
                        help="the atomic-dq and warp-specialize candidates' head dims")
    parser.add_argument("--rotate", type=int, default=None,
                        help="atomic-dq: each config in one variant, rotated by this number; "
                             "warp-specialize: one config of each kernel, the one this picks")
    args = parser.parse_args()
    groups = args.only.split(",")
    if not set(groups) <= set(GROUPS):
        print(f"Error: --only takes {', '.join(GROUPS)}, got {','.join(groups)!r}", file=sys.stderr)
        return 2
    try:
        head_dims = tuple(int(d) for d in args.head_dims.split(","))
    except ValueError:
        head_dims = ()
    if not head_dims or any(d not in (16, 32, 64, 128) for d in head_dims):
        print(f"Error: --head-dims takes 16, 32, 64 or 128, got {args.head_dims!r}", file=sys.stderr)
        return 2
    if not args.json:
        print(f"triton {triton.__version__}, sm_90")
    builds = {**GROUPS, "atomic-dq": lambda: atomic_dq_builds(head_dims, args.rotate),
              "warp-specialize": lambda: warp_specialize_builds(head_dims, args.rotate)}
    failed = 0
    for group in groups:
        for label, build in builds[group]():
            if args.json:
                fields = ({"error": str(build)} if isinstance(build, Exception)
                          else dataclasses.asdict(build))
                print(json.dumps({"group": group, "kernel": " ".join(label.split()), **fields}))
                failed += isinstance(build, Exception)
                continue
            if isinstance(build, Exception):
                failed += 1
                first = str(build).splitlines()[0][:200] if str(build) else ""
                build = f"FAILED: {type(build).__name__}: {first}"
            print(f"{group:9s} {label}: {build}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
