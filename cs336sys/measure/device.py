"""Devices: resolve the user's choice, synchronise, and know each GPU's peak throughput."""

from __future__ import annotations

DEVICE_CHOICES = ("auto", "cpu", "cuda")

# Dense peak TFLOP/s from NVIDIA's data sheets (no sparsity), by precision of the matmuls.
# "fp32" is plain FP32 on CUDA cores; "tf32" is used instead when torch allows TF32 matmuls.
# Order matters: the first key contained in the device name wins ("H100 PCIe" before "H100").
PEAK_TFLOPS: dict[str, dict[str, float]] = {
    # the CS336 2026 handout's B200 figures (its section 2.1.5): FP32 80, BF16/FP16 2,500;
    # TF32 half of BF16, as on NVIDIA's Blackwell data sheets
    "B200": {"fp32": 80.0, "tf32": 1250.0, "bf16": 2500.0, "fp16": 2500.0},
    # NVIDIA H200 NVL data sheet: BF16/FP16 1,671 with sparsity, TF32 835, FP32 60
    "H200 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.5, "fp16": 835.5},
    "H200": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},
    "H100 PCIe": {"fp32": 51.2, "tf32": 378.0, "bf16": 756.0, "fp16": 756.0},
    "H100 NVL": {"fp32": 60.0, "tf32": 417.5, "bf16": 835.0, "fp16": 835.0},
    "H100": {"fp32": 67.0, "tf32": 494.7, "bf16": 989.4, "fp16": 989.4},  # SXM5
    "A100": {"fp32": 19.5, "tf32": 156.0, "bf16": 312.0, "fp16": 312.0},
    # NVIDIA's L40S data sheet: BF16/FP16 362.05 dense (733 with sparsity), TF32 183
    "L40S": {"fp32": 91.6, "tf32": 183.0, "bf16": 362.05, "fp16": 362.05},
    "A10G": {"fp32": 31.2, "tf32": 62.5, "bf16": 125.0, "fp16": 125.0},
    "V100": {"fp32": 15.7, "fp16": 125.0},
}


# Under every table and chart that shows MFU: fp32 MFU of 42 % beside bf16's 3 % reads as
# fp32 using the GPU better, unless the reader knows each is against its own peak.
MFU_NOTE = ("MFU: TFLOP/s over the GPU's dense peak in the precision the matmuls ran in (an "
            "H100 SXM's: " + ", ".join(f"{p.replace('tf32', 'TF32')} {PEAK_TFLOPS['H100'][p]:.0f}"
                                       for p in ("fp32", "tf32", "bf16"))
            + f"; a B200's, the 2026 handout's: fp32 {PEAK_TFLOPS['B200']['fp32']:.0f}, bf16 "
            f"{PEAK_TFLOPS['B200']['bf16']:,.0f}), so fp32 and bf16 are each "
            "against their own peak; shown only where the GPU's peak is known.")


def peak_tflops(device_name: str | None, precision: str, tf32: bool = False) -> float | None:
    """The GPU's dense peak for `precision` (fp32|bf16|fp16), or None where unknown (CPUs)."""
    if not device_name:
        return None
    for key, peaks in PEAK_TFLOPS.items():
        if key.lower() in device_name.lower():
            if precision == "fp32" and tf32:
                return peaks.get("tf32", peaks.get("fp32"))
            return peaks.get(precision)
    return None


def tf32_matmuls() -> bool:
    """Whether float32 matmuls on CUDA run in TF32, as the user's code may have set it: torch
    2.9's `fp32_precision` (set, or inherited from torch.backends.fp32_precision), else the
    legacy `allow_tf32`. The legacy getter raises once code has used the new setting (the
    course's adapters setting `fp32_precision = "tf32"` made every model point an error)."""
    import torch

    matmul = torch.backends.cuda.matmul
    if hasattr(matmul, "fp32_precision"):
        return matmul.fp32_precision == "tf32"
    return bool(matmul.allow_tf32)


def validate_device(name: str) -> None:
    """Raise ValueError (user-facing) for a device that is unknown or not present."""
    base = name.split(":", 1)[0]
    if not name.strip():
        raise ValueError("--device: empty value; choose from auto, cpu, cuda, cuda:N")
    if base not in DEVICE_CHOICES or (base != "cuda" and ":" in name):  # cpu:0 was its own
        raise ValueError(f"--device: unknown device {name!r}; choose from auto, cpu, cuda, cuda:N")
    if base == "cuda":
        import torch

        if not torch.cuda.is_available():
            raise ValueError(f"--device {name}: CUDA is not available on this machine")
        if ":" in name:
            index = name.split(":", 1)[1]
            if not index.isdigit() or int(index) >= torch.cuda.device_count():
                raise ValueError(
                    f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)"
                )


def resolve_device(name: str) -> str:
    """'auto' -> 'cuda' when CUDA is there, else 'cpu'; validates the rest."""
    validate_device(name)
    if name == "auto":
        import torch

        return "cuda:0" if torch.cuda.is_available() else "cpu"
    return "cuda:0" if name == "cuda" else name


def synchronize(device: str) -> None:
    """Wait for the device's queued work, so a host timer measures the device's time."""
    if device.startswith("cuda"):
        import torch

        torch.cuda.synchronize(device)


def device_name(device: str) -> str | None:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return None
