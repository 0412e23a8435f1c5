"""A layer's param list: an ordered id → typed value mapping that remembers each token's
original text, so an unedited token is written back exactly as it was read.

Parsing is lazy: loading a 100k-layer file only validates the syntax of each line (one regex
per line); values are typed the first time a layer's params are read or edited.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any, Iterable, Iterator, Sequence, cast

from paramsurgery.core.values import (Kind, PyValue, Value, ValueError_, format_value, infer, parse_value,
                                      pnnx_order_key)

if TYPE_CHECKING:
    from paramsurgery.ir.layer import Layer

# one `key=value` token; a quoted value may contain spaces (ncnn-format.md §1.6)
TOKEN_RE = re.compile(r'([^\s=]+)=("[^"\r\n]*"|\S+)')


# Parsed tokens by their text: a graph repeats the same few hundred `k=v` tokens across
# thousands of layers, and `Value`s are immutable, so each distinct token is parsed once.
# Bounded so a long-running process loading many files does not grow without limit.
_PARSED: dict[str, tuple[int, Value]] = {}
_PARSED_MAX = 1 << 16
_PARSED_TOKEN_MAX = 128  # longer tokens (long arrays) are rare and would pin big strings

# Parsed lines by their text, shared copy-on-write: most layers of a graph repeat a param line
# another layer has (every BinaryOp add, every block's Gemm), so reading a 100k-layer graph's
# params parses each distinct line once and allocates nothing per layer. A Params reading a
# shared line owns nothing until it is edited (`_owned`).
_LINES: dict[str, tuple[dict[int, "_Entry"], Sequence["_Entry"]]] = {}
_LINES_MAX = 1 << 14
_LINE_TEXT_MAX = 512  # longer lines (long arrays) are rarely repeated


def _tokens(text: str) -> list[tuple[int, int, str, str]]:
    """(start, end, key, value text) of every `k=v` token, as TOKEN_RE finds them; a plain
    whitespace split when every token has that shape and no quoted string (which may hold
    spaces) is involved."""
    if '"' not in text:
        out = []
        pos = 0
        for token in text.split():
            key, _, value = token.partition("=")
            if not key or not value:
                break
            start = text.find(token, pos)
            pos = start + len(token)
            out.append((start, pos, key, value))
        else:
            return out
    return [(m.start(), m.end(), m.group(1), m.group(2)) for m in TOKEN_RE.finditer(text)]


class _Entry:
    __slots__ = ("pid", "value", "_text", "_src", "_start", "_end")

    def __init__(self, pid: int, value: Value, text: str | None, src: str | None = None,
                 start: int = 0, end: int = 0) -> None:
        self.pid = pid
        self.value = value
        # the original `k=v` token, None once edited; read from the param text on demand
        # (`src[start:end]`) so a long array's text is held once
        self._text = text
        self._src, self._start, self._end = src, start, end

    @property
    def text(self) -> str | None:
        if self._src is not None:
            return self._src[self._start:self._end]
        return self._text

    @text.setter
    def text(self, value: str | None) -> None:
        self._text, self._src = value, None

    def render(self) -> str:
        return self.text if self.text is not None else format_value(self.pid, self.value)


class Params:
    """Ordered mapping param id (0..31) → value. `params[0]` gives the plain Python value;
    `params.value(0)` the typed `Value`. Assignments keep the int/float kind of an existing
    param (see `values.infer`)."""

    __slots__ = ("_text", "_entries", "_dupes", "_owner", "edited", "_shared")

    def __init__(self, text: str = "", owner: "Layer | None" = None) -> None:
        self._text = text  # the param part of the line, parsed on first use
        self._entries: dict[int, _Entry] | None = None if text.strip() else {}
        # earlier tokens of a duplicated id (ncnn: last wins); a tuple, replaced (never
        # appended to) on edits, so the common empty one is shared
        self._dupes: Sequence[_Entry] = ()
        self._owner = owner
        self.edited = False
        self._shared = False  # `_entries` / `_dupes` are `_LINES`' (read them, never edit)

    # ------------------------------------------------------------------ parsing
    def _load(self) -> dict[int, _Entry]:
        """The entries, for reading (they may be shared with other layers: edit through
        `_owned`)."""
        entries = self._entries
        if entries is None:
            src = self._text
            shared = _LINES.get(src)
            if shared is not None:
                self._entries, self._dupes = shared
                self._shared = True
                return shared[0]
            entries = {}
            dupes: list[_Entry] = []
            for start, end, key, text in _tokens(src):
                token = src[start:end] if end - start <= _PARSED_TOKEN_MAX else None
                parsed = _PARSED.get(token) if token is not None else None
                if parsed is None:
                    try:
                        parsed = parse_value(key, text)
                    except ValueError_ as exc:  # the loader validated the syntax; semantic
                        raise _located(self, src[start:end], len(key) + 1 + exc.offset,
                                       str(exc)) from None
                    if token is not None:
                        if len(_PARSED) >= _PARSED_MAX:
                            _PARSED.clear()
                        _PARSED[token] = parsed
                pid, value = parsed
                old = entries.pop(pid, None)
                if old is not None:
                    dupes.append(old)
                entries[pid] = _Entry(pid, value, None, src, start, end)
            self._entries = entries
            if dupes:
                self._dupes = tuple(dupes)
            if len(src) <= _LINE_TEXT_MAX:
                if len(_LINES) >= _LINES_MAX:
                    _LINES.clear()
                _LINES[src] = (entries, self._dupes)
                self._shared = True
        return entries

    def _owned(self) -> dict[int, _Entry]:
        """The entries, this Params' own (copied from the shared line first): for editing."""
        entries = self._load()
        if self._shared:
            entries = {pid: _Entry(e.pid, e.value, e._text, e._src, e._start, e._end)
                       for pid, e in entries.items()}
            self._dupes = tuple(_Entry(e.pid, e.value, e._text, e._src, e._start, e._end)
                                for e in self._dupes)
            self._entries = entries
            self._shared = False
        return entries

    def check(self) -> None:
        """Parse every value now (raises ParamSyntaxError on a semantic error)."""
        self._load()

    # ------------------------------------------------------------------ reading
    def __contains__(self, pid: object) -> bool:
        return pid in self._load()

    def __iter__(self) -> Iterator[int]:
        return iter(self._load())

    def __len__(self) -> int:
        return len(self._load())

    def __getitem__(self, pid: int) -> PyValue:
        return self._load()[pid].value.python

    def get(self, pid: int, default: PyValue | None = None) -> PyValue | None:
        e = self._load().get(pid)
        return default if e is None else e.value.python

    def get_int(self, pid: int, default: int = 0) -> int:
        """The param as an int (`int(p.get(pid, default))`, typed): a float is truncated, a
        list or a string that is not a number raises."""
        return int(cast(Any, self.get(pid, default)))

    def get_float(self, pid: int, default: float = 0.0) -> float:
        """The param as a float (`float(p.get(pid, default))`, typed)."""
        return float(cast(Any, self.get(pid, default)))

    def get_ints(self, pid: int) -> list[int] | None:
        """An array param as ints (a scalar: a list of one); None when absent."""
        v = self.get(pid)
        if v is None:
            return None
        return [int(x) for x in v] if isinstance(v, list) else [int(cast(Any, v))]

    def value(self, pid: int) -> Value | None:
        e = self._load().get(pid)
        return None if e is None else e.value

    def kind(self, pid: int) -> Kind | None:
        e = self._load().get(pid)
        return None if e is None else e.value.kind

    def items(self) -> Iterator[tuple[int, PyValue]]:
        for pid, e in self._load().items():
            yield pid, e.value.python

    def values_typed(self) -> Iterator[tuple[int, Value]]:
        for pid, e in self._load().items():
            yield pid, e.value

    def to_dict(self) -> dict[int, PyValue]:
        return dict(self.items())

    def source_text(self) -> str | None:
        """The text these params were read from, while it still states them exactly (nothing
        edited since); None for edited params or ones built in memory. Layers of one type
        with the same source text have the same params, so a verdict about one holds for
        all (lint parses each distinct line once)."""
        if self.edited or (self._entries and not self._text.strip()):
            return None
        return self._text

    @classmethod
    def of_values(cls, values: Iterable[tuple[int, Value]], owner: "Layer | None" = None) -> "Params":
        """Params holding typed values with no source text (a binary reader's): written back
        from the values' bits. The ids must be distinct."""
        p = cls("", owner)
        p._entries = {pid: _Entry(pid, v, None) for pid, v in values}
        return p

    def forget_tokens(self) -> None:
        """Drop the text each value was spelled with, so an edit re-encodes every value from
        its bits (a reader whose source was binary: the text was only made up from them)."""
        for e in self._owned().values():
            e.text = None
        for e in self._dupes:
            e.text = None

    def encoding(self) -> list[tuple[int, Value, str | None]]:
        """(id, typed value, original token or None once edited) in order, last of a
        duplicated id only: what a writer encodes."""
        return [(e.pid, e.value, e.text) for e in self._load().values()]

    def may_hold(self, pid: int) -> bool:
        """False when `pid` is certainly absent, tested on the unparsed text where it has not
        been parsed yet (a cheap filter before `get`)."""
        if self._entries is not None:
            return pid in self._entries
        return f"{-23300 - pid}=" in self._text or f"{pid}=" in self._text

    @property
    def has_duplicates(self) -> bool:
        self._load()
        return bool(self._dupes)

    # ------------------------------------------------------------------ editing
    def set(self, pid: int, value: object) -> "Params":
        """Set param `pid`. An existing param keeps its position and int/float kind; a new one
        is placed where pnnx would put it (keys sorted as decimal strings)."""
        if not isinstance(pid, int) or not 0 <= pid <= 31:
            raise ValueError(f"param id must be 0..31, got {pid!r}")
        entries = self._owned()
        old = entries.get(pid)
        like = old.value if old else self._schema_value(pid)
        new_value = infer(value, like=like)
        if old is not None:
            if old.value == new_value and type(old.value) is type(new_value):
                return self
            old.value = new_value
            old.text = None
        else:
            self._insert_sorted(entries, _Entry(pid, new_value, None))
        self._dupes = tuple(d for d in self._dupes if d.pid != pid)
        self._touch()
        return self

    def _schema_value(self, pid: int) -> Value | None:
        """A placeholder of the kind ncnn's load_param reads for this id, if known."""
        if self._owner is None:
            return None
        from paramsurgery.core.layer_params import param_kind

        kind = param_kind(self._owner.type, pid)
        if kind is None:
            return None
        return Value(kind, () if kind.is_array else ("" if kind is Kind.STRING else 0))

    def __setitem__(self, pid: int, value: object) -> None:
        self.set(pid, value)

    def remove(self, pid: int) -> "Params":
        # a shared line is copied only when something changes (`_owned`)
        if pid in self._load() or any(d.pid == pid for d in self._dupes):
            self._owned().pop(pid, None)
            self._dupes = tuple(d for d in self._dupes if d.pid != pid)
            self._touch()
        return self

    def move_first(self, pid: int) -> "Params":
        """Put param `pid` first on the line (ncnnoptimize writes `-23330=` hints there)."""
        current = self._load()
        if pid in current and next(iter(current)) != pid:
            entries = self._owned()
            first = entries.pop(pid)
            rest = list(entries.values())
            entries.clear()
            entries[pid] = first
            entries.update((e.pid, e) for e in rest)
            self._touch()
        return self

    def __delitem__(self, pid: int) -> None:
        if pid not in self._load():
            raise KeyError(pid)
        self.remove(pid)

    def normalize(self) -> "Params":
        """Re-render every value in pnnx style and sort ids as pnnx does (for `fmt`)."""
        current = self._load()
        ordered = sorted(current, key=pnnx_order_key)
        stale = [pid for pid in ordered if current[pid].text is not None
                 and current[pid].text != format_value(pid, current[pid].value)]
        if ordered == list(current) and not self._dupes and not stale:
            return self  # already as pnnx writes it: a shared line stays shared
        entries = self._owned()
        for pid in stale:
            entries[pid].text = None
        self._entries = {pid: entries[pid] for pid in ordered}
        self._dupes = ()
        self._touch()
        return self

    def _insert_sorted(self, entries: dict[int, _Entry], new: _Entry) -> None:
        key = pnnx_order_key(new.pid)
        items = list(entries.values())
        pos = len(items)
        for i, e in enumerate(items):
            if pnnx_order_key(e.pid) > key:
                pos = i
                break
        items.insert(pos, new)
        entries.clear()
        entries.update((e.pid, e) for e in items)

    def _touch(self) -> None:
        self.edited = True
        if self._owner is not None:
            self._owner._mark_edited()

    # ------------------------------------------------------------------ writing
    def tokens(self) -> list[str]:
        """The `k=v` tokens as they will be written (original text where unedited)."""
        if self.source_text() is not None:
            text = self._text  # no need to parse values
            return [text[start:end] for start, end, _, _ in _tokens(text)]
        entries = self._load()
        if not self._dupes:
            return [e.render() for e in entries.values()]
        # keep duplicates where they were (only while the line is unedited)
        return [m.group(0) for m in TOKEN_RE.finditer(self._text)] if not self.edited else \
            [e.render() for e in entries.values()]

    def copy(self, owner: "Layer | None" = None) -> "Params":
        p = Params("", owner)
        p._entries = {pid: _Entry(e.pid, e.value, e.text) for pid, e in self._load().items()}
        return p

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Params):
            return NotImplemented
        return {k: v for k, v in self.values_typed()} == {k: v for k, v in other.values_typed()}

    def __repr__(self) -> str:
        return "Params(" + " ".join(self.tokens()) + ")"


def _located(params: Params, token: str, offset: int, message: str):
    """A ParamSyntaxError at the token's column in the layer's source line (if known)."""
    from paramsurgery.core.errors import ParamSyntaxError

    owner = params._owner
    if owner is None or owner.source_line is None:
        return ParamSyntaxError(f"{message} in {token!r}")
    col = None
    # a text origin's record (any origin with a `body`), while it still is the layer's text
    body = None if owner.edited else getattr(owner.origin, "body", None)
    if body is not None:
        line_no = owner.source_line
        lines = body.split("\n")
        # the param list is on the record's last line, after the blob names
        last = lines[-1]
        skip = 0 if len(lines) > 1 else 4 + len(owner._inputs) + len(owner._outputs)
        pos = 0
        for m in re.finditer(r"\S+", last):
            if skip == 0:
                break
            skip -= 1
            pos = m.end()
        hit = last.find(token, pos)
        if hit >= 0:
            col = hit + offset + 1
            line_no = owner.source_line + len(lines) - 1
        return ParamSyntaxError(message, file=owner.source_file, line=line_no, col=col)
    return ParamSyntaxError(message, file=owner.source_file, line=owner.source_line)
