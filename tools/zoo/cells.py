"""Run the zoo through paramsurgery's steps, one cell (family × route × step) at a time.

Used by tests/test_zoo.py and tools/zoo_table.py. Every command runs as a user runs it
(`python -m paramsurgery ...` in a child process, through `paramsurgery.runtime.launch`),
every ncnn run is isolated (`run_isolated`: a crash is a status), and every result is
compared with the torch outputs in `F/torch.npz`.

A cell's `Outcome`:
- `ok`: the command exited 0 and the result matches torch at every tested length;
- `refused`: the command exited 2 (or 1) and said why; `names_layer` tells whether the
  message names a layer of the graph (the bar: a refusal names the layer);
- `wrong`: the command exited 0 but the result does not match torch (or does not run) at
  some tested length: silently wrong, the one outcome that must never happen;
- `fails`: the raw export itself does not run right (no command involved: pnnx's result).
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
ZOO = ROOT / "fixtures" / "zoo"
TOL = 1e-3          # max |ncnn - torch| / max |torch| (fp32 ncnn vs torch on tiny models)
TIMEOUT = 300.0
REF_T = 11          # the length of every route's X.ref.npz (ViT: 24)
NO_BATCH = 233


@dataclass
class Outcome:
    status: str                      # ok | refused | wrong | fails | skipped
    detail: str = ""
    names_layer: bool = False
    errors: dict[str, float] = field(default_factory=dict)   # length -> rel error
    returncode: int | None = None

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def short(self) -> str:
        if self.status == "ok":
            return "✓"
        text = re.sub(r"\s+", " ", self.detail).strip()
        return f"{self.status}: {text[:160]}" if text else self.status


def index() -> dict[str, Any]:
    """zoo.json (ZOO is read at each call: a test may point it at a rebuilt copy)."""
    return json.loads((ZOO / "zoo.json").read_text())


def family_record(family: str) -> dict[str, Any]:
    return index()["families"][family]


def route_files(family: str, route: str) -> tuple[Path, Path]:
    return ZOO / family / f"{route}.ncnn.param", ZOO / family / f"{route}.ncnn.bin"


def torch_arrays(family: str) -> dict[str, np.ndarray]:
    with np.load(ZOO / family / "torch.npz") as z:
        return {k: z[k] for k in z.files}


def _io(family: str, route: str) -> dict[str, Any]:
    return json.loads((ZOO / family / f"{route}.ref.io.json").read_text())


def rel_error(out: np.ndarray, ref: np.ndarray) -> float:
    out = np.asarray(out, np.float32).reshape(-1) if out.size == ref.size else out
    if out.size != ref.size:
        return float("inf")
    ref = ref.reshape(-1)
    scale = float(np.max(np.abs(ref))) or 1.0
    return float(np.max(np.abs(out.reshape(-1) - ref))) / scale


def run_at_lengths(param: Path, bin_path: Path, family: str, route: str,
                   lengths: list[int]) -> tuple[dict[int, float], str]:
    """rel error of `param` against torch at each length (inf where it does not run), and
    the first failure's description. One child process loads the graph once and runs every
    length (`lengths_child.py`); a crash is reported, not fatal."""
    from paramsurgery.core.npz import save_arrays
    from paramsurgery.runtime.launch import run_child

    rec = family_record(family)
    entry = rec["routes"][route]["entry"]
    io = _io(family, route)
    arrays = torch_arrays(family)
    with temp_workdir() as tmp:
        tmpdir = Path(tmp)
        feeds = {}
        read_as_ids = _embed_inputs(param)
        for n in lengths:
            for i, e in enumerate(io["inputs"]):
                x = arrays[f"{entry}.{e['name']}@{n}"]
                if x.dtype.kind in "iu":  # ncnn holds ints only where an Embed reads them
                    x = x.astype(np.int32 if e["blob"] in read_as_ids else np.float32)
                feeds[f"{i}@{n}"] = x
        save_arrays(tmpdir / "inputs.npz", feeds)
        spec = {"param": str(param), "bin": str(bin_path), "inputs": str(tmpdir / "inputs.npz"),
                "feeds": [[e["blob"], e["batch_index"]] for e in io["inputs"]],
                "lengths": lengths, "output": io["outputs"][0]["blob"],
                "output_batch": io["outputs"][0]["batch_index"]}
        spec_path = tmpdir / "spec.json"
        spec_path.write_text(json.dumps(spec))
        proc = run_child(Path(__file__).with_name("lengths_child.py"), spec_path,
                         timeout=TIMEOUT)
        err = spec_path.with_suffix(".error.txt")
        first = err.read_text() if err.exists() else ""
        res = spec_path.with_suffix(".result.npz")
        outs: dict[str, np.ndarray] = {}
        if res.exists():
            with np.load(res) as z:
                outs = {k: z[k] for k in z.files}
        elif not first:
            first = f"ncnn child {proc.how()} {proc.tail()}"
    errors: dict[int, float] = {}
    for n in lengths:
        out = outs.get(f"out@{n}")
        errors[n] = float("inf") if out is None else rel_error(out, arrays[f"{entry}.output@{n}"])
        if errors[n] > TOL and not first:
            first = f"T={n}: rel error {errors[n]:.2g} vs torch"
    return errors, first


def paramsurgery(*args: str | Path, timeout: float = TIMEOUT) -> tuple[int | None, str]:
    """`python -m paramsurgery ARGS` in a child: (exit code, stdout + stderr)."""
    from paramsurgery.runtime.launch import module_argv, run_child

    proc = run_child(*module_argv("paramsurgery", *args), timeout=timeout)
    return proc.returncode, (proc.stdout or "") + (proc.stderr or "")


def graph_layer_names(param: Path) -> set[str]:
    names = set()
    for line in param.read_text().splitlines()[2:]:
        toks = line.split()
        if len(toks) >= 2:
            names.add(toks[1])
    return names


def names_a_layer(message: str, param: Path) -> bool:
    words = set(re.findall(r"[A-Za-z0-9_.:/\-]+", message))
    words |= {w.strip("'\".,:;()") for w in words}
    return bool(words & graph_layer_names(param))


def refusal_text(output: str) -> str:
    lines = [ln for ln in output.splitlines()
             if re.search(r"refus|error|cannot|not repairable|mismatch", ln, re.I)]
    return " / ".join(lines[:3]) or output.strip().splitlines()[-1:][0] if output.strip() \
        else ""


# --------------------------------------------------------------------------- steps

def raw_at_traced(family: str, route: str) -> Outcome:
    """The raw export through ncnn at its traced length(s), against torch."""
    rec = family_record(family)
    param, bin_path = route_files(family, route)
    traced = rec["routes"][route]["traced"]
    errors, first = run_at_lengths(param, bin_path, family, route, traced)
    status = "ok" if all(e <= TOL for e in errors.values()) else "fails"
    return Outcome(status, first, errors={str(k): v for k, v in errors.items()})


def fix_args(family: str, route: str, out: Path) -> list[str | Path]:
    """The `fix` command line of a route: static routes with the reference next to the
    file; `pair` routes: the static export with `--pair` its second-length export."""
    base = route.replace("_pair", "_static")
    param, bin_path = route_files(family, base)
    args: list[str | Path] = ["fix", param, "--bin", bin_path, "-o", out]
    if route.endswith("_pair"):
        args += ["--pair", ZOO / family / f"{route.replace('_pair', '_static2')}.ncnn.param"]
    return args


def _embed_inputs(param: Path) -> set[str]:
    """Graph inputs an Embed reads (through Splits): fed as int32 ids; any other integer
    input (positions after `lower` removed HF's `.float()` cast) is fed as float32."""
    import paramsurgery
    from paramsurgery.patterns.match import readers_through_splits

    g = paramsurgery.load(str(param))
    return {b for b in g.inputs
            if any(r.type == "Embed" for r, _slot in readers_through_splits(g, b)[0])}


def fix(family: str, route: str, workdir: Path) -> tuple[Outcome, Path | None]:
    """`paramsurgery fix` then ncnn at every tested length (traced and untraced)."""
    rec = family_record(family)
    base = route.replace("_pair", "_static")
    param, _ = route_files(family, base)
    out = workdir / f"{family}.{route}.fixed.ncnn.param"
    rc, text = paramsurgery(*fix_args(family, route, out))
    if rc != 0:
        return Outcome("refused", refusal_text(text), names_a_layer(text, param),
                       returncode=rc), None
    if not out.exists():
        if "nothing to change" not in text:
            return Outcome("wrong", "exit 0 but no output written", returncode=rc), None
        out = param  # nothing to repair: fix writes no copy, the export itself is the result
    out_bin = out.with_name(out.name[: -len(".param")] + ".bin")
    lengths = sorted({*rec["routes"][base]["traced"], *rec["lengths"]["untraced"]})
    errors, first = run_at_lengths(out, out_bin, family, base, lengths)
    bad = {n: e for n, e in errors.items() if e > TOL}
    status = "wrong" if bad else "ok"
    return Outcome(status, first, errors={str(k): v for k, v in errors.items()},
                   returncode=rc), out


def shapes(family: str, route: str) -> Outcome:
    param, _ = route_files(family, route.replace("_pair", "_static"))
    rc, text = paramsurgery("shapes", param)
    if rc == 0:
        return Outcome("ok", returncode=rc)
    return Outcome("refused", refusal_text(text), names_a_layer(text, param), returncode=rc)


def compare(family: str, route: str) -> Outcome:
    """`compare --pnnx`: the ncnn export against pnnx's own IR run in torch."""
    base = route.replace("_pair", "_static")
    param, bin_path = route_files(family, base)
    pnnx = ZOO / family / f"{base}.pnnx.param"
    args: list[str | Path] = ["compare", param, bin_path, "--pnnx", pnnx]
    if base.endswith("_dynamic"):  # at the untraced length of the reference, held against it
        args += ["--inputs", ZOO / family / f"{base}.ref.npz"]
    rc, text = paramsurgery(*args)
    if rc in (0, 1):  # it ran: the verdict line (and why it stopped, when it did)
        lines = text.strip().splitlines()
        notes = [ln for ln in lines if ln.startswith("note: pnnx's torch export stopped")]
        return Outcome("ok", " ".join(lines[-1:] + notes), returncode=rc)
    return Outcome("refused", refusal_text(text), names_a_layer(text, param), returncode=rc)


def temp_workdir() -> tempfile.TemporaryDirectory:
    return tempfile.TemporaryDirectory(prefix="paramsurgery-zoo-")


def kvcache(family: str, route: str, fixed: Path, workdir: Path) -> Outcome:
    """`add-kvcache` on a fixed export, then a greedy decode through ncnn with the native
    caches against torch's greedy decode with HF's DynamicCache (tokens and logits)."""
    import paramsurgery as ps
    from paramsurgery.passes.kvcache import cache_slots
    from paramsurgery.runtime.launch import run_child

    kv = workdir / f"{family}.{route}.kvcache.ncnn.param"
    fixed_bin = fixed.with_name(fixed.name[: -len(".param")] + ".bin")
    rc, text = paramsurgery("add-kvcache", fixed, "--bin", fixed_bin, "-o", kv)
    if rc != 0:
        return Outcome("refused", refusal_text(text), names_a_layer(text, fixed), returncode=rc)
    g = ps.load(kv)
    slots = cache_slots(g)
    base = route.replace("_pair", "_static")
    io = _io(family, base)
    cache_ins = {b for s in slots for b in (s.k_in, s.v_in)}
    arrays = torch_arrays(family)
    entry = family_record(family)["routes"][base]["entry"]
    extra: dict[str, list] = {}
    ids = _embed_inputs(kv)
    for e in io["inputs"][1:]:
        traced = arrays[f"{entry}.{e['name']}@{REF_T}"]
        rank = traced.ndim - (0 if e["batch_index"] == NO_BATCH else 1)
        kind = "mask" if e["name"] == "mask" else \
            "position_ids" if e["blob"] in ids else "positions"
        extra[e["blob"]] = [kind, rank]
    others = [b for b in g.inputs if b not in cache_ins and b != io["inputs"][0]["blob"]
              and b not in extra]
    if others:
        return Outcome("wrong", f"add-kvcache exit 0 but the cached graph has inputs "
                                f"{', '.join(others)} the export did not have", returncode=rc)
    np.save(workdir / "embed.npy", arrays["decode.embed_tokens"])
    spec = {"param": str(kv), "bin": str(kv.with_name(kv.name[: -len(".param")] + ".bin")),
            "input": io["inputs"][0]["blob"], "output": io["outputs"][0]["blob"],
            "input_ids": io["inputs"][0]["blob"] in ids,
            "embed": str(workdir / "embed.npy"),
            "prompt": arrays["decode.prompt_ids"].reshape(-1).tolist(),
            "steps": int(arrays["decode.tokens"].size),
            "slots": [[s.k_in, s.v_in, s.k_out, s.v_out] for s in slots], "extra": extra}
    spec_path = workdir / f"{family}.{route}.decode.json"
    spec_path.write_text(json.dumps(spec))
    proc = run_child(Path(__file__).with_name("decode_child.py"), spec_path, timeout=TIMEOUT)
    result_path = spec_path.with_suffix(".result.json")
    if not proc.ok or not result_path.exists():
        return Outcome("wrong", f"add-kvcache exit 0 but the decode failed: {proc.how()} "
                                f"{proc.tail()}", returncode=rc)
    result = json.loads(result_path.read_text())
    if "error" in result:
        return Outcome("wrong", f"add-kvcache exit 0 but the decode failed: {result['error']}",
                       returncode=rc)
    want = arrays["decode.tokens"].reshape(-1).tolist()
    err = rel_error(np.array(result["logits"], np.float32), arrays["decode.logits"])
    if result["tokens"] != want or err > TOL:
        return Outcome("wrong", f"cached decode: tokens {result['tokens']} vs torch {want}, "
                                f"logits rel {err:.2g}", errors={"decode": err}, returncode=rc)
    return Outcome("ok", errors={"decode": err}, returncode=rc)
