"""Typed `.param` values: parsing one `k=v` token the way ncnn does, and writing values the
way pnnx does.

ncnn decides a value's type from its text (ncnn-format.md §1.4): a token with `.`, `e` or
`E` is a float, one starting with a letter or `"` is a string, a comma makes an array, and
keys `-23300-id` are old-style arrays whose first element is the count. Because an int read
where a float is expected (or the reverse) is misread by ncnn, the kind is part of the value
and survives every edit.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum
from itertools import chain
from typing import Any, Iterator, Sequence, Union, cast

import numpy as np

ARRAY_KEY_BASE = -23300  # array param `id` is written with key `-23300 - id`
MAX_PARAM_ID = 31  # NCNN_MAX_PARAM_COUNT 32
INT32_MIN, INT32_MAX = -(2 ** 31), 2 ** 31 - 1
FLT_MAX = float(np.finfo(np.float32).max)


class Kind(str, Enum):
    INT = "int"
    FLOAT = "float"
    INTS = "int[]"
    FLOATS = "float[]"
    STRING = "string"

    @property
    def is_array(self) -> bool:
        return self in (Kind.INTS, Kind.FLOATS)

    @property
    def noun(self) -> str:
        """`an int`, `a float array`: the kind in a sentence."""
        return {"int": "an int", "float": "a float", "int[]": "an int array",
                "float[]": "a float array", "string": "a string"}[self.value]


PyValue = Union[int, float, str, list]  # as Python code sees a param (arrays as lists)
Stored = Union[int, float, str, tuple]  # as a Value holds it (arrays as tuples)


@dataclass(frozen=True)
class Value:
    """A typed param value. `quoted` only matters for strings (how they were written)."""

    kind: Kind
    value: Stored
    quoted: bool = False

    def __post_init__(self) -> None:
        if self.kind.is_array and not isinstance(self.value, tuple):
            object.__setattr__(self, "value", tuple(cast(Any, self.value)))  # a list given

    @property
    def python(self) -> PyValue:
        """The plain Python value (arrays as lists)."""
        v = self.value
        return list(v) if isinstance(v, tuple) else v


# --------------------------------------------------------------------------- constructors

def Int(v: int) -> Value:
    return Value(Kind.INT, _check_int(v))


def Float(v: float | np.integer | np.floating) -> Value:
    return Value(Kind.FLOAT, _to_f32(v))


def Ints(v: Sequence[int]) -> Value:
    return Value(Kind.INTS, tuple(_check_int(x) for x in v))


def Floats(v: Sequence[float]) -> Value:
    return Value(Kind.FLOATS, tuple(_to_f32(x) for x in v))


def Str(v: str, quoted: bool | None = None) -> Value:
    if '"' in v or "\n" in v or "\r" in v:
        raise ValueError(f"a param string cannot contain quotes or newlines: {v!r}")
    if len(v.encode("utf-8", "surrogateescape")) > 255:
        raise ValueError("a param string is at most 255 bytes")
    return Value(Kind.STRING, v, bool(quoted) if quoted is not None else not _BARE_RE.fullmatch(v))


def _check_int(v: object) -> int:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"expected an int, got {type(v).__name__} {v!r}")
    v = int(v)
    if not INT32_MIN <= v <= INT32_MAX:
        raise ValueError(f"{v} does not fit in int32")
    return v


def _to_f32(v: object) -> float:
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, np.integer, np.floating)):
        raise TypeError(f"expected a float, got {type(v).__name__} {v!r}")
    with np.errstate(over="ignore"):
        f = float(np.float32(v))
    if not np.isfinite(f):
        # ncnn's text parser cannot read inf/nan (they parse as strings or fail)
        raise ValueError(f"{v!r} cannot be written in a text .param (not finite in float32)")
    return f


def infer(v: object, *, like: Value | None = None) -> Value:
    """Make a Value from a Python value. With `like` (the current value of that id), the
    int/float distinction of the existing param is kept: an int assigned to a float param
    stays a float, a non-integral float assigned to an int param is refused."""
    if isinstance(v, Value):
        return v
    if like is not None:
        if like.kind is Kind.FLOAT and isinstance(v, (int, float, np.integer, np.floating)):
            return Float(v)
        if like.kind is Kind.FLOATS and isinstance(v, (list, tuple, np.ndarray)):
            return Floats(list(v))
        if like.kind is Kind.INT and isinstance(v, (float, np.floating)):
            if float(v).is_integer():
                return Int(int(v))
            raise TypeError(f"param is an int; refusing to store float {v!r} (ncnn would read 0)")
        if like.kind is Kind.INTS and isinstance(v, (list, tuple, np.ndarray)):
            vals = list(v)
            if all(float(x).is_integer() for x in vals):
                return Ints([int(x) for x in vals])
            raise TypeError("param is an int array; refusing to store floats")
        if like.kind is Kind.STRING and isinstance(v, str):
            return Str(v)
        if like.kind in (Kind.INT, Kind.FLOAT) and isinstance(v, (str, list, tuple, np.ndarray)):
            what = "a string" if isinstance(v, str) else "a list"
            raise TypeError(f"param is {like.kind.noun}; refusing to store {what} {v!r} "
                            f"(ncnn would read its default)")
        if like.kind.is_array and isinstance(v, (str, int, float, np.integer, np.floating)) \
                and not isinstance(v, bool):
            raise TypeError(f"param is {like.kind.noun}; refusing to store {v!r} "
                            f"(give a list: ncnn's load_param rejects a scalar there)")
    if isinstance(v, (bool, np.bool_)):
        return Int(int(v))
    if isinstance(v, (int, np.integer)):
        return Int(int(v))
    if isinstance(v, (float, np.floating)):
        return Float(v)
    if isinstance(v, str):
        return Str(v)
    if isinstance(v, np.ndarray):
        v = v.tolist()
    if isinstance(v, (list, tuple)):
        if v and all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in v):
            return Ints(v)
        if v and all(isinstance(x, (int, float, np.integer, np.floating)) for x in v):
            return Floats(v)
        if not v:
            return Ints([])
    raise TypeError(f"cannot store {type(v).__name__} {v!r} as an ncnn param")


# --------------------------------------------------------------------------- pnnx formatting

def pnnx_float(f: float) -> str:
    """pnnx's float_to_string (tools/pnnx/src/utils.cpp), as measured on pnnx 20261020:
    `%g` when it round-trips float32, `%.9g` otherwise, scientific with a normalised exponent
    for tiny/huge magnitudes; always with a `.` or `e` so ncnn reads a float."""
    f32 = np.float32(f)
    if f32 == 0:
        return "0.0"

    def sci(fmt: str) -> str:
        mant, exp = (fmt % f32).split("e")
        return f"{mant}e{'-' if exp[0] == '-' else ''}{int(exp[1:])}"

    if abs(f32) < np.float32(1e-4) or abs(f32) >= np.float32(1e6):
        return sci("%e") if np.float32("%e" % f32) == f32 else sci("%.8e")
    s = "%g" % f32
    if np.float32(s) != f32:
        s = "%.9g" % f32
        if "." in s and len(s.split(".")[1]) > 9:
            return sci("%.8e")
    return s if any(c in s for c in ".eE") else s + ".0"


_BARE_RE = re.compile(r"[A-Za-z][A-Za-z0-9_]*")


def format_value(pid: int, value: Value) -> str:
    """One `k=v` token in pnnx's style: arrays always old-style `-233xx=n,...`."""
    kind = value.kind
    if kind is Kind.INT:
        return f"{pid}={value.value}"
    v = value.value
    if kind is Kind.FLOAT:
        return f"{pid}={pnnx_float(float(cast(Any, v)))}"
    if kind.is_array:
        if isinstance(value, Packed):
            # a chunk of elements at a time: a string per element only for one chunk
            pieces = [_format_elements(kind, part) for part in value.chunks()]
            count = len(value)
        else:
            elems = cast(tuple, v)
            pieces = [_format_elements(kind, elems)]
            count = len(elems)
        body = ",".join(p for p in pieces if p)
        return f"{ARRAY_KEY_BASE - pid}={count}" + (f",{body}" if body else "")
    s = str(v)
    if '"' in s:
        return f"{pid}={s}"  # read unquoted (`a"b`): the only form ncnn reads it back in
    if value.quoted or not _BARE_RE.fullmatch(s):
        return f'{pid}="{s}"'
    return f"{pid}={s}"


def _format_elements(kind: Kind, elems: Sequence) -> str:
    if kind is Kind.INTS:
        return ",".join(map(str, elems))
    # a long array repeats few distinct values (zeros, ones, a scale): format each once
    spelled: dict[float, str] = {}
    out = []
    for x in elems:
        t = spelled.get(x)
        if t is None:
            t = spelled[x] = pnnx_float(x)
        out.append(t)
    return ",".join(out)


def pnnx_order_key(pid: int) -> str:
    """pnnx writes params in std::map<std::string> order: by the decimal id as a string."""
    return str(pid)


# --------------------------------------------------------------------------- parsing

class ValueError_(ValueError):
    """A malformed value, with the offset (within the value text) of the bad part."""

    def __init__(self, message: str, offset: int = 0) -> None:
        super().__init__(message)
        self.offset = offset


_INT_RE = re.compile(r"[+-]?[0-9]+")
_NUM_RE = re.compile(r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")


def _is_float_text(t: str) -> bool:
    return "." in t or "e" in t or "E" in t


MAX_NUMBER_CHARS = 127  # ncnn reads at most this many characters of a number
MAX_KEY_CHARS = 15  # ... and of a param id


def _parse_number(t: str, offset: int) -> tuple[bool, int | float]:
    if len(t) > MAX_NUMBER_CHARS:
        raise ValueError_(f"number longer than {MAX_NUMBER_CHARS} characters (ncnn: 'read "
                          f"value failed')", offset)
    if not _NUM_RE.fullmatch(t):
        raise ValueError_(f"invalid numeric value {t!r}", offset)
    if _is_float_text(t):
        with np.errstate(over="ignore"):
            f32 = np.float32(float(t))  # rounds like ncnn's cast: FLT_MAX spelled 3.40282347e38 is fine
        if not np.isfinite(f32):
            raise ValueError_(f"float {t!r} overflows float32", offset)
        return True, float(f32)
    v = int(t)
    if not INT32_MIN <= v <= INT32_MAX:
        raise ValueError_(f"int {t!r} does not fit in int32", offset)
    return False, v


def parse_key(text: str) -> tuple[int, bool]:
    """Return (param id, is_array_key) or raise ValueError_."""
    if len(text) > MAX_KEY_CHARS or not _INT_RE.fullmatch(text):
        raise ValueError_(f"invalid parameter id {text[:40]!r}")
    k = int(text)
    if k <= ARRAY_KEY_BASE:
        pid = ARRAY_KEY_BASE - k
        if pid > MAX_PARAM_ID:
            raise ValueError_(f"array id {k} out of range (-23300..-23331)")
        return pid, True
    if k == 0 and text.startswith("-"):
        return 0, False  # ncnn reads `-0=` as id 0
    if not 0 <= k <= MAX_PARAM_ID:
        raise ValueError_(f"parameter id {k} out of range (0..31; arrays -23300..-23331)")
    return k, False


def parse_value(key: str, text: str) -> tuple[int, Value]:
    """Parse the value text of one `key=text` token as ncnn 1.0.20261020 reads it."""
    pid, is_array_key = parse_key(key)
    if text.startswith('"'):
        if len(text) < 2 or not text.endswith('"') or '"' in text[1:-1]:
            raise ValueError_("unterminated or malformed quoted string")
        body = text[1:-1]
        if len(body.encode("utf-8", "surrogateescape")) > 255:
            raise ValueError_("string longer than 255 bytes")
        return pid, Value(Kind.STRING, body, True)
    if not text:
        raise ValueError_("missing value after '='")
    if is_array_key:
        comma = text.find(",")
        head = text if comma < 0 else text[:comma]
        if len(head) > MAX_NUMBER_CHARS or not _INT_RE.fullmatch(head) or int(head) < 0:
            raise ValueError_(f"array count {head[:40]!r} is not a non-negative int")
        count = int(head)
        n = text.count(",")
        if n != count:
            what = "fewer" if n < count else "more"
            raise ValueError_(f"array declares {count} elements but has {what} ({n})")
        if count > LONG_ARRAY:
            return pid, _parse_long_array(text, comma + 1, old_style=True)
        rest = text[comma + 1:] if comma >= 0 else ""
        vals: list = []
        floats = []
        off = len(head) + 1
        for e in (rest.split(",") if rest else ()):
            is_f, v = _parse_number(e, off)
            floats.append(is_f)
            vals.append(v)
            off += len(e) + 1
        # ncnn types an old-style array by its last element and keeps raw bits of the others;
        # a mixed array is representable only as written, so keep each element's own kind.
        if floats and floats[-1]:
            return pid, Value(Kind.FLOATS, tuple(float(v) for v in vals)) if all(floats) else \
                _Mixed(Kind.FLOATS, vals)
        if any(floats):
            return pid, _Mixed(Kind.INTS, vals)
        return pid, Value(Kind.INTS, tuple(vals))
    c0 = text[0]
    if c0.isalpha() and c0.isascii():
        # ncnn ends an unquoted string at whitespace only: `a"b` is the string a"b
        if len(text.encode("utf-8", "surrogateescape")) > 255:
            raise ValueError_("string longer than 255 bytes")
        return pid, Value(Kind.STRING, text, False)
    if "," in text:
        if text.endswith(",") and len(text) > 1:
            text = text[:-1]  # `0=5,` is a one-element array
        if len(text) > LONG_ARRAY:
            return pid, _parse_long_array(text, 0, old_style=False)
        parts = text.split(",")
        vals = []
        off = 0
        first_float = None
        for i, e in enumerate(parts):
            is_f, v = _parse_number(e, off)
            if first_float is None:
                first_float = is_f
            elif is_f and not first_float:
                raise ValueError_(f"invalid array element (index {i}): float in an int array", off)
            vals.append(float(np.float32(v)) if first_float else v)  # ncnn: strtof
            off += len(e) + 1
        return pid, Value(Kind.FLOATS if first_float else Kind.INTS, tuple(vals))
    is_f, v = _parse_number(text, 0)
    return pid, Value(Kind.FLOAT if is_f else Kind.INT, v)


_LONG_ELEMENT_RE = re.compile(rf"[^,]{{{MAX_NUMBER_CHARS + 1}}}")
_INT_CHARS = str.maketrans("", "", "0123456789+-,")  # translate() leaves what is not these
_NUMBER_CHARS = str.maketrans("", "", "0123456789+-.eE,")
LONG_ARRAY = 4096  # elements (old style) or characters (new style) for the chunked parser
_CHUNK = 1 << 16  # characters per chunk


def _chunks(text: str, pos: int) -> Iterator[tuple[int, str]]:
    """(offset, piece) of `text[pos:]` cut at commas into pieces of about _CHUNK characters."""
    n = len(text)
    while pos < n:
        end = text.find(",", pos + _CHUNK) if pos + _CHUNK < n else -1
        end = n if end < 0 else end
        yield pos, text[pos:end]
        pos = end + 1


def _parse_long_array(text: str, start: int, old_style: bool) -> Value:
    """The array elements in `text[start:]`, parsed a chunk at a time with numpy into one
    preallocated 4-byte-per-element array (ncnn's own layout: int32 or float32 bits), never
    a Python object or string per element. A chunk numpy cannot convert is re-parsed
    element by element to name the bad one."""
    count = text.count(",", start) + 1 if start < len(text) else 0
    bits = np.empty(count, dtype=np.int32)
    chunk_kinds: list[tuple[int, int, np.ndarray | bool]] = []  # (begin, end, is_float)
    first_float: bool | None = None
    n = 0
    for off, piece in _chunks(text, start):
        parts = piece.split(",")
        fl = [_is_float_text(p) for p in parts] if _is_float_text(piece) else [False]
        if first_float is None:
            first_float = fl[0]
        if not old_style and not first_float and any(fl):
            i = fl.index(True)
            raise ValueError_(f"invalid array element (index {n + i}): float in an int array",
                              off + sum(len(p) + 1 for p in parts[:i]))
        if not old_style:
            is_float: np.ndarray | bool = bool(first_float)
        elif any(fl):
            is_float = True if all(fl) and len(fl) == len(parts) else np.array(fl, dtype=bool)
        else:
            is_float = False
        _convert(parts, off, is_float, bits[n:n + len(parts)])
        chunk_kinds.append((n, n + len(parts), is_float))
        n += len(parts)
    if not old_style:
        return Packed(Kind.FLOATS if first_float else Kind.INTS, bits)
    any_f = any(k is not False for _, _, k in chunk_kinds)
    all_f = all(k is True for _, _, k in chunk_kinds)
    if all_f and chunk_kinds:
        return Packed(Kind.FLOATS, bits)
    if not any_f:
        return Packed(Kind.INTS, bits)
    mask = np.zeros(count, dtype=bool)
    for b, e, k in chunk_kinds:
        mask[b:e] = k
    last_float = _is_float_text(text[text.rfind(",") + 1:])
    return Packed(Kind.FLOATS if last_float else Kind.INTS, bits, mask)


def _convert(parts: list[str], offset: int, is_float: "np.ndarray | bool",
             out: np.ndarray) -> None:
    """Convert one chunk's elements into `out` (int32 bits; a float element's float32 bits);
    `is_float` is the kind of every element or, for a mixed chunk, of each."""
    # numpy converts what Python's int()/float() accept; restricted to these characters
    # and with no empty or over-long element that is exactly ncnn's number syntax
    piece = ",".join(parts)
    try:
        if _LONG_ELEMENT_RE.search(piece) or "" in parts:
            raise ValueError
        if not isinstance(is_float, bool):  # a mixed chunk: ints are exact in float64
            if piece.translate(_NUMBER_CHARS):
                raise ValueError
            wide = np.array(parts, dtype=np.float64)
            ints = wide[~is_float]
            if ints.size and (ints.min() < INT32_MIN or ints.max() > INT32_MAX):
                raise ValueError
            with np.errstate(over="ignore"):
                floats = wide[is_float].astype(np.float32)
            if not np.isfinite(floats).all():
                raise ValueError
            out[~is_float] = ints.astype(np.int32)
            out[is_float] = floats.view(np.int32)
            return
        if is_float:
            if piece.translate(_NUMBER_CHARS):
                raise ValueError
            with np.errstate(over="ignore"):
                arr = np.array(parts, dtype=np.float64).astype(np.float32)
            if not np.isfinite(arr).all():
                raise ValueError
            out[:] = arr.view(np.int32)
            return
        if piece.translate(_INT_CHARS):
            raise ValueError
        wide = np.array(parts, dtype=np.int64)
        if wide.size and (wide.min() < INT32_MIN or wide.max() > INT32_MAX):
            raise ValueError
        out[:] = wide
    except (ValueError, OverflowError):
        off = offset
        for i, e in enumerate(parts):
            elem_float, v = _parse_number(e, off)
            want_float = is_float if isinstance(is_float, bool) else bool(is_float[i])
            if want_float:
                out[i:i + 1] = np.array([v], dtype=np.float32).view(np.int32)
            else:
                out[i] = v
            off += len(e) + 1


class _Mixed(Value):
    """An old-style array mixing int and float elements. ncnn loads it but reinterprets the
    bits of the minority elements; we keep it as written and lint flags it."""

    def __init__(self, kind: Kind, values: Sequence) -> None:
        super().__init__(kind, tuple(values))

    @property
    def mixed(self) -> bool:
        return True


class Packed(Value):
    """A long array held as ncnn holds it: one int32 array of element bits (float32 bits for
    float elements), 4 bytes per element, with a per-element float mask only for a mixed
    old-style array. `value` builds the Python tuple on demand, so loading, checking and
    writing a 2-million-element array never makes an object per element."""

    bits: np.ndarray
    float_mask: np.ndarray | None

    def __init__(self, kind: Kind, bits: np.ndarray, float_mask: np.ndarray | None = None) -> None:
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "quoted", False)
        object.__setattr__(self, "bits", bits)
        object.__setattr__(self, "float_mask", float_mask)

    @property
    def mixed(self) -> bool:
        return self.float_mask is not None

    def __len__(self) -> int:
        return len(self.bits)

    def chunks(self, size: int = 1 << 15) -> Iterator[list]:
        """The elements as Python values (each with its own kind), `size` at a time."""
        bits, mask = self.bits, self.float_mask
        for b in range(0, len(bits), size):
            part = bits[b:b + size]
            if mask is None:
                yield (part.view(np.float32) if self.kind is Kind.FLOATS else part).tolist()
            else:
                m = mask[b:b + size]
                fl, it = part.view(np.float32).tolist(), part.tolist()
                yield [f if is_f else i for f, i, is_f in zip(fl, it, m.tolist())]

    @property  # type: ignore[override]
    def value(self) -> tuple:
        return tuple(chain.from_iterable(self.chunks()))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Packed):
            mine, theirs = self.float_mask, other.float_mask
            same_mask = (mine is None and theirs is None) or (
                mine is not None and theirs is not None and np.array_equal(mine, theirs))
            return (self.kind is other.kind and np.array_equal(self.bits, other.bits)
                    and same_mask)
        if isinstance(other, Value):
            return (self.kind is other.kind and not other.quoted
                    and self.value == other.value and is_mixed(other) == self.mixed)
        return NotImplemented

    def __hash__(self) -> int:
        return hash((self.kind, self.value, self.quoted))  # as the dataclass hashes a Value


def is_mixed(value: Value) -> bool:
    return isinstance(value, _Mixed) or (isinstance(value, Packed) and value.mixed)


def int_list(v: Value) -> list[int] | None:
    """An int or int-array value as a list of ints; None for any other kind."""
    if v.kind is Kind.INT and isinstance(v.value, int):
        return [v.value]
    if v.kind is Kind.INTS and isinstance(v.value, tuple):
        return list(v.value)
    return None
