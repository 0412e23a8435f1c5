"""A module that runs its child inside export-patch contexts.

Entering the patches in `forward` (instead of around the export call) means every call
of a ported wrapper -- the trace, the torch reference, the equivalence check -- sees the
same patched code, and the raw variant can use the very same child module unpatched.
The child is registered once, so parameter names are unique (qwen3-tts.md §6.10).
"""

from __future__ import annotations

import contextlib
from typing import Callable, ContextManager, Sequence

import torch
from torch import nn


class PatchedCall(nn.Module):
    def __init__(self, inner: nn.Module, contexts: Sequence[Callable[[], ContextManager]]) -> None:
        super().__init__()
        self.inner = inner
        self._contexts = list(contexts)

    def forward(self, *args: torch.Tensor):  # noqa: ANN201 - tensor or tuple of tensors
        with contextlib.ExitStack() as stack:
            for make in self._contexts:
                stack.enter_context(make())
            return self.inner(*args)
