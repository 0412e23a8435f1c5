#!/usr/bin/env python
"""The README's "Model zoo" table: every zoo export (fixtures/zoo/) through each step.

    PYTHONPATH=. /work/genvenv/bin/python tools/zoo_table.py [--jobs N] [--write-readme]
                          [--only FAMILY ...] [--json OUT] [--steps STEP ... --reuse JSON]

Run it with an interpreter that has torch (the export environment) so `compare --pnnx`
can run pnnx's torch export; without torch that column says so. Columns, per family ×
route:
- raw @ traced: pnnx's export through ncnn at its traced length(s) vs torch;
- fix → untraced: `paramsurgery fix` (with the reference next to the file, or `--pair`
  for the pair route), then ncnn at every tested length (traced and untraced) vs torch;
- kv cache: `add-kvcache` on the fixed graph, then a greedy decode through ncnn with the
  native caches vs torch's greedy decode with HF's DynamicCache (tokens and logits);
- shapes: `paramsurgery shapes` on the export;
- compare --pnnx: against pnnx's torch export (kept for the sdpa static route).
A cell is ✓, or the reason: a refusal (exit 2) with its message, or **WRONG** when a
command exited 0 with a result that does not match torch (silently wrong).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tools"))

from zoo import cells  # noqa: E402

README = ROOT / "README.md"
BEGIN, END = "<!-- zoo-table:begin -->", "<!-- zoo-table:end -->"
STEPS = ("raw", "fix", "kvcache", "shapes", "compare")
HEAD = ("raw @ traced", "fix → untraced (5, 11, 16)", "kv cache (greedy decode)", "shapes",
        "compare --pnnx")


def table_routes(rec: dict[str, Any]) -> list[str]:
    """The routes of the table: every export except the second-length ones, which are the
    `--pair` of their static route."""
    out = []
    for r in rec["routes"]:
        if r.endswith("_static2"):
            out.append(r.replace("_static2", "_pair"))
        else:
            out.append(r)
    order = {"static": 0, "pair": 1, "dynamic": 2}
    return sorted(out, key=lambda r: (r.split("_")[0] != rec["routes"][_base(r)]["entry"],
                                      r.split("_")[0], r.split("_")[1] != "sdpa",
                                      order[r.rsplit("_", 1)[1]]))


def _base(route: str) -> str:
    return route.replace("_pair", "_static")


def route_label(route: str) -> str:
    entry, attn, shape = route.split("_")
    what = {"static": "static + ref", "pair": "static --pair", "dynamic": "dynamic"}[shape]
    entry_text = {"embeds": "inputs_embeds", "ids": "input_ids", "kv": "kv form",
                  "x": "features"}[entry]
    return f"{entry_text}, {attn}, {what}"


def torch_available() -> bool:
    try:
        import torch  # noqa: F401
    except ImportError:
        return False
    return True


def run_cell(family: str, route: str, workdir: Path, with_torch: bool,
             steps: tuple[str, ...] = STEPS) -> dict[str, str]:
    rec = cells.family_record(family)
    base = _base(route)
    out: dict[str, str] = {}
    if "raw" in steps:
        out["raw"] = "(as static)" if route.endswith("_pair") else \
            cells.raw_at_traced(family, base).short()
    if "fix" in steps or "kvcache" in steps:
        fixed_outcome, fixed = cells.fix(family, route, workdir)
        out["fix"] = describe(fixed_outcome)
        if rec["kind"] != "decoder":
            out["kvcache"] = "— (encoder)"
        elif fixed is None or not fixed_outcome.ok:
            out["kvcache"] = "— (fix did not give a graph that runs right)"
        else:
            out["kvcache"] = describe(cells.kvcache(family, route, fixed, workdir))
    if "shapes" in steps:
        out["shapes"] = "(as static)" if route.endswith("_pair") else \
            describe(cells.shapes(family, route))
    if "compare" not in steps:
        return out
    has_torch_export = (cells.ZOO / family / f"{base}_pnnx.py").exists()
    if route.endswith("_pair"):
        out["compare"] = "(as static)"
    elif not has_torch_export:
        out["compare"] = "— (torch export not kept)"
    elif not with_torch:
        out["compare"] = "— (needs torch)"
    else:
        out["compare"] = describe(cells.compare(family, route))
    return out


def describe(o: cells.Outcome) -> str:
    if o.status == "ok":
        if o.detail and "coverage" in o.detail:  # compare's verdict
            m = re.search(r"(\d+)/(\d+) blobs compared", o.detail)
            cov = f"{m.group(1)}/{m.group(2)} blobs" if m else "?"
            fd = re.search(r"first divergence: (\S+ \(\w+\)) at line \d+, blob \S+: ([^;]+)",
                           o.detail)
            stop = re.search(r"TypeError: [^;)]+|\w+Error: [^;)]+", o.detail) \
                if "stopped partway" in o.detail else None
            text = (f"first divergence {fd.group(1)}: {fd.group(2)}; " if fd else
                    "✓ " if m and m.group(1) == m.group(2) and not stop else "no divergence; ")
            text += cov + " compared"
            if stop:
                text += f" (pnnx's torch export stops: {stop.group(0)[:90]})"
            return text
        return "✓"
    if o.status == "wrong":
        return f"**WRONG** (exit 0): {o.detail[:140]}"
    text = re.sub(r"\s+", " ", o.detail).strip()
    text = re.sub(r"/\S*/fixtures/zoo/", "", text)
    text = re.sub(r"/tmp/\S+?/", "", text)
    prefix = "refused" if o.names_layer else "refused (names no layer)"
    return f"{prefix}: {text[:180]}"


def markdown(results: dict[tuple[str, str], dict[str, str]], families: list[str]) -> str:
    lines = ["| architecture | route | " + " | ".join(HEAD) + " |",
             "|---|---|" + "---|" * len(HEAD)]
    for family in families:
        for (fam, route), row in results.items():
            if fam != family:
                continue
            cellv = [row[s].replace("|", "\\|") for s in STEPS]
            lines.append(f"| {family} | {route_label(route)} | " + " | ".join(cellv) + " |")
    return "\n".join(lines)


def summary(results: dict[tuple[str, str], dict[str, str]]) -> str:
    counts = {s: [0, 0] for s in STEPS}
    wrong = 0
    for row in results.values():
        for s in STEPS:
            v = row[s]
            if v.startswith(("(as", "—")):
                continue
            counts[s][1] += 1
            counts[s][0] += v.startswith("✓")
            wrong += "WRONG" in v
    parts = [f"{h}: {c[0]}/{c[1]} ✓" for h, c in zip(HEAD, counts.values())]
    return "; ".join(parts) + f"; silently wrong (exit 0, not torch's result): {wrong}"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", metavar="FAMILY")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--write-readme", action="store_true",
                    help=f"replace the table between {BEGIN} and {END} in README.md")
    ap.add_argument("--json", type=Path, help="also write the cells as JSON")
    ap.add_argument("--steps", nargs="+", choices=STEPS, default=list(STEPS),
                    help="recompute only these columns, the others from --reuse")
    ap.add_argument("--reuse", type=Path, metavar="JSON",
                    help="a previous --json: the cells of the columns not recomputed")
    args = ap.parse_args(argv)
    previous = json.loads(args.reuse.read_text()) if args.reuse else {}
    index = cells.index()
    families = [f for f in index["families"] if not args.only or f in args.only]
    work = [(f, r) for f in families for r in table_routes(index["families"][f])]
    with_torch = torch_available()
    results: dict[tuple[str, str], dict[str, str]] = {}
    with cells.temp_workdir() as tmp:
        def one(fr: tuple[str, str]) -> tuple[tuple[str, str], dict[str, str]]:
            d = Path(tmp) / f"{fr[0]}.{fr[1]}"
            d.mkdir()
            res = dict(previous.get(f"{fr[0]}/{fr[1]}", {}))
            res.update(run_cell(fr[0], fr[1], d, with_torch, tuple(args.steps)))
            missing = [s for s in STEPS if s not in res]
            if missing:
                raise SystemExit(f"{fr[0]}/{fr[1]}: no cell for {', '.join(missing)} "
                                 f"(recompute it or give --reuse)")
            print(f"{fr[0]}/{fr[1]}: " + " | ".join(res[s][:60] for s in STEPS),
                  file=sys.stderr, flush=True)
            return fr, res

        with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            for fr, res in pool.map(one, work):
                results[fr] = res
    # families not recomputed: their cells from --reuse (so the table stays whole)
    for family in index["families"]:
        if family in families:
            continue
        for route in table_routes(index["families"][family]):
            if f"{family}/{route}" in previous:
                results[family, route] = previous[f"{family}/{route}"]
    families = [f for f in index["families"] if any(k[0] == f for k in results)]
    results = {k: results[k] for f in families for k in results if k[0] == f}
    table = markdown(results, families)
    text = table + "\n\n" + summary(results) + "\n"
    print(text)
    if args.json:
        args.json.write_text(json.dumps({f"{f}/{r}": v for (f, r), v in results.items()},
                                        indent=1, ensure_ascii=False) + "\n")
    if args.write_readme:
        readme = README.read_text()
        if BEGIN not in readme or END not in readme:
            print(f"README.md has no {BEGIN} … {END} section", file=sys.stderr)
            return 2
        head, rest = readme.split(BEGIN, 1)
        _, tail = rest.split(END, 1)
        README.write_text(head + BEGIN + "\n" + text + END + tail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
