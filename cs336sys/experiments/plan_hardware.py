"""The devices `cs336sys plan` plans for: C (dense bf16 FLOP/s), W (egress bytes/s per
device) and memory, from data sheets (HARDWARE), given by hand (--flops, --bandwidth), or
measured on this GPU (experiments/plan_measured.py)."""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from cs336sys.sweep.points import SpecError, choices


@dataclass(frozen=True)
class Hardware:
    """One device: C (dense bf16 FLOP/s), W (egress bytes/s, per direction) and memory."""

    name: str
    flops: float
    egress: float
    memory_bytes: int
    source: str  # where the figures come from (a data sheet; or the stored runs used)


GiB = 2**30
# Data sheets give dense bf16 (half their "with sparsity" figure), NVLink as the total of
# both directions (W is half of it) and memory in GB, read here as GiB: about what the driver
# reports (an H100 SXM shows 79.6 GiB in nvidia-smi; a B200 179 GiB).
HARDWARE: dict[str, Hardware] = {
    # NVIDIA A100 Tensor Core GPU data sheet (2021): BF16 312 TFLOPS dense (624 sparse),
    # A100 80GB SXM, NVLink 3 600 GB/s.
    "a100": Hardware("A100 SXM 80GB", 312e12, 300e9, 80 * GiB, "NVIDIA A100 data sheet"),
    # NVIDIA H100 Tensor Core GPU data sheet (2023), SXM5: BF16 1,979 TFLOPS with sparsity,
    # 80 GB HBM3, NVLink 4 900 GB/s.
    "h100": Hardware("H100 SXM 80GB", 989.4e12, 450e9, 80 * GiB, "NVIDIA H100 data sheet"),
    # NVIDIA H200 Tensor Core GPU data sheet (2024), SXM: BF16 1,979 TFLOPS with sparsity,
    # 141 GB HBM3e, NVLink 900 GB/s.
    "h200": Hardware("H200 SXM 141GB", 989.4e12, 450e9, 141 * GiB, "NVIDIA H200 data sheet"),
    # The CS336 2026 handout's B200 (section 2.1.5, "the NVIDIA B200 spec sheet"): BF16 2,500
    # TFLOPS. NVIDIA HGX B200 data sheet (2024), per GPU of eight: 1.44 TB HBM3e for the eight
    # (180 GB each), NVLink 5 1.8 TB/s per GPU.
    "b200": Hardware("B200 180GB", 2.5e15, 900e9, 180 * GiB,
                     "CS336 2026 handout (C), NVIDIA HGX B200 data sheet (W, memory)"),
    # The CS336 2025 handout's TPU v5p (communication_accounting, after Austin et al. 2025,
    # "How to Scale Your Model"): C = 4.6e14 FLOP/s, W_ici = 2 x 9e10 bytes/s, and "95GB per
    # device", which its question (b) compares against in bytes: 95e9.
    "tpu-v5p": Hardware("TPU v5p", 4.6e14, 2 * 9e10, 95 * 10**9,
                        "CS336 2025 handout (How to Scale Your Model)"),
}


def listed_hardware(hardware: Iterable[Any] | Any | None) -> list[tuple[str, Hardware]]:
    """(key, Hardware) pairs: a preset key ("h100", or "h100,b200" as the command line
    splits it; none given: h100, the command line's default), or a Hardware (measured) keyed
    'measured'. An unknown key is a SpecError naming the presets."""
    if hardware is None:
        hardware = hardware_presets(None)
    elif isinstance(hardware, str | Hardware):
        hardware = [hardware]
    out = []
    for h in hardware:
        if isinstance(h, str):
            out += [(key, HARDWARE[key]) for key in hardware_presets([h])]
        else:
            out.append(("by-hand" if h.source.startswith("given by hand") else "measured", h))
    if not out:
        raise SpecError("--hardware: give a preset or --measured")
    return out


def by_hand(flops: float | None, bandwidth: float | None, memory_gib: float) -> Hardware | None:
    """The device of --flops C and --bandwidth W (None without them); SpecError if only one
    is given or a figure is not a positive number."""
    if flops is None and bandwidth is None:
        return None
    if flops is None or bandwidth is None:
        raise SpecError("--flops and --bandwidth go together: C and W of one device")
    # within bounds that keep every figure of a plan finite (1e30 FLOP/s is 10^15 H100s)
    for name, value, low, high, bounds in (
            ("--flops", flops, 1, 1e30, "1 and 1e30"),
            ("--bandwidth", bandwidth, 1, 1e30, "1 and 1e30"),
            ("--memory-gib", memory_gib, 2**-10, 2**32, "1/1024 (1 MiB) and 2^32")):
        if not (math.isfinite(value) and value > 0):
            raise SpecError(f"{name} must be a positive number, got {value}")
        if not low <= value <= high:
            raise SpecError(f"{name} must be between {bounds}, got {value:g}")
    return Hardware(f"C={flops:.3g} W={bandwidth:.3g}", flops, bandwidth,
                    int(memory_gib * GiB), "given by hand (--flops, --bandwidth)")


def hardware_presets(values: Iterable[str] | None) -> list[str]:
    """The --hardware list, checked against HARDWARE."""
    return choices(values, tuple(HARDWARE), "--hardware", default=["h100"])
