"""AdamW as assignment 1 writes it (Loshchilov and Hutter, 2019, Algorithm 2): bias-corrected
moments, then the decoupled weight decay, one parameter at a time."""

import math

import torch


class AdamW(torch.optim.Optimizer):
    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None if closure is None else closure()
        for group in self.param_groups:
            lr, (beta1, beta2) = group["lr"], group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["t"], state["m"], state["v"] = 0, torch.zeros_like(p), torch.zeros_like(p)
                state["t"] += 1
                m, v, t = state["m"], state["v"], state["t"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                lr_t = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
                p.sub_(lr_t * m / (v.sqrt() + group["eps"]))
                p.sub_(lr * group["weight_decay"] * p)
        return loss
