"""Proof for `fold-explicit-cache`: a decode loop through ncnn under each graph's contract.

Folding `Concat(past, cur) → SDPA` into SDPA's native cache changes what the past inputs
mean: the explicit graph takes the past keys/values as plain arrays; the folded graph takes
the opaque cache ncnn itself returned on the previous call (`extract(present, 1)`), and an
empty cache to prefill. Feeding the folded graph plain arrays gives wrong attention (the
cache is packed), so equivalence can only be shown with the protocol each graph needs:

    step 0 (prefill): folded graph, empty caches        → its outputs, its caches, and the
                                                           plain current k/v (extracted)
    step t >= 1:      folded graph, caches from step t-1 → outputs, new caches
                      explicit graph, plain pasts        → outputs, new plain pasts
                                                           (its Concat outputs)
    compare the outputs of every step t >= 1

(the explicit graph cannot prefill from an empty past: ncnn's Concat crashes on an empty
input). The loop runs in a child process, since ncnn may crash.
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from paramsurgery.passes.fold_explicit_cache import FoldedCache

from paramsurgery.core.npz import save_arrays

from paramsurgery.core.errors import VerificationError


@dataclass
class FoldParity:
    steps: list[tuple[int, float, float]] = field(default_factory=list)  # (step, abs, rel)
    tol: float = 1e-5
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.steps) and \
            all(rel <= self.tol for _, _, rel in self.steps)

    def format(self) -> str:
        if self.error:
            return f"verify: could not run the decode loop: {self.error}"
        worst = max((r for _, _, r in self.steps), default=float("nan"))
        lines = [f"verify: decode loop (prefill, then {len(self.steps)} step(s) feeding back "
                 f"ncnn's caches) vs the explicit graph fed plain past arrays: max rel error "
                 f"{worst:.2e} (tol {self.tol:g}) {'ok' if self.ok else 'FAILED'}"]
        lines += [f"  step {t}: max abs {a:.3e}, max rel {r:.3e}" for t, a, r in self.steps]
        return "\n".join(lines)

    def to_json(self) -> dict:
        return {"ok": self.ok, "tol": self.tol, "error": self.error,
                "steps": [{"step": t, "max_abs": a, "max_rel": r} for t, a, r in self.steps]}


def verify_fold(explicit_param: str | Path, folded_param: str | Path, bin: str | Path | None,
                caches: Sequence[FoldedCache], steps: Sequence[Mapping[str, np.ndarray]],
                outputs: Sequence[str], *, tol: float = 1e-5,
                timeout: float = 1800) -> FoldParity:
    """Run the decode loop (module doc) on `steps` (per step, the arrays of every input that
    is not a cache, in ncnn layout: numpy (c, h, w)) and compare `outputs`."""
    if len(steps) < 2:
        raise VerificationError("the decode loop needs a prefill and at least one step")
    with tempfile.TemporaryDirectory(prefix="paramsurgery-fold-") as tmp:
        d = Path(tmp)
        arrays = {f"s{i}_{j}": np.asarray(a) for i, feeds in enumerate(steps)
                  for j, a in enumerate(feeds.values())}
        save_arrays(d / "steps.npz", arrays)
        spec = {"explicit": str(explicit_param), "folded": str(folded_param),
                "bin": None if bin is None else str(bin),
                "caches": [c.__dict__ for c in caches], "outputs": list(outputs),
                "steps": [list(feeds) for feeds in steps]}
        (d / "spec.json").write_text(json.dumps(spec))
        from paramsurgery.runtime.child import run_module_child

        result_path = d / "result.json"
        report = FoldParity(tol=tol)
        report.error = run_module_child("paramsurgery.verify.fold", d, result_path, timeout)
        if report.error:
            return report
        data = json.loads(result_path.read_text())
    report.error = data.get("error")
    report.steps = [tuple(s) for s in data.get("steps", [])]
    return report


# --------------------------------------------------------------------------- inputs

PREFILL, STEPS = 3, 4  # generated decode loop: a 3-position prefill, then 4 single steps


def decode_steps(g, caches: Sequence[FoldedCache], inputshape: Mapping[str, tuple],
                 where: str | None = None, *, prefill: int = PREFILL, steps: int = STEPS,
                 seed: int = 0) -> list[dict[str, np.ndarray]]:
    """The non-cache inputs of each call of the decode loop, generated: `inputshape` gives
    every such input's shape with the sequence length as its one symbol (`q=[2,T,8]`,
    `mask=[T,T]`). Arrays are made once for the whole length by kind (`shapes.feeds`: ids
    for Embed, a causal mask for an attention mask, N(0, 1) otherwise) and cut per call:
    a length axis gives the call's positions, the last of two (a mask's columns) every
    position up to the call's last (past and current)."""
    from paramsurgery.verify.kvcache import generic_plan, slice_step
    from paramsurgery.analysis.shapes import normalize_inputshape
    from paramsurgery.analysis.shapes.affine import evaluate
    from paramsurgery.analysis.shapes.feeds import make_feeds

    past = {b for c in caches for b in (c.past_k, c.past_v)}
    wanted = [b for b in g.inputs if b not in past]
    shapes = {b: s for b, s in normalize_inputshape(inputshape).items() if b not in past}
    unknown = [b for b in shapes if b not in wanted]
    if unknown:
        raise VerificationError(f"--inputshape names {', '.join(map(repr, unknown))}, not a "
                                f"non-cache input of the graph (those: {', '.join(wanted)})",
                                file=where)
    missing = [b for b in wanted if b not in shapes]
    if missing:
        raise VerificationError(
            "--verify needs the inputs of each call of the decode loop: --feeds NPZ, or "
            "--inputshape with the sequence length as a symbol for every non-cache input "
            f"(missing: {', '.join(missing)}; e.g. {missing[0]}=[T,...])", file=where)
    symbols = {x for s in shapes.values() for d in s for x in getattr(d, "symbols", ())}
    if len(symbols) != 1:
        raise VerificationError(f"--inputshape must use exactly one symbol, the sequence "
                                f"length (got {', '.join(sorted(symbols)) or 'none'})",
                                file=where)
    sym, plans, _ = generic_plan(g, shapes, where or "")
    total = prefill + steps
    full = {b: tuple(evaluate(d, {sym: total}) for d in s) for b, s in shapes.items()}
    arrays = make_feeds(g, full, seed=seed)
    calls = [(0, prefill)] + [(prefill + i, prefill + i + 1) for i in range(steps)]
    return [{b: slice_step(arrays[b], plans[b], start, stop) for b in wanted}
            for start, stop in calls]


# --------------------------------------------------------------------------- child process

def _child(d: Path) -> int:
    import ncnn

    from paramsurgery.runtime.child import NcnnRunError, RunOptions, load_net

    spec = json.loads((d / "spec.json").read_text())
    caches = [FoldedCache(**c) for c in spec["caches"]]
    with np.load(d / "steps.npz") as z:
        steps = [{name: z[f"s{i}_{j}"] for j, name in enumerate(names)}
                 for i, names in enumerate(spec["steps"])]
    keep: list = []

    def mat(a: np.ndarray):
        a = np.ascontiguousarray(a)
        a = a.astype(np.int32 if a.dtype.kind in "iub" else np.float32)
        keep.append(a)
        return ncnn.Mat(a).clone()

    def run(net, feeds: dict, extract: list[str], raw: list[str]) -> tuple[dict, dict]:
        ex = net.create_extractor()
        ex.set_light_mode(False)  # intermediate blobs (current k/v, Concat outputs) are read
        for name, value in feeds.items():
            if ex.input(name, value if isinstance(value, ncnn.Mat) else mat(value)) != 0:
                raise RuntimeError(f"input {name!r} rejected")
        plain, opaque = {}, {}
        for name in extract:
            r, m = ex.extract(name)
            if r != 0:
                raise RuntimeError(f"extract {name!r} returned {r}")
            plain[name] = np.array(m, copy=True)
        for name in raw:
            r, m = ex.extract(name, 1)  # SDPA's cache is opaque: keep ncnn's Mat
            if r != 0:
                raise RuntimeError(f"extract {name!r} (raw) returned {r}")
            opaque[name] = m
        return plain, opaque

    result: dict = {"steps": []}
    try:
        # one net at a time (its weights are resident once): the folded graph's whole run
        # first, keeping only its outputs, then the explicit graph's
        folded = load_net(spec["folded"], spec["bin"], RunOptions(light_mode=False))
        outs = spec["outputs"]
        # prefill: the folded graph from empty caches
        feeds = dict(steps[0])
        for c in caches:
            feeds[c.past_k] = ncnn.Mat()
            feeds[c.past_v] = ncnn.Mat()
        plain, opaque = run(folded, feeds, [x for c in caches for x in (c.cur_k, c.cur_v)],
                            [x for c in caches for x in (c.present_k, c.present_v)])
        past = {c.past_k: plain[c.cur_k] for c in caches}
        past.update({c.past_v: plain[c.cur_v] for c in caches})
        native = {c.past_k: opaque[c.present_k] for c in caches}
        native.update({c.past_v: opaque[c.present_v] for c in caches})
        folded_outs = []
        for t in range(1, len(steps)):
            got, opaque = run(folded, {**steps[t], **native}, outs,
                              [x for c in caches for x in (c.present_k, c.present_v)])
            folded_outs.append(got)
            native = {c.past_k: opaque[c.present_k] for c in caches}
            native.update({c.past_v: opaque[c.present_v] for c in caches})
        del folded, native, opaque
        explicit = load_net(spec["explicit"], spec["bin"], RunOptions(light_mode=False))
        for t in range(1, len(steps)):
            got = folded_outs[t - 1]
            want, _ = run(explicit, {**steps[t], **past},
                          outs + [x for c in caches for x in (c.concat_k, c.concat_v)], [])
            worst_abs = worst_rel = 0.0
            for name in outs:
                a, b = got[name], want[name]
                if a.shape != b.shape:
                    worst_abs = worst_rel = float("inf")
                    continue
                diff = float(np.max(np.abs(a - b))) if a.size else 0.0
                scale = float(np.max(np.abs(b))) if b.size else 0.0
                worst_abs = max(worst_abs, diff)
                worst_rel = max(worst_rel, diff / scale if scale > 0 else diff)
            result["steps"].append([t, worst_abs, worst_rel])
            past = {c.past_k: want[c.concat_k] for c in caches}
            past.update({c.past_v: want[c.concat_v] for c in caches})
    except (RuntimeError, NcnnRunError) as exc:
        result = {"error": str(exc), "steps": result["steps"]}
    (d / "result.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":  # pragma: no cover - run by verify_fold
    sys.exit(_child(Path(sys.argv[1])))
