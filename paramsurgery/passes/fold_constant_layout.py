"""`fold-constant-layout`: a `MemoryData` constant that only layout layers (Reshape,
Permute, ExpandDims, Squeeze, Flatten) rearrange becomes one `MemoryData` holding the
result, as pnnx leaves them for tables it could not fold (RoPE tables, position ids, masks
reshaped for broadcasting).

    MemoryData c 0=64 1=12  →  Reshape 0=16 1=4 2=12  →  Permute 0=2  →  (readers)
    MemoryData c 0=16 1=12 2=4 (the permuted values)                →  (readers)

The new values are what ncnn itself computes for the chain (the chains run once, together,
in a child process), and each new MemoryData is run alone afterwards and must give those
values bit for bit: the fold is proven at the only shape a constant has. The chain must be a
line (each blob read once): a constant also read elsewhere is left alone.
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass

import numpy as np

from paramsurgery.core.match import MatchFailure
from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.core.values import format_value
from paramsurgery.formats.io import save
from paramsurgery.formats.weights import set_weights
from paramsurgery.ir.graph import Graph
from paramsurgery.ir.layer import Layer
from paramsurgery.passes.base import Pass, PassResult
from paramsurgery.runtime.child import RunOptions, run_isolated

LAYOUT_TYPES = ("Reshape", "Permute", "ExpandDims", "Squeeze", "Flatten")
DIM_PARAMS = {1: (0,), 2: (0, 1), 3: (0, 1, 2), 4: (0, 1, 11, 2)}  # numpy rank -> w h [d] c ids


@dataclass
class _Chain:
    constant: Layer
    layers: list[Layer]
    end: str  # the blob the last layout layer writes


class FoldConstantLayout(Pass, name="fold-constant-layout", tag="foldconst",
                         summary="MemoryData → Reshape/Permute/ExpandDims/Squeeze/Flatten chain → one "
                                 "MemoryData with the values ncnn computes for it (needs --bin)"):
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        chains = _chains(g, result)
        if not chains:
            return result
        missing = next((c.constant for c in chains if c.constant.weights is None), None)
        if missing is not None:
            raise PassRefused(f"MemoryData {missing.name!r}: its values are in the weights; give "
                              f"--bin", line=missing.source_line)
        values = _evaluate(g, chains)
        for chain in chains:
            arr = values[chain.end]
            c = chain.constant
            line, name = c.source_line, c.name
            before = " + ".join(_spelled(x) for x in [c, *chain.layers])
            for layer in reversed(chain.layers):
                g.remove_layer(layer)
            g.remove_layer(c)
            dims = DIM_PARAMS.get(arr.ndim)
            if dims is None:
                raise PassRefused(f"{name}: the folded constant has {arr.ndim} dims (ncnn has 1-4)",
                                  line=line)
            params = {pid: int(n) for pid, n in zip(dims, reversed(arr.shape))}
            new = g.add_layer("MemoryData", name, [], [chain.end], params)
            set_weights(new, {"data": np.ascontiguousarray(arr, dtype=np.float32).reshape(-1)})
            result.changes.append(Change(name, "constant layout folded", before,
                                         _spelled(new), line))
        result.modified = True
        _check_alone(g, {c.end: values[c.end] for c in chains})
        return result


def _spelled(layer: Layer) -> str:
    """`Type k=v ...` as the .param spells it."""
    return " ".join([layer.type, *(format_value(pid, layer.params.value(pid))  # type: ignore[arg-type]
                                   for pid in layer.params)])


def _chains(g: Graph, result: PassResult) -> list[_Chain]:
    out = []
    for m in g.by_type("MemoryData"):
        if len(m.outputs) != 1:
            continue
        blob, layers = m.outputs[0], []
        while True:
            readers = g.consumers(blob)
            if len(readers) != 1:
                break
            layer, _slot = readers[0]
            if layer.type not in LAYOUT_TYPES or len(layer.inputs) != 1 or len(layer.outputs) != 1:
                break
            layers.append(layer)
            blob = layer.outputs[0]
        if layers:
            out.append(_Chain(m, layers, blob))
        elif len(g.consumers(m.outputs[0])) > 1:
            result.skipped.append(MatchFailure(m.name, "read by several layers", line=m.source_line))
    return out


def _evaluate(g: Graph, chains: list[_Chain]) -> dict[str, np.ndarray]:
    """Every chain's end, computed by ncnn (one child run of the constants and chains alone)."""
    sub = Graph()
    for chain in chains:
        for layer in [chain.constant, *chain.layers]:
            new = sub.add_layer(layer.type, layer.name, layer.inputs, layer.outputs, layer.params.copy())
            if layer.weights is not None:
                set_weights(new, {w.role: w for w in layer.weights})
    return _run(sub, [c.end for c in chains], "the constant layout chains")


def _check_alone(g: Graph, want: dict[str, np.ndarray]) -> None:
    """The new MemoryData layers, run alone, give the values they were made from."""
    sub = Graph()
    for blob in want:
        layer = g.producer(blob)
        assert layer is not None
        new = sub.add_layer("MemoryData", layer.name, [], [blob], layer.params.copy())
        set_weights(new, {w.role: w for w in layer.weights})
    got = _run(sub, list(want), "the folded constants")
    for blob, arr in want.items():
        if got[blob].shape != arr.shape or got[blob].tobytes() != arr.astype(np.float32).tobytes():
            raise PassRefused(f"{g.producer(blob).name}: the folded MemoryData reads back as "  # type: ignore[union-attr]
                              f"{got[blob].shape}, not the {arr.shape} ncnn computed: not folded")


def _run(sub: Graph, outputs: list[str], what: str) -> dict[str, np.ndarray]:
    with tempfile.TemporaryDirectory(prefix="paramsurgery-fold-") as tmp:
        param, bin = os.path.join(tmp, "c.param"), os.path.join(tmp, "c.bin")
        save(sub, param, bin=bin)
        res = run_isolated(param, bin, {}, outputs, RunOptions())
    if not res.ok:
        raise PassRefused(f"ncnn could not run {what}: {res.describe()}")
    return res.outputs
