"""Putting two arrays of the same tensor side by side and measuring how far apart they are.

ncnn drops the batch axis and may keep or drop other size-1 axes; pnnx may move an axis
into ncnn's batch `n` (`Reshape ... 12=233 13=k`), which a blob then carries as its
leading axis. So arrays are compared with size-1 axes dropped on both sides, the leading
`n` of an ncnn blob tried at every position, and - only where the mapping says the two are
the same values under a reshape (pnnx's `_ncnnreshape` pairs) - in flat order. Integer
tensors travel through ncnn as int32 bit patterns in float blobs: they are compared as
ints.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# float32 values below this are denormals: an all-denormal blob is int32 bits, not floats
_DENORMAL = np.float32(1.1754944e-38)


@dataclass(frozen=True)
class Error:
    """How far `actual` is from `expected`: max |a - e|, max |e| (for the relative error),
    or why they could not be compared (`shape`)."""

    max_abs: float
    max_ref: float
    shape: str | None = None  # "(4,4) vs (4,5)" when the shapes do not line up

    @property
    def rel(self) -> float:
        if self.shape is not None:
            return float("inf")
        return self.max_abs / self.max_ref if self.max_ref > 0 else (0.0 if self.max_abs == 0
                                                                     else float("inf"))

    def within(self, atol: float, rtol: float) -> bool:
        return self.shape is None and self.max_abs <= atol + rtol * self.max_ref


def looks_like_int_bits(arr: np.ndarray) -> bool:
    """A float32 blob whose nonzero values are all denormal: int32 ids in float clothing."""
    if arr.dtype != np.float32 or arr.size == 0:
        return False
    mag = np.abs(arr)
    nz = mag[mag != 0]
    return nz.size > 0 and bool(np.all(nz < _DENORMAL))


def _as_numbers(arr: np.ndarray, as_int: bool) -> np.ndarray:
    if as_int and arr.dtype == np.float32:
        return arr.view(np.int32).astype(np.float64)
    return arr.astype(np.float64, copy=False)


def _squeezed(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(d for d in shape if d != 1)


def candidate_views(actual: np.ndarray, batch_n: int) -> list[np.ndarray]:
    """`actual` as is, and - when its leading axis is ncnn's batch `n` - with that axis
    moved to every other position."""
    views = [actual]
    if batch_n > 1 and actual.ndim >= 2 and actual.shape[0] == batch_n:
        views += [np.moveaxis(actual, 0, i) for i in range(1, actual.ndim)]
    return views


def measure(actual: np.ndarray, expected: np.ndarray, *, batch_n: int = 1,
            flat: bool = False) -> Error:
    """The error of `actual` (an ncnn blob) against `expected` (a torch operand or the
    other graph's blob). `batch_n` = the blob's ncnn batch size; `flat` allows comparing in
    flat order when the element counts agree but the shapes do not."""
    as_int = expected.dtype.kind in "iub" or (expected.dtype == np.float32
                                             and looks_like_int_bits(expected))
    if as_int and expected.dtype.kind == "b":
        expected = expected.astype(np.int32)
    e = _as_numbers(expected, as_int and expected.dtype == np.float32)
    want = _squeezed(e.shape)
    for view in candidate_views(actual, batch_n):
        if _squeezed(view.shape) == want:
            a = _as_numbers(view, as_int)
            return _error(a.reshape(want), e.reshape(want))
    if flat and actual.size == expected.size:
        return _error(_as_numbers(actual, as_int).ravel(), e.ravel())
    return Error(float("inf"), float(np.max(np.abs(e))) if e.size else 0.0,
                 shape=f"{_fmt(actual.shape)} vs {_fmt(expected.shape)}")


def _error(a: np.ndarray, e: np.ndarray) -> Error:
    if a.size == 0:
        return Error(0.0, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(a - e)
    finite = np.isfinite(diff)
    max_abs = float(np.max(diff)) if finite.all() else float("inf")
    if not finite.all() and np.array_equal(np.isnan(a), np.isnan(e)) and \
            np.array_equal(a[~np.isfinite(a)], e[~np.isfinite(e)], equal_nan=True):
        # the same infinities / NaNs in the same places: measure the rest
        max_abs = float(np.max(diff[finite])) if finite.any() else 0.0
    ref = np.abs(e[np.isfinite(e)])
    return Error(max_abs, float(np.max(ref)) if ref.size else 0.0)


def _fmt(shape: tuple[int, ...]) -> str:
    return "(" + ",".join(map(str, shape)) + ")"
