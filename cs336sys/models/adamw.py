"""AdamW: Adam with decoupled weight decay (Loshchilov & Hutter 2019, Algorithm 2).

Written as a readable per-parameter loop so that its state (two moment buffers per
parameter, i.e. 8 bytes/param in float32) is plain to see when the benchmarks account for
optimizer memory. The order of operations follows `torch.optim.AdamW` exactly, so the two
agree to float rounding:

    p   <- p * (1 - lr * wd)                       decoupled decay, applied first
    m   <- beta1 * m + (1 - beta1) * g
    v   <- beta2 * v + (1 - beta2) * g^2
    p   <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)

Mixed precision: a bfloat16 or float16 parameter gets float32 moments, and its
update is computed in float32 from a float32 copy of the weights and gradient, then rounded
to the parameter's dtype once. A 16-bit v would flush small squared gradients, and rounding
the weights after the decay and again after the update would round twice per step. The one
rounding left still drops any update below half a bf16 ulp of its weight (2^-9 of it or
less): that is what 16-bit weights without a float32 master copy mean. torch.optim.AdamW
keeps a 16-bit parameter's state in its dtype instead; for float32 (and float64) parameters
the two are the same. The fused versions (adamw_fused.py) follow this rule too.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

import torch

# Parameters of these dtypes keep float32 state and are updated in float32 (docstring).
LOW_PRECISION = (torch.bfloat16, torch.float16)


def state_dtype(p: torch.Tensor) -> torch.dtype:
    """The dtype of `p`'s moments: float32 for a 16-bit parameter, else p's own."""
    return torch.float32 if p.dtype in LOW_PRECISION else p.dtype


class AdamW(torch.optim.Optimizer):
    """AdamW (Loshchilov & Hutter, 2019) in torch.optim.AdamW's order of operations: the
    decoupled decay p·(1 - lr·wd) first, then the moments m and v, then the bias-corrected
    step (the module's docstring has the formulas). A 16-bit parameter gets float32 moments
    and a float32 update (`state_dtype`); the fused versions (adamw_fused.py) compute the
    same update."""

    def __init__(
        self,
        params: Iterable[torch.Tensor] | Iterable[dict[str, Any]],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.01,
        *,
        foreach: bool | None = None,
        fused: bool | None = None,
    ) -> None:
        # foreach and fused choose among torch.optim.AdamW's implementations of the same math;
        # taken, as torch takes them, so that a sharded optimizer that hands them to its inner
        # optimizer (as the course's test, with torch's AdamW, allows) runs on ours too
        del foreach, fused
        if not lr >= 0.0:
            raise ValueError(f"learning rate must be >= 0, got {lr}.")
        if not 0.0 <= betas[0] < 1.0 or not 0.0 <= betas[1] < 1.0:
            raise ValueError(f"betas must each be in [0, 1), got {betas}.")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}.")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}.")
        defaults = {"lr": lr, "betas": betas, "eps": eps, "weight_decay": weight_decay}
        super().__init__(params, defaults)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's, keeping a 16-bit parameter's moments float32: torch casts every floating
        state tensor to its parameter's dtype, which would round them to 16 bits."""
        super().load_state_dict(state_dict)
        saved_ids = [i for g in state_dict["param_groups"] for i in g["params"]]
        params = [p for g in self.param_groups for p in g["params"]]
        for i, p in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(i)
            if p.dtype in LOW_PRECISION and saved:
                for key in ("exp_avg", "exp_avg_sq"):
                    self.state[p][key] = saved[key].to(p.device, torch.float32, copy=True)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None) -> float | None:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            self._update_group(group)
        return loss

    def _stepped(self, group: dict[str, Any]) -> list[tuple[torch.Tensor, dict[str, Any]]]:
        """(param, state) of every parameter of `group` with a gradient, its step counted and
        its state made on first use: step 0 and zero moments (float32 for a 16-bit
        parameter). The fused versions (adamw_fused.py) update the same list."""
        out = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("AdamW does not support sparse gradients.")
            state = self.state[p]
            if not state:
                like = dict(dtype=state_dtype(p), memory_format=torch.preserve_format)
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, **like)
                state["exp_avg_sq"] = torch.zeros_like(p, **like)
            state["step"] += 1
            out.append((p, state))
        return out

    def _update_group(self, group: dict[str, Any]) -> None:
        """The update, one parameter at a time (the readable reference)."""
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        beta1, beta2 = group["betas"]
        for p, state in self._stepped(group):
            grad, t = p.grad, state["step"]
            exp_avg, exp_avg_sq = state["exp_avg"], state["exp_avg_sq"]
            # A 16-bit parameter is updated in a float32 copy, rounded back once at the end.
            low = p.dtype in LOW_PRECISION
            weights = p.float() if low else p
            if low:
                grad = grad.float()

            # Decoupled weight decay: shrink the weights directly instead of adding
            # wd * p to the gradient, so decay is not rescaled by the adaptive denominator.
            weights.mul_(1 - lr * wd)

            exp_avg.lerp_(grad, 1 - beta1)  # m = beta1 m + (1 - beta1) g
            exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)

            # Bias corrections undo the zero initialisation of m and v (Kingma & Ba 2015).
            bias_correction1 = 1 - beta1**t
            bias_correction2 = 1 - beta2**t
            step_size = lr / bias_correction1
            denom = (exp_avg_sq.sqrt() / math.sqrt(bias_correction2)).add_(eps)
            weights.addcdiv_(exp_avg, denom, value=-step_size)
            if low:
                p.copy_(weights)
