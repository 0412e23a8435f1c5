"""Running pnnx's own torch export (`X_pnnx.py` + `X.pnnx.bin`) in a child process with
every operand written to a scratch file (`torch_child`), and naming the files pnnx wrote
next to `X.pnnx.param`."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path
from typing import Mapping


from paramsurgery.core.npz import save_arrays

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.runtime.child import Feed
from paramsurgery.runtime.launch import module_argv, run_child


def export_files(pnnx_param: str) -> tuple[str, str]:
    """(`X_pnnx.py`, `X.pnnx.bin`) next to `X.pnnx.param`; ParamSurgeryError if absent."""
    p = os.fspath(pnnx_param)
    if not p.endswith(".pnnx.param"):
        raise ParamSurgeryError("--pnnx expects pnnx's X.pnnx.param (with X_pnnx.py and "
                                "X.pnnx.bin next to it)", file=p)
    stem = p[: -len(".pnnx.param")]
    script, weights = stem + "_pnnx.py", stem + ".pnnx.bin"
    missing = [f for f in (p, script, weights) if not os.path.isfile(f)]
    if missing:
        raise ParamSurgeryError(f"pnnx's torch export is incomplete: {', '.join(missing)} "
                                f"not found (pnnx writes X_pnnx.py and X.pnnx.bin next to "
                                f"X.pnnx.param unless they were deleted)", file=p)
    return script, weights


def python_name(operand: str) -> str:
    """The local pnnx's `X_pnnx.py` gives an operand (`v_` + the name, sanitized)."""
    return "v_" + re.sub(r"[^0-9a-zA-Z_]", "_", operand)


def run_torch(script: str, inputs: Mapping[str, Feed], dtypes: list[str | None], out: str,
              timeout: float = 600.0) -> tuple[str, str]:
    """Run the export on `inputs` (in pnnx input order); operands go to `out` as frames
    named by their Python locals. Returns (status, message)."""
    with tempfile.TemporaryDirectory(prefix="paramsurgery-torch-") as tmp:
        tmpdir = Path(tmp)
        save_arrays(tmpdir / "inputs.npz", {f"i{i}": f.array for i, f in enumerate(inputs.values())})
        (tmpdir / "spec.json").write_text(json.dumps(
            {"script": os.path.abspath(script), "dtypes": dtypes, "out": os.path.abspath(out)}))
        proc = run_child(*module_argv("paramsurgery.verify.compare.torch_child", tmpdir),
                         timeout=timeout)
        if proc.timed_out:
            return "timeout", f"the torch run was stopped after {timeout:.0f} s"
    if not proc.ok:
        status = blame(proc.stderr or "", script)
        if status == "pnnx":
            return status, pnnx_failure(proc.stderr or "", script)
        return status, proc.tail(3, " / ") or proc.how()
    return "ok", ""


# pnnx script failures whose cause is known: (the exception text, what pnnx wrote, the
# repro case of the catalogue that shows it: `paramsurgery repro issue ID`)
KNOWN_PNNX_FAILURES = (
    (re.compile(r"Linear\.forward\(\) takes 2 positional arguments"),
     "pnnx writes a tied Linear (its weight another layer's table, a tied lm_head) as a "
     "2-input nn.Linear; lint PS017, repaired in the ncnn graph by fix-tied-linear",
     "tied-linear"),
)


def pnnx_failure(stderr: str, script: str) -> str:
    """A failure inside pnnx's script, said as pnnx's: the script's line that raised (the
    innermost frame in it), the exception, and the known cause with its repro case."""
    script_abs = os.path.abspath(script)
    lines = stderr.splitlines()
    where = ""
    for i, ln in enumerate(lines):
        m = _FRAME_LINE.match(ln)
        if m and os.path.abspath(m.group(1)) == script_abs:
            code = lines[i + 1].strip() if i + 1 < len(lines) else ""
            where = f"line {m.group(2)}" + (f" `{code}`" if code else "") + ": "
    error = next((ln.strip() for ln in reversed(lines) if ln.strip()), "")
    for pattern, cause, case in KNOWN_PNNX_FAILURES:
        if pattern.search(error):
            return f"{where}{error}; {cause} (pnnx's bug: paramsurgery repro issue {case})"
    return where + error


def raise_for_setup(status: str, message: str, script: str, command: str) -> None:
    """The torch run's failures that are no finding about the model: torch missing
    (MissingDependency) or paramsurgery's own recorder failing (never blamed on pnnx)."""
    from paramsurgery.core.errors import MissingDependency

    if status == "missing_torch":
        raise MissingDependency(f"{command} runs pnnx's torch export: torch is not "
                                f"installed in this environment (pip install torch)")
    if status == "internal":
        raise ParamSurgeryError(f"paramsurgery's torch recorder failed on pnnx's export "
                                f"(a bug in paramsurgery, not in pnnx): {message}", file=script)


# the traceback line of a Python frame: `  File "/path/x.py", line 12, in f`
_FRAME = re.compile(r'^\s*File "([^"]+)", line \d+')
_FRAME_LINE = re.compile(r'^\s*File "([^"]+)", line (\d+)')


def blame(stderr: str, script: str) -> str:
    """Whose failure a failed torch run is, from the innermost frame of its traceback:
    "missing_torch" (torch is not installed where compare runs), "pnnx" (inside pnnx's
    `X_pnnx.py` or torch called from it), "internal" (inside paramsurgery's recorder: a bug
    here, not in pnnx's export), else "error" (no traceback: a crash, a signal)."""
    if re.search(r"ModuleNotFoundError: No module named 'torch'", stderr):
        return "missing_torch"
    frames = [m.group(1) for ln in stderr.splitlines() if (m := _FRAME.match(ln))]
    if not frames:
        return "error"
    script_abs = os.path.abspath(script)
    pkg = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    # the innermost frame that is pnnx's script or this package decides
    for f in reversed(frames):
        f_abs = os.path.abspath(f)
        if f_abs == script_abs:
            return "pnnx"
        if f_abs.startswith(pkg + os.sep):
            return "internal"
    return "error"
