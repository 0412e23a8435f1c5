"""One ncnn layer: type, name, ordered bottoms/tops, params, and where it came from.

The record's source text belongs to the format that read it (`origin`, opaque to the IR);
the IR only tracks whether the layer was edited since.

Bottoms and tops are tuples (one allocation each, and `inputs`/`outputs` hand them out
without a copy); rewiring goes through `Graph`, which replaces them, so the blob indexes
(and the networkx view, once built) stay consistent.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

from paramsurgery.ir.params import Params

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph


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
    @property
    def type(self) -> str:
        return self._type

    @type.setter
    def type(self, value: str) -> None:
        self._set_token("_type", value, "layer type")

    @property
    def name(self) -> str:
        return self._name

    @name.setter
    def name(self, value: str) -> None:
        self._set_token("_name", value, "layer name")

    def _set_token(self, field: str, value: str, what: str) -> None:
        """Set the type or the name; the graph (when attached) re-indexes the layer first."""
        _check_token(value, what)
        if value != getattr(self, field):
            if self.graph is not None:
                reindex = self.graph._retype_layer if field == "_type" else self.graph._rename_layer
                reindex(self, value)
            setattr(self, field, value)
            self._mark_edited()

    @property
    def inputs(self) -> tuple[str, ...]:
        return self._inputs

    @property
    def outputs(self) -> tuple[str, ...]:
        return self._outputs

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
