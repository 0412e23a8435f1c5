"""`paramsurgery repro issue ID -o DIR`: everything a pnnx/ncnn maintainer needs for one
case, ready to paste.

    DIR/ISSUE.md            title, environment, minimal model, exact pnnx command, expected
                            vs observed, offending lines, why, workaround, related issues
    DIR/test_<id>.py        in the shape of pnnx's tools/pnnx/tests/ncnn/test_*.py: build the
                            model, trace, run pnnx, import the generated *_ncnn.py, compare
                            with torch.allclose (and once more at an untraced length)
    DIR/model.py            the model (and its workaround) with the export command
    DIR/model.ncnn.param, model.ncnn.bin, model.pnnx.param, model_ncnn.py
                            what pnnx wrote (absent when pnnx itself failed)

By default the observation is the committed fixture (fixtures/repros/<id>/, no torch
needed); `fresh=True` exports and runs again with the installed torch/pnnx/ncnn.
"""

from __future__ import annotations

import re
import shutil
import string
import tempfile
from pathlib import Path
from typing import Any

from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.core.fs import atomic_write
from paramsurgery.repro import cases as C
from paramsurgery.repro.catalogue import recorded, variant_dir
from paramsurgery.repro.observe import MODEL_FILES, environment, evidence
from paramsurgery.repro.scripts import script

SHOW_FULL_GRAPH = 30        # print a graph in full up to this many lines

_INPUTSHAPE_RE = re.compile(r"\[([0-9,]*)\]([a-z0-9]*)")
_DTYPE = {"f32": ("torch.float", "float32"), "f64": ("torch.double", "float64"),
          "f16": ("torch.half", "float16"), "i32": ("torch.int", "int32"),
          "i64": ("torch.long", "int64"), "": ("torch.float", "float32")}
_NP_TO_SUFFIX = {"float32": "f32", "float64": "f64", "float16": "f16", "int32": "i32",
                 "int64": "i64"}
_VAR_NAMES = ("x", "y", "z", "w")


def module_name(case_id: str) -> str:
    return "test_" + case_id.replace("-", "_")


def parse_inputshape(arg: str) -> list[tuple[tuple[int, ...], str]]:
    """`[1,4,10]f32,[3,7]i32` -> [((1, 4, 10), 'f32'), ((3, 7), 'i32')]."""
    return [(tuple(int(d) for d in m.group(1).split(",") if d), m.group(2) or "f32")
            for m in _INPUTSHAPE_RE.finditer(arg)]


def _shapes_from_command(cmd: list[str], key: str) -> list[tuple[tuple[int, ...], str]] | None:
    for tok in cmd:
        if tok.startswith(key + "="):
            return parse_inputshape(tok[len(key) + 1:])
    return None


def _tensor_expr(shape: tuple[int, ...], suffix: str) -> str:
    """The call pnnx's generated runner uses for an input of this shape and type."""
    dims = ", ".join(str(d) for d in shape)
    torch_dtype = _DTYPE.get(suffix, _DTYPE["f32"])[0]
    if suffix.startswith("i"):
        tup = f"({dims}, )" if len(shape) == 1 else f"({dims})"
        return f"torch.randint(10, {tup}, dtype={torch_dtype})"
    return f"torch.rand({dims}, dtype={torch_dtype})"


def _var_names(n: int) -> list[str]:
    return list(_VAR_NAMES[:n]) if n <= len(_VAR_NAMES) else [f"in{i}" for i in range(n)]


def _rename_class(source: str, new: str) -> str:
    return source.replace("class Model(nn.Module):", f"class {new}(nn.Module):", 1)


# =========================================================================== observation

class Observation:
    """What was observed for every variant of a case, and where its files are."""

    def __init__(self, case: C.ReproCase, statuses: dict[str, dict[str, Any]],
                 dirs: dict[str, Path | None], env: dict[str, Any], source: str) -> None:
        self.case = case
        self.statuses = statuses
        self.dirs = dirs
        self.env = env
        self.source = source          # "fixture" | "fresh"

    @property
    def bug(self) -> dict[str, Any]:
        return self.statuses["bug"]

    def text(self, variant: str, name: str) -> str | None:
        d = self.dirs.get(variant)
        if d is None or not (d / name).is_file():
            return None
        return (d / name).read_text()


def from_fixture(case: C.ReproCase) -> Observation:
    statuses, dirs = {}, {}
    for v in case.variants:
        st = recorded(case.id, v.name)
        if st is None:
            raise ParamSurgeryError(f"no committed fixture for {case.id}/{v.name}; build it "
                                    f"with tools/fixtures_repros.py, or use --fresh")
        statuses[v.name] = st
        dirs[v.name] = variant_dir(case.id, v.name)
    from paramsurgery import __version__
    from paramsurgery.repro.observe import os_string

    env = dict(statuses["bug"].get("versions") or {})
    env["os"] = os_string()                 # the fixtures do not record the OS
    env["paramsurgery"] = __version__
    return Observation(case, statuses, dirs, env, "fixture")


def fresh(case: C.ReproCase, workdir: Path) -> Observation:
    from paramsurgery.repro.observe import check_cases

    result = check_cases([case], keep=workdir)[0]
    statuses = {v.variant: v.observed for v in result.variants}
    dirs: dict[str, Path | None] = {v.variant: workdir / case.id / v.variant
                                    for v in result.variants}
    return Observation(case, statuses, dirs, environment(), "fresh")


# =========================================================================== ISSUE.md

def _fmt_shape(shape: Any) -> str:
    return "(" + ", ".join(str(d) for d in shape) + ("," if len(shape) == 1 else "") + ")"


def _command(st: dict[str, Any]) -> str | None:
    p = st.get("pnnx")
    return " ".join(p["command"]) if p else None


def _lengths(case: C.ReproCase, v: C.Variant) -> str:
    traces, run = case.lengths(v)
    if v.handwritten_param is not None:
        return "hand-written graph"
    kind = "dynamic export" if len(traces) > 1 else "static export"
    return f"{kind} at T={'/'.join(map(str, traces))}, run at T={run}"


def _observed_sentence(case: C.ReproCase, st: dict[str, Any], env: dict[str, Any]) -> str:
    """What happens, in one or two sentences, for the opening paragraph."""
    status = st["status"]
    ncnn_v = env.get("ncnn") or "?"
    if st.get("handwritten"):
        where = f"ncnn {ncnn_v} loads the graph below"
    else:
        where = (f"the ncnn graph loads in ncnn {ncnn_v}" if status != "load_fail" else "")
    run = st["run_length"]
    if status == "export_fail":
        p = st["pnnx"]
        how = f"is killed by {p['signal_name']}" if p.get("signal_name") \
            else f"exits with {p['returncode']}"
        last = (p.get("stderr_tail") or [""])[-1]
        return (f"pnnx itself {how} right after printing `{last}` and writes no ncnn file.")
    if status == "load_fail":
        lines = st.get("ncnn_stderr") or []
        msg = f" (`{lines[0]}`)" if lines else ""
        return f"ncnn {ncnn_v} cannot load the graph pnnx writes{msg}."
    if status == "crash":
        return (f"{where}, and the process is killed by {st.get('signal_name')} when it "
                f"runs" + ("" if st.get("handwritten") else f" (T={run})") + ".")
    if status == "wrong":
        return (f"{where} and runs at T={run}, a length no trace used, without any error, "
                f"but the result is wrong: {evidence(st)}.")
    return f"{where} and gives the right result ({evidence(st)})."


def _pnnx_said(st: dict[str, Any]) -> str:
    p = st.get("pnnx")
    if not p:
        return ""
    if p["returncode"] != 0:
        return ""
    warns = p.get("warnings") or []
    if not warns:
        return "pnnx exits 0 and prints no warning."
    return "pnnx exits 0; its only hints are on stderr: " + \
        ", ".join(f"`{w}`" for w in warns) + "."


def _graph_block(text: str | None, label: str, lines_only: list[str] | None = None) -> list[str]:
    if text is None:
        return []
    rows = text.rstrip("\n").splitlines()
    out = []
    if len(rows) <= SHOW_FULL_GRAPH:
        out += [f"{label}:", "", "```", *rows, "```"]
    elif lines_only:
        out += [f"{label} ({len(rows) - 2} layers; the relevant lines):", "", "```",
                *lines_only, "```"]
    return out


def _details(summary: str, body: list[str]) -> list[str]:
    if not body:
        return []
    return ["<details>", f"<summary>{summary}</summary>", "", *body, "", "</details>"]


def _file_details(obs: "Observation", variant: str, name: str, summary: str) -> list[str]:
    """A blank line and a folded block showing a file pnnx wrote (nothing when absent)."""
    text = obs.text(variant, name)
    if text is None:
        return []
    return ["", *_details(summary, _graph_block(text, f"`{name}`"))]


def _input_lines(case: C.ReproCase, st: dict[str, Any]) -> str:
    names = list(case.input_names)
    return "; ".join(f"`{n}`" for n in names)


def lint_findings(param_path: Path | None) -> list[str] | None:
    """`paramsurgery lint` findings for a bug graph (pnnx's files next to it are used, as
    `paramsurgery lint` does), when the lint module is available; None otherwise."""
    if param_path is None or not param_path.is_file():
        return None
    try:
        from paramsurgery.lint import lint_file
    except ImportError:
        return None
    try:
        findings = lint_file(param_path)
    except Exception:  # noqa: BLE001 - lint is advisory here
        return None
    out = []
    for f in findings:
        where = "model.ncnn.param" + (f":{f.line}" if f.line is not None else "")
        text = f"{where}: {f.code} {f.severity} {f.message}"
        if f.fix:
            text += f" (fix: {f.fix})"
        out.append(text)
    return out


def render_issue(obs: Observation, *, lint: bool = True) -> str:
    """ISSUE.md: `templates/ISSUE.md.tmpl` with the sections that depend on the case."""
    case = obs.case
    st = obs.bug
    sc = script(case.id)
    env = obs.env
    construct = f"**Construct:** `{case.construct}`" + (
        "." if case.handwritten else f" ({_lengths(case, case.variant('bug'))}).")
    summary = ((f"With pnnx {env.get('pnnx')}, " if not case.handwritten else "")
               + f"{_observed_sentence(case, st, env)} {_pnnx_said(st)}".rstrip())
    return _template("ISSUE.md.tmpl").substitute(
        kind="ncnn" if case.handwritten else "pnnx", title=case.title, construct=construct,
        summary=summary, case_id=case.id, seed=case.seed,
        how="the committed fixture" if obs.source == "fixture" else "a fresh export and run",
        **{k: env.get(k) for k in ("pnnx", "ncnn", "torch", "python", "numpy", "os",
                                   "paramsurgery")},
        imports=sc.imports.rstrip(), model=sc.model.rstrip(), inputs=_input_lines(case, st),
        notes=f"\n\n{case.notes}" if case.notes else "",
        export=_section_export(case, st), expected=_section_expected(obs),
        graph=_section_graph(obs, lint), why=case.why + (
            f"\n\n**Details.** {sc.details}" if sc.details else ""),
        workaround=_section_workaround(obs),
        related="\n".join(f"- {u}" for u in case.upstream) if case.upstream else
        "No related upstream issue or pull request known.",
        files=_section_files(obs))


def _section_export(case: C.ReproCase, st: dict[str, Any]) -> str:
    cmd = _command(st)
    if not cmd:
        return ("No pnnx run: the graph below is hand-written (pnnx 20261020 no longer emits "
                "it; older pnnx did).")
    traced = _shapes_from_command(st["pnnx"]["command"], "inputshape") or []
    names = _var_names(len(traced))
    args = names[0] if len(names) == 1 else "(" + ", ".join(names) + ")"
    lines = ["```python", f"torch.manual_seed({case.seed})", "net = Model().eval()",
             *(f"{n} = {_tensor_expr(shape, suffix)}" for n, (shape, suffix) in zip(names, traced)),
             f"torch.jit.trace(net, {args}).save(\"model.pt\")", "```", "",
             "```sh", cmd, "```", ""]
    p = st["pnnx"]
    rc = p["returncode"]
    lines.append(f"pnnx exit code: {rc}"
                 + (f" ({p['signal_name']})" if p.get("signal_name") else "") + ".")
    if p.get("warnings"):
        lines += ["", "pnnx stderr (warnings):", "", "```", *p["warnings"], "```"]
    if rc != 0 and p.get("stderr_tail"):
        lines += ["", "Last lines pnnx printed:", "", "```", *p["stderr_tail"][-8:], "```"]
    return "\n".join(lines)


def _section_expected(obs: Observation) -> str:
    case, st = obs.case, obs.bug
    ref_shapes = st.get("reference_output_shapes") or {}
    exp = ", ".join(f"`{k}` {_fmt_shape(v)}" for k, v in ref_shapes.items())
    lines = []
    if not case.handwritten:
        where = "a length neither trace used" if st.get("dynamic") else "not the traced length"
        lines += [f"Run at T={st['run_length']} ({where}), inputs fed with the batch_index pnnx "
                  f"wrote in `model_ncnn.py`:", ""]
    lines += [f"- **expected** (torch): {exp}", f"- **observed**: {_observed_detail(st)}"]
    for v in case.variants[1:]:
        if v.name == "workaround":
            continue
        vst = obs.statuses[v.name]
        lines.append(f"- **{v.name}** variant ({v.description}; {_lengths(case, v)}): "
                     f"{vst['status']}, {evidence(vst)}")
    return "\n".join(lines)


def _section_graph(obs: Observation, lint: bool) -> str:
    case, st = obs.case, obs.bug
    lines: list[str] = []
    bug_text = obs.text("bug", "model.ncnn.param")
    offending = st.get("offending_lines") or []
    if bug_text is not None:
        lines += [*_graph_block(bug_text, "`model.ncnn.param`", offending), ""]
    if offending:
        lines += ["Offending lines:", "", "```", *offending, "```"]
    else:
        lines.append(f"Offending lines: {case.offending_text}")
    lines += _file_details(obs, "bug", "model.pnnx.param",
                           "pnnx's own IR (<code>model.pnnx.param</code>)")
    if lint:
        bug_dir = obs.dirs.get("bug")
        found = lint_findings(bug_dir / "model.ncnn.param" if bug_dir is not None else None)
        if found:
            lines += ["", "`paramsurgery lint model.ncnn.param`:", "", "```", *found, "```"]
    return "\n".join(lines)


def _section_workaround(obs: Observation) -> str:
    case = obs.case
    sc = script(case.id)
    wst = obs.statuses["workaround"]
    lines = [f"**{case.variant('workaround').description}**, verified with the same export "
             f"and run:", "", "```python"]
    if sc.host:
        lines.append(f"# on the host, before calling the model: {sc.host}")
    lines += [sc.workaround.rstrip(), "```", "", f"Result: **{wst['status']}** ({evidence(wst)})."]
    lines += _file_details(obs, "workaround", "model.ncnn.param",
                           "the workaround's <code>model.ncnn.param</code>")
    return "\n".join(lines)


def _section_files(obs: Observation) -> str:
    case, st, env = obs.case, obs.bug, obs.env
    mod = module_name(case.id)
    again = ", then once more at an untraced length" if not case.handwritten else ""
    lines = [f"- `{mod}.py`: in the shape of `tools/pnnx/tests/ncnn/test_*.py` (build the model, "
             f"trace, run pnnx, import the generated `{mod}_ncnn.py`, compare with "
             f"`torch.allclose`{again}). `PNNX=/path/to/pnnx python {mod}.py` exits 0 once this "
             f"is fixed; with pnnx {env.get('pnnx')} it {_test_outcome(st)}.",
             "- `model.py`: the model, its workaround and the export command above "
             "(`python model.py [workaround]`)."]
    bug_dir = obs.dirs.get("bug")
    files = [n for n in MODEL_FILES if bug_dir is not None and (bug_dir / n).is_file()]
    if files:
        lines.append("- " + ", ".join(f"`{n}`" for n in files) + f": what pnnx "
                     f"{env.get('pnnx')} wrote" + (" (hand-written graph)" if case.handwritten
                                                   else "") + ".")
    return "\n".join(lines)


def _observed_detail(st: dict[str, Any]) -> str:
    status = st["status"]
    if status == "export_fail":
        return f"no ncnn model: {evidence(st)}"
    if status == "load_fail":
        msg = "; ".join(f"`{ln}`" for ln in (st.get("ncnn_stderr") or [])[:3])
        return f"`load_param` fails ({st.get('ncnn_status')}): {msg}" if msg else \
            f"`load_param` fails ({st.get('ncnn_status')})"
    if status == "crash":
        return f"ncnn loads the graph; `extract` kills the process with {st.get('signal_name')}"
    if status == "wrong":
        got = ", ".join(f"`out{i}` {_fmt_shape(o['ncnn'])}"
                        for i, o in enumerate(st.get("output_shapes") or []))
        return (f"load 0, extract 0, {got}: silently wrong ({evidence(st)})")
    return f"right ({evidence(st)})"


def _test_outcome(st: dict[str, Any]) -> str:
    status = st["status"]
    if status == "export_fail":
        return "exits 1 (pnnx fails, no ncnn files)"
    if status == "crash":
        return f"is killed by {st.get('signal_name')} inside ncnn"
    if status == "load_fail":
        return "exits 1 (ncnn load_param fails)"
    if status == "wrong":
        return "exits 1 (ncnn differs from torch)"
    return "exits 0"


# =========================================================================== test_<id>.py

# the helper functions every generated test defines (compare, fp32, run_ncnn, loads,
# describe), verbatim
_TEST_HELPERS = (Path(__file__).parent / "templates" / "test_helpers.py.tmpl").read_text()


def _ints(d: dict[str, int] | None, prefix: str, n: int) -> str:
    d = d or {}
    return "[" + ", ".join(str(d.get(f"{prefix}{i}", C.NO_BATCH)) for i in range(n)) + "]"


def _input_block(names: list[str], shapes: list, suffixes: list[str]) -> str:
    return "\n".join(f"    {n} = {_tensor_expr(shape, suf)}"
                     for n, shape, suf in zip(names, shapes, suffixes))


def render_test(obs: Observation) -> str:
    case = obs.case
    st = obs.bug
    sc = script(case.id)
    mod = module_name(case.id)
    env = obs.env
    n_out = len(st.get("reference_output_shapes") or {}) or 1
    run_shapes = [tuple(v) for v in st["input_shapes"].values()]
    run_suffix = [_NP_TO_SUFFIX.get(d, "f32") for d in st["input_dtypes"].values()]
    in_b = _ints(st.get("input_batch_index"), "in", len(run_shapes))
    out_b = _ints(st.get("output_batch_index"), "out", n_out)
    if case.handwritten:
        names = _var_names(len(run_shapes))
        body = _template("test_handwritten.py.tmpl").substitute(
            param=case.variant("bug").handwritten_param or "", mod=mod, in_b=in_b, out_b=out_b,
            inputs=_input_block(names, run_shapes, run_suffix), names=", ".join(names))
    else:
        cmdline = st["pnnx"]["command"]
        traced = _shapes_from_command(cmdline, "inputshape") or []
        traced2 = _shapes_from_command(cmdline, "inputshape2")
        names = _var_names(len(traced))
        rnames = _var_names(len(run_shapes))
        body = _template("test_exported.py.tmpl").substitute(
            seed=case.seed, mod=mod, names=", ".join(names),
            inputs=_input_block(names, [t[0] for t in traced], [t[1] for t in traced]),
            trace_args=names[0] if len(names) == 1 else "(" + ", ".join(names) + ")",
            dynamic=" (dynamic shape: two input shapes)" if traced2 else "",
            shape_args=" ".join(cmdline[2:]), trace_len=_trace_len(case),
            run_len=st["run_length"],
            which="neither trace used" if traced2 else "the trace did not use",
            run_inputs=_input_block(rnames, run_shapes, run_suffix),
            run_names=", ".join(rnames), in_b=in_b, out_b=out_b)
    return _template("test.py.tmpl").substitute(
        case_id=case.id, number=case.number, title=case.title, pnnx=env.get("pnnx"),
        ncnn=env.get("ncnn"), torch=env.get("torch"), outcome=_test_outcome(st),
        math="import math\n" if "math." in sc.model else "", model=sc.model.rstrip(),
        helpers="\n" + _TEST_HELPERS.rstrip("\n"), body=body.rstrip("\n"))


def _trace_len(case: C.ReproCase) -> int:
    return case.lengths(case.variant("bug"))[0][0]


# =========================================================================== model.py

def _template(name: str) -> string.Template:
    """A file of `paramsurgery/repro/templates/` (string.Template, `${name}` fields)."""
    return string.Template((Path(__file__).parent / "templates" / name).read_text())


def render_model_script(obs: Observation) -> str:
    case = obs.case
    sc = script(case.id)
    exports = {}
    for vname in ("bug", "workaround"):
        st = obs.statuses.get(vname) or {}
        if st.get("pnnx"):
            exports[vname] = st["pnnx"]["command"]
    if exports:
        rows = "\n".join(f"    {vname!r}: ({'Model' if vname == 'bug' else 'ModelWorkaround'}, "
                         f"{cmdline[2:]!r})," for vname, cmdline in exports.items())
        main = _template("model_export.py.tmpl").substitute(exports=rows, seed=case.seed)
    else:
        main = _template("model_handwritten.py.tmpl").template
    return _template("model.py.tmpl").substitute(
        title=case.title, case_id=case.id, number=case.number, imports=sc.imports.rstrip(),
        model=sc.model.rstrip(),
        workaround=_rename_class(sc.workaround, "ModelWorkaround").rstrip(), main=main.rstrip())


# =========================================================================== writer

def write_issue(case_id: str, out_dir: str | Path, *, use_fresh: bool = False,
                lint: bool = True) -> dict[str, Path]:
    """Write the issue bundle for `case_id` into `out_dir` (created if missing). Every file
    is written atomically; returns name -> path."""
    from paramsurgery.repro.catalogue import resolve_ids

    case = resolve_ids([case_id])[0]
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tmp = None
    try:
        if use_fresh:
            tmp = Path(tempfile.mkdtemp(prefix="paramsurgery-issue-"))
            obs = fresh(case, tmp)
        else:
            obs = from_fixture(case)
        written: dict[str, Path] = {}
        texts = {"ISSUE.md": render_issue(obs, lint=lint),
                 f"{module_name(case.id)}.py": render_test(obs),
                 "model.py": render_model_script(obs)}
        for name, text in texts.items():
            atomic_write(out / name, text)
            written[name] = out / name
        bug_dir = obs.dirs.get("bug")
        for name in MODEL_FILES:
            dst = out / name
            src = bug_dir / name if bug_dir is not None else None
            if src is not None and src.is_file():
                atomic_write(dst, src.read_bytes())
                written[name] = dst
            elif dst.exists():
                dst.unlink()        # a stale file from another case would mislead
        return written
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
