"""Error metrics of a reduced-precision run against its reference (`--metric`).

- `rel`: max|a - r| / max|r| (lower is better; tolerance: at most `tol`);
- `snr`: 10·log10(Σr² / Σ(a - r)²) in dB (higher is better; at least `tol`);
- `cos`: cosine similarity of the flattened arrays (higher is better; at least `tol`).

A non-finite value where the reference is finite (an fp16 overflow) is the worst value of
the metric (rel inf, snr -inf, cos -inf), never a number that looks small. `badness` maps
every metric onto one order (larger = worse) for sorting and for the worst of several
outputs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Metric:
    name: str
    higher_is_better: bool
    default_tol: float
    unit: str = ""

    def measure(self, got: np.ndarray, ref: np.ndarray) -> float:
        a = np.asarray(got, dtype=np.float64).reshape(-1)
        r = np.asarray(ref, dtype=np.float64).reshape(-1)
        worst = -math.inf if self.higher_is_better else math.inf
        if a.shape != r.shape:
            return worst
        if not np.all(np.isfinite(a[np.isfinite(r)])):
            return worst
        if self.name == "rel":
            return rel_error(a, r)
        if self.name == "snr":
            fin = np.isfinite(r)  # a non-finite reference value is compared by the check above
            a, r = a[fin], r[fin]
            noise = float(np.sum((a - r) ** 2))
            signal = float(np.sum(r ** 2))
            if noise == 0.0:
                return math.inf
            return 10.0 * math.log10(signal / noise) if signal > 0 else -math.inf
        na, nr = float(np.linalg.norm(a)), float(np.linalg.norm(r))
        if na == 0.0 and nr == 0.0:
            return 1.0
        if na == 0.0 or nr == 0.0:
            return 0.0
        return float(np.dot(a, r) / (na * nr))

    def within(self, value: float, tol: float) -> bool:
        return value >= tol if self.higher_is_better else value <= tol

    def badness(self, value: float) -> float:
        return -value if self.higher_is_better else value

    def worst(self, values: list[float]) -> float:
        """The worst of several outputs' values (the perfect value when there are none)."""
        if not values:
            return math.inf if self.higher_is_better else 0.0
        return max(values, key=self.badness)

    def format(self, value: float | None) -> str:
        if value is None:
            return "-"
        if math.isinf(value):
            return "non-finite" if self.badness(value) > 0 else \
                ("exact" if self.name != "rel" else "0")
        if self.name == "snr":
            return f"{value:.1f} dB"
        if self.name == "cos":
            return f"{value:.6f}"
        return f"{value:.3g}"


def rel_error(a: np.ndarray, r: np.ndarray) -> float:
    """max|a - r| / max|r| over the finite reference (inf where `a` is not finite)."""
    a = np.asarray(a, dtype=np.float64).reshape(-1)
    r = np.asarray(r, dtype=np.float64).reshape(-1)
    if a.shape != r.shape:
        return math.inf
    fin = np.isfinite(r)
    if not np.all(np.isfinite(a[fin])):
        return math.inf
    if not fin.any():
        return 0.0
    diff = float(np.max(np.abs(a[fin] - r[fin])))
    scale = float(np.max(np.abs(r[fin])))
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else math.inf


METRICS = {
    "rel": Metric("rel", False, 1e-2),
    "snr": Metric("snr", True, 30.0, "dB"),
    "cos": Metric("cos", True, 0.999),
}


def json_number(value: float | None) -> float | str | None:
    """A float for JSON: infinities spelled "inf" / "-inf" (JSON has no infinity)."""
    if value is None:
        return None
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return float(value)


def same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    """Bit for bit the same array (NaNs included)."""
    a, b = np.ascontiguousarray(a), np.ascontiguousarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()
