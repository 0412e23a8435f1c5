"""The child side of a torch run: `python -m paramsurgery.verify.compare.torch_child DIR`.

Imports pnnx's own `X_pnnx.py` (unchanged; it loads `X.pnnx.bin` relative to its own
directory, so that is the working directory), builds its `Model`, and runs `forward` on
the inputs with a trace function on that one frame: when a line of `forward` starts, the
names the previous line assigned (`v_12`, or `v_3, v_4 = torch.chunk(...)`) are read from
the frame's locals and written as frames (`paramsurgery.verify.compare.frames`) to a scratch
file. Nothing in the generated file is edited; other frames are not traced.
"""

from __future__ import annotations

import ast
import importlib.util
import inspect
import json
import os
import sys
import textwrap
from pathlib import Path
from types import FrameType
from typing import IO, Any, Callable

import numpy as np

from paramsurgery.verify.compare.frames import write_frame

_TORCH_DTYPES = {"f32": "float32", "f16": "float16", "f64": "float64", "i32": "int32",
                 "i64": "int64", "i8": "int8", "u8": "uint8", "bool": "bool"}


def assigned_names_by_line(func: Callable[..., Any]) -> dict[int, list[str]]:
    """Absolute line number → names a statement starting there assigns."""
    lines, first = inspect.getsourcelines(func)
    tree = ast.parse(textwrap.dedent("".join(lines)))
    out: dict[int, list[str]] = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
            out.setdefault(first + node.lineno - 1, []).extend(names)
    return out


def _write_value(out: IO[bytes], name: str, value: Any, written: set[str]) -> None:
    import torch

    if name in written:
        return
    if isinstance(value, torch.Tensor):
        written.add(name)
        arr = value.detach().cpu()
        if arr.dtype == torch.bfloat16:
            arr = arr.float()
        write_frame(out, {"name": name}, np.ascontiguousarray(arr.numpy()))


def capture_forward(model: Any, args: list[Any], out: IO[bytes]) -> Any:
    """Run `model(*args)` writing every local of its `forward` as it is assigned."""
    forward = type(model).forward
    code = forward.__code__
    by_line = assigned_names_by_line(forward)
    written: set[str] = set()
    pending: list[str] = []

    def flush(frame: FrameType) -> None:
        loc = frame.f_locals
        for n in pending:
            if n in loc:
                _write_value(out, n, loc[n], written)
        pending.clear()

    def local(frame: FrameType, event: str, arg: Any):
        if event == "line":
            flush(frame)
            pending.extend(by_line.get(frame.f_lineno, ()))
        elif event == "return":
            flush(frame)
        return local

    def global_(frame: FrameType, event: str, arg: Any):
        if event == "call" and frame.f_code is code:
            loc = frame.f_locals
            for n in code.co_varnames[1:code.co_argcount]:
                if n in loc:
                    _write_value(out, n, loc[n], written)
            return local
        return None

    sys.settrace(global_)
    try:
        return model(*args)
    finally:
        sys.settrace(None)


def main(argv: list[str]) -> int:
    work = Path(argv[1])
    spec = json.loads((work / "spec.json").read_text())
    script = Path(spec["script"]).resolve()
    with np.load(work / "inputs.npz") as data:
        arrays = [data[f"i{i}"] for i in range(len(spec["dtypes"]))]
    import torch

    torch.manual_seed(0)
    os.chdir(script.parent)
    mod_spec = importlib.util.spec_from_file_location("paramsurgery_pnnx_export", script)
    assert mod_spec is not None and mod_spec.loader is not None
    module = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(module)
    model = module.Model()
    model.float()
    model.eval()
    args = []
    for arr, dt in zip(arrays, spec["dtypes"]):
        t = torch.from_numpy(np.ascontiguousarray(arr))
        want = getattr(torch, _TORCH_DTYPES.get(dt or "f32", "float32"))
        args.append(t.to(want))
    with open(spec["out"], "wb") as fh, torch.no_grad():
        capture_forward(model, args, fh)
        write_frame(fh, {"end": True})
    return 0


if __name__ == "__main__":  # pragma: no cover - run by paramsurgery.verify.compare.torch_run
    sys.exit(main(sys.argv))
