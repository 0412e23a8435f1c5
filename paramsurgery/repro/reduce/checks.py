"""What "still fails" means: a command, a Python predicate, or ncnn itself (crash,
load error, mismatch against a reference graph)."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
import shlex
import subprocess
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.runtime.child import Fetch, RunOptions, RunResult, run_isolated

from paramsurgery.repro.reduce.builder import Candidate, Verdict
from paramsurgery.repro.reduce.values import FAIL, KINDS, OTHER, PASS, UNKNOWN


# =========================================================================== checks

def _squeezed(shape: Sequence[int]) -> list[int]:
    return [d for d in shape if d != 1]


def compare_values(got: np.ndarray, want: np.ndarray, atol: float, rtol: float) -> str | None:
    """None when equal within tolerance (unit axes ignored); else what differs."""
    got = np.asarray(got)
    want = np.asarray(want)
    if _squeezed(got.shape) != _squeezed(want.shape) or got.size != want.size:
        return f"shape {list(got.shape)} vs reference {list(want.shape)}"
    if got.size == 0:
        return None
    g = got.reshape(want.shape).astype(np.float64)
    w = want.astype(np.float64)
    if np.allclose(g, w, atol=atol, rtol=rtol, equal_nan=True):
        return None
    finite = np.isfinite(g) & np.isfinite(w)
    err = float(np.max(np.where(finite, np.abs(g - w), np.inf)))
    return f"max abs error {err:.3g}"


class Check:
    """Decides whether a candidate still fails. `describe()` goes into the replay log."""

    needs_values = False

    def __call__(self, cand: Candidate) -> Verdict:  # pragma: no cover - interface
        raise NotImplementedError

    def describe(self) -> dict[str, Any]:  # pragma: no cover - interface
        raise NotImplementedError

    def calibrate(self, verdict: Verdict) -> None:
        """Called with the source graph's verdict (lets a check pin the failure kind)."""


class CommandCheck(Check):
    def __init__(self, template: str, *, fail_codes: Sequence[int] = (),
                 fail_regex: str | None = None, timeout: float = 600.0) -> None:
        try:
            self.argv = shlex.split(template)
        except ValueError as exc:
            raise ParamSurgeryError(f"--check: {exc}") from None
        if not self.argv:
            raise ParamSurgeryError("--check: empty command")
        self.template = template
        self.fail_codes = set(fail_codes)
        self.fail_regex = re.compile(fail_regex) if fail_regex else None
        self.timeout = timeout

    def describe(self) -> dict[str, Any]:
        return {"check": "command", "command": self.template,
                "fail_codes": sorted(self.fail_codes) or "any non-zero",
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    def __call__(self, cand: Candidate) -> Verdict:
        subst = {"param": str(cand.param), "bin": str(cand.bin) if cand.bin else "",
                 "inputs": str(cand.inputs_npz), "expected": str(cand.expected_npz),
                 "dir": str(cand.param.parent)}
        argv = [_substitute(a, subst) for a in self.argv]
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, errors="replace",
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired:
            return Verdict(OTHER, f"no exit after {self.timeout:.0f} s")
        except OSError as exc:
            raise ParamSurgeryError(f"--check: cannot run {argv[0]!r}: {exc.strerror or exc}") \
                from None
        rc = proc.returncode
        out = proc.stdout + proc.stderr
        tail = " | ".join([ln.strip() for ln in out.splitlines() if ln.strip()][-2:])
        code = _describe_rc(rc)
        failed = rc in self.fail_codes if self.fail_codes else rc != 0
        if failed and self.fail_regex is not None and not self.fail_regex.search(out):
            return Verdict(OTHER, f"{code}, output does not match --fail-regex: {tail}")
        if failed:
            return Verdict(FAIL, f"{code}" + (f": {tail}" if tail else ""))
        if rc != 0:
            return Verdict(OTHER, f"{code} (not a --fail-code)" + (f": {tail}" if tail else ""))
        return Verdict(PASS, code)


def _substitute(arg: str, subst: dict[str, str]) -> str:
    return re.sub(r"\{(param|bin|inputs|expected|dir)\}", lambda m: subst[m.group(1)], arg)


def _describe_rc(rc: int) -> str:
    if rc < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit {rc}"


class PredicateCheck(Check):
    def __init__(self, fn: Callable[[Candidate], Any], name: str) -> None:
        self.fn = fn
        self.name = name

    def describe(self) -> dict[str, Any]:
        return {"check": "predicate", "predicate": self.name}

    def __call__(self, cand: Candidate) -> Verdict:
        try:
            res = self.fn(cand)
        except Exception as exc:
            raise ParamSurgeryError(f"--predicate {self.name} raised {type(exc).__name__}: "
                                    f"{exc}") from exc
        if isinstance(res, Verdict):
            return res
        if isinstance(res, tuple) and len(res) == 2:
            return Verdict(FAIL if res[0] else PASS, str(res[1]))
        return Verdict(FAIL if res else PASS, "")


def load_predicate(spec: str) -> PredicateCheck:
    """`module:function` or `path/to/file.py:function`."""
    mod_name, sep, fn_name = spec.rpartition(":")
    if not sep or not mod_name or not fn_name:
        raise ParamSurgeryError(f"--predicate {spec!r}: expected module:function")
    try:
        if mod_name.endswith(".py") or os.sep in mod_name:
            path = Path(mod_name)
            if not path.is_file():
                raise ParamSurgeryError("no such file", file=mod_name)
            sp = importlib.util.spec_from_file_location(f"_paramsurgery_predicate_{path.stem}",
                                                        path)
            module = importlib.util.module_from_spec(sp)  # type: ignore[arg-type]
            sp.loader.exec_module(module)  # type: ignore[union-attr]
        else:
            module = importlib.import_module(mod_name)
    except ParamSurgeryError:
        raise
    except Exception as exc:  # noqa: BLE001
        raise ParamSurgeryError(f"--predicate {spec!r}: cannot import {mod_name}: "
                                f"{type(exc).__name__}: {exc}") from None
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        raise ParamSurgeryError(f"--predicate {spec!r}: {mod_name} has no function {fn_name!r}")
    return PredicateCheck(fn, spec)


class BuiltinCheck(Check):
    """Run the candidate through ncnn in a child process and classify what happened."""

    def __init__(self, kind: str, *, atol: float = 1e-3, rtol: float = 1e-3,
                 timeout: float = 600.0, fail_regex: str | None = None,
                 same_signal: bool = True, compare: str = "outputs") -> None:
        if kind not in KINDS:
            raise ParamSurgeryError(f"unknown failure kind {kind!r} (one of {', '.join(KINDS)})")
        if compare not in ("outputs", "all"):
            raise ParamSurgeryError(f"unknown compare mode {compare!r} (outputs or all)")
        self.kind = kind
        self.compare = compare
        self.atol = atol
        self.rtol = rtol
        self.timeout = timeout
        self.fail_regex = re.compile(fail_regex) if fail_regex else None
        self.same_signal = same_signal
        self.signal: int | None = None
        self.needs_values = kind != "load-error"

    def describe(self) -> dict[str, Any]:
        return {"check": "builtin", "kind": self.kind, "compare": self.compare,
                "atol": self.atol, "rtol": self.rtol, "signal": self.signal,
                "fail_regex": self.fail_regex.pattern if self.fail_regex else None}

    def calibrate(self, verdict: Verdict) -> None:
        if verdict.failed and verdict.signal is not None:
            self.signal = verdict.signal

    def compared(self, cand: Candidate) -> dict[str, np.ndarray]:
        """Blob -> reference value for the blobs this check compares."""
        if self.compare == "outputs" or cand.reference is None:
            return dict(cand.expected)
        out: dict[str, np.ndarray] = {}
        for layer in cand.graph:
            if layer.type == "Input":
                continue
            for b in layer.outputs:
                v = cand.reference.get(b)
                if v is not None:
                    out[b] = v[0]
        return out

    def _run(self, cand: Candidate, load_only: bool, blobs: Sequence[str]) -> RunResult:
        if load_only:
            return run_isolated(cand.param, cand.bin, {}, [], timeout=self.timeout)
        if not blobs or set(blobs) <= set(cand.outputs):
            fetches = [Fetch(b) for b in cand.outputs]
            return run_isolated(cand.param, cand.bin, cand.feeds, fetches, timeout=self.timeout)
        # intermediate blobs too: in file order with light mode off (ncnn 1.0.20261020
        # segfaults when a blob its light mode already released is extracted afterwards)
        wanted = set(blobs) | set(cand.outputs)
        order = [b for b in cand.graph.blob_names() if b in wanted]
        return run_isolated(cand.param, cand.bin, cand.feeds, [Fetch(b) for b in order],
                            options=RunOptions(light_mode=False), timeout=self.timeout)

    def __call__(self, cand: Candidate) -> Verdict:
        load_only = self.kind == "load-error"
        if not load_only and cand.missing:
            return Verdict(UNKNOWN, "no value for input(s) " + ", ".join(cand.missing[:5]))
        expected = self.compared(cand) if self.kind in ("mismatch", "any") else {}
        if self.kind == "mismatch" and not expected:
            return Verdict(UNKNOWN, "no reference value for any compared blob")
        run = self._run(cand, load_only, list(expected))
        text = run.message + "\n" + run.stderr
        verdict = self._classify(run, expected)
        if verdict.failed and self.fail_regex is not None and not self.fail_regex.search(text):
            return Verdict(OTHER, verdict.detail + " (does not match --fail-regex)")
        return verdict

    def _classify(self, run: RunResult, expected: dict[str, np.ndarray]) -> Verdict:
        st = run.status
        msg = (run.message or "").strip().splitlines()
        err = [ln.strip() for ln in run.stderr.splitlines() if ln.strip()]
        first = (err[0] if err else (msg[0] if msg else ""))
        if st == "crash":
            desc = f"ncnn {run.describe()}"
            if self.kind in ("crash", "any"):
                if self.kind == "crash" and self.same_signal and self.signal is not None \
                        and run.signal != self.signal:
                    return Verdict(OTHER, desc + f", not signal {self.signal}", run.signal)
                return Verdict(FAIL, desc, run.signal)
            return Verdict(OTHER, desc, run.signal)
        if st in ("load_param_failed", "load_model_failed"):
            desc = f"{st}: {first}" if first else st
            return Verdict(FAIL if self.kind in ("load-error", "any") else OTHER, desc)
        if self.kind == "load-error":
            return Verdict(PASS, "loads")
        if st == "ok":
            if self.kind in ("mismatch", "any") and expected:
                diffs = []
                for b, want in expected.items():
                    got = run.outputs.get(b)
                    if got is None:
                        continue
                    d = compare_values(got, want, self.atol, self.rtol)
                    if d is not None:
                        diffs.append(f"{b}: {d}")
                if diffs:
                    return Verdict(FAIL, "mismatch: " + "; ".join(diffs[:3]) +
                                   (f" (+{len(diffs) - 3} more)" if len(diffs) > 3 else ""))
                what = "output" if self.compare == "outputs" else "blob"
                return Verdict(PASS, f"{len(expected)} {what}(s) match the reference")
            return Verdict(PASS, "runs")
        if st in ("input_failed", "error"):
            return Verdict(OTHER, f"{st}: {first}")
        if st == "timeout":
            return Verdict(OTHER, run.describe())
        # extract_failed: the graph loads but an output cannot be computed
        return Verdict(FAIL if self.kind == "any" else OTHER, f"{st}: {first}")
