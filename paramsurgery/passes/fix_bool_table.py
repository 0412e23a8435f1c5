"""`fix-bool-table`: a MemoryData pnnx wrote with its bool load type (`21=3`, one byte per
value; lint PS020) becomes a float32 MemoryData of the same shape holding 0.0/1.0 (load type
1, ncnn's default raw float32), which ncnn loads.

    MemoryData mask 0=7 1=7 11=1 2=1 21=3   (49 bytes + 3 pad)
    MemoryData mask 0=7 1=7 11=1 2=1        (49 float32: 1.0 where torch's bool is True)

ncnn has no bool blobs: every layer pnnx writes for a bool tensor reads it as float 0/1 (the
comparisons `lower` emits give 0/1 float, torch's bool promoted), so the readers compute
what they would on the bool. The bytes must be 0 or 1 (a bool); anything else is refused,
naming the layer. No length in it: the table keeps its shape (whether that shape is right at
other lengths is dynamize's question). Needs the weights (`--bin`).
"""

from __future__ import annotations

import numpy as np

from paramsurgery.core.changes import Change
from paramsurgery.core.errors import PassRefused
from paramsurgery.formats.weights import set_weights
from paramsurgery.formats.weights.binfile import PNNX_BOOL_LOAD_TYPE
from paramsurgery.ir.graph import Graph
from paramsurgery.passes.base import Pass, PassResult


# repair_order 5, the first: nothing else can read the table's values before
class FixBoolTable(Pass, name="fix-bool-table", tag="booltable", repair_order=5, needs_weights=True,
                   summary="a MemoryData with pnnx's bool load type (21=3, one byte per value, which ncnn "
                           "cannot load) -> float32 0/1 (needs --bin)"):
    def run(self, g: Graph) -> PassResult:
        result = PassResult(g, False)
        sites = [layer for layer in g if layer.type == "MemoryData"
                 and layer.params.get(21, 1) == PNNX_BOOL_LOAD_TYPE]
        if not sites:
            result.notes.append("no MemoryData with load type 21=3")
            return result
        for layer in sites:
            if not layer.weights or not len(layer.weights):
                raise PassRefused(f"MemoryData {layer.name!r}: its bool values are in the "
                                  f"weights; give --bin", line=layer.source_line)
            values = layer.weights[0].array().reshape(-1)
            bad = np.flatnonzero((values != 0) & (values != 1))
            if bad.size:
                raise PassRefused(f"MemoryData {layer.name!r} (21=3) holds {values[bad[0]]} at "
                                  f"element {bad[0]}: not a bool (0/1), so its meaning as float "
                                  f"is not known", line=layer.source_line)
        for layer in sites:
            values = layer.weights[0].array().reshape(-1).astype(np.float32)
            before = " ".join(layer.params.tokens())
            params = layer.params.copy()
            params.remove(21)  # ncnn's default: 1, raw float32
            new = g.replace_layer(layer, "MemoryData", layer.name, inputs=[],
                                  outputs=list(layer.outputs), params=params)
            set_weights(new, {"data": values})
            ones = int(values.sum())
            result.changes.append(Change(layer.name, f"bool table ({values.size} values, {ones} "
                                                     f"true) written as float32 0/1", before,
                                         " ".join(params.tokens()), layer.source_line))
        result.modified = True
        return result
