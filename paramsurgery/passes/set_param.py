"""Typed param overrides (`paramsurgery set-param`).

Replaces the hand-written flags of per-model patchers that rewrite one param by string
surgery (`--rotary-param0`, `--softmax-axis`, the Concat axis fixes, `--fix-sdpa-output-permute`):

    paramsurgery set-param m.param --type Softmax axis=-1 1=1
    paramsurgery set-param m.param --layer cat_2 cat_5 0=1
    paramsurgery set-param m.param --type Concat --where 0=2 0=1     # only Concats with 0=2

- An assignment is `ID=VALUE`: ID is the param id (`0`), its array key (`-23300`) or its name
  in `layer_params` (`axis`, `kv_cache`); VALUE is typed by what the layer's `load_param`
  reads: a float param set to `1` is written `1.0`, an int param refuses `1.5`, an array
  param takes `1,2,3` (or one element), a string param takes the text (quotes optional).
- An id the layer type does not read is refused unless `force` (then VALUE is typed the way
  ncnn's parser would type the text).
- A change to how many bytes the layer reads from the `.bin` (Convolution `0=`, `5=`, `6=`,
  ...) is refused unless `force`: the `.bin` has no index and every later weight would shift.
- Every edited layer is loaded by ncnn's own `load_param` (the layer alone, fed by an `Input`);
  a layer ncnn rejects is refused with ncnn's message, naming the layer.

The report gives `layer: id(name): before -> after` per edit; setting a value a layer already
has changes nothing (idempotent).
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import KW_ONLY
from typing import Any, Sequence, cast

from paramsurgery.core.match import MatchFailure
from paramsurgery.analysis.contracts import arity_problem, param_problem
from paramsurgery.core.errors import PassRefused
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.ir.params import Params
from paramsurgery.core.layer_params import LAYER_PARAMS, param_default, param_info, param_name
from paramsurgery.core.layer_types import is_ncnn_layer
from paramsurgery.core.values import (ARRAY_KEY_BASE, Float, Floats, Int, Ints, Kind, Str, Value, ValueError_,
                                      parse_value, pnnx_float)
from paramsurgery.core.changes import Change
from paramsurgery.passes.base import Pass, PassResult


# ============================================================================ assignments

def resolve_key(layer_type: str, key: str) -> tuple[int, bool]:
    """`0`, `-23300` or a param name (`axis`) → (param id, known to the type)."""
    key = key.strip()
    try:
        k = int(key)
    except ValueError:
        for pid, info in LAYER_PARAMS.get(layer_type, {}).items():
            if info.name == key:
                return pid, True
        names = ", ".join(f"{p}={i.name}" for p, i in LAYER_PARAMS.get(layer_type, {}).items())
        raise PassRefused(f"{layer_type} has no param named {key!r}"
                          + (f" (it reads {names})" if names else " (it reads no params)")) \
            from None
    pid = ARRAY_KEY_BASE - k if k <= ARRAY_KEY_BASE else k
    if not 0 <= pid <= 31:
        raise PassRefused(f"param id {key!r} out of range (0..31; arrays -23300..-23331)")
    return pid, param_info(layer_type, pid) is not None


def _strip_quotes(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == '"':
        return text[1:-1]
    return text


def _numbers(text: str, pid: int, what: str) -> list[int | float]:
    out: list[int | float] = []
    for i, part in enumerate(p for p in text.split(",") if p != ""):
        try:
            _, v = parse_value(str(pid), part)
        except ValueError_ as exc:
            raise PassRefused(f"{what}: element {i} {part!r}: {exc}") from None
        if v.kind not in (Kind.INT, Kind.FLOAT):
            raise PassRefused(f"{what}: element {i} {part!r} is not a number")
        out.append(cast("int | float", v.value))  # a number: its kind is checked above
    return out


def typed_value(layer_type: str, pid: int, text: str, *, force: bool = False,
                key: str | None = None) -> Value:
    """The value `text` gives param `pid` of `layer_type`, typed as ncnn's load_param reads it.
    With an array key (`key` = `-23303`) the text is old-style, count first (`1,0`)."""
    what = f"{layer_type} {param_name(layer_type, pid)}={text!r}"
    info = param_info(layer_type, pid)
    array_key = key is not None and key.strip().lstrip("-").isdigit() and \
        int(key) <= ARRAY_KEY_BASE
    if info is None or array_key:
        if info is None and not force:
            raise PassRefused(f"{layer_type} does not read param {pid} (its load_param ignores "
                              f"it); use --force to write it anyway")
        try:
            parsed = parse_value(key.strip() if key is not None and array_key else str(pid),
                                 text)[1]
        except ValueError_ as exc:
            raise PassRefused(f"{what}: {exc}") from None
        if info is None:
            return parsed
        if not info.kind.is_array:
            raise PassRefused(f"{what}: {info.kind.value} param, but {key} is an array key")
        text = ",".join(str(v) for v in cast(tuple, parsed.value))
    kind = info.kind
    if kind is Kind.STRING:
        try:
            return Str(_strip_quotes(text))
        except ValueError as exc:
            raise PassRefused(f"{what}: {exc}") from None
    text = _strip_quotes(text)
    if kind.is_array:
        vals = _numbers(text, pid, what)
        if kind is Kind.FLOATS:
            return Floats([float(v) for v in vals])
        bad = [v for v in vals if not float(v).is_integer()]
        if bad:
            raise PassRefused(f"{what}: {kind.value} param, but {bad[0]!r} is not an integer")
        return Ints([int(v) for v in vals])
    if text == "":
        raise PassRefused(f"{what}: missing value (use --unset {pid} to remove the param)")
    vals = _numbers(text, pid, what)
    if len(vals) != 1 or "," in text:
        raise PassRefused(f"{what}: {kind.value} param, but the value is a list")
    v = vals[0]
    if kind is Kind.FLOAT:
        try:
            return Float(float(v))
        except ValueError as exc:
            raise PassRefused(f"{what}: {exc}") from None
    if not float(v).is_integer():
        raise PassRefused(f"{what}: int param, but {v!r} is not an integer (ncnn would read "
                          f"its default)")
    try:
        return Int(int(v))
    except ValueError as exc:
        raise PassRefused(f"{what}: {exc}") from None


def split_assignment(text: str) -> tuple[str, str]:
    key, eq, value = text.partition("=")
    if not eq or not key:
        raise PassRefused(f"expected ID=VALUE, got {text!r}")
    return key, value


def show(value: Value | None, layer_type: str = "", pid: int = -1) -> str:
    """A value as the report prints it (`2`, `1.0`, `[1,2]`, `"0w,-1"`, `absent (default 0)`)."""
    if value is None:
        d = param_default(layer_type, pid) if layer_type else None
        if d is None or not isinstance(d, (int, float, str)):
            return "absent"
        return f"absent (default {d!r})" if isinstance(d, str) else f"absent (default {d})"
    k, v = value.kind, value.value
    if k is Kind.INT:
        return str(v)
    if k is Kind.FLOAT:
        return pnnx_float(float(cast(Any, v)))
    if isinstance(v, tuple):
        return "[" + ",".join(str(x) if k is Kind.INTS else pnnx_float(x) for x in v) + "]"
    return f'"{v}"'


def apply_params(layer: Layer, assignments: Sequence[str], *, force: bool = False
                 ) -> list[tuple[int, Value | None, Value]]:
    """Parse and set `ID=VALUE` assignments on a layer; returns (id, before, after) for the
    params that changed."""
    parsed: list[tuple[int, Value]] = []
    for text in assignments:
        key, value = split_assignment(text)
        pid, known = resolve_key(layer.type, key)
        if not known and not force:
            raise PassRefused(f"{layer.type} does not read param {key} (its load_param ignores "
                              f"it); use --force to write it anyway")
        parsed.append((pid, typed_value(layer.type, pid, value, force=force, key=key)))
    changed = []
    for pid, new in parsed:
        old = layer.params.value(pid)
        if old is not None and old == new and type(old) is type(new):
            continue
        layer.set(pid, new)
        changed.append((pid, old, new))
    return changed


# ============================================================================ ncnn's verdict

def _capture_stderr(fn):
    """Run fn() with the C-level stderr redirected; returns (result, captured text)."""
    import sys

    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            result = fn()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        tmp.seek(0)
        text = tmp.read().decode("utf-8", "replace")
    return result, text


def ncnn_load_error(layer: Layer) -> str | None:
    """None when ncnn's `load_param` accepts this layer (alone, its bottoms fed by one
    `Input`), else ncnn's message. Types ncnn does not have are not checked (None)."""
    if not is_ncnn_layer(layer.type):
        return None
    import ncnn

    bottoms = list(dict.fromkeys(layer.inputs))
    lines = []
    if bottoms:
        lines.append(f"Input __paramsurgery_in 0 {len(bottoms)} " + " ".join(bottoms))
    lines.append(layer.render())
    blobs = len(set(bottoms) | set(layer.outputs))
    text = f"7767517\n{len(lines)} {max(blobs, 1)}\n" + "\n".join(lines) + "\n"
    net = ncnn.Net()
    ret, err = _capture_stderr(lambda: net.load_param_mem(text))
    if ret == 0:
        return None
    msg = "; ".join(ln.strip() for ln in err.splitlines() if ln.strip())
    return msg or f"load_param returned {ret}"


def check_loads(layer: Layer) -> None:
    """Refuse (naming the layer) when ncnn's load_param rejects it."""
    err = ncnn_load_error(layer)
    if err is not None:
        raise PassRefused(f"ncnn's load_param rejects layer {layer.name!r} "
                          f"({' '.join([layer.type] + layer.params.tokens())}): {err}",
                          file=layer.source_file, line=layer.source_line)


def contract_error(layer: Layer) -> str | None:
    """What the edited layer breaks of ncnn's run-time contract (the table validate's PS113
    and PS114 read: bottoms/tops its params fix, params that contradict each other), or
    None."""
    return arity_problem(layer) or param_problem(layer)


def _reads(layer_type: str, params: "Params") -> "str | list[tuple[str, int, str]] | None":
    """What the weight schema reads for these params, an error text, or None (no weights)."""
    from paramsurgery.formats.weights.schema import SchemaError, reads_for

    try:
        reads = reads_for(layer_type, params)
    except SchemaError as exc:
        return f"error: {exc.message}"
    if reads is None:
        return None
    return [(r.role, r.count, r.mode) for r in reads]


def _fmt_reads(reads: str | Sequence[tuple[str, int, str]] | None) -> str:
    if isinstance(reads, str):
        return reads
    if not reads:
        return "nothing"
    return ", ".join(f"{role}[{count}]" for role, count, _ in reads)


# ============================================================================ the pass

class SetParam(Pass, name="set-param",
               summary="typed param overrides on layers picked by name or type (checked by ncnn's "
                       "load_param)"):
    assignments: Sequence[str] = ()
    _: KW_ONLY
    layers: Sequence[str] = ()
    types: Sequence[str] = ()
    unset: Sequence[str] = ()
    where: Sequence[str] = ()
    force: bool = False

    def __post_init__(self) -> None:
        if not self.layers and not self.types:
            raise PassRefused("say which layers: --layer NAME... or --type TYPE...")
        if not self.assignments and not self.unset:
            raise PassRefused("nothing to set: give ID=VALUE assignments or --unset ID")
        for a in self.assignments:
            split_assignment(a)
        for key in ("assignments", "layers", "types", "unset", "where"):  # a list given: kept
            object.__setattr__(self, key, tuple(getattr(self, key)))

    def _targets(self, g: Graph) -> list[Layer]:
        out: dict[int, Layer] = {}
        missing = [n for n in self.layers if g.find(n) is None]
        if missing:
            raise PassRefused(f"no layer named {', '.join(repr(n) for n in missing)}")
        for n in self.layers:
            for layer in g:
                if layer.name == n:
                    out[layer.id] = layer
        if self.types:
            hits = g.by_type(*self.types)
            absent = [t for t in self.types if not g.by_type(t)]
            if absent:
                have = ", ".join(sorted(g.types()))
                raise PassRefused(f"no layer of type {', '.join(absent)} (the graph has {have})")
            for layer in hits:
                out[layer.id] = layer
        pos = g.position()
        return sorted(out.values(), key=lambda lay: pos[lay.id])

    def _selected(self, layer: Layer) -> str | None:
        """None when `layer` passes every --where filter, else why not."""
        for text in self.where:
            key, value = split_assignment(text)
            pid, _ = resolve_key(layer.type, key)
            want = typed_value(layer.type, pid, value, force=True, key=key)
            have = layer.params.value(pid)
            if have is None:
                d = param_default(layer.type, pid, layer.params)
                same = d is not None and isinstance(d, (int, float)) and \
                    want.kind in (Kind.INT, Kind.FLOAT) and float(d) == float(cast(Any, want.value))
            else:
                same = have.python == want.python
            if not same:
                return f"--where {text}: has {show(have, layer.type, pid)}"
        return None

    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        targets = self._targets(g)
        chosen = []
        for layer in targets:
            why = self._selected(layer)
            if why is None:
                chosen.append(layer)
            else:
                result.skipped.append(MatchFailure(layer.name, why, line=layer.source_line))
        if not chosen:
            raise PassRefused("no selected layer matches " + " ".join(f"--where {w}"
                                                                        for w in self.where))
        for layer in chosen:
            self._edit(layer, result)
        if not result.modified:
            result.notes.append(f"{len(chosen)} layer(s) already have these values")
        return result

    def _edit(self, layer: Layer, result: PassResult) -> None:
        line = layer.source_line
        where: dict[str, Any] = dict(file=layer.source_file, line=line)
        reads_before = _reads(layer.type, layer.params)
        broken_before = contract_error(layer)
        try:
            changed = apply_params(layer, self.assignments, force=self.force)
            removed = []
            for key in self.unset:
                pid, known = resolve_key(layer.type, key)
                if not known and not self.force and pid not in layer.params:
                    raise PassRefused(f"{layer.type} does not read param {key}")
                old = layer.params.value(pid)
                if old is not None:
                    layer.unset(pid)
                    removed.append((pid, old))
        except PassRefused as exc:
            raise PassRefused(f"layer {layer.name!r}: {exc.message}", **where) from None
        if not changed and not removed:
            result.skipped.append(MatchFailure(layer.name, "already has these values", line=line))
            return
        reads_after = _reads(layer.type, layer.params)
        if reads_before != reads_after and not self.force:
            raise PassRefused(f"layer {layer.name!r}: the edit changes what it reads from the "
                              f".bin ({_fmt_reads(reads_before)} -> {_fmt_reads(reads_after)}); "
                              f"the .bin has no index, so every later weight would shift "
                              f"(--force to write it anyway)", **where)
        broken = contract_error(layer)
        if broken is not None and broken != broken_before and not self.force:
            raise PassRefused(f"layer {layer.name!r}: {broken}; ncnn would crash at run time "
                              f"(--force to write it anyway)", **where)
        check_loads(layer)
        for pid, old, new in changed:
            result.changes.append(Change(layer.name, param_name(layer.type, pid),
                                         show(old, layer.type, pid), show(new), line))
        for pid, old in removed:
            result.changes.append(Change(layer.name, param_name(layer.type, pid), show(old),
                                         show(None, layer.type, pid), line))
        if not is_ncnn_layer(layer.type):
            result.notes.append(f"{layer.name}: {layer.type} is not an ncnn layer; ncnn cannot "
                                f"load it whatever its params (not checked)")
        result.modified = True
