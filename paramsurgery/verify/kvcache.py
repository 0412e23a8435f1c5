"""Parity of a kv-cache decoder through ncnn (`paramsurgery verify-kvcache`).

The decoder convention is the fixtures' (and the Qwen3-TTS port's): inputs `embeds`
(T, hidden), an additive `mask` (T, past+T), RoPE `cos`/`sin` (T, head_dim) for the current
positions, and one output (T, hidden). The check runs, through the real ncnn runtime:

1. a full prefill of N+M positions with empty caches (= the graph without cache);
2. a prefill of the first N positions, then M single-token steps, each feeding back the
   cache outputs of the previous call exactly as ncnn returned them (`extract(name, 1)`:
   the SDPA cache is an opaque packed buffer and must not go through numpy);

and compares every step's output with the matching rows of (1). It runs in a child process
so a crashing graph is reported, not fatal.
"""

from __future__ import annotations

import json
import re
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from paramsurgery.core.npz import save_arrays

from paramsurgery.core.errors import ParamSurgeryError, VerificationError
from paramsurgery.ir.graph import Graph
from paramsurgery.formats.io import load
from paramsurgery.analysis.shapes import infer_shapes


@dataclass
class DecoderIO:
    embeds: str = "in0"
    mask: str = "in1"
    cos: str = "in2"
    sin: str = "in3"
    output: str = "out0"
    hidden: int | None = None  # inferred from the graph when None
    head_dim: int | None = None  # inferred from the graph when None
    rope_theta: float = 10000.0


@dataclass
class StepResult:
    label: str
    positions: tuple[int, int]
    max_abs: float
    max_rel: float


@dataclass
class ParityReport:
    n: int
    m: int
    tol: float
    steps: list[StepResult] = field(default_factory=list)
    reference_rel: float | None = None  # full prefill vs the graph without cache, if given
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and all(s.max_rel <= self.tol for s in self.steps) and \
            (self.reference_rel is None or self.reference_rel <= self.tol)

    def format(self) -> str:
        from paramsurgery.verify.equivalence import format_parity

        rows = [] if self.reference_rel is None else [
            f"full prefill vs graph without cache: rel {self.reference_rel:.3e}"]
        rows += [self.row(s) for s in self.steps]
        return format_parity(self.header(), self.error, rows, self.ok, failed="FAILED to run")

    def header(self) -> str:
        return (f"kv-cache parity: prefill {self.n} + {self.m} single-token steps "
                f"vs a full prefill of {self.n + self.m} (tolerance rel {self.tol:g})")

    def row(self, s: StepResult) -> str:
        """One step's line; positions as a closed range `first..last` (JSON: `first`,
        `last`)."""
        return (f"{s.label:<10} positions {s.positions[0]:>3}..{s.positions[1] - 1:<3} "
                f"max_abs {s.max_abs:.3e}  rel {s.max_rel:.3e}  "
                f"{'ok' if s.max_rel <= self.tol else 'MISMATCH'}")

    def to_json(self) -> dict:
        """The machine form: positions as the closed range the text shows."""
        return {"ok": self.ok, "n": self.n, "m": self.m, "tol": self.tol, "error": self.error,
                "reference_rel": self.reference_rel,
                "steps": [{"label": s.label, "first": s.positions[0],
                           "last": s.positions[1] - 1, "max_abs": s.max_abs,
                           "max_rel": s.max_rel, "ok": s.max_rel <= self.tol}
                          for s in self.steps]}


# --------------------------------------------------------------------------- inference

_INT_RE = re.compile(r"-?\d+")


def infer_hidden(g: Graph, embeds: str) -> int | None:
    """Feature width of the embeds input: the first norm / linear reading it."""
    frontier = [embeds]
    seen: set[str] = set()
    while frontier:
        blob = frontier.pop(0)
        if blob in seen:
            continue
        seen.add(blob)
        for layer, _ in g.consumers(blob):
            p = layer.params
            if layer.type in ("RMSNorm", "LayerNorm") and p.get(0):
                return p.get_int(0)
            if layer.type == "Gemm" and p.get(5, 0) and p.get(9):
                return p.get_int(9)
            if layer.type == "MultiHeadAttention" and p.get(0):
                return p.get_int(3, p.get_int(0))
            if layer.type in ("Split", "Noop"):
                frontier.extend(layer.outputs)
    return None


def infer_head_dim(g: Graph) -> int | None:
    """head_dim from the q/k path into RotaryEmbed: a per-head norm (0=head_dim) or the
    Reshape that splits heads (`6="hd,heads,0h"` or `0=hd`)."""
    for rope in g.by_type("RotaryEmbed"):
        cur = rope.inputs[0]
        for _ in range(8):
            p = g.producer(cur)
            if p is None:
                break
            if p.type in ("RMSNorm", "LayerNorm") and p.params.get(0):
                return p.params.get_int(0)
            if p.type == "Reshape":
                expr = p.params.get(6)
                if isinstance(expr, str):
                    first = expr.split(",")[0]
                    if _INT_RE.fullmatch(first):
                        return int(first)
                dims0 = p.params.get(0)
                if isinstance(dims0, int) and dims0 > 0:
                    return dims0
                break
            if not p.inputs:
                break
            cur = p.inputs[0]
    return None


def rope_tables(positions: np.ndarray, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = positions[:, None].astype(np.float64) * inv[None, :]
    ang = np.concatenate([ang, ang], axis=1)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def causal_mask(rows: int, past: int) -> np.ndarray:
    m = np.zeros((rows, past + rows), np.float32)
    m[:, past:][np.triu_indices(rows, 1)] = -np.inf
    return m


# --------------------------------------------------------------------------- public API

def generic_plan(g: Graph, inputshape: dict, param: str) -> tuple[str, dict, int]:
    """From an input spec with one symbol (the sequence length): each input's axes as "q"
    (query positions: a step feeds rows start..stop), "k" (key positions, the last of two
    length axes, e.g. a mask's columns: a step feeds 0..stop) or "-" (fixed), and the
    output's length axis (from the shape analysis)."""
    from paramsurgery.analysis.shapes.affine import Affine

    syms = {sym for s in inputshape.values() for d in s for sym in getattr(d, "symbols", ())}
    if len(syms) != 1:
        raise VerificationError("the generic kv-cache check needs --inputshape with exactly one "
                                f"symbol, the sequence length (got {sorted(syms) or 'none'})",
                                file=param)
    T = Affine.symbol(syms.pop())
    plans: dict[str, list[str]] = {}
    for blob, shape in inputshape.items():
        bad = [d for d in shape if isinstance(d, Affine) and d != T]
        if bad:
            raise VerificationError(f"--inputshape {blob}: dim {bad[0]} is not the length {T} "
                                    f"itself or a number", file=param)
        axes = [i for i, d in enumerate(shape) if d == T]
        plan = ["-"] * len(shape)
        for i in axes:
            plan[i] = "q"
        if len(axes) >= 2:
            plan[axes[-1]] = "k"
        plans[blob] = plan
    return str(T), plans, -1


def verify_kvcache(param: str | Path, bin: str | Path | None, *, n: int, m: int,
                   io: DecoderIO | None = None, tol: float = 1e-5, seed: int = 0,
                   reference_param: str | Path | None = None, timeout: float = 1800,
                   inputshape: dict | None = None,
                   inputs: str | Path | None = None) -> ParityReport:
    """Run the parity check in a child process. `reference_param` (the same graph without
    cache, sharing `bin`) adds a check of the full prefill against it. `inputshape` (one
    symbol, the length; e.g. `{"in0": ("T", 1024), "in1": (1, "T", "T")}`) makes the check
    generic: inputs are generated for the full length by kind (or taken from `inputs`, an
    .npz of full-length arrays) and sliced per step; the decoder convention is not used."""
    if n < 1 or m < 1:
        raise ParamSurgeryError("need at least one prefill position and one step (n, m >= 1)")
    io = io or DecoderIO()
    g = load(param)
    from paramsurgery.passes.kvcache import cache_slots

    slots = cache_slots(g)
    if not slots:
        raise VerificationError("the graph has no attention layer with a kv cache (7=1); run "
                                "add-kvcache first", file=str(param))
    if inputshape:
        return _verify_generic(g, param, bin, slots, n, m, io, tol, seed, reference_param,
                               timeout, inputshape, inputs)
    rope = io.cos in g.inputs and io.sin in g.inputs
    if not rope and g.by_type("RotaryEmbed"):
        raise VerificationError(f"the graph applies RoPE but {io.cos!r}/{io.sin!r} are not both "
                                f"graph inputs (inputs: {', '.join(g.inputs)})", file=str(param))
    missing = [b for b in (io.embeds, io.mask) + ((io.cos, io.sin) if rope else ())
               if b not in g.inputs]
    if missing:
        raise VerificationError(f"decoder input(s) {', '.join(missing)} are not graph inputs "
                                f"(inputs: {', '.join(g.inputs)}); pass the names explicitly",
                                file=str(param))
    if io.output not in g.outputs:
        raise VerificationError(f"{io.output!r} is not a graph output", file=str(param))
    hidden = io.hidden or infer_hidden(g, io.embeds)
    head_dim = (io.head_dim or infer_head_dim(g)) if rope else 0
    if not hidden or (rope and not head_dim):
        what = "hidden size" if not hidden else "head_dim"
        raise VerificationError(f"cannot infer the {what} from the graph; give it explicitly",
                                file=str(param))
    spec = {"param": str(param), "bin": None if bin is None else str(bin), "n": n, "m": m,
            "io": {**asdict(io), "hidden": hidden, "head_dim": head_dim}, "seed": seed,
            "rope": rope,
            "reference_param": None if reference_param is None else str(reference_param),
            "slots": [[s.k_in, s.v_in, s.k_out, s.v_out] for s in slots]}
    with tempfile.TemporaryDirectory(prefix="paramsurgery-kv-") as tmp:
        return _run_child(spec, Path(tmp), ParityReport(n, m, tol), timeout)


def _verify_generic(g: Graph, param, bin, slots, n: int, m: int, io: DecoderIO,
                    tol: float, seed: int, reference_param, timeout: float,
                    inputshape: dict, inputs) -> ParityReport:
    from paramsurgery.analysis.shapes import normalize_inputshape
    from paramsurgery.analysis.shapes.affine import evaluate
    from paramsurgery.analysis.shapes.feeds import make_feeds

    shapes = normalize_inputshape(inputshape)
    sym, plans, _ = generic_plan(g, shapes, str(param))
    if io.output not in g.outputs:
        raise VerificationError(f"{io.output!r} is not a graph output (--output-blob)",
                                file=str(param))
    out_shape = infer_shapes(g, inputshape=shapes).shape_of(io.output)
    from paramsurgery.analysis.shapes.affine import Affine

    out_axes = [i for i, d in enumerate(out_shape or ()) if d == Affine.symbol(sym)]
    if not out_axes:
        raise VerificationError(f"the shape of output {io.output!r} is not known along the "
                                f"length {sym} at --inputshape: cannot slice it per step",
                                file=str(param))
    total = n + m
    full = {b: tuple(evaluate(d, {sym: total}) for d in s) for b, s in shapes.items()}
    feeds = make_feeds(g, full, seed=seed, npz=inputs)
    report = ParityReport(n, m, tol)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-kv-") as tmp:
        names = list(feeds)
        save_arrays(Path(tmp) / "feeds.npz", {f"a{i}": feeds[b] for i, b in enumerate(names)})
        spec = {"param": str(param), "bin": None if bin is None else str(bin), "n": n, "m": m,
                "io": asdict(io), "seed": seed, "rope": False,
                "reference_param": None if reference_param is None else str(reference_param),
                "slots": [[s.k_in, s.v_in, s.k_out, s.v_out] for s in slots],
                "generic": {"names": names, "plans": plans, "out_axis": out_axes[0]}}
        return _run_child(spec, Path(tmp), report, timeout)


def _run_child(spec: dict, tmp: Path, report: ParityReport, timeout: float) -> ParityReport:
    """The check's two sides, one after the other, each in its own child process: only one
    net's weights are resident at a time, and only the compared outputs come back. The
    current progress reporter gets the plan (the header) at once and each step's line as
    the child finishes it."""
    from paramsurgery.core import progress

    reference = bool(spec.get("reference_param"))
    progress.plan(report.header())
    with progress.task("kv-cache parity", total=report.m + 2 + reference, unit="run") as task:
        def on_line(text: str) -> None:
            try:
                item = json.loads(text)
            except ValueError:
                return  # not a step record (a library printing on stdout)
            if not isinstance(item, dict) or "label" not in item:
                return
            if item["label"] == "full prefill":
                last = item["positions"][1] - 1
                task.done(f"  full prefill positions 0..{last} (what each step must equal)")
                return
            step = StepResult(item["label"], tuple(item["positions"]), item["max_abs"],
                              item["max_rel"])
            task.done("  " + report.row(step))

        data = _run_side({**spec, "role": "candidate"}, tmp, timeout, on_line)
        ref: dict | None = None
        if data.get("error") is None and reference:
            ref = _run_side({**spec, "role": "reference", "param": spec["reference_param"]},
                            tmp, timeout)
            task.done()
        report = _finish(tmp, report, data, ref)
        if report.error is None:
            if report.reference_rel is not None:
                progress.line(f"  full prefill vs graph without cache: rel "
                              f"{report.reference_rel:.3e}")
            progress.line("  parity: " + ("ok" if report.ok else "FAILED"))
    return report


def _finish(tmp: Path, report: ParityReport, data: dict, ref: dict | None) -> ParityReport:
    """The report from the sides' results (`ref`: the graph without cache, when run)."""
    if ref is not None:
        if ref.get("error") is not None:
            data = ref
        else:
            data["reference_rel"] = _rel(np.load(tmp / "candidate.npy"),
                                         np.load(tmp / "reference.npy"))[1]
    if data.get("error"):
        report.error = data["error"]
        return report
    report.steps = [StepResult(s["label"], tuple(s["positions"]), s["max_abs"], s["max_rel"])
                    for s in data["steps"]]
    report.reference_rel = data.get("reference_rel")
    return report


def _run_side(spec: dict, tmp: Path, timeout: float, on_line=None) -> dict:
    """One side in a child process: its result, or {"error": what went wrong}. `on_line`
    gets each step record (a JSON line) the child prints as it finishes the step."""
    from paramsurgery.runtime.child import run_module_child

    role = spec["role"]
    spec_path = tmp / f"{role}.json"
    spec_path.write_text(json.dumps(spec))
    out_path = tmp / f"{role}.result.json"
    error = run_module_child("paramsurgery.verify.kvcache", spec_path, out_path, timeout,
                             on_line=on_line)
    return {"error": error} if error else json.loads(out_path.read_text())


def slice_step(arr: np.ndarray, plan: list[str], start: int, stop: int) -> np.ndarray:
    """One call's part of a whole-length array: a "q" axis gives positions start..stop, a
    "k" axis 0..stop (past and current), a "-" axis all of it (`generic_plan`)."""
    idx = tuple(slice(start, stop) if r == "q" else slice(0, stop) if r == "k" else slice(None)
                for r in plan)
    return np.ascontiguousarray(arr[idx])


# --------------------------------------------------------------------------- child process

def _rel(a: np.ndarray, ref: np.ndarray) -> tuple[float, float]:
    if a.shape != ref.shape:
        return float("inf"), float("inf")
    diff = float(np.max(np.abs(a - ref))) if a.size else 0.0
    scale = float(np.max(np.abs(ref))) if ref.size else 0.0
    return diff, diff / scale if scale > 0 else diff


def _child(spec_path: Path) -> int:
    import ncnn

    from paramsurgery.runtime.child import NcnnRunError, RunOptions, load_net, write_child_result

    spec = json.loads(spec_path.read_text())
    role = spec.get("role", "candidate")
    out_path = spec_path.parent / f"{role}.result.json"
    io = spec["io"]
    n, m = spec["n"], spec["m"]
    total = n + m
    rng = np.random.default_rng(spec["seed"])
    generic = spec.get("generic")
    if generic:  # full-length arrays from the input spec, sliced per step
        with np.load(spec_path.parent / "feeds.npz") as data:
            full_inputs = {b: data[f"a{i}"] for i, b in enumerate(generic["names"])}
    else:
        embeds = rng.standard_normal((total, io["hidden"])).astype(np.float32)
    rope = spec["rope"]
    cos, sin = rope_tables(np.arange(total), io["head_dim"], io["rope_theta"]) if rope else (None, None)
    slots = spec["slots"]
    try:
        net = load_net(spec["param"], spec["bin"], RunOptions())
    except NcnnRunError as exc:
        out_path.write_text(json.dumps({"error": exc.message}))
        return 0

    keep: list = []  # numpy arrays backing Mats stay alive until the call ends

    def mat(a: np.ndarray):
        a = np.ascontiguousarray(a, np.int32 if a.dtype.kind in "iu" else np.float32)
        keep.append(a)
        return ncnn.Mat(a).clone()

    def call(net_, start: int, stop: int, past: int, caches: dict | None):
        ex = net_.create_extractor()
        if generic:
            feeds = {b: slice_step(a, generic["plans"][b], start, stop)
                     for b, a in full_inputs.items()}
        else:
            feeds = {io["embeds"]: embeds[start:stop],
                     io["mask"]: causal_mask(stop - start, past)}
        if cos is not None and sin is not None:
            feeds[io["cos"]] = cos[start:stop]
            feeds[io["sin"]] = sin[start:stop]
        for name, arr in feeds.items():
            if ex.input(name, mat(arr)) != 0:
                raise RuntimeError(f"input {name} rejected")
        if caches is not None:
            for k_in, v_in, _, _ in slots:
                ex.input(k_in, caches.get(k_in, ncnn.Mat()))
                ex.input(v_in, caches.get(v_in, ncnn.Mat()))
        ret, out = ex.extract(io["output"])
        if ret != 0:
            raise RuntimeError(f"extract {io['output']} returned {ret}")
        result = np.array(out, copy=True)
        if generic:
            result = np.moveaxis(result, generic["out_axis"], 0)
        result = result.reshape(stop - start, -1)
        new = {}
        if caches is not None:
            for k_in, v_in, k_out, v_out in slots:
                for src, dst in ((k_out, k_in), (v_out, v_in)):
                    r, c = ex.extract(src, 1)  # raw: the cache layout is backend-private
                    if r != 0:
                        raise RuntimeError(f"extract {src} returned {r}")
                    new[dst] = c
        return result, new

    def tell(item: dict) -> None:  # the parent shows each step as it is finished
        print(json.dumps(item), flush=True)

    def parity() -> dict:
        if role == "reference":  # the graph without cache: only its full prefill
            ref, _ = call(net, 0, total, 0, None)
            np.save(spec_path.parent / "reference.npy", ref)
            return {"steps": []}
        full, _ = call(net, 0, total, 0, {})
        np.save(spec_path.parent / "candidate.npy", full)
        tell({"label": "full prefill", "positions": [0, total]})
        steps: list[dict[str, object]] = []
        pre, caches = call(net, 0, n, 0, {})
        d, r = _rel(pre, full[:n])
        steps.append({"label": "prefill", "positions": [0, n], "max_abs": d, "max_rel": r})
        tell(steps[-1])
        for t in range(n, total):
            out, caches = call(net, t, t + 1, t, caches)
            d, r = _rel(out, full[t:t + 1])
            steps.append({"label": f"step {t - n + 1}", "positions": [t, t + 1], "max_abs": d,
                          "max_rel": r})
            tell(steps[-1])
        return {"steps": steps}

    return write_child_result(out_path, parity)


if __name__ == "__main__":  # pragma: no cover - run by verify_kvcache
    sys.exit(_child(Path(sys.argv[1])))
