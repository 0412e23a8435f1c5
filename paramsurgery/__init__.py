"""paramsurgery: exact, verified graph surgery on ncnn models.

    import paramsurgery
    g = paramsurgery.load("model.param")          # text or binary .param (+ bin=...)
    g.validate()                                   # structural findings
    g.save("out.param")                            # byte-identical when nothing changed
"""

from .errors import (BinLayoutError, GraphError, MissingDependency, ParamSurgeryError,
                     ParamSyntaxError, PassRefused, VerificationError)
from .findings import Finding
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
