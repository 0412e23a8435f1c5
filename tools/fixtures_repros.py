"""Build the minimal pnnx-bug repro fixtures: fixtures/repros/<case>/<variant>/.

For each case of paramsurgery.repro.cases and each variant: export with the pnnx binary
(two trace lengths for dynamic variants), run the ncnn graph in a child process at a length
no trace used, compare with torch, and write

    model.ncnn.param, model.ncnn.bin, model.pnnx.param, model_ncnn.py   (what pnnx wrote)
    ref.npz       inputs in0.. and torch outputs out0.. at the run length, plus
                  batch_index_<blob> (int32 scalars) for every blob pnnx gave a batch axis
    status.json   observed status and the evidence (pnnx rc/warnings, ncnn message/signal,
                  max abs error, offending lines, versions)

Where pnnx fails, only ref.npz and status.json are written. Every file is rewritten
byte-identically on a rerun (seeded weights and inputs, deterministic npz, sorted json, no
timings), except where ncnn itself is nondeterministic (recorded in status.json).

    python tools/fixtures_repros.py [--only ID ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import json
import platform
import random
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from paramsurgery.core.errors import MissingDependency  # noqa: E402
from paramsurgery.repro import cases as C  # noqa: E402
from paramsurgery.core.npz import write_npz  # noqa: E402
from paramsurgery.repro.check import rounded  # noqa: E402
from paramsurgery.repro.observe import observe_variant  # noqa: E402

DEFAULT_OUT = ROOT / "fixtures" / "repros"
from paramsurgery.repro.observe import MODEL_FILES  # noqa: E402
OWNED_FILES = MODEL_FILES + ("ref.npz", "status.json")
MAX_NCNN_PY = 8192          # keep the generated test script only when it is small


# --------------------------------------------------------------------------- io helpers

def write_json(path: Path, obj: Any) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True, allow_nan=False) + "\n")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def versions() -> dict[str, str | None]:
    import ncnn
    import torch

    return {"pnnx": _version("pnnx"), "ncnn": getattr(ncnn, "__version__", _version("ncnn")),
            "torch": torch.__version__, "python": platform.python_version(),
            "numpy": np.__version__}


# --------------------------------------------------------------------------- build

def _rel(path: Path) -> str:
    try:
        return path.resolve().relative_to(ROOT).as_posix()
    except ValueError:
        return path.as_posix()


def build_variant(case: C.ReproCase, variant: C.Variant, vdir: Path,
                  vers: dict[str, str | None]) -> dict[str, Any]:
    """Export, run and record one variant into `vdir` (the observation is `repro check`'s,
    plus the catalogue facts a fixture keeps); returns the status dict written."""
    vdir.mkdir(parents=True, exist_ok=True)
    for name in OWNED_FILES:            # a rerun must not leave files of an older outcome
        (vdir / name).unlink(missing_ok=True)
    with tempfile.TemporaryDirectory(prefix="paramsurgery-repro-") as tmp:
        check = observe_variant(case, variant, Path(tmp))
        for name, path in check.files.items():
            if name == "model_ncnn.py" and path.stat().st_size > MAX_NCNN_PY:
                continue
            shutil.copyfile(path, vdir / name)

    status: dict[str, Any] = dict(check.observed)
    status.update({
        "title": case.title, "construct": case.construct, "description": variant.description,
        "expected_status": variant.expected, "seed": case.seed,
        "input_names": list(case.input_names), "why": case.why,
        "offending_pattern": case.offending_text, "upstream": list(case.upstream),
        "versions": vers,
        "host_preprocessing": variant.prepare.__name__.lstrip("_") if variant.prepare else None,
    })
    if variant.name != "bug":
        _, run_len = case.lengths(variant)
        status["torch_max_abs_diff_vs_bug"] = rounded(C.equivalent_to_bug(case, variant, run_len))
    if variant.handwritten_param is not None or case.notes:
        status["notes"] = case.notes
    write_npz(vdir / "ref.npz", check.reference.arrays())
    status["matches_catalogue"] = status["status"] == variant.expected
    write_json(vdir / "status.json", status)
    return status


def write_readme(out_dir: Path) -> Path:
    """fixtures/repros/README.md: the table of every variant on disk, from its status.json."""
    rows = []
    paths = [out_dir / c.id / v.name / "status.json" for c in C.CASES for v in c.variants]
    for st_path in (p for p in paths if p.exists()):   # catalogue order
        st = json.loads(st_path.read_text())
        if st["status"] == "export_fail":
            ev = f"pnnx rc {st['pnnx']['returncode']}"
        elif st.get("signal_name"):
            ev = st["signal_name"]
        elif st.get("nondeterministic"):
            ev = "error varies run to run"
        elif st.get("max_abs_err") is not None:
            ev = f"max abs err {st['max_abs_err']}"
        elif st["status"] == "wrong" and not st.get("output_shapes"):
            ev = st.get("ncnn_message") or st.get("ncnn_status") or ""  # no output at all
        elif st["status"] == "wrong":
            ev = "shape " + "; ".join(f"{o['ncnn']} vs torch {o['torch']}"
                                      for o in st["output_shapes"] if o["ncnn"] != o["torch"])
        elif st["status"] == "load_fail":
            ev = (st.get("ncnn_stderr") or [""])[-1]
        else:
            ev = ""
        lengths = ("hand-written" if st["handwritten"] else
                   "/".join(map(str, st["trace_lengths"])) + f" -> {st['run_length']}")
        rows.append(f"| {st['case_number']} | `{st['case']}` | {st['variant']} | {lengths} "
                    f"| {st['status']} | {ev.replace('|', '/')} |")
    text = (
        "# Minimal pnnx 20261020 -> ncnn bug repros\n\n"
        "Generated by `python tools/fixtures_repros.py` from the catalogue in\n"
        "`paramsurgery/repro/cases.py`; do not edit by hand. One directory per case and\n"
        "variant: `model.ncnn.param/.bin` and `model.pnnx.param` as pnnx wrote them,\n"
        "`model_ncnn.py` (pnnx's generated runner), `ref.npz` (inputs `in*`, torch outputs\n"
        "`out*`, `batch_index_<blob>`) and `status.json` (observed status and evidence).\n"
        "Lengths: trace length(s) -> the untraced length the ncnn graph was run at.\n\n"
        "`paramless-slice` is hand-written: pnnx 20261020 no longer emits a parameterless\n"
        "Slice, but older pnnx did and ncnn still segfaults on it.\n\n"
        "| # | case | variant | lengths | status | evidence |\n|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n")
    path = out_dir / "README.md"
    path.write_text(text)
    return path


def build(out_dir: Path = DEFAULT_OUT, only: list[str] | None = None) -> list[dict]:
    """Build the repro fixtures (all cases, or the ids in `only`) into `out_dir` and return
    one manifest entry per file written."""
    try:
        import torch
    except ImportError as exc:
        raise MissingDependency("building the repro fixtures needs torch (the export "
                                "extra); the committed fixtures need only numpy and ncnn") from exc

    # every model and input is seeded per case; these only guard against stray randomness
    random.seed(0)
    np.random.seed(0)
    torch.manual_seed(0)
    out_dir = Path(out_dir)
    selected = [C.get_case(i) for i in only] if only else list(C.CASES)
    vers = versions()
    entries: list[dict] = []
    for case in selected:
        for variant in case.variants:
            vdir = out_dir / case.id / variant.name
            st = build_variant(case, variant, vdir, vers)
            for name in OWNED_FILES:
                p = vdir / name
                if not p.exists():
                    continue
                entries.append({
                    "path": _rel(p), "kind": "repro", "case": case.id, "variant": variant.name,
                    "sha256": sha256(p), "size": p.stat().st_size, "status": st["status"],
                    "expected_status": variant.expected, "versions": vers,
                    "input_shapes": st["input_shapes"], "seed": case.seed,
                    "handwritten": variant.handwritten_param is not None,
                    "notes": case.notes or None,
                })
    readme = write_readme(out_dir)
    entries.append({"path": _rel(readme), "kind": "repro", "case": None, "variant": None,
                    "sha256": sha256(readme), "size": readme.stat().st_size, "status": None,
                    "versions": vers})
    return entries


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="ID", help="case ids (default: all)")
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = ap.parse_args(argv)
    entries = build(args.out, args.only)
    seen = set()
    for e in entries:
        if e["case"] is None:
            continue
        key = (e["case"], e["variant"])
        if key in seen:
            continue
        seen.add(key)
        st = json.loads((args.out / e["case"] / e["variant"] / "status.json").read_text())
        extra = st.get("signal_name") or ("" if st.get("max_abs_err") is None else st["max_abs_err"])
        if st["status"] == "export_fail":
            extra = f"pnnx rc {st['pnnx']['returncode']}"
        mark = "" if st["matches_catalogue"] else f"   (catalogue: {st['expected_status']})"
        print(f"{e['case']:<24} {e['variant']:<11} {st['status']:<11} {extra}{mark}")
    total = sum(e["size"] for e in entries)
    print(f"{len(entries)} files, {total / 1e6:.2f} MB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
