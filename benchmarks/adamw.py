"""How long one AdamW step takes over a model's parameters, for each optimizer of
`cs336sys model --optimizer` (ours at or under torch's fused=True on an H100).

    python benchmarks/adamw.py                      # xl on CUDA, tiny on CPU
    python benchmarks/adamw.py --size xl --param-dtype bf16 --iters 20

The parameters have the shapes of TransformerLM(--size) (built on the meta device, so no
initialisation is paid), random values and random gradients, on the device. Each optimizer
gets a fresh state, `--warmup` untimed steps (the first allocates the moments; on CUDA the
Triton kernel compiles) and `--iters` timed ones, each ended by a device sync; the median is
printed with its ratio to torch-adamw-fused and the bandwidth it would reach if it moved only
the bytes AdamW must (p, g, m, v read; p, m, v written). On a CPU the Triton kernel runs only
interpreted (TRITON_INTERPRET=1), which is no speed figure: it is left out there unless
--impl names it. adamw-triton-per-tensor is the same kernel launched once per tensor.
Nothing is stored.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from cs336sys.experiments.training_step import LR, OPTIMIZERS, WEIGHT_DECAY, make_optimizer
from cs336sys.measure.device import resolve_device, synchronize
from cs336sys.models.adamw import state_dtype
from cs336sys.models.config import from_preset
from cs336sys.models.transformer import TransformerLM

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# Beyond `--optimizer`'s choices: the Triton kernel launched once per tensor (the
# multi-tensor launch is adamw-triton).
PER_TENSOR = "adamw-triton-per-tensor"
NAMES = (*OPTIMIZERS, PER_TENSOR)


def parameters(size: str, device: str, dtype: torch.dtype) -> list[torch.nn.Parameter]:
    """Random parameters with the shapes of the `size` model, with random gradients."""
    with torch.device("meta"):
        shapes = [p.shape for p in TransformerLM(from_preset(size)).parameters()]
    g = torch.Generator(device).manual_seed(0)
    params = []
    for shape in shapes:
        p = torch.nn.Parameter(torch.randn(shape, generator=g, device=device).mul_(0.02).to(dtype))
        p.grad = torch.randn(shape, generator=g, device=device).mul_(1e-3).to(dtype)
        params.append(p)
    return params


def min_bytes(params: list[torch.Tensor], torch_state: bool) -> int:
    """What one AdamW step must move: p and g read, p written, m and v read and written.
    torch keeps a 16-bit parameter's moments in its dtype; ours keep them float32."""
    total = 0
    for p in params:
        moment = p.element_size() if torch_state else state_dtype(p).itemsize
        total += p.numel() * (3 * p.element_size() + 4 * moment)
    return total


def time_steps(name: str, params: list, device: str, warmup: int, iters: int) -> list[float]:
    if name == PER_TENSOR:
        from cs336sys.models.adamw_fused import AdamWTriton

        opt = AdamWTriton(params, lr=LR, weight_decay=WEIGHT_DECAY, multi_tensor=False)
    else:
        opt = make_optimizer(name, params)
    for _ in range(warmup):
        opt.step()
    synchronize(device)
    times = []
    for _ in range(iters):
        t0 = time.perf_counter()
        opt.step()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    opt.state.clear()  # free the moments before the next optimizer allocates its own
    del opt
    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size", help="model size preset [default: xl on CUDA, tiny on CPU]")
    parser.add_argument("--device", default="auto")
    parser.add_argument("--param-dtype", choices=DTYPES, default="fp32",
                        help="the parameters' dtype (bf16: ours keep fp32 moments, torch bf16)")
    parser.add_argument("--impl", help=f"comma list from {', '.join(NAMES)} [default: all; "
                        "on a CPU all but the Triton ones]")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--iters", type=int, help="timed steps [default: 20 on CUDA, 5 on CPU]")
    args = parser.parse_args()

    device = resolve_device(args.device)
    on_cuda = device.startswith("cuda")
    size = args.size or ("xl" if on_cuda else "tiny")
    iters = args.iters or (20 if on_cuda else 5)
    impls = args.impl.split(",") if args.impl else [
        n for n in NAMES if on_cuda or "triton" not in n]
    if unknown := [n for n in impls if n not in NAMES]:
        parser.error(f"--impl: unknown {', '.join(unknown)}; choose from {', '.join(NAMES)}")

    params = parameters(size, device, DTYPES[args.param_dtype])
    n = sum(p.numel() for p in params)
    name = torch.cuda.get_device_name(device) if on_cuda else "cpu"
    print(f"{size}: {len(params)} tensors, {n / 1e6:.1f}M params, {args.param_dtype}, on {name}; "
          f"median of {iters} steps after {args.warmup} warm-up")
    medians, samples = {}, {}
    for impl in impls:
        samples[impl] = time_steps(impl, params, device, args.warmup, iters)
        medians[impl] = statistics.median(samples[impl])
    base = medians.get("torch-adamw-fused")
    for impl, ms in medians.items():
        gbs = min_bytes(params, impl.startswith("torch")) / (ms / 1e3) / 1e9
        ratio = f"{ms / base:6.2f}x torch-adamw-fused" if base else ""
        spread = f"(min {min(samples[impl]):.2f}, max {max(samples[impl]):.2f})"
        print(f"{impl:24s} {ms:9.2f} ms {spread:26s} {gbs:7.1f} GB/s at the minimum traffic"
              f"  {ratio}")


if __name__ == "__main__":
    main()
