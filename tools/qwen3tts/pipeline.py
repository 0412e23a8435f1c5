"""Export one module variant with pnnx, check it in ncnn against torch, keep its files.

For each `VariantSpec` at one size:
1. trace + `pnnx ... inputshape= inputshape2= fp16=0` in a scratch directory
   (`paramsurgery.repro.pnnx_export.export_with_pnnx`, exit code checked);
2. copy `<module>.<variant>.ncnn.param` and `.pnnx.param` (both sizes) and `.ncnn.bin`
   (tiny only) into the fixture directory, and for raw exports pnnx's `X_ncnn.py` and, at
   real size, the small constants pnnx folded from the trace (`X.folds.npz`); when pnnx
   fails (nonzero exit, signal) no file is kept and the record holds the exit code and the
   stderr tail instead;
3. run the torch wrapper on the reference inputs (a length no trace used), run ncnn on the
   same inputs in a child process with the `.bin` from the scratch directory, classify
   (`ncnn_check`), and for tiny save the inputs + torch outputs as `<name>.ref.npz`;
4. delete the scratch directory (real-size `.bin`/`.pt` intermediates are GBs).
"""

from __future__ import annotations

import re
import shutil
import time
import traceback
from pathlib import Path
from typing import Any

import numpy as np
import torch

from paramsurgery.formats.pnnx_reference import write_io_sidefile
from paramsurgery.repro.pnnx_export import NO_BATCH, export_with_pnnx

from . import ncnn_check
from .inputs import INPUT_SEED
from .npz import save_npz
from .spec import VariantSpec, dtypes, shapes

STDERR_TAIL_LINES = 15


def param_stats(path: Path) -> dict[str, Any]:
    """Header counts and a layer-type histogram of an ncnn `.param`."""
    lines = path.read_text().splitlines()
    layer_count, blob_count = (int(v) for v in lines[1].split())
    hist: dict[str, int] = {}
    for line in lines[2:]:
        if line.strip():
            t = line.split()[0]
            hist[t] = hist.get(t, 0) + 1
    return {"layer_count": layer_count, "blob_count": blob_count,
            "layer_types": dict(sorted(hist.items(), key=lambda kv: (-kv[1], kv[0])))}


def _as_tuple(out: Any) -> tuple[torch.Tensor, ...]:
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def _tail(text: str, n: int = STDERR_TAIL_LINES) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return "\n".join(lines[-n:])


# Python stack frames that TorchScript appends to an interpreter error ("/abs/path.py(12): f"):
# machine-specific and not about the failure; the serialized-code frame above them is.
_PY_FRAME = re.compile(r"^\S+\.py\(\d+\): \S+$")


def pnnx_failure_tail(stderr: str, n: int = STDERR_TAIL_LINES) -> str:
    """The end of pnnx's stderr without the host Python frames, starting at the C++
    exception banner when there is one."""
    lines = [ln for ln in stderr.splitlines() if ln.strip() and not _PY_FRAME.match(ln.strip())]
    for i, ln in enumerate(lines):
        if ln.startswith("terminate called"):
            lines = lines[i:]
            break
    kept = [ln for ln in lines if not ln.startswith("Traceback of TorchScript, original code")]
    return "\n".join(kept[-n:] if len(kept) > n else kept)


def io_spec(spec: VariantSpec, n_outputs: int, in_bidx: dict[str, int],
            out_bidx: dict[str, int]) -> dict[str, list[dict[str, Any]]]:
    """pnnx blob names, our npz keys and pnnx's batch axes for every input/output."""
    inputs = [{"blob": f"in{i}", "key": f"input_{name}", "name": name,
               "batch_index": int(in_bidx.get(f"in{i}", NO_BATCH))}
              for i, name in enumerate(spec.input_names)]
    outputs = [{"blob": f"out{j}", "key": f"output_{spec.output_names[j]}",
                "name": spec.output_names[j], "batch_index": int(out_bidx.get(f"out{j}", NO_BATCH))}
               for j in range(n_outputs)]
    return {"inputs": inputs, "outputs": outputs}


FOLDED_MAX_ELEMENTS = 64  # a folded constant this small is a value of the trace, kept


def folded_constants(param: Path, bin_path: Path) -> dict[str, np.ndarray]:
    """The small constants pnnx folded from its trace (`MemoryData pnnx_fold_*` of at most
    `FOLDED_MAX_ELEMENTS` elements), by layer name, read from the export's weights."""
    import paramsurgery
    from paramsurgery.analysis.frozen_extent import is_folded

    g = paramsurgery.load(param, bin_path)
    out: dict[str, np.ndarray] = {}
    for layer in g.by_type("MemoryData"):
        if is_folded(layer) and layer.weights and len(layer.weights) == 1 \
                and layer.weights[0].count <= FOLDED_MAX_ELEMENTS:
            out[layer.name] = layer.weights[0].array().astype(np.float32).reshape(-1)
    return out


def export_variant(spec: VariantSpec, size: str, fixture_dir: Path, scratch: Path,
                   rel_root: Path) -> dict[str, Any]:
    """Export, check and store one variant; returns its manifest record (files are
    listed by their path relative to `rel_root`)."""
    name = f"{spec.module}.{spec.variant}"
    work = scratch / f"{size}-{name}"
    shutil.rmtree(work, ignore_errors=True)
    fixture_dir.mkdir(parents=True, exist_ok=True)
    for old in fixture_dir.glob(f"{name}.*"):
        old.unlink()

    with torch.no_grad():
        ref_outputs = _as_tuple(spec.wrapper(*spec.ref_inputs))
    if len(ref_outputs) != len(spec.output_names):
        raise ValueError(f"{name}: {len(ref_outputs)} outputs, {len(spec.output_names)} names")

    record: dict[str, Any] = {
        "module": spec.module, "variant": spec.variant, "size": size,
        "input_names": spec.input_names, "output_names": spec.output_names,
        "input_dtypes": dtypes(spec.trace_inputs),
        "input_shapes": {"trace": shapes(spec.trace_inputs),
                         "trace2": (shapes(spec.trace_inputs2)
                                    if spec.trace_inputs2 is not None else None),
                         "reference": shapes(spec.ref_inputs)},
        "output_shapes_reference": shapes(ref_outputs),
        "lengths": {"trace": spec.trace_length, "trace2": spec.trace_length2,
                    "reference": spec.ref_length, "meaning": spec.length_axis_note},
        "constructs": spec.constructs,
        "input_seed": INPUT_SEED,
        **({"notes": spec.extra} if spec.extra else {}),
    }
    if spec.hf_check is not None:
        record["torch_patched_vs_hf_max_abs"] = spec.hf_check()

    t0 = time.monotonic()
    try:
        res = export_with_pnnx(spec.wrapper, spec.trace_inputs, work, name,
                               example_inputs2=spec.trace_inputs2, fp16=False, optlevel=2)
    except Exception as exc:  # noqa: BLE001 - a trace failure is a recorded outcome
        record["status"] = {"kind": "trace_failed",
                            "detail": f"{type(exc).__name__}: {exc}"[:2000],
                            "traceback_tail": _tail(traceback.format_exc(), 6)}
        record["files"] = {}
        shutil.rmtree(work, ignore_errors=True)
        return record
    record["export_seconds"] = {"pnnx": round(res.seconds, 2),
                                "trace_and_pnnx": round(time.monotonic() - t0, 2)}
    record["pnnx"] = {"returncode": res.returncode, "signal": res.signal,
                      "command": " ".join(res.command[1:]),
                      "warnings": res.warnings, "trace_warnings": res.trace_warnings}
    files: dict[str, str] = {}
    if not res.ok:
        record["status"] = {"kind": "pnnx_failed", "returncode": res.returncode,
                            "signal": res.signal, "stderr_tail": pnnx_failure_tail(res.stderr)}
        record["files"] = files
        shutil.rmtree(work, ignore_errors=True)
        return record

    io = io_spec(spec, len(ref_outputs), res.input_batch_index, res.output_batch_index)
    record["io"] = io
    record.update(param_stats(res.ncnn_param))
    arrays: dict[str, np.ndarray] = {}
    for entry, t in zip(io["inputs"], spec.ref_inputs):
        arrays[entry["key"]] = t.detach().numpy()
    for entry, t in zip(io["outputs"], ref_outputs):
        arrays[entry["key"]] = t.detach().numpy().astype(np.float32)
    record["status"] = ncnn_check.check(res.ncnn_param, res.ncnn_bin, io["inputs"], io["outputs"],
                                        arrays)

    def keep(src: Path | None, suffix: str, kind: str) -> None:
        if src is None:
            return
        dst = fixture_dir / f"{name}{suffix}"
        shutil.copyfile(src, dst)
        files[kind] = dst.relative_to(rel_root).as_posix()

    keep(res.ncnn_param, ".ncnn.param", "ncnn_param")
    keep(res.pnnx_param, ".pnnx.param", "pnnx_param")
    if spec.variant == "raw":
        # pnnx's test script records the traced input shapes: the evidence `lower` needs
        # to read a constant pnnx folded from the first trace as that trace's length
        keep(res.ncnn_py, "_ncnn.py", "pnnx_script")
    if size == "tiny":
        keep(res.ncnn_bin, ".ncnn.bin", "ncnn_bin")
        ref_path = fixture_dir / f"{name}.ref.npz"
        save_npz(ref_path, arrays)
        files["reference"] = ref_path.relative_to(rel_root).as_posix()
        # the batch axes for `fix --verify` / lint / compare (X.ref.io.json, read_io_sidefile)
        write_io_sidefile(str(ref_path), io)
    else:
        record["ncnn_bin_bytes_not_kept"] = res.ncnn_bin.stat().st_size
        if spec.variant == "raw":
            folds = folded_constants(res.ncnn_param, res.ncnn_bin)
            if folds:
                # the .bin is not kept, but these values are the trace's, not learned
                # weights: `synth-bin --keep-values` writes them into a stand-in .bin so
                # `fix` can read a folded trace length at real size
                path = fixture_dir / f"{name}.folds.npz"
                save_npz(path, folds)
                files["folded_constants"] = path.relative_to(rel_root).as_posix()
    record["files"] = files
    shutil.rmtree(work, ignore_errors=True)
    return record
