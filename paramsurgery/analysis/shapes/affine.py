"""Symbolic sizes: integer affine forms in named symbols (`T`, `2*T+1`, `T-3`, `T+P`).

A dimension is an `int` when it is fixed and an `Affine` when it depends on a symbol; an
`Affine` never has zero symbols (arithmetic normalises such results back to `int`). Anything
that would leave the affine integers (a product of two symbols, a division that is not
exact) has no form here: the helpers return None and the caller records "not known".
"""

from __future__ import annotations

import re
from collections.abc import Mapping


class Affine:
    """`const + Σ coef·symbol` with integer coefficients; immutable and hashable."""

    __slots__ = ("const", "terms")

    def __init__(self, const: int, terms: Mapping[str, int]) -> None:
        self.const = int(const)
        self.terms = tuple(sorted((s, int(c)) for s, c in terms.items() if c))

    # ------------------------------------------------------------------ construction
    @staticmethod
    def symbol(name: str) -> Affine:
        if not _SYMBOL_RE.fullmatch(name):
            raise ValueError(f"not a symbol name: {name!r}")
        return Affine(0, {name: 1})

    @staticmethod
    def parse(text: str) -> Dim:
        """`"2*T+1"`, `"T-3"`, `"-T"`, `"12"`, `"T+P"`, `"3T"` → Dim. Raises ValueError."""
        s = text.replace(" ", "")
        if not s:
            raise ValueError("empty size")
        if s[0] not in "+-":
            s = "+" + s
        const = 0
        terms: dict[str, int] = {}
        pos = 0
        for m in _TERM_RE.finditer(s):
            if m.start() != pos:
                break
            pos = m.end()
            sign = -1 if m.group(1) == "-" else 1
            num, sym = m.group(2), m.group(3)
            if sym:
                terms[sym] = terms.get(sym, 0) + sign * (int(num) if num else 1)
            elif num:
                const += sign * int(num)
            else:
                raise ValueError(f"not a size: {text!r}")
        if pos != len(s):
            raise ValueError(f"not an integer, a symbol or an affine form such as 2*T+1: "
                             f"{text!r}")
        return normalize(Affine(const, terms))

    # ------------------------------------------------------------------ queries
    @property
    def symbols(self) -> tuple[str, ...]:
        return tuple(s for s, _ in self.terms)

    def evaluate(self, env: Mapping[str, int]) -> int:
        return self.const + sum(c * env[s] for s, c in self.terms)

    # ------------------------------------------------------------------ arithmetic
    def __add__(self, other: object) -> Dim:
        if isinstance(other, int):
            return normalize(Affine(self.const + other, dict(self.terms)))
        if isinstance(other, Affine):
            t = dict(self.terms)
            for s, c in other.terms:
                t[s] = t.get(s, 0) + c
            return normalize(Affine(self.const + other.const, t))
        return NotImplemented

    __radd__ = __add__

    def __neg__(self) -> Affine:
        return Affine(-self.const, {s: -c for s, c in self.terms})

    def __sub__(self, other: object) -> Dim:
        if isinstance(other, (int, Affine)):
            return self + (-other)
        return NotImplemented

    def __rsub__(self, other: object) -> Dim:
        if isinstance(other, int):
            return (-self) + other
        return NotImplemented

    def __mul__(self, other: object) -> Dim:
        if isinstance(other, int):
            return normalize(Affine(self.const * other, {s: c * other for s, c in self.terms}))
        return NotImplemented

    __rmul__ = __mul__

    def exact_div(self, k: int) -> Dim | None:
        """self / k when every coefficient is divisible by k, else None."""
        if k == 0 or self.const % k or any(c % k for _, c in self.terms):
            return None
        return normalize(Affine(self.const // k, {s: c // k for s, c in self.terms}))

    # ------------------------------------------------------------------ identity / text
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Affine) and self.const == other.const and \
            self.terms == other.terms

    def __hash__(self) -> int:
        return hash((self.const, self.terms))

    def __str__(self) -> str:
        out = ""
        for s, c in self.terms:
            if c == 1:
                part = s
            elif c == -1:
                part = "-" + s
            else:
                part = f"{c}*{s}"
            out += part if not out or part.startswith("-") else "+" + part
        if self.const:
            out += f"{self.const:+d}"
        return out

    def __repr__(self) -> str:
        return f"Affine({self})"


Dim = int | Affine
MaybeDim = int | Affine | None

_SYMBOL_RE = re.compile(r"[A-Za-z_][A-Za-z_0-9]*")
_TERM_RE = re.compile(r"([+-])(\d*)\*?([A-Za-z_][A-Za-z_0-9]*)?")


def normalize(a: Affine) -> Dim:
    return a.const if not a.terms else a


def parse_dim(text: str) -> Dim:
    return Affine.parse(text)


def dim_str(d: MaybeDim) -> str:
    return "?" if d is None else str(d)


def dim_json(d: MaybeDim) -> int | str | None:
    return d if isinstance(d, int) or d is None else str(d)


def evaluate(d: Dim, env: Mapping[str, int]) -> int:
    return d if isinstance(d, int) else d.evaluate(env)


def symbols_of(d: MaybeDim) -> tuple[str, ...]:
    return d.symbols if isinstance(d, Affine) else ()


# --------------------------------------------------------------------------- None-aware math
def add(a: MaybeDim, b: MaybeDim) -> MaybeDim:
    return None if a is None or b is None else a + b


def sub(a: MaybeDim, b: MaybeDim) -> MaybeDim:
    return None if a is None or b is None else a - b


def mul(a: MaybeDim, b: MaybeDim) -> MaybeDim:
    """a·b when at most one side is symbolic."""
    if a is None or b is None:
        return None
    if isinstance(a, int) or isinstance(b, int):
        return a * b
    return None


def div(a: MaybeDim, k: MaybeDim) -> MaybeDim:
    """Exact a / k (k an int, or equal to a); None otherwise."""
    if a is None or k is None:
        return None
    if isinstance(k, Affine):
        return 1 if a == k else None
    if k == 0:
        return None
    if isinstance(a, int):
        return a // k if a % k == 0 else None
    return a.exact_div(k)


def floordiv(a: MaybeDim, k: int) -> MaybeDim:
    """⌊a / k⌋ (k > 0): exact for ints; for a symbolic a only when the division is exact."""
    if a is None or k <= 0:
        return None
    if isinstance(a, int):
        return a // k
    return a.exact_div(k)


def same(a: MaybeDim, b: MaybeDim) -> bool | None:
    """True / False when decidable for every value of the symbols, None when not."""
    if a is None or b is None:
        return None
    if a == b:
        return True
    if isinstance(a, int) and isinstance(b, int):
        return False
    d = a - b
    if isinstance(d, int):
        return False
    return None


def dmax(a: MaybeDim, b: MaybeDim) -> MaybeDim:
    """max(a, b) where it has an affine form (equal sides, or one side is 1)."""
    if a is None or b is None:
        return None
    if a == b:
        return a
    if isinstance(a, int) and isinstance(b, int):
        return max(a, b)
    if a == 1:
        return b
    if b == 1:
        return a
    return None


def product(dims: tuple[MaybeDim, ...] | list[MaybeDim]) -> MaybeDim:
    out: MaybeDim = 1
    for d in dims:
        out = mul(out, d)
        if out is None:
            return None
    return out
