"""Compile the pointer and TMA FlashAttention kernels for sm_90 (H100) offline, without a GPU,
and print each config's registers, spills and shared memory (issue 15: what README's
register figures for the Hopper path come from).

    python benchmarks/attention_sm90_compile.py
    PYTHONPATH=<a Triton 3.6 install> python benchmarks/attention_sm90_compile.py   # GPU hosts'

Each kernel is specialised as the launchers would at the leaderboard shape (pointers 16-byte
aligned, strides and sizes multiples of 16) and compiled by Triton's CUDA backend for
GPUTarget("cuda", 90, 32); `cuobjdump -res-usage` (shipped with Triton) reads the cubin.
No speed figure: registers and spills only say whether a config can run at full occupancy.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from cs336sys.attention import flash_triton_kernels as pointer
from cs336sys.attention import flash_triton_tma as tma

CUOBJDUMP = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
TARGET = GPUTarget("cuda", 90, 32)
BF16, FP32 = "*bf16", "*fp32"
KERNELS = {  # name -> (pointer kernel, TMA kernel)
    "fwd": ("_attn_fwd_kernel", "_attn_fwd_tma_kernel"),
    "dkdv": ("_attn_bwd_dkdv_kernel", "_attn_bwd_dkdv_tma_kernel"),
    "dq": ("_attn_bwd_dq_kernel", "_attn_bwd_dq_tma_kernel"),
}
FWD, DKDV, DQ = [BF16] * 4 + [FP32], [BF16] * 4 + [FP32] * 2 + [BF16] * 2, [BF16] * 4 + [FP32] * 2 + [BF16]
# (kernel, pointer types, constexprs, warps, stages): configs the tile pruner keeps.
CASES = [
    ("fwd", FWD, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=128, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("fwd", FWD, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=128, K_TILE=64, IS_CAUSAL=True), 8, 3),
    ("fwd", FWD, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=128, K_TILE=64, IS_CAUSAL=True), 8, 3),
    ("fwd", FWD, dict(HEAD_DIM=80, BLOCK_D=128, Q_TILE=128, K_TILE=64, IS_CAUSAL=False), 8, 3),
    ("dkdv", DKDV, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=64, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("dkdv", DKDV, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=32, K_TILE=128, IS_CAUSAL=True), 8, 2),
    ("dq", DQ, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=128, K_TILE=64, IS_CAUSAL=True), 8, 2),
    ("dq", DQ, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=128, K_TILE=32, IS_CAUSAL=True), 8, 2),
    ("fwd", [FP32] * 5, dict(HEAD_DIM=64, BLOCK_D=64, Q_TILE=32, K_TILE=32, IS_CAUSAL=True), 4, 2),
    ("dkdv", [FP32] * 8, dict(HEAD_DIM=128, BLOCK_D=128, Q_TILE=16, K_TILE=16, IS_CAUSAL=False), 4, 2),
]  # fmt: skip
SCALARS = ("qk_scale", "sm_scale")


def usage(kernel, pointers: list[str], constexprs: dict, warps: int, stages: int) -> str:
    """'REG:.. STACK:.. SHARED:..' of the kernel compiled for sm_90, with its smem and the
    TMA copies and wgmma instructions in its PTX."""
    signature = {}
    for i, name in enumerate(kernel.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif i < len(pointers):
            signature[name] = pointers[i]
        else:
            signature[name] = "fp32" if name in SCALARS else "i32"
    aligned = {(i,): [["tt.divisibility", 16]] for i, n in enumerate(kernel.arg_names)
               if n not in constexprs and n not in SCALARS}  # fmt: skip
    compiled = triton.compile(ASTSource(kernel, signature, constexprs, aligned), target=TARGET,
                              options={"num_warps": warps, "num_stages": stages})  # fmt: skip
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        out = subprocess.run([CUOBJDUMP, "-res-usage", f.name], capture_output=True, text=True)
    regs = " ".join(line.strip() for line in out.stdout.splitlines() if "REG" in line)
    ptx = compiled.asm["ptx"]
    return (f"{regs} | smem {compiled.metadata.shared} B | "
            f"{ptx.count('cp.async.bulk.tensor')} TMA copies, {ptx.count('wgmma.mma_async')} wgmma")  # fmt: skip


def main() -> int:
    print(f"triton {triton.__version__}, sm_90")
    failed = 0
    for name, pointers, constexprs, warps, stages in CASES:
        precision = "ieee" if pointers[0] == FP32 else "tf32"
        c = {**constexprs, "PRECISION": precision, "UPCAST_DOT": False, "ROUND_BF16": False}
        for label, module, kernel in (("pointer", pointer, KERNELS[name][0]),
                                      ("tma", tma, KERNELS[name][1])):  # fmt: skip
            try:
                result = usage(getattr(module, kernel), pointers, c, warps, stages)
            except Exception as exc:  # noqa: BLE001 (a config that does not compile is a finding)
                failed += 1
                result = f"FAILED: {type(exc).__name__}: {str(exc).splitlines()[0][:200] if str(exc) else ''}"
            print(f"{label:7s} {name:4s} {pointers[0]} d{c['HEAD_DIM']} {c['Q_TILE']}x{c['K_TILE']} "
                  f"w{warps} s{stages} causal={c['IS_CAUSAL']}: {result}", flush=True)  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
