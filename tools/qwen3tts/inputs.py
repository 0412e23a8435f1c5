"""Seeded example inputs (trace shapes and reference inputs)."""

from __future__ import annotations

import torch

INPUT_SEED = 7


class Inputs:
    """Draws ids and float tensors from one generator, so a module's example inputs are
    fixed by (INPUT_SEED, call order)."""

    def __init__(self, seed: int = INPUT_SEED) -> None:
        self.gen = torch.Generator().manual_seed(seed)

    def ids(self, shape: tuple[int, ...], high: int) -> torch.Tensor:
        # int32: what ncnn Embed reads and what pnnx's `i32` inputshape declares
        return torch.randint(0, high, shape, generator=self.gen, dtype=torch.int64).to(torch.int32)

    def normal(self, shape: tuple[int, ...], scale: float = 1.0) -> torch.Tensor:
        return torch.randn(shape, generator=self.gen, dtype=torch.float32) * scale

    def uniform(self, shape: tuple[int, ...], low: float, high: float) -> torch.Tensor:
        return torch.rand(shape, generator=self.gen, dtype=torch.float32) * (high - low) + low
