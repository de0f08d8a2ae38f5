"""Norms and MLPs shared by the encoderlab families."""

import torch
from torch import nn


class RMSNorm(nn.Module):
    """Root-mean-square norm with a learned gain (no bias, no mean subtraction)."""

    def __init__(self, hidden_size, eps=1e-5):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

    def forward(self, x):
        # Normalise in fp32 at least: bf16 squares lose too much precision.
        compute_dtype = torch.promote_types(x.dtype, torch.float32)
        variance = x.to(compute_dtype).pow(2).mean(-1, keepdim=True)
        normed = x.to(compute_dtype) * torch.rsqrt(variance + self.eps)
        return self.weight * normed.to(x.dtype)


def build_norm(config, hidden_size=None):
    hidden_size = config.hidden_size if hidden_size is None else hidden_size
    if config.norm_type == "rmsnorm":
        return RMSNorm(hidden_size, eps=config.norm_eps)
    return nn.LayerNorm(hidden_size, eps=config.norm_eps)


class SwiGLUMLP(nn.Module):
    """``down(silu(gate(x)) * up(x))``; gate and up share one fused projection."""

    def __init__(self, hidden_size, intermediate_size, bias=False):
        super().__init__()
        self.gate_up = nn.Linear(hidden_size, 2 * intermediate_size, bias=bias)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.down(nn.functional.silu(gate) * up)


class GeLUMLP(nn.Module):
    """``down(gelu(up(x)))``, the BERT MLP."""

    def __init__(self, hidden_size, intermediate_size, bias=True):
        super().__init__()
        self.up = nn.Linear(hidden_size, intermediate_size, bias=bias)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=bias)

    def forward(self, x):
        return self.down(nn.functional.gelu(self.up(x)))


def build_mlp(config, bias=False):
    if config.mlp_type == "swiglu":
        return SwiGLUMLP(config.hidden_size, config.intermediate_size, bias=bias)
    return GeLUMLP(config.hidden_size, config.intermediate_size, bias=bias)


__all__ = ["RMSNorm", "build_norm", "SwiGLUMLP", "GeLUMLP", "build_mlp"]
