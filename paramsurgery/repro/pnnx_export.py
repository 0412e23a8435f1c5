"""Export a torch module to ncnn with the `pnnx` binary, keeping everything needed to judge
the result: exit code (a negative one is the signal that killed pnnx), stdout/stderr, the
batch axes pnnx chose, and its "not supported"/"ignore" warnings.

Why the binary and not `pnnx.export()`: the Python helper ignores the exit code, so a pnnx
segfault only surfaces later as a failed import of the missing `*_pnnx.py`
(pnnx-bugs.md §0). The console script `pnnx` that pip installs is itself a Python wrapper
around the native executable, and it folds a signal into an exit status (-11 -> 245), so we
call the native executable inside the installed `pnnx` package whenever we can find it.

torch is imported lazily: importing this module must work in an environment without torch.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from paramsurgery.core.errors import MissingDependency

from paramsurgery.core.ncnn import NO_BATCH

# Files pnnx writes next to the .pt that we drop by default: big or not needed to
# reproduce anything (the TorchScript, pnnx's own weights/onnx and python re-export).
_INTERMEDIATE_SUFFIXES = (".pt", ".pnnx.bin", ".pnnx.onnx", "_pnnx.py",
                          ".foldable_constants.zip")

# stderr lines that explain a broken conversion; the rest is pass banners and echo.
_WARNING_PATTERNS = (
    re.compile(r"not supported", re.I),
    re.compile(r"^ignore ", re.I),
    re.compile(r"\bexpect\b", re.I),
    re.compile(r"\berror\b", re.I),
    re.compile(r"\bfailed\b", re.I),
    re.compile(r"\bmust match\b", re.I),
    re.compile(r"^terminate called", re.I),
    re.compile(r"^what\(\)", re.I),
)

_DTYPE_SUFFIX = {
    "torch.float32": "f32",
    "torch.float64": "f64",
    "torch.float16": "f16",
    "torch.bfloat16": "bf16",
    "torch.int32": "i32",
    "torch.int64": "i64",
    "torch.int16": "i16",
    "torch.int8": "i8",
    "torch.uint8": "u8",
    "torch.bool": "bool",
}


@dataclass
class PnnxExport:
    """The outcome of one pnnx run. Paths are None when pnnx did not write the file."""

    name: str
    returncode: int
    seconds: float
    stdout: str
    stderr: str
    command: list[str]
    ncnn_param: Path | None
    ncnn_bin: Path | None
    pnnx_param: Path | None
    ncnn_py: Path | None
    input_batch_index: dict[str, int] = field(default_factory=dict)
    output_batch_index: dict[str, int] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    trace_warnings: list[str] = field(default_factory=list)
    timed_out: bool = False

    @property
    def ok(self) -> bool:
        return (self.returncode == 0 and self.ncnn_param is not None
                and self.ncnn_bin is not None)

    @property
    def signal(self) -> int | None:
        """The signal that killed pnnx (11 = SIGSEGV, 6 = SIGABRT), if any."""
        return -self.returncode if self.returncode < 0 and not self.timed_out else None

    def stderr_tail(self, n: int = 15) -> str:
        lines = [ln for ln in self.stderr.splitlines() if ln.strip()]
        return "\n".join(lines[-n:])


def find_pnnx() -> str:
    """Path of the native pnnx executable.

    Order: the executable shipped inside the installed `pnnx` package (found without
    importing the package, whose __init__ pulls in torch), then `pnnx` next to
    sys.executable, then `pnnx` on PATH. Raises MissingDependency when none exists."""
    env = os.environ.get("PARAMSURGERY_PNNX")
    if env:
        if os.access(env, os.X_OK):
            return env
        raise MissingDependency(f"PARAMSURGERY_PNNX={env!r} is not an executable file")
    try:
        spec = importlib.util.find_spec("pnnx")
    except (ImportError, ValueError):
        spec = None
    if spec is not None and spec.submodule_search_locations:
        for loc in spec.submodule_search_locations:
            for exe in ("pnnx", "pnnx.exe"):
                cand = Path(loc) / exe
                if cand.is_file() and os.access(cand, os.X_OK):
                    return str(cand)
    beside = Path(sys.executable).parent / "pnnx"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    on_path = shutil.which("pnnx")
    if on_path:
        return on_path
    raise MissingDependency(
        "the pnnx executable was not found (install the export extra: "
        "pip install pnnx==20261020, or set PARAMSURGERY_PNNX to the binary)")


def _import_torch():
    try:
        import torch
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise MissingDependency(
            "torch is needed to trace models for pnnx (install torch==2.13.0 CPU first, "
            "then the export extra)") from exc
    return torch


def shape_arg(inputs: Sequence[Any]) -> str:
    """pnnx's inputshape syntax for example tensors: `[1,4,10],[3,7]i32`."""
    parts = []
    for t in inputs:
        suffix = _DTYPE_SUFFIX.get(str(t.dtype))
        if suffix is None:
            raise ValueError(f"pnnx has no inputshape type for {t.dtype}")
        parts.append("[" + ",".join(str(int(d)) for d in t.shape) + "]" + suffix)
    return ",".join(parts)


_INPUT_RE2 = re.compile(r'ex\.input\("([^"]+)",\s*ncnn\.Mat\(\w+\.numpy\(\)'
                        r'(?:,\s*batch_index=(\d+))?\)')
_EXTRACT_RE = re.compile(r'_,\s*(\w+)\s*=\s*ex\.extract\("([^"]+)"')
_NUMPY_RE = re.compile(r'(\w+)\.numpy\(batch_index=(\d+)\)')


def parse_ncnn_py(text: str) -> tuple[dict[str, int], dict[str, int]]:
    """Blob name -> batch_index for the inputs and outputs of a pnnx-generated `*_ncnn.py`.
    A blob fed or read without batch_index gets 233 (no batch axis)."""
    inputs: dict[str, int] = {}
    for m in _INPUT_RE2.finditer(text):
        inputs[m.group(1)] = int(m.group(2)) if m.group(2) else NO_BATCH
    var_to_blob = {m.group(1): m.group(2) for m in _EXTRACT_RE.finditer(text)}
    outputs = {blob: NO_BATCH for blob in var_to_blob.values()}
    for m in _NUMPY_RE.finditer(text):
        blob = var_to_blob.get(m.group(1))
        if blob is not None:
            outputs[blob] = int(m.group(2))
    return inputs, outputs


def keep_warning_lines(stderr: str) -> list[str]:
    """pnnx stderr lines worth keeping (unsupported ops, ignored params, shape errors)."""
    kept: list[str] = []
    for line in stderr.splitlines():
        s = line.strip()
        if s and any(p.search(s) for p in _WARNING_PATTERNS) and s not in kept:
            kept.append(s)
    return kept


def export_with_pnnx(module: Any, example_inputs: tuple, out_dir: Path, name: str, *,
                     example_inputs2: tuple | None = None, fp16: bool = False,
                     optlevel: int = 2, keep_intermediates: bool = False,
                     timeout: float = 3600) -> PnnxExport:
    """Trace `module` with `example_inputs` (eval, no grad), save `<name>.pt` in `out_dir`
    and run the pnnx executable on it. `example_inputs2` adds `inputshape2=` (dynamic
    export). Never raises for a pnnx failure: look at `returncode`/`ok`.

    pnnx runs with cwd=out_dir and relative file names, so the generated `*_ncnn.py`
    refers to `<name>.ncnn.param` and not to an absolute temporary path."""
    torch = _import_torch()
    exe = find_pnnx()
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    module = module.eval()
    trace_msgs: list[str] = []
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        # check_trace re-runs the module and compares; the repro models are deterministic
        # but the comparison can spuriously fail on graphs with data-dependent control flow.
        traced = torch.jit.trace(module, tuple(example_inputs), check_trace=False)
    for w in caught:
        if issubclass(w.category, DeprecationWarning):
            continue  # "torch.jit.trace is deprecated": noise, says nothing about the model
        msg = f"{w.category.__name__}: {w.message}"
        if msg not in trace_msgs:
            trace_msgs.append(msg)
    pt = out_dir / f"{name}.pt"
    traced.save(str(pt))  # TorchScript's own writer (not paramsurgery.save)

    cmd = [exe, pt.name, f"inputshape={shape_arg(example_inputs)}"]
    if example_inputs2 is not None:
        cmd.append(f"inputshape2={shape_arg(example_inputs2)}")
    cmd += [f"fp16={1 if fp16 else 0}", f"optlevel={optlevel}"]

    t0 = time.monotonic()
    timed_out = False
    try:
        proc = subprocess.run(cmd, cwd=out_dir, capture_output=True, text=True,
                              errors="replace", timeout=timeout)
        rc, stdout, stderr = proc.returncode, proc.stdout, proc.stderr
    except subprocess.TimeoutExpired as exc:
        timed_out = True
        rc = -9
        stdout = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        stderr = exc.stderr.decode(errors="replace") if isinstance(exc.stderr, bytes) else (exc.stderr or "")
        stderr += f"\n[paramsurgery] pnnx killed after {timeout:.0f} s timeout\n"
    seconds = time.monotonic() - t0

    def existing(suffix: str) -> Path | None:
        p = out_dir / f"{name}{suffix}"
        return p if p.is_file() else None

    ncnn_py = existing("_ncnn.py")
    in_bidx: dict[str, int] = {}
    out_bidx: dict[str, int] = {}
    if ncnn_py is not None:
        in_bidx, out_bidx = parse_ncnn_py(ncnn_py.read_text())

    if not keep_intermediates:
        for suffix in _INTERMEDIATE_SUFFIXES:
            p = out_dir / f"{name}{suffix}"
            if p.is_file():
                p.unlink()

    return PnnxExport(
        name=name, returncode=rc, seconds=seconds, stdout=stdout, stderr=stderr,
        command=cmd,
        ncnn_param=existing(".ncnn.param"), ncnn_bin=existing(".ncnn.bin"),
        pnnx_param=existing(".pnnx.param"), ncnn_py=ncnn_py,
        input_batch_index=in_bidx, output_batch_index=out_bidx,
        warnings=keep_warning_lines(stderr), trace_warnings=trace_msgs, timed_out=timed_out)
