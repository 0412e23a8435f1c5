"""Rewrite rules written in the `.param` format itself (pnnx's idea for its own passes, read
by our reader): a `pattern` section of layer lines, a `replacement` section, and optional
`where` conditions.

    # GELU by tanh, as old exporters write it: one GELU layer (ncnn's fast_gelu is this formula)
    pattern
    BinaryOp  cube  1 1 %x x3    0=6 1=1 2=3.0
    ...
    replacement
    GELU      gelu  1 1 %x %y    0=1
    where
    abs(c1[2] - 0.044715) < 1e-6

- A layer line is `Type label nbottom ntop bottoms... tops... key=value...` as in a `.param`
  (the `7767517` magic and the counts line are optional). Comments run from `#` to the end
  of the line; blank lines are ignored.
- Blobs named `%name` are captures carried across: a pattern input (read, not produced)
  binds to whatever feeds the match; a pattern output binds to the blob the matched layers
  write, and the replacement must write a blob of the same name (its readers are kept).
  Other blob names are internal: in the pattern they must not be read outside the match.
- Pattern params: each listed `k=v` must equal the layer's value as ncnn reads it (floats
  to 1e-6 relative), `k=*` matches any value; a param not listed must be at ncnn's default,
  unless the line ends with `*` (other params are free).
- Replacement params: literal `k=v`, `k=%label[pid]` (the matched layer's value of param
  `pid`), and `%label[*]` (every param of the matched layer, then the listed ones on top).
  A replacement layer named `%label` keeps the matched layer's name.
- `where` lines: conditions that must all hold, over `label[pid]` (a matched layer's value,
  ncnn's default when absent), numbers, `+ - * /`, `abs()`, `len()`, comparisons, `in`,
  `and`/`or`/`not`.

Errors are `file:line:col: message` (`ParamSyntaxError`), exit 2 in the command.
"""

from __future__ import annotations

import ast
import os
from dataclasses import dataclass, field

from paramsurgery.core.errors import ParamSyntaxError
from paramsurgery.core.layer_types import NCNN_LAYER_TYPES
from paramsurgery.core.values import Value, ValueError_, parse_value

MAGIC = "7767517"
SECTIONS = ("pattern", "replacement", "where")
ANY = "*"


@dataclass
class LayerLine:
    """One layer line of a rule: its type, label, blobs and params as written."""

    type: str
    label: str
    bottoms: list[str]
    tops: list[str]
    params: dict[int, Value]  # literal values
    wildcards: set[int] = field(default_factory=set)  # `k=*` (pattern)
    refs: dict[int, tuple[str, int]] = field(default_factory=dict)  # `k=%label[pid]` (replacement)
    copy_from: str | None = None  # `%label[*]` (replacement)
    open_params: bool = False  # a trailing `*` (pattern): unlisted params are free
    line: int = 0


@dataclass
class Condition:
    text: str
    tree: ast.expr
    line: int


@dataclass
class RewriteRule:
    path: str
    pattern: list[LayerLine]
    replacement: list[LayerLine]
    where: list[Condition]

    @property
    def name(self) -> str:
        return os.path.basename(self.path)

    def inputs(self) -> list[str]:
        """Captured blobs the pattern reads and does not write, in first-read order."""
        written = {t for layer in self.pattern for t in layer.tops}
        out: list[str] = []
        for layer in self.pattern:
            for b in layer.bottoms:
                if b not in written and b not in out:
                    out.append(b)
        return out

    def outputs(self) -> list[str]:
        """Captured blobs the pattern writes (the replacement writes them again)."""
        return [t for layer in self.pattern for t in layer.tops if t.startswith("%")]


def read_rule_file(path: str | os.PathLike) -> RewriteRule:
    path_s = os.fspath(path)
    try:
        with open(path_s, encoding="utf-8") as fh:
            text = fh.read()
    except OSError as exc:
        raise ParamSyntaxError(f"cannot read the rule file: {exc.strerror}", file=path_s) from None
    except UnicodeDecodeError:
        raise ParamSyntaxError("the rule file is not UTF-8 text", file=path_s) from None
    return parse_rule(text, path_s)


def parse_rule(text: str, path: str = "<rule>") -> RewriteRule:
    sections: dict[str, list[tuple[int, str]]] = {s: [] for s in SECTIONS}
    current: str | None = None
    seen: set[str] = set()
    for no, raw in enumerate(text.splitlines(), 1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        word = line.rstrip(":").lower()
        if word in SECTIONS and " " not in line:
            if word in seen:
                raise ParamSyntaxError(f"a second {word!r} section", file=path, line=no, col=1)
            seen.add(word)
            current = word
            continue
        if current is None:
            raise ParamSyntaxError("a rule starts with a 'pattern' line", file=path, line=no, col=1)
        sections[current].append((no, line))
    for needed in ("pattern", "replacement"):
        if needed not in seen:
            raise ParamSyntaxError(f"no {needed!r} section", file=path, line=1, col=1)
    pattern = _layer_lines(sections["pattern"], path, replacement=False)
    replacement = _layer_lines(sections["replacement"], path, replacement=True)
    if not pattern:
        raise ParamSyntaxError("the pattern has no layer", file=path, line=1, col=1)
    where = [_condition(no, line, path) for no, line in sections["where"]]
    rule = RewriteRule(path, pattern, replacement, where)
    _check_rule(rule)
    return rule


def _strip_comment(line: str) -> str:
    i = line.find("#")
    return line if i < 0 else line[:i]


def _layer_lines(lines: list[tuple[int, str]], path: str, *, replacement: bool) -> list[LayerLine]:
    out: list[LayerLine] = []
    body = list(lines)
    if body and body[0][1] == MAGIC:
        body = body[1:]
        if body and len(body[0][1].split()) == 2 and all(t.isdigit() for t in body[0][1].split()):
            body = body[1:]  # the counts line
    for no, line in body:
        out.append(_layer_line(no, line, path, replacement))
    labels: dict[str, int] = {}
    for layer in out:
        if layer.label in labels and not replacement:
            raise ParamSyntaxError(f"label {layer.label!r} is used twice (line {labels[layer.label]})",
                                   file=path, line=layer.line, col=1)
        labels[layer.label] = layer.line
    return out


def _col(line: str, token_index: int) -> int:
    tokens_seen = 0
    i = 0
    while i < len(line):
        while i < len(line) and line[i].isspace():
            i += 1
        if tokens_seen == token_index:
            return i + 1
        while i < len(line) and not line[i].isspace():
            i += 1
        tokens_seen += 1
    return len(line) + 1


def _layer_line(no: int, line: str, path: str, replacement: bool) -> LayerLine:
    toks = line.split()

    def err(msg: str, tok: int) -> ParamSyntaxError:
        return ParamSyntaxError(msg, file=path, line=no, col=_col(line, tok))

    if len(toks) < 4:
        raise err("a layer line is: Type label nbottom ntop bottoms... tops... params...", 0)
    ltype, label = toks[0], toks[1]
    if ltype not in NCNN_LAYER_TYPES and not ltype.startswith(("pnnx.", "torch.", "Tensor.", "F.",
                                                               "nn.", "aten::", "prim::")):
        raise err(f"{ltype!r} is not an ncnn layer type", 0)
    try:
        nb, nt = int(toks[2]), int(toks[3])
    except ValueError:
        raise err("the bottom and top counts must be integers", 2) from None
    if nb < 0 or nt < 0 or 4 + nb + nt > len(toks):
        raise err(f"{nb} bottom(s) and {nt} top(s) declared, {len(toks) - 4} token(s) follow", 2)
    bottoms = toks[4:4 + nb]
    tops = toks[4 + nb:4 + nb + nt]
    layer = LayerLine(ltype, label, bottoms, tops, {}, line=no)
    for i, tok in enumerate(toks[4 + nb + nt:], 4 + nb + nt):
        if tok == ANY and not replacement:
            layer.open_params = True
            continue
        if replacement and tok.startswith("%") and tok.endswith("[*]"):
            layer.copy_from = tok[1:-3]
            continue
        key, eq, val = tok.partition("=")
        if not eq:
            raise err(f"expected key=value, got {tok!r}", i)
        if val == ANY and not replacement:
            try:
                pid = int(key)
            except ValueError:
                raise err(f"param id {key!r} is not an integer", i) from None
            layer.wildcards.add(pid)
            continue
        if replacement and val.startswith("%"):
            ref = _param_ref(val)
            if ref is None:
                raise err(f"{val!r}: a reference is %label[pid]", i)
            try:
                layer.refs[int(key)] = ref
            except ValueError:
                raise err(f"param id {key!r} is not an integer", i) from None
            continue
        try:
            pid, value = parse_value(key, val)
        except (ValueError_, ValueError) as exc:
            raise err(f"{tok}: {exc}", i) from None
        layer.params[pid] = value
    return layer


def _param_ref(text: str) -> tuple[str, int] | None:
    if not (text.startswith("%") and text.endswith("]") and "[" in text):
        return None
    label, _, pid = text[1:-1].partition("[")
    try:
        return label, int(pid)
    except ValueError:
        return None


_ALLOWED = (ast.Expression, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.UAdd,
            ast.BinOp, ast.Add, ast.Sub, ast.Mult, ast.Div, ast.Compare, ast.Eq, ast.NotEq, ast.Lt,
            ast.LtE, ast.Gt, ast.GtE, ast.In, ast.NotIn, ast.Constant, ast.Name, ast.Subscript,
            ast.Tuple, ast.List, ast.Call, ast.Load)


def _condition(no: int, line: str, path: str) -> Condition:
    try:
        tree = ast.parse(line, mode="eval")
    except SyntaxError as exc:
        raise ParamSyntaxError(f"condition: {exc.msg}", file=path, line=no,
                               col=exc.offset or 1) from None
    for node in ast.walk(tree):
        if not isinstance(node, _ALLOWED):
            raise ParamSyntaxError(f"condition: {type(node).__name__} is not allowed (labels, "
                                   f"label[pid], numbers, arithmetic, comparisons, abs, len)",
                                   file=path, line=no, col=getattr(node, "col_offset", 0) + 1)
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name)
                                               and node.func.id in ("abs", "len")):
            raise ParamSyntaxError("condition: only abs() and len() may be called", file=path,
                                   line=no, col=node.col_offset + 1)
    return Condition(line, tree.body, no)


def _check_rule(rule: RewriteRule) -> None:
    """What must hold between the sections (located on the offending line)."""
    path = rule.path
    written: dict[str, int] = {}
    for layer in rule.pattern:
        for t in layer.tops:
            if t in written:
                raise ParamSyntaxError(f"blob {t!r} is written twice in the pattern", file=path,
                                       line=layer.line, col=1)
            written[t] = layer.line
    for b in rule.inputs():
        if not b.startswith("%"):
            line = next(lay.line for lay in rule.pattern if b in lay.bottoms)
            raise ParamSyntaxError(f"pattern input {b!r} must be a capture (%{b})", file=path,
                                   line=line, col=1)
    labels = {lay.label for lay in rule.pattern}
    made = {t for lay in rule.replacement for t in lay.tops}
    for out in rule.outputs():
        if out not in made:
            raise ParamSyntaxError(f"the replacement does not write {out!r}, which the pattern "
                                   f"writes (its readers would be left without it)", file=path,
                                   line=rule.replacement[-1].line if rule.replacement else written[out],
                                   col=1)
    known = set(rule.inputs()) | set(rule.outputs())
    for lay in rule.replacement:
        for b in lay.bottoms:
            if b.startswith("%") and b not in known:
                raise ParamSyntaxError(f"{b!r} is not a capture of the pattern", file=path,
                                       line=lay.line, col=1)
        for t in lay.tops:
            if t.startswith("%") and t not in rule.outputs():
                raise ParamSyntaxError(f"{t!r} is not a blob the pattern writes", file=path,
                                       line=lay.line, col=1)
        refs = [r for r, _ in lay.refs.values()] + ([lay.copy_from] if lay.copy_from else [])
        if lay.label.startswith("%"):
            refs.append(lay.label[1:])
        for r in refs:
            if r not in labels:
                raise ParamSyntaxError(f"%{r}: no pattern layer is labelled {r!r}", file=path,
                                       line=lay.line, col=1)
    for cond in rule.where:
        for node in ast.walk(cond.tree):
            if isinstance(node, ast.Name) and node.id not in labels and node.id not in ("abs", "len"):
                raise ParamSyntaxError(f"condition: {node.id!r} is not a pattern label", file=path,
                                       line=cond.line, col=node.col_offset + 1)
