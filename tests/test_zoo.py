"""The model zoo (fixtures/zoo/, built by tools/zoo/build.py) through paramsurgery.

The invariant every cell checks (issue 24, "never silently wrong"):
    exit 0  =>  the output matches torch at every tested length (traced and untraced);
    exit 2  =>  the refusal names a layer of the graph.
Cells that work today also assert that they work (`WORKS`), so a regression is caught.
Cells that break the invariant today are listed in `KNOWN_VIOLATIONS` and marked
`xfail(strict=True)`: the change that fixes one makes its test XPASS, which fails, and
must move the cell from `KNOWN_VIOLATIONS` to `WORKS`.

Default CI runs one export of each family through `fix` (and the decoders' kv cache);
`-m slow` runs the whole zoo × routes and the byte-for-byte regeneration.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tools"))

from zoo import cells  # noqa: E402

ZOO = REPO / "fixtures" / "zoo"
GENVENV = Path("/work/genvenv/bin/python")
INDEX = cells.index()
FAMILIES = list(INDEX["families"])

# cells that work on main today and must keep working (a regression fails)
WORKS: set[tuple[str, str, str]] = {
    (f, f"{'x' if f in ('vit', 'whisper_encoder') else 'embeds'}_sdpa_static", "raw")
    for f in ("llama", "qwen2", "qwen3", "mistral", "phi3", "gpt_neox", "bert",
              "whisper_encoder", "vit")
}
# cells that break the invariant on main today (issue 24), with what they do: each is an
# xfail(strict=True), so the change that fixes one must move it out of here (into WORKS)
_WRONG = "fix exits 0 and the result is not torch's at untraced lengths (silently wrong)"
_NO_LAYER = "fix refuses naming only a layer of its own rewrite (PS105 on *_rows)"
# (the default-CI cells of every family hold the invariant since the passes merged at
# 17:30: they left this list; the slow cells below are as measured before them)
_DEFAULT_FIXED = {(f, f"{'x' if f in ('vit', 'whisper_encoder') else 'embeds'}_sdpa_static", "fix")
                  for f in ("llama", "qwen2", "qwen3", "mistral", "gemma", "vit",
                            "whisper_encoder", "phi3", "gpt_neox")}
KNOWN_VIOLATIONS: dict[tuple[str, str, str], str] = {
    **{(f, r, "fix"): _WRONG for f, routes in {
        "llama": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static",
                  "ids_sdpa_static"),
        "qwen2": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
        "qwen3": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
        "mistral": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
        "gemma": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
        "gpt2": ("kv_sdpa_dynamic",),
        "vit": ("x_sdpa_static", "x_sdpa_pair"),
        "whisper_encoder": ("x_sdpa_static", "x_sdpa_pair", "x_sdpa_dynamic"),
    }.items() for r in routes},
    **{(f, r, "fix"): _NO_LAYER for f in ("phi3", "gpt_neox")
       for r in ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static")},
}
for _cell in _DEFAULT_FIXED:
    KNOWN_VIOLATIONS.pop(_cell, None)
WORKS |= {("vit", "x_sdpa_dynamic", "fix")}
# fix → add-kvcache → a cached greedy decode equal to HF's, on the static, eager, ids and
# `--pair` routes of every RoPE family and the kv form of every decoder (add-kvcache counts
# the positions `causal-mask` and the RoPE tables take from the call's length from the past,
# and reads the past from the v cache; gpt2's kv form was WRONG (rel 0.39) while the mask
# Crop read the k cache: passes/kvcache.py)
_CACHED = {
    "llama": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static",
              "ids_sdpa_static", "kv_sdpa_dynamic"),
    "qwen2": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static", "kv_sdpa_dynamic"),
    "qwen3": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static", "kv_sdpa_dynamic"),
    "mistral": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
    "gemma": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static", "kv_sdpa_dynamic"),
    "phi3": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
    "gpt_neox": ("embeds_sdpa_static", "embeds_sdpa_pair", "embeds_eager_static"),
    "gpt2": ("kv_sdpa_dynamic",),
}
# holding the invariant on main as measured at 20:40 (a refusal naming the layer, or right)
for _cell in (("gemma", "embeds_sdpa_pair", "fix"), ("vit", "x_sdpa_pair", "fix"),
              ("whisper_encoder", "x_sdpa_dynamic", "fix"), ("whisper_encoder", "x_sdpa_pair", "fix")):
    KNOWN_VIOLATIONS.pop(_cell, None)
for _f, _routes in _CACHED.items():
    for _r in _routes:
        KNOWN_VIOLATIONS.pop((_f, _r, "fix"), None)
        WORKS |= {(_f, _r, "fix"), (_f, _r, "kvcache")}

# pnnx's dynamic export (`inputshape2`) of the RoPE decoders: fix rebuilds the causal mask
# built in the graph (causal-mask, values from X.pnnx.param), folds repeat_kv with the batch
# axis kept on k (fold-gqa) and lowers the arange positions; add-kvcache counts those from
# the past (kvcache_positions.widen_table). Phi-3 and GPT-NeoX (fused QKV, partial rotary) keep
# the heads in ncnn's batch axis: unbatch-heads (and fold-gqa for the k/v it folds) rewrites
# them to [D, T, H] (patterns/batch_heads.py); causal-mask follows NeoX's crop to the 4-D k.
_DYNAMIC = {
    "llama": ("embeds_sdpa_dynamic", "embeds_eager_dynamic", "ids_sdpa_dynamic"),
    "qwen2": ("embeds_sdpa_dynamic", "embeds_eager_dynamic"),
    "qwen3": ("embeds_sdpa_dynamic", "embeds_eager_dynamic"),
    "mistral": ("embeds_sdpa_dynamic", "embeds_eager_dynamic"),
    "gemma": ("embeds_sdpa_dynamic", "embeds_eager_dynamic"),
    # learned positions `wpe(arange(T))`: lower's arange table holds int32 ids for the Embed
    # (float32 positions read as ids: fix exited 0 with rel 0.25 before, now proven by default)
    "gpt2": ("embeds_sdpa_dynamic",),
    "phi3": ("embeds_sdpa_dynamic", "embeds_eager_dynamic"),
    "gpt_neox": ("embeds_sdpa_dynamic", "embeds_eager_dynamic"),
}
for _f, _routes in _DYNAMIC.items():
    for _r in _routes:
        WORKS |= {(_f, _r, "fix"), (_f, _r, "kvcache")}
# BERT's dynamic export: the default all-ones padding mask built in the graph is proven 0 at
# every length and dropped from the SDPAs, token_type_ids[:, :T].expand(1, T) is the identity
# (lower: passes/zero_mask.py, lower_masks._cropped_extent); an encoder: no kv cell
WORKS |= {("bert", "embeds_sdpa_dynamic", "fix")}

# the one default-CI export per family (the smallest route that exercises fix)
DEFAULT_ROUTE = {f: "embeds_sdpa_static" if "embeds_sdpa_static" in INDEX["families"][f]["routes"]
                 else "x_sdpa_static" for f in FAMILIES}


def _mark(family: str, route: str, step: str):  # noqa: ANN202 - a pytest param
    marks = []
    if (family, route, step) in KNOWN_VIOLATIONS:
        marks.append(pytest.mark.xfail(strict=True, reason="issue 24: "
                                       + KNOWN_VIOLATIONS[family, route, step]))
    return pytest.param(family, route, marks=marks, id=f"{family}-{route}")


def check_invariant(family: str, route: str, step: str, outcome: cells.Outcome) -> None:
    assert outcome.status != "wrong", (
        f"{family}/{route} {step}: exit 0 but silently wrong: {outcome.detail} {outcome.errors}")
    if outcome.status == "refused":
        assert outcome.names_layer, (
            f"{family}/{route} {step}: the refusal names no layer: {outcome.detail}")
    if (family, route, step) in WORKS:
        assert outcome.ok, f"{family}/{route} {step} worked before: {outcome.short()}"


# --------------------------------------------------------------------------- the zoo itself

def test_zoo_has_every_file_and_reference() -> None:
    for family, rec in INDEX["families"].items():
        assert (ZOO / family / "torch.npz").is_file()
        assert max(rec["plain_call_max_abs"].values()) <= 1e-5, (family, rec["plain_call_max_abs"])
        if rec["kind"] == "decoder":
            assert rec["decode"]["full_prefill_vs_cached_max_abs"] <= 1e-4
        for route, r in rec["routes"].items():
            assert r["pnnx_returncode"] == 0, (family, route, r.get("pnnx_stderr_tail"))
            for rel in r["files"]:
                assert (ZOO / rel).is_file(), rel
            if route.endswith("_static2"):
                continue
            n = rec["lengths"]["reference"]
            with np.load(ZOO / family / f"{route}.ref.npz") as z:
                shape = z["input_x"].shape
            assert shape == {"vit": (1, 3, n, n), "whisper_encoder": (1, 8, 2 * n)}.get(
                family, shape[:1] + (n,) + shape[2:]), (family, route, shape)


def test_zoo_is_small() -> None:
    total = sum(p.stat().st_size for p in ZOO.rglob("*") if p.is_file())
    assert total < 5_000_000, f"fixtures/zoo is {total} bytes"


# --------------------------------------------------------------------------- default CI

@pytest.mark.parametrize("family", FAMILIES)
def test_raw_export_runs_at_its_traced_length(family: str) -> None:
    route = DEFAULT_ROUTE[family]
    outcome = cells.raw_at_traced(family, route)
    if (family, route, "raw") in WORKS:
        assert outcome.ok, outcome.short()


# gpt2's static export is refused (its learned position table has no rows past the trace):
# its kv form is the default run's fix → add-kvcache → cached decode for that family
# gemma's --pair: the tied lm_head repaired in the pair without the pair's .bin (the zoo
# keeps none), so --pair proves the lengths of a tied-head export (fix-tied-linear); llama's
# dynamic export is the default run's pnnx-dynamic route (the others: -m slow), and phi3's the one
# with the heads in ncnn's batch axis (fused QKV, partial rotary: unbatch-heads + fold-gqa);
# qwen3's has its k written 4-D with a unit c before RotaryEmbed (after the per-head k norm):
# it regressed to a refusal once when fold-gqa's rewrite of that split was lost
_DEFAULT_CELLS = [_mark(f, DEFAULT_ROUTE[f], "fix") for f in FAMILIES] + \
    [_mark("gpt2", "kv_sdpa_dynamic", "fix"), _mark("gemma", "embeds_sdpa_pair", "fix"),
     _mark("llama", "embeds_sdpa_dynamic", "fix"), _mark("gpt2", "embeds_sdpa_dynamic", "fix"),
     _mark("bert", "embeds_sdpa_dynamic", "fix"), _mark("phi3", "embeds_sdpa_dynamic", "fix"),
     _mark("qwen3", "embeds_sdpa_dynamic", "fix")]


@pytest.mark.parametrize("family,route", _DEFAULT_CELLS)
def test_fix_then_ncnn_at_untraced_lengths(family: str, route: str, tmp_path: Path) -> None:
    """The silent-wrong regression (issue 24): a static export with a reference at another
    length next to it: `fix` must refuse naming the layer, or be right at T=11 (and 5, 16);
    a decoder's fixed graph then through add-kvcache: a greedy decode through ncnn with the
    native caches equal to HF's cached decode (`WORKS` says which must)."""
    outcome, fixed = cells.fix(family, route, tmp_path)
    check_invariant(family, route, "fix", outcome)
    if fixed is not None and outcome.ok and INDEX["families"][family]["kind"] == "decoder":
        kv = cells.kvcache(family, route, fixed, tmp_path)
        check_invariant(family, route, "kvcache", kv)


# --------------------------------------------------------------------------- slow: everything

def _all_cells() -> list:
    out = []
    for family, rec in INDEX["families"].items():
        routes = [r for r in rec["routes"] if not r.endswith("_static2")]
        routes += [r.replace("_static2", "_pair") for r in rec["routes"] if r.endswith("_static2")]
        out += [_mark(family, r, "fix") for r in routes]
    return out


@pytest.mark.slow
@pytest.mark.parametrize("family,route", _all_cells())
def test_zoo_cell(family: str, route: str, tmp_path: Path) -> None:
    outcome, fixed = cells.fix(family, route, tmp_path)
    check_invariant(family, route, "fix", outcome)
    if fixed is not None and outcome.ok and INDEX["families"][family]["kind"] == "decoder":
        check_invariant(family, route, "kvcache", cells.kvcache(family, route, fixed, tmp_path))
    check_invariant(family, route, "shapes", cells.shapes(family, route))


@pytest.mark.slow
def test_zoo_regenerates_byte_for_byte(tmp_path: Path) -> None:
    if not GENVENV.exists():
        pytest.skip("needs the export environment /work/genvenv")
    only = ["llama", "bert"]
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([str(GENVENV), str(REPO / "tools" / "zoo" / "build.py"), "--out",
                    str(tmp_path), "--only", *only], check=True, env=env, timeout=1800,
                   capture_output=True)
    for family in only:
        for p in sorted((ZOO / family).iterdir()):
            assert (tmp_path / family / p.name).read_bytes() == p.read_bytes(), p.name
        assert sorted(q.name for q in (tmp_path / family).iterdir()) == \
            sorted(q.name for q in (ZOO / family).iterdir())
    built = json.loads((tmp_path / "zoo.json").read_text())["families"]
    for family in only:
        assert built[family] == INDEX["families"][family]
    shutil.rmtree(tmp_path, ignore_errors=True)


# --------------------------------------------------------------------------- shapes / compare

def _exports() -> list:
    return [pytest.param(f, r, id=f"{f}-{r}") for f, rec in INDEX["families"].items()
            for r in rec["routes"]]


def test_shapes_on_every_export(capsys) -> None:
    """`shapes` works on every zoo export (issue 24, item 4): without --inputshape it
    takes pnnx's traced shapes (X_ncnn.py); on a static export every blob is known."""
    from paramsurgery.cli import main

    for family, route in ((p.values[0], p.values[1]) for p in _exports()):
        param = ZOO / family / f"{route}.ncnn.param"
        assert main(["shapes", str(param)]) == 0, (family, route)
        out = capsys.readouterr().out
        assert "input shapes traced by pnnx" in out, (family, route)
        lines = [ln.split() for ln in out.splitlines() if not ln.startswith("note:")]
        if route.endswith(("_static", "_static2")) and (family, route, "raw") in WORKS:
            unknown = [ln[0] for ln in lines if ln[1] == "?"]
            assert not unknown, (family, route, unknown[:5])


@pytest.mark.slow
def test_compare_pnnx_on_every_export(tmp_path: Path, monkeypatch) -> None:
    """`compare --pnnx` on every zoo export (issue 24, item 4): rebuild the zoo with every
    route's torch export, then compare each: it runs (exit 0 or 1, never 2 or a crash)
    and compares blobs."""
    pytest.importorskip("torch")
    python = str(GENVENV) if GENVENV.exists() else sys.executable
    env = dict(os.environ, PYTHONPATH=str(REPO))
    subprocess.run([python, str(REPO / "tools" / "zoo" / "build.py"), "--out", str(tmp_path),
                    "--torch-exports", "all"], check=True, env=env, timeout=3600,
                   capture_output=True)
    monkeypatch.setattr(cells, "ZOO", tmp_path)
    failures = []
    for family, rec in cells.index()["families"].items():
        for route in rec["routes"]:
            if route.endswith("_static2"):
                continue
            o = cells.compare(family, route)
            if not o.ok or "blobs compared" not in o.detail:
                failures.append(f"{family}/{route}: {o.short()}")
    assert not failures, "\n".join(failures)
