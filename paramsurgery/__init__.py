"""paramsurgery: exact, verified graph surgery on ncnn models.

    import paramsurgery
    g = paramsurgery.load("model.param")          # text or binary .param (+ bin=...)
    g.validate()                                   # structural findings
    g.save("out.param")                            # byte-identical when nothing changed
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from .errors import (BinLayoutError, GraphError, MissingDependency, ParamSurgeryError,
                     ParamSyntaxError, PassRefused, VerificationError)
from .findings import Finding

if TYPE_CHECKING:
    from .graph import Graph
    from .io import load, loads
    from .layer import Layer
    from .params import Params
    from .values import Float, Floats, Int, Ints, Kind, Str, Value

__version__ = "0.1.0"

__all__ = [
    "load", "loads", "Graph", "Layer", "Params", "Finding", "Value", "Kind",
    "Int", "Float", "Ints", "Floats", "Str",
    "ParamSurgeryError", "ParamSyntaxError", "BinLayoutError", "GraphError", "PassRefused",
    "VerificationError", "MissingDependency", "__version__",
]

# the IR (graph, networkx, params) is imported on first use, not by `import paramsurgery`:
# a child process that only runs ncnn (`python -m paramsurgery.runtime`) imports the package
# too, and the IR's modules were ~20 MB of its memory next to the weights it holds
_LAZY = {"Graph": ".graph", "load": ".io", "loads": ".io", "Layer": ".layer",
         "Params": ".params", **dict.fromkeys(("Float", "Floats", "Int", "Ints", "Kind",
                                                "Str", "Value"), ".values")}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'paramsurgery' has no attribute {name!r}")
    value = getattr(importlib.import_module(module, __name__), name)
    globals()[name] = value
    return value
