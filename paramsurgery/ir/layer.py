"""One ncnn layer: type, name, ordered bottoms/tops, params, and where it came from.

The record's source text belongs to the format that read it (`origin`, opaque to the IR);
the IR only tracks whether the layer was edited since.

Bottoms and tops are tuples (one allocation each, and `inputs`/`outputs` hand them out
without a copy); rewiring goes through `Graph`, which replaces them, so the blob indexes
(and the networkx view, once built) stay consistent.
"""

from __future__ import annotations

from operator import attrgetter
from typing import TYPE_CHECKING, Any, Protocol, Sequence, TypeVar

from paramsurgery.ir.params import Params

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph

T_co = TypeVar("T_co", covariant=True)


class _Getter(Protocol[T_co]):
    """What type checkers see of a read-only slot behind a C-level getter."""

    def __get__(self, obj: Any, owner: Any = None) -> T_co: ...


class _Token(Protocol):
    """What type checkers see of the type and the name: read as a str, set as a str."""

    def __get__(self, obj: Any, owner: Any = None) -> str: ...

    def __set__(self, obj: Any, value: str) -> None: ...


def _token(slot: str, what: str) -> _Token:
    """A layer's type or name: its slot, set through `Layer._set_token` (`what` names it in
    the error for a bad token)."""
    def set_token(self: "Layer", value: str) -> None:
        self._set_token(slot, value, what)

    return property(attrgetter(slot), set_token)  # type: ignore[return-value]


class Layer:
    __slots__ = ("id", "_type", "_name", "_inputs", "_outputs", "params", "graph",
                 "source_file", "source_line", "origin", "_edited", "weights", "_meta")

    def __init__(self, type: str, name: str, inputs: Sequence[str], outputs: Sequence[str],
                 params: Params | None = None) -> None:
        self.id = -1
        self._type = type
        self._name = name
        self._inputs: tuple[str, ...] = tuple(inputs)
        self._outputs: tuple[str, ...] = tuple(outputs)
        self.params = params if params is not None else Params()
        self.params._owner = self
        self.graph: Graph | None = None
        self.source_file: str | None = None
        self.source_line: int | None = None
        # what the reader needs to write the record back as it was (its text, the blank
        # lines before it, its line end): owned by the format that read it, opaque here
        self.origin: Any = None
        self._edited = False
        self.weights: Any = None  # filled by the .bin reader (paramsurgery.formats.weights)
        self._meta: dict | None = None  # made on first use: most layers never have any

    @property
    def meta(self) -> dict:
        """Free-form facts readers attach to the layer (the `.param.bin` record offset...)."""
        if self._meta is None:
            self._meta = {}
        return self._meta

    @meta.setter
    def meta(self, value: dict) -> None:
        self._meta = value

    def meta_value(self, key: str, default: Any = None) -> Any:
        """`meta.get(key)` without making an empty dict for a layer that has none."""
        return self._meta.get(key, default) if self._meta else default

    # ------------------------------------------------------------------ identity
    # type and name: read as the slot itself (a C-level getter, cheaper than a property
    # function on the hot paths of load and lint), set through `_set_token` (checked, and
    # re-indexed in the graph); bottoms and tops are read-only here (rewired by Graph)
    type = _token("_type", "layer type")
    name = _token("_name", "layer name")
    inputs: "_Getter[tuple[str, ...]]" = property(attrgetter("_inputs"))  # type: ignore[assignment]
    outputs: "_Getter[tuple[str, ...]]" = property(attrgetter("_outputs"))  # type: ignore[assignment]

    def _set_token(self, field: str, value: str, what: str) -> None:
        """Set the type or the name; the graph (when attached) re-indexes the layer first."""
        _check_token(value, what)
        if value != getattr(self, field):
            if self.graph is not None:
                reindex = self.graph._retype_layer if field == "_type" else self.graph._rename_layer
                reindex(self, value)
            setattr(self, field, value)
            self._mark_edited()

    # ------------------------------------------------------------------ state
    @property
    def edited(self) -> bool:
        """Changed since it was read (or made in memory): its record must be rendered."""
        return self._edited or self.origin is None

    def _mark_edited(self) -> None:
        self._edited = True
        if self.graph is not None:
            self.graph._modified = True

    def set(self, pid: int, value: object) -> "Layer":
        """Set a param; returns the layer so edits chain."""
        self.params.set(pid, value)
        return self

    def unset(self, pid: int) -> "Layer":
        self.params.remove(pid)
        return self

    def where(self) -> str:
        """`file:line` of this layer's source line, or its name for layers made in memory."""
        if self.source_line is None:
            off = self._meta.get("param_bin_offset") if self._meta else None
            if off is not None:  # read from a .param.bin: no lines, a record offset
                return (f"{self.source_file or '<input>'}: layer #{self.meta['param_bin_index']}"
                        f" at byte {off}")
            return f"<new layer {self._name}>"
        return f"{self.source_file or '<input>'}:{self.source_line}"

    # ------------------------------------------------------------------ text
    def render(self) -> str:
        """The layer line in pnnx's layout (`%-24s %-24s %d %d`, single spaces)."""
        parts = ["%-24s %-24s %d %d" % (self._type, self._name, len(self._inputs),
                                         len(self._outputs))]
        parts.extend(self._inputs)
        parts.extend(self._outputs)
        parts.extend(self.params.tokens())
        return " ".join(parts)

    def __repr__(self) -> str:
        return (f"Layer({self._type} {self._name} {' '.join(self._inputs)} -> "
                f"{' '.join(self._outputs)} {' '.join(self.params.tokens())})").replace("  ", " ")


def _check_token(value: str, what: str) -> None:
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) <= 63 and value.isprintable() and " " not in value:
        return  # the common case, checked in C: every other whitespace is unprintable
    if any(c.isspace() for c in value):
        raise ValueError(f"{what} {value!r} contains whitespace")
    if len(value.encode("utf-8", "surrogateescape")) > 255:
        raise ValueError(f"{what} {value!r} is longer than 255 bytes")
