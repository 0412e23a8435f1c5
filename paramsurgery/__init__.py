"""paramsurgery: exact, verified graph surgery on ncnn models.

    import paramsurgery
    g = paramsurgery.load("model.param")          # text or binary .param (+ bin=...)
    paramsurgery.validate(g)                       # structural findings
    paramsurgery.save(g, "out.param")              # byte-identical when nothing changed
"""

from __future__ import annotations

import importlib as _importlib
from typing import TYPE_CHECKING

from paramsurgery.core.errors import (BinLayoutError, GraphError, MissingDependency, ParamSurgeryError,
                                      ParamSyntaxError, PassRefused, VerificationError)
from paramsurgery.core.findings import Finding

if TYPE_CHECKING:
    from paramsurgery.ir.graph import Graph
    from paramsurgery.analysis.shapes import infer_shapes
    from paramsurgery.analysis.validate import validate
    from paramsurgery.formats.io import load, loads, save
    from paramsurgery.formats.param_text import dump_bytes, dumps
    from paramsurgery.ir.layer import Layer
    from paramsurgery.ir.params import Params
    from paramsurgery.core.values import Float, Floats, Int, Ints, Kind, Str, Value

__version__ = "0.1.0"

__all__ = [
    "load", "loads", "save", "dumps", "dump_bytes", "validate", "infer_shapes",
    "Graph", "Layer", "Params", "Finding", "Value", "Kind",
    "Int", "Float", "Ints", "Floats", "Str",
    "ParamSurgeryError", "ParamSyntaxError", "BinLayoutError", "GraphError", "PassRefused",
    "VerificationError", "MissingDependency", "__version__",
]

# the IR (graph, networkx, params) is imported on first use, not by `import paramsurgery`:
# a child process that only runs ncnn (`python -m paramsurgery.runtime.child`) imports the
# package
# too, and the IR's modules were ~20 MB of its memory next to the weights it holds
_LAZY = {"Graph": ".ir.graph", "Layer": ".ir.layer", "Params": ".ir.params",
         **dict.fromkeys(("load", "loads", "save"), ".formats.io"),
         **dict.fromkeys(("dumps", "dump_bytes"), ".formats.param_text"),
         "validate": ".analysis.validate", "infer_shapes": ".analysis.shapes",
         **dict.fromkeys(("Float", "Floats", "Int", "Ints", "Kind", "Str", "Value"), ".core.values")}


def __getattr__(name: str) -> object:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paramsurgery' has no attribute {name!r}")
    value = getattr(_importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    """The public API (`__all__`), not the names the module itself imports."""
    return sorted(__all__)
