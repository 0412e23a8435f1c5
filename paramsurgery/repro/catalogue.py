"""The catalogue as users see it: every case with the status recorded in the committed
fixtures (`fixtures/repros/<case>/<variant>/status.json`), for `paramsurgery repro list`,
`repro check` (what a status is compared with) and `repro issue` (what was observed).
Needs neither torch nor pnnx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from paramsurgery.repro import cases as C


def repros_dir() -> Path | None:
    """fixtures/repros of the source tree or of the installed package, if present."""
    try:
        from paramsurgery.core.resources import fixtures_dir

        path = fixtures_dir() / "repros"
    except FileNotFoundError:
        return None
    return path if path.is_dir() else None


def variant_dir(case_id: str, variant: str) -> Path | None:
    root = repros_dir()
    if root is None:
        return None
    path = root / case_id / variant
    return path if (path / "status.json").is_file() else None


def recorded(case_id: str, variant: str) -> dict[str, Any] | None:
    """The committed status.json of one variant, or None when the fixture is absent."""
    d = variant_dir(case_id, variant)
    if d is None:
        return None
    return json.loads((d / "status.json").read_text())


def recorded_status(case: C.ReproCase, variant: C.Variant) -> tuple[str, str]:
    """(status, source): the fixture's observed status, else the catalogue's expectation."""
    st = recorded(case.id, variant.name)
    if st is not None:
        return st["status"], "fixture"
    return variant.expected, "catalogue"


def resolve_ids(ids: list[str] | None) -> list[C.ReproCase]:
    """Cases by id (or by number, e.g. `2d`), in catalogue order when none are given."""
    if not ids:
        return list(C.CASES)
    out = []
    by_number = {c.number: c for c in C.CASES}
    for i in ids:
        if i in by_number:
            out.append(by_number[i])
            continue
        out.append(C.get_case(i))
    return out


def rows() -> list[dict[str, Any]]:
    """One row per case: id, number, title, construct, recorded status per variant,
    upstream references."""
    out = []
    for case in C.CASES:
        statuses = {}
        sources = set()
        for v in case.variants:
            status, source = recorded_status(case, v)
            statuses[v.name] = status
            sources.add(source)
        out.append({
            "id": case.id, "number": case.number, "title": case.title,
            "construct": case.construct, "recorded": statuses,
            "recorded_from": "fixture" if sources == {"fixture"} else "catalogue",
            "dynamic": case.is_dynamic(case.variant("bug")),
            "handwritten": case.handwritten,
            "upstream": list(case.upstream),
        })
    return out


def format_rows(table: list[dict[str, Any]]) -> str:
    lines = [f"{'#':<3} {'id':<24} {'bug':<12} {'workaround':<11} title"]
    for r in table:
        rec = r["recorded"]
        extra = [f"{k}: {v}" for k, v in rec.items() if k not in ("bug", "workaround")]
        lines.append(f"{r['number']:<3} {r['id']:<24} {rec['bug']:<12} "
                     f"{rec.get('workaround', '-'):<11} {r['title']}")
        pad = " " * 53
        lines.append(f"{pad}torch: {r['construct']}")
        if extra:
            lines.append(f"{pad}also: {', '.join(extra)}")
        ups = ", ".join(r["upstream"]) if r["upstream"] else "none found (never reported)"
        lines.append(f"{pad}upstream: {ups}")
    n_fix = sum(r["recorded_from"] == "fixture" for r in table)
    tools = recorded_versions()
    with_ = f" with pnnx {tools.get('pnnx')}, ncnn {tools.get('ncnn')}" if tools else ""
    lines.append(f"{len(table)} cases; statuses recorded in fixtures/repros for {n_fix}{with_}")
    return "\n".join(lines)


def recorded_versions() -> dict[str, Any]:
    """The tool versions the fixtures were recorded with (those of the first case found)."""
    for case in C.CASES:
        st = recorded(case.id, "bug")
        if st is not None and st.get("versions"):
            return dict(st["versions"])
    return {}
