"""Observe a repro case with the tools installed now: export each variant with the pnnx
binary, run the ncnn graph in a child process at the untraced length, compare with torch,
and say whether the outcome is still the one recorded in the fixtures.

The record of one variant has the keys of the fixtures' status.json that describe an
outcome (status, pnnx, ncnn_status, signal_name, max_abs_err, output_shapes,
offending_lines, ...), so `repro check` and `repro issue --fresh` can use either.
"""

from __future__ import annotations

import importlib.metadata
import platform
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from paramsurgery.core.errors import MissingDependency
from paramsurgery.repro import cases as C
from paramsurgery.repro.catalogue import recorded
from paramsurgery.repro.check import Reference, classify, rounded, run_reference, signal_name

MODEL_FILES = ("model.ncnn.param", "model.ncnn.bin", "model.pnnx.param", "model_ncnn.py")


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def os_string() -> str:
    return f"{platform.system()} {platform.release()} {platform.machine()}"


def environment() -> dict[str, str | None]:
    """Versions of everything that decides a repro's outcome, on this machine."""
    import numpy as np

    try:
        import ncnn

        ncnn_v = getattr(ncnn, "__version__", None) or _version("ncnn")
    except ImportError:
        ncnn_v = None
    try:
        import torch

        torch_v = torch.__version__
    except ImportError:
        torch_v = None
    from paramsurgery import __version__

    return {"pnnx": _version("pnnx"), "ncnn": ncnn_v, "torch": torch_v,
            "python": platform.python_version(), "numpy": np.__version__,
            "os": os_string(), "paramsurgery": __version__}


def require_export_tools() -> str:
    """The pnnx executable; MissingDependency naming every missing piece otherwise."""
    from paramsurgery.repro.pnnx_export import find_pnnx

    missing = []
    try:
        import torch  # noqa: F401
    except ImportError:
        missing.append("torch (pip install torch==2.13.0, CPU wheel)")
    try:
        exe = find_pnnx()
    except MissingDependency:
        exe = None
        missing.append("the pnnx executable (pip install pnnx==20261020, or set "
                       "PARAMSURGERY_PNNX)")
    if missing:
        raise MissingDependency("repro check/--fresh export every model again and need the "
                                "export extra; missing: " + "; ".join(missing))
    return exe  # type: ignore[return-value]


@dataclass
class VariantCheck:
    case: str
    variant: str
    recorded: str | None          # status in the fixtures (None: no fixture)
    expected: str                 # the catalogue's status
    observed: dict[str, Any]      # status.json-like record of this run
    seconds: float
    files: dict[str, Path] = field(default_factory=dict)
    reference: Reference | None = None  # the inputs and torch outputs of the run

    @property
    def status(self) -> str:
        return self.observed["status"]

    @property
    def baseline(self) -> str:
        return self.recorded if self.recorded is not None else self.expected

    @property
    def changed(self) -> bool:
        return self.status != self.baseline


def evidence(st: dict[str, Any]) -> str:
    """One line: why a status is what it is (signal, ncnn message, error, shapes, pnnx rc)."""
    status = st["status"]
    if status == "export_fail":
        p = st.get("pnnx") or {}
        sig = p.get("signal_name")
        tail = (p.get("stderr_tail") or [""])[-1]
        return f"pnnx exit {p.get('returncode')}" + (f" ({sig})" if sig else "") + \
            (f": {tail}" if tail else "")
    if status == "crash":
        return f"ncnn killed by {st.get('signal_name') or st.get('signal')}"
    if status == "load_fail":
        lines = st.get("ncnn_stderr") or []
        first = lines[0] if lines else (st.get("ncnn_message") or "")
        return f"{st.get('ncnn_status')}: {first}".rstrip(": ")
    if status == "wrong":
        if st.get("nondeterministic"):
            return "wrong values that change from run to run (" + st["nondeterministic"] + ")"
        shapes = [o for o in (st.get("output_shapes") or []) if o["ncnn"] != o["torch"]]
        if st.get("max_abs_err") is None and shapes:
            return "shape " + "; ".join(f"ncnn {o['ncnn']} vs torch {o['torch']}" for o in shapes)
        if st.get("max_abs_err") is not None:
            return f"max abs error {st['max_abs_err']} vs torch"
        return st.get("ncnn_status") or "wrong"
    if status == "right":
        return f"max abs error {st.get('max_abs_err')} vs torch"
    return ""


def observe_variant(case: C.ReproCase, variant: C.Variant, workdir: Path, *,
                    timeout: float = 300.0) -> VariantCheck:
    """Export `variant` (or write its hand-written graph) into `workdir`, run it through
    ncnn in a child process at the case's untraced length and classify the outcome."""
    from paramsurgery.repro.pnnx_export import export_with_pnnx

    t0 = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    traces, run_len = case.lengths(variant)
    run_inputs = C.case_inputs(case, variant, run_len)
    module = C.build_module(case, variant)
    ref_outputs = C.torch_reference(case, variant, run_inputs, module)
    st: dict[str, Any] = {
        "case": case.id, "case_number": case.number, "variant": variant.name,
        "trace_lengths": list(traces), "run_length": run_len,
        "dynamic": case.is_dynamic(variant),
        "input_shapes": {f"in{i}": list(a.shape) for i, a in enumerate(run_inputs)},
        "input_dtypes": {f"in{i}": str(a.dtype) for i, a in enumerate(run_inputs)},
        "reference_output_shapes": {f"out{i}": list(a.shape) for i, a in enumerate(ref_outputs)},
        "handwritten": variant.handwritten_param is not None,
    }
    param = workdir / "model.ncnn.param"
    binf = workdir / "model.ncnn.bin"
    if variant.handwritten_param is not None:
        param.write_text(variant.handwritten_param)
        binf.write_bytes(b"")
        in_bidx = {f"in{i}": C.NO_BATCH for i in range(len(run_inputs))}
        out_bidx = {f"out{i}": C.NO_BATCH for i in range(len(ref_outputs))}
        st["pnnx"] = None
    else:
        examples = [C.to_torch(x) for x in C.trace_inputs(case, variant)]
        exp = export_with_pnnx(module, examples[0], workdir, "model",
                               example_inputs2=examples[1] if len(examples) > 1 else None,
                               fp16=False, optlevel=2, timeout=timeout)
        st["pnnx"] = {"returncode": exp.returncode, "signal_name": signal_name(exp.signal),
                      "command": ["pnnx"] + exp.command[1:], "warnings": exp.warnings,
                      "trace_warnings": exp.trace_warnings,
                      "stderr_tail": [ln.rstrip() for ln in exp.stderr.splitlines()
                                      if ln.strip()][-12:] if not exp.ok else []}
        in_bidx, out_bidx = exp.input_batch_index, exp.output_batch_index
        if not exp.ok:
            for name in MODEL_FILES:            # a failed export may leave partial files
                (workdir / name).unlink(missing_ok=True)
    ref = Reference(run_inputs, ref_outputs, in_bidx, out_bidx)
    if not param.exists():
        st.update({"status": "export_fail", "offending_lines": [], "unsupported_layers": []})
    else:
        text = param.read_text()
        st["offending_lines"] = C.offending_lines(case, text)
        st["unsupported_layers"] = C.unsupported_layers(text)
        st["input_batch_index"] = in_bidx
        st["output_batch_index"] = out_bidx
        run = run_reference(param, binf, ref, timeout=timeout)
        st.update(classify(run, ref_outputs, variant.nondeterministic))
    rec = recorded(case.id, variant.name)
    files = {name: workdir / name for name in MODEL_FILES if (workdir / name).exists()}
    return VariantCheck(case.id, variant.name, rec["status"] if rec else None,
                        variant.expected, st, time.monotonic() - t0, files, ref)


@dataclass
class CaseCheck:
    case: C.ReproCase
    variants: list[VariantCheck]

    @property
    def bug(self) -> VariantCheck:
        return self.variants[0]

    @property
    def changed(self) -> bool:
        return any(v.changed for v in self.variants)

    @property
    def verdict(self) -> str:
        """still reproduces | fixed in this pnnx | different failure (+ other variants)."""
        bug = self.bug
        if bug.status == "right":
            text = "fixed in this pnnx"
        elif not bug.changed:
            text = "still reproduces"
        else:
            text = f"different failure (recorded {bug.baseline}, now {bug.status})"
        others = [v for v in self.variants[1:] if v.changed]
        if others:
            text += "; " + "; ".join(f"{v.variant} now {v.status} (recorded {v.baseline})"
                                     for v in others)
        return text


def check_cases(cases: list[C.ReproCase], *, keep: Path | None = None,
                timeout: float = 300.0, progress=None) -> list[CaseCheck]:
    """Observe every variant of `cases`. Files go to `keep/<case>/<variant>/` when given,
    else to a temporary directory removed afterwards."""
    needs_export = any(v.handwritten_param is None for c in cases for v in c.variants)
    if needs_export:
        require_export_tools()
    else:
        try:
            import torch  # noqa: F401
        except ImportError:
            raise MissingDependency("repro check needs torch for the reference outputs "
                                    "(install the export extra)") from None
    results = []
    tmp = None if keep is not None else tempfile.mkdtemp(prefix="paramsurgery-repro-check-")
    base = keep if keep is not None else Path(tmp)  # type: ignore[arg-type]
    try:
        for case in cases:
            checks = []
            for v in case.variants:
                vdir = base / case.id / v.name
                if vdir.exists():
                    shutil.rmtree(vdir)
                vc = observe_variant(case, v, vdir, timeout=timeout)
                checks.append(vc)
                if progress is not None:
                    progress(vc)
            results.append(CaseCheck(case, checks))
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
    return results


def format_table(results: list[CaseCheck]) -> str:
    """The `repro check` table: one row per variant, the case verdict on the bug row, the
    evidence under it."""
    head = (f"{'#':<3} {'case':<24} {'variant':<10} {'recorded':<11} {'now':<11} "
            f"{'verdict / evidence'}")
    lines = [head, "-" * len(head)]
    for r in results:
        for i, v in enumerate(r.variants):
            mark = "" if not v.changed else "  <-- changed"
            verdict = r.verdict if i == 0 else ""
            lines.append(f"{r.case.number if i == 0 else '':<3} "
                         f"{r.case.id if i == 0 else '':<24} {v.variant:<10} "
                         f"{v.baseline:<11} {v.status:<11} {verdict}{mark}")
            ev = evidence(v.observed)
            pad = " " * 63
            if ev:
                lines.append(f"{pad}{ev}")
            if v.status != "right":
                for ln in v.observed.get("offending_lines") or []:
                    lines.append(f"{pad}| {ln}")
    n_changed = sum(v.changed for r in results for v in r.variants)
    lines.append("")
    lines.append(f"{len(results)} cases, {sum(len(r.variants) for r in results)} variants: "
                 + ("all as recorded" if not n_changed else f"{n_changed} changed from the "
                    f"recorded status"))
    return "\n".join(lines)


def to_json(results: list[CaseCheck]) -> list[dict[str, Any]]:
    out = []
    for r in results:
        out.append({
            "case": r.case.id, "number": r.case.number, "verdict": r.verdict,
            "changed": r.changed,
            "variants": [{"variant": v.variant, "recorded": v.recorded,
                          "expected": v.expected, "status": v.status, "changed": v.changed,
                          "evidence": evidence(v.observed),
                          "offending_lines": v.observed.get("offending_lines"),
                          "max_abs_err": v.observed.get("max_abs_err"),
                          "signal_name": v.observed.get("signal_name"),
                          "pnnx": v.observed.get("pnnx"), "seconds": round(v.seconds, 2)}
                         for v in r.variants],
        })
    return out


__all__ = ["environment", "require_export_tools", "observe_variant", "check_cases",
           "CaseCheck", "VariantCheck", "format_table", "to_json", "evidence", "rounded"]
