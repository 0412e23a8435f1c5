"""Rewrite imports of paramsurgery's old flat module paths to the layered ones.

The package was moved into layers (core → ir ‖ runtime → formats → analysis → patterns →
passes ‖ lint → verify → pipeline → view/repro/... → commands → cli). Code written against
the old paths (a branch started before the move) is brought over with

    python tools/relayer_imports.py [FILE_OR_DIR ...]     # default: paramsurgery tests tools

It is idempotent. Per file it
- turns every relative import into an absolute one, resolved against the file's place BEFORE
  the move (a moved file keeps meaning what it meant), then
- maps every dotted `paramsurgery.<old>` module path (imports, `-m` strings, monkeypatch
  targets) to its new place; `paramsurgery.io` is split by name (file-system helpers went to
  `core.fs`, graph load/save stayed in `formats.io`), `paramsurgery.runtime`'s names went to
  `runtime.child`;
- with `--graph-methods`, turns `X.dumps()`, `X.dump_bytes()`, `X.save(...)`, `X.validate()`,
  `X.shapes(...)` on graphs into the free functions `dumps(X)`, `dump_bytes(X)`,
  `save(X, ...)`, `validate(X)`, `infer_shapes(X, ...)` (the IR imports no serializer or
  analysis), adding the import; it prints every site it rewrote (receivers it cannot tell
  from a graph, e.g. a codebook manifest's `.dumps()`, are left: see SKIP_RECEIVERS).

`--moves` (run once, on main, by the move itself) does the `git mv`s.
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PKG = "paramsurgery"

# old module -> new module (modules and packages; a package maps everything below it)
MOVES: dict[str, str] = {
    "paramsurgery.errors": "paramsurgery.core.errors",
    "paramsurgery.findings": "paramsurgery.core.findings",
    "paramsurgery.values": "paramsurgery.core.values",
    "paramsurgery.layer_params": "paramsurgery.core.layer_params",
    "paramsurgery.layer_types": "paramsurgery.core.layer_types",
    "paramsurgery._gc": "paramsurgery.core.collector",
    "paramsurgery.resources": "paramsurgery.core.resources",
    "paramsurgery.npz": "paramsurgery.core.npz",
    "paramsurgery.params": "paramsurgery.ir.params",
    "paramsurgery.layer": "paramsurgery.ir.layer",
    "paramsurgery.graph": "paramsurgery.ir.graph",
    "paramsurgery.cone": "paramsurgery.ir.cone",
    "paramsurgery.runtime": "paramsurgery.runtime.child",
    "paramsurgery.ncnn_loader": "paramsurgery.runtime.loader",
    "paramsurgery.io": "paramsurgery.formats.io",
    "paramsurgery.normalize": "paramsurgery.formats.normalize",
    "paramsurgery.codebooks": "paramsurgery.formats.codebooks",
    "paramsurgery.weights": "paramsurgery.formats.weights",
    "paramsurgery.passes._traced": "paramsurgery.formats.pnnx_traced",
    "paramsurgery.compare.mapping": "paramsurgery.formats.pnnx_mapping",
    "paramsurgery.compare.inputs": "paramsurgery.analysis.traced_inputs",
    "paramsurgery.validate": "paramsurgery.analysis.validate",
    "paramsurgery.shapes": "paramsurgery.analysis.shapes",
    "paramsurgery.summary": "paramsurgery.analysis.summary",
    "paramsurgery.passes._timeflow": "paramsurgery.analysis.timeflow",
    "paramsurgery.passes.int_affine": "paramsurgery.analysis.int_affine",
    "paramsurgery.passes.shape_expr": "paramsurgery.analysis.shape_expr",
    "paramsurgery.passes.frozen_extent": "paramsurgery.analysis.frozen_extent",
    "paramsurgery.passes.match": "paramsurgery.patterns.match",
    "paramsurgery.equivalence": "paramsurgery.verify.equivalence",
    "paramsurgery.kvcache_verify": "paramsurgery.verify.kvcache",
    "paramsurgery.fold_verify": "paramsurgery.verify.fold",
    "paramsurgery.codebooks_verify": "paramsurgery.verify.codebooks",
    "paramsurgery.verify_reference": "paramsurgery.verify.reference",
    "paramsurgery.compare": "paramsurgery.verify.compare",
}

# names of the old paramsurgery/io.py that went to core/fs.py (the rest stayed in formats.io)
FS_NAMES = {
    "WRITE_WATCHERS", "_written", "Terminated", "signals_raise", "write_error", "atomic_open",
    "atomic_write", "atomic_write_many", "MAX_STREAM_BYTES", "read_bytes", "companion",
    "_CLEANUP_SIGNALS", "_raise_terminated", "_default_mode", "_stage",
}
FS_MODULE = "paramsurgery.core.fs"

# modules split by name: (module after MOVES) -> {name: the module it went to}
SPLITS: dict[str, dict[str, str]] = {
    "paramsurgery.lint.conformance": dict.fromkeys(
        ('InputSpec', 'parse_input_shapes', 'find_pnnx_script', 'read_pnnx_script', 'Reference',
         '_fits', '_pair', 'io_sidefile', 'read_io_sidefile', 'write_io_sidefile', 'find_reference',
         '_strip', 'shape_matches', '_match', 'fmt_shape', '_SPEC_RE', '_RAND_RE', '_INPUT_RE',
         '_OUTPUT_RE', 'REFERENCE_ERRORS'), "paramsurgery.formats.pnnx_reference"),
    "paramsurgery.runtime.child": {"child_env": "paramsurgery.runtime.launch"},
    "paramsurgery.patterns.match": dict.fromkeys(("Match", "matched", "fail", "NoMatch"),
                                                 "paramsurgery.core.match"),
    "paramsurgery.passes.base": {"Change": "paramsurgery.core.changes",
                                 "PassManager": "paramsurgery.pipeline.manager"},
    "paramsurgery.commands._common": {"run_param_pass": "paramsurgery.commands._runner"},
    "paramsurgery.analysis.shapes.hints": {"refresh_after": "paramsurgery.analysis.shapes.static"},
    "paramsurgery.analysis.shapes.rules": {"_ncnn_axes": "paramsurgery.analysis.shapes.exprs",
                                          "AXIS_NAMES": "paramsurgery.analysis.shapes.exprs"},
    "paramsurgery.passes.dynamize": {"int_params": "paramsurgery.passes.dynamize_shapes",
                                     "_int_list": "paramsurgery.core.values"},
    "paramsurgery.lint.registry": dict.fromkeys(("all_rules", "get_rule", "select_rules"),
                                                "paramsurgery.lint.catalogue"),
    "paramsurgery.passes.lower": dict.fromkeys(
        ('ABS', 'ADD', 'BASE_RULES', 'DIV', 'Declined', 'MAX', 'MIN', 'MUL', 'NEG', 'Rule', 'Rules',
         'SUB', 'Site', 'Step', 'TABLE', 'TRUNC', '_BASE_RULES', '_NOT_EXACT', '_RULES',
         '_add_combined', '_as_float', '_declines', '_is_int', 'addcdiv', 'addcmul', 'checked_dim',
         'clamp', 'clamp_max', 'clamp_min', 'deg2rad', 'frac', 'lerp', 'mT', 'narrow', 'rrelu',
         'rule', 'softmin', 'softsign', 'tanhshrink'),
                                               "paramsurgery.passes.lowering"),
    "paramsurgery.passes.fix_batch_reshape": dict.fromkeys(
        ("match_pair", "find_lossy_pairs", "NOT_A_CANDIDATE", "DIM_PARAMS", "_is_int"),
        "paramsurgery.patterns.batch_reshape"),
    "paramsurgery.passes.fold_gqa": dict.fromkeys(("FoldCheck", "decoder_feeds", "verify_fold"),
                                                  "paramsurgery.verify.gqa"),
    "paramsurgery.verify.fold": {"FoldedCache": "paramsurgery.passes.fold_explicit_cache"},
    "paramsurgery.passes.fuse_codebooks": {
        **dict.fromkeys(("MANIFEST_FORMAT", "MANIFEST_VERSION", "CodebookGroup", "FusedManifest",
                         "Fusion"), "paramsurgery.formats.codebooks"),
        **dict.fromkeys(("FusionCheck", "verify_fusion"), "paramsurgery.verify.codebooks")},
}
# spelled in pieces so that running this script over tools/ leaves its own table alone
OLD_IO = ".".join((PKG, "io"))
RUNTIME = ".".join((PKG, "runtime"))

# Graph methods that became free functions: method -> (module, function)
GRAPH_METHODS = {
    "dumps": ("paramsurgery.formats.param_text", "dumps"),
    "dump_bytes": ("paramsurgery.formats.param_text", "dump_bytes"),
    "save": ("paramsurgery.formats.io", "save"),
    "validate": ("paramsurgery.analysis.validate", "validate"),
    "shapes": ("paramsurgery.analysis.shapes", "infer_shapes"),
}
SKIP_RECEIVERS = re.compile(r"^(np|numpy|torch|json|pickle|manifest|fusion|ctx|self)\b"
                            r"|^paramsurgery$|manifest|\"\]$")


def module_of(path: Path) -> str | None:
    rel = path.resolve().relative_to(ROOT)
    parts = list(rel.with_suffix("").parts)
    if not parts or parts[0] != PKG:
        return None
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def new_modules() -> set[str]:
    out = set()
    for p in (ROOT / PKG).rglob("*.py"):
        m = module_of(p)
        if m:
            out.add(m)
    return out


def map_dotted(name: str, new: set[str]) -> str:
    """The new path of a dotted name that starts with an old module path."""
    if name in new and name not in MOVES:
        return name
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in new and head not in MOVES:
            return name  # already a new module (or an attribute of one)
        if head in MOVES:
            tail = parts[i:]
            if head == RUNTIME and tail and f"{RUNTIME}.{tail[0]}" in new:
                return name  # a submodule of the new runtime package
            return ".".join([MOVES[head], *tail])
    return name


def old_module_of(path: Path, new: set[str]) -> str | None:
    """What module this file was before the move (for resolving its relative imports)."""
    mod = module_of(path)
    if mod is None:
        return None
    inverse = {v: k for k, v in MOVES.items()}
    parts = mod.split(".")
    for i in range(len(parts), 1, -1):
        head = ".".join(parts[:i])
        if head in inverse:
            return ".".join([inverse[head], *parts[i:]])
    return mod


def resolve_relative(node: ast.ImportFrom, old_mod: str, is_pkg: bool) -> str:
    base = old_mod.split(".")
    if not is_pkg:
        base = base[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def render_from(module: str, names: list[ast.alias], indent: str) -> str:
    """`from module import a, b` on one line, or wrapped with a hanging indent under the
    parenthesis (several names a line, the package's style)."""
    items = [a.name + (f" as {a.asname}" if a.asname else "") for a in names]
    line = f"{indent}from {module} import {', '.join(items)}"
    if len(line) <= 110:
        return line
    head = f"{indent}from {module} import ("
    pad = " " * len(head)
    lines, cur = [], head
    for i, it in enumerate(items):
        piece = it + (")" if i == len(items) - 1 else ",")
        if cur not in (head, pad) and len(cur) + 1 + len(piece) > 110:
            lines.append(cur)
            cur = pad
        cur += ("" if cur in (head, pad) else " ") + piece
    lines.append(cur)
    return "\n".join(lines)


def compact_imports(text: str) -> str:
    """Re-wrap `from x import (` lists written one name a line (and without comments)."""
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    edits = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.end_lineno and \
                node.end_lineno - node.lineno >= 2:
            segment = "".join(lines[node.lineno - 1:node.end_lineno])
            if "#" in segment:
                continue
            indent = lines[node.lineno - 1][: node.col_offset]
            edits.append((node.lineno, node.col_offset, node.end_lineno, node.end_col_offset or 0,
                          render_from(node.module, node.names, indent)[len(indent):]))
    return apply_edits(lines, edits) if edits else text


def rewrite_imports(path: Path, text: str, new: set[str]) -> str:
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    old_mod = old_module_of(path, new)
    is_pkg = path.name == "__init__.py"
    edits: list[tuple[int, int, int, int, str]] = []  # (l0, c0, l1, c1, text)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                if old_mod is None:
                    continue
                target = resolve_relative(node, old_mod, is_pkg)
            else:
                target = node.module or ""
            if not (target == PKG or target.startswith(PKG + ".")):
                continue
            indent = lines[node.lineno - 1][: node.col_offset]
            groups: dict[str, list[ast.alias]] = {}
            for alias in node.names:
                full = f"{target}.{alias.name}"
                if full in MOVES:  # `from paramsurgery import graph`, `from .passes import _traced`
                    mod, _, name = map_dotted(full, new).rpartition(".")
                    groups.setdefault(mod, []).append(ast.alias(name, alias.asname or alias.name))
                elif target == OLD_IO:
                    dest = FS_MODULE if alias.name in FS_NAMES else "paramsurgery.formats.io"
                    groups.setdefault(dest, []).append(alias)
                elif target == RUNTIME and f"{RUNTIME}.{alias.name}" in new:
                    groups.setdefault(target, []).append(alias)
                else:
                    dest = map_dotted(target, new)
                    groups.setdefault(SPLITS.get(dest, {}).get(alias.name, dest), []).append(alias)
            if node.level == 0 and list(groups) == [target]:
                continue  # nothing moved: keep the statement as written (comments included)
            rendered = "\n".join(render_from(m, a, indent) for m, a in groups.items())
            edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                          node.end_col_offset or 0, rendered[len(indent):]))
        elif isinstance(node, ast.Import):
            changed = False
            items = []
            for alias in node.names:
                name = alias.name
                if name.startswith(PKG + "."):
                    mapped = map_dotted(name, new)
                    if name == OLD_IO:
                        mapped = "paramsurgery.formats.io"
                    changed |= mapped != name
                    name = mapped
                    if alias.asname is None and mapped != alias.name:
                        print(f"{path}:{node.lineno}: `import {alias.name}` now `import {mapped}`: "
                              "check the uses", file=sys.stderr)
                items.append(name + (f" as {alias.asname}" if alias.asname else ""))
            if changed:
                edits.append((node.lineno, node.col_offset, node.end_lineno or node.lineno,
                              node.end_col_offset or 0, "import " + ", ".join(items)))
    return apply_edits(lines, edits)


def apply_edits(lines: list[str], edits: list[tuple[int, int, int, int, str]]) -> str:
    for l0, c0, l1, c1, new_text in sorted(edits, reverse=True):
        head = lines[l0 - 1][:c0]
        tail = lines[l1 - 1][c1:]
        lines[l0 - 1:l1] = [head + new_text + tail]
    return "".join(lines)


DOTTED = re.compile(r"\bparamsurgery(?:\.[A-Za-z_][A-Za-z0-9_]*)+")


def rewrite_dotted(text: str, new: set[str]) -> str:
    """Dotted module paths outside import statements: `-m` strings, monkeypatch targets,
    `paramsurgery.verify.kvcache.verify_kvcache(...)` attribute chains."""
    def sub(m: re.Match) -> str:
        name = m.group(0)
        if name in new and text[m.end():m.end() + 8] == " import ":
            return name  # `from <new package> import x`: the import pass settled it
        if text[m.end():m.end() + 1] == "(":
            return name  # a call: `paramsurgery.validate(g)` is the API's function, not a module
        if name.startswith(OLD_IO + ".") or name == OLD_IO:
            tail = name[len(OLD_IO):].lstrip(".").split(".")[0]
            return FS_MODULE if tail in FS_NAMES else "paramsurgery.formats.io" + name[len(OLD_IO):]
        mapped = map_dotted(name, new)
        mod, _, attr = mapped.rpartition(".")
        return f"{SPLITS[mod][attr]}.{attr}" if attr in SPLITS.get(mod, {}) else mapped
    return DOTTED.sub(sub, text)


def graph_method_sites(path: Path, text: str) -> list[tuple[ast.Call, str, str, str]]:
    """(call, receiver text, module, function) of every graph-method call in the text."""
    tree = ast.parse(text)
    defined = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    defined |= {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
                if isinstance(t, ast.Name)}
    out = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        attr = node.func.attr
        if attr not in GRAPH_METHODS:
            continue
        recv = ast.get_source_segment(text, node.func.value) or ""
        if SKIP_RECEIVERS.search(recv) or "\n" in recv:
            continue
        mod, fn = GRAPH_METHODS[attr]
        if fn in defined and module_of(path) != mod:
            print(f"{path}:{node.lineno}: `{fn}` is defined here: {recv}.{attr}(...) left", file=sys.stderr)
            continue
        out.append((node, recv, mod, fn))
    return out


def rewrite_graph_methods(path: Path, text: str) -> str:
    needed: dict[str, set[str]] = {}
    while True:  # one call at a time, the last in the file first: nested calls compose
        sites = graph_method_sites(path, text)
        if not sites:
            break
        node, recv, mod, fn = max(sites, key=lambda s: (s[0].lineno, s[0].col_offset))
        args = [ast.get_source_segment(text, a) or "" for a in node.args]
        args += [f"{k.arg}={ast.get_source_segment(text, k.value)}" if k.arg
                 else f"**{ast.get_source_segment(text, k.value)}" for k in node.keywords]
        simple = isinstance(node.func.value, (ast.Name, ast.Attribute, ast.Subscript, ast.Call))  # type: ignore[union-attr]
        call = f"{fn}({', '.join([recv if simple else f'({recv})', *args])})"
        lines = text.splitlines(keepends=True)
        text = apply_edits(lines, [(node.lineno, node.col_offset, node.end_lineno or node.lineno,
                                    node.end_col_offset or 0, call)])
        needed.setdefault(mod, set()).add(fn)
        print(f"{path}:{node.lineno}: {recv}.{node.func.attr}(...) -> {fn}(...)")  # type: ignore[union-attr]
    return add_imports(text, needed, module_of(path)) if needed else text


def add_imports(text: str, needed: dict[str, set[str]], own: str | None) -> str:
    tree = ast.parse(text)
    lines = text.splitlines(keepends=True)
    have = {(n.module, a.name) for n in tree.body if isinstance(n, ast.ImportFrom) for a in n.names}
    add = [f"from {m} import {f}\n" for m, fns in sorted(needed.items()) if m != own
           for f in sorted(fns) if (m, f) not in have]
    if not add:
        return text
    last = 0
    for n in tree.body:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            break
        if isinstance(n, (ast.Import, ast.ImportFrom)):
            last = n.end_lineno or n.lineno
    if last == 0 and tree.body and isinstance(tree.body[0], ast.Expr):
        last = tree.body[0].end_lineno or 0
    lines[last:last] = add
    return "".join(lines)


def files(args: list[str]) -> list[Path]:
    out = []
    for a in args or ["paramsurgery", "tests", "tools"]:
        p = (ROOT / a) if not Path(a).is_absolute() else Path(a)
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    me = Path(__file__).resolve()
    return [p for p in out if "fixtures" not in p.parts and ".venv" not in p.parts and p.resolve() != me]


def do_moves() -> None:
    for old, new in MOVES.items():
        src_pkg = ROOT / Path(*old.split("."))
        src = src_pkg if src_pkg.is_dir() else src_pkg.with_suffix(".py")
        dst_pkg = ROOT / Path(*new.split("."))
        dst = dst_pkg if src.is_dir() else dst_pkg.with_suffix(".py")
        if not src.exists():
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        init = dst.parent / "__init__.py"
        if not init.exists():
            init.write_text("")
            subprocess.run(["git", "add", str(init)], cwd=ROOT, check=True)
        subprocess.run(["git", "mv", str(src), str(dst)], cwd=ROOT, check=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("paths", nargs="*")
    ap.add_argument("--moves", action="store_true", help="git mv the modules first (once, on main)")
    ap.add_argument("--graph-methods", action="store_true")
    a = ap.parse_args()
    if a.moves:
        # resolve relative imports against the old places while the files are still there
        old_new = new_modules()
        for p in files(a.paths):
            t = p.read_text()
            t2 = rewrite_imports(p, t, old_new | set(MOVES.values()))
            if t2 != t:
                p.write_text(t2)
        do_moves()
    new = new_modules()
    for p in files(a.paths):
        text = p.read_text()
        out = rewrite_imports(p, text, new) if not a.moves else text
        out = rewrite_dotted(out, new)
        if a.graph_methods:
            out = rewrite_graph_methods(p, out)
        out = compact_imports(out)
        if out != text:
            p.write_text(out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
