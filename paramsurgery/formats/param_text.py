"""Text `.param` reader and writer, byte-exact.

Reading keeps, for every layer, the exact text of its record (plus the blank lines before
it and its line ending), the header as written and whatever follows the last layer. Writing
emits that text for every layer nobody edited and re-renders only edited or new layers, in
pnnx's layout. So `load → save` reproduces a file byte for byte whatever tool wrote it.

The grammar is ncnn 1.0.20261020's (ncnn-format.md §1): whitespace-separated header and
blob tokens (a blob list may continue on the next line, the first layer may start on the
header's line), a param list that ends at the end of its line, values typed by their text.
Token lengths are ncnn's: integers of the header and blob counts at most 31 characters,
param ids 15, numbers 127, strings and names 255; header counts at most 1,000,000.
Tokenising is done on `str` decoded with `surrogateescape` (lossless for any bytes) and
C-locale whitespace only. Long lines (arrays of millions of elements) are matched with
possessive repeats, which keep no per-element state.
"""

from __future__ import annotations

import re
from typing import Iterator

from paramsurgery.core.collector import paused_gc
from paramsurgery.core.errors import ParamSyntaxError
from paramsurgery.ir.graph import Graph, Source, count_ncnn_blobs
from paramsurgery.ir.layer import Layer
from paramsurgery.ir.params import Params


class TextOrigin:
    """A layer's record as the `.param` text held it: the record (one line, or several for a
    record ncnn's tokenizer reads across line ends), its line end, and the blank lines before
    it. Written back verbatim while the layer is unedited; the lead and line end always."""

    __slots__ = ("body", "eol", "lead")

    def __init__(self, body: str, eol: str, lead: str = "") -> None:
        self.body = body
        self.eol = eol
        self.lead = lead

MAGIC = 7767517
BINARY_MAGIC = b"\xdd\x85\x76\x00"  # 7767517 as little-endian int32: a .param.bin

# --- strict syntax of a param list (validated at load with one regex per line) -----------
# Every repeat over array elements or tokens is possessive (`*+`): Python's regex engine
# otherwise keeps ~500 bytes of backtracking state per iteration (1 GB for a 2-million
# element array). A possessive iteration keeps its first successful match, so each token
# ends in a lookahead for the separator that must follow it.
MAX_NUMBER_CHARS = 127  # ncnn: "read value failed" / "invalid array element" beyond
MAX_KEY_CHARS = 15  # ncnn: "invalid parameter id or missing equals sign" beyond
MAX_COUNT_CHARS = 31  # header counts and blob counts ("parse ... failed" beyond)
MAX_HEADER_COUNT = 1_000_000  # ncnn: "invalid layer_count or blob_count" beyond
_KEY_S = r"(?:\+?0*(?:[12]?[0-9]|3[01])|-0+)"
_KEY_A = r"-0*233(?:[0-2][0-9]|3[01])"
_INT = r"[+-]?[0-9]+"
_NUM = r"[+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?"
_FLT = (r"[+-]?(?:[0-9]+\.[0-9]*(?:[eE][+-]?[0-9]+)?|\.[0-9]+(?:[eE][+-]?[0-9]+)?"
        r"|[0-9]+[eE][+-]?[0-9]+)")
_END = r"(?=[ \t\v\f]|\Z)"
_SVAL = (rf'"[^"\r\n]*"{_END}|[A-Za-z][^ \t\n\v\f\r]*|{_INT}(?:,{_INT})*+,?{_END}'
         rf"|{_FLT}(?:,{_NUM})*+,?{_END}")
_AVAL = rf"[+-]?[0-9]+(?:,{_NUM})*+{_END}"
_TOKEN = rf"(?:{_KEY_S}=(?:{_SVAL})|{_KEY_A}=(?:{_AVAL}))"
PARAMS_RE = re.compile(rf"(?:[ \t\v\f]+{_TOKEN})*+[ \t\v\f]*")
# The common case in one match: scalars and new-style arrays whose values cannot overflow
# (ints of at most 9 digits, floats below 1e29), no old-style arrays, no string that could
# exceed 255 bytes. A line it accepts needs no further check; any other goes through PARAMS_RE and
# a full parse of its values (array counts, int32/float32 range, string length).
_SAFE_INT = r"[+-]?[0-9]{1,9}"
_SAFE_FLT = (r"[+-]?(?:[0-9]{1,20}\.[0-9]*(?:[eE][+-]?[0-9])?|\.[0-9]+(?:[eE][+-]?[0-9])?"
             r"|[0-9]{1,20}[eE][+-]?[0-9])")
_SAFE_NUM = rf"(?:{_SAFE_FLT}|{_SAFE_INT})"
_SAFE_KEY = r"\+?0{0,3}(?:[12]?[0-9]|3[01])"
_SAFE_SVAL = (rf'"[^"\r\n]{{0,60}}"|[A-Za-z][^\s"]{{0,60}}|{_SAFE_INT}(?:,{_SAFE_INT})*,?'
              rf"|{_SAFE_FLT}(?:,{_SAFE_NUM})*,?")
SAFE_PARAMS_RE = re.compile(rf"(?:[ \t\v\f]+{_SAFE_KEY}=(?:{_SAFE_SVAL}))*[ \t\v\f]*")
_TOKEN_RE = re.compile(rf"{_TOKEN}(?=[ \t\v\f]|$)")
_WS_RUN = re.compile(r"[ \t\v\f]+")

# C isspace() in the C locale; str.split() would also split on \x1c-\x1f, \x85, \xa0, ...
_C_WS = " \t\n\v\f\r"
_ODD_WS = re.compile(r"[\x1c-\x1f\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]")
_C_SPLIT = re.compile(r"[ \t\n\v\f\r]+")
_NONWS = re.compile(r"[^ \t\n\v\f\r]+")


def read_param(data: bytes, path: str | None = None) -> Graph:
    """Parse text `.param` bytes into a Graph. Raises ParamSyntaxError with file:line:col."""
    if data[:4] == BINARY_MAGIC:  # formats.io.read_graph reads those
        raise ParamSyntaxError("a binary .param.bin, not text", file=path)
    text = data.decode("utf-8", "surrogateescape")
    del data  # a long file is held once, as lines, while it is parsed
    with paused_gc():
        reader = _Reader(text, path)
        del text
        return reader.run()


class _Reader:
    def __init__(self, text: str, path: str | None) -> None:
        self.path = path
        if "\r" in text:
            parts = re.split(r"(\r\n|\r|\n)", text)
            self.lines = parts[0::2]
            self.eols = parts[1::2] + [""]
        else:
            self.lines = text.split("\n")
            self.eols = ["\n"] * (len(self.lines) - 1) + [""]
        self.split = _c_split if _ODD_WS.search(text) else str.split
        # When the first layer starts on the header's line, that line is held as two
        # (header part, layer part); `split_at` is the index of the layer part, `split_col`
        # its column offset in the physical line.
        self.split_at = -1
        self.split_col = 0
        self.param_texts: dict[str, str] = {}

    def lineno(self, line_idx: int) -> int:
        """1-based physical line number of a line index."""
        return line_idx + (0 if 0 <= self.split_at <= line_idx else 1)

    def colno(self, line_idx: int, col: int | None) -> int | None:
        return col + self.split_col if col is not None and line_idx == self.split_at else col

    def err(self, msg: str, line_idx: int, col: int | None = None) -> ParamSyntaxError:
        return ParamSyntaxError(msg, file=self.path, line=self.lineno(line_idx),
                                col=self.colno(line_idx, col))

    def col_of(self, line_idx: int, tok_index: int) -> int:
        """1-based column of the tok_index-th token of a line (error path only)."""
        for i, m in enumerate(_NONWS.finditer(self.lines[line_idx])):
            if i == tok_index:
                return m.start() + 1
        return len(self.lines[line_idx]) + 1

    # ------------------------------------------------------------------ header
    def header(self) -> tuple[int, int, int]:
        """Read magic, layer_count, blob_count; return (count, count, index of next line)."""
        toks: list[tuple[str, int, int]] = []
        i = 0
        lines = self.lines
        while len(toks) < 3:
            if i >= len(lines):
                what = ("magic number 7767517", "layer_count", "blob_count")[len(toks)]
                if not toks:
                    raise self.err("empty file: expected the magic number 7767517", 0, 1)
                raise self.err(f"file ended before the header's {what}", max(i - 1, 0))
            for ti, t in enumerate(self.split(lines[i])):
                toks.append((t, i, ti))
                if len(toks) == 3:
                    break
            i += 1
        (m, mi, mt), (lc, li, lt), (bc, bi, bt) = toks
        if not _is_int(m) or int(m) != MAGIC:
            raise self.err(f"bad magic {m[:40]!r}: expected 7767517 (ncnn: 'param is too old, "
                           f"please regenerate')", mi, self.col_of(mi, mt))
        for v, li_, ti_, what in ((lc, li, lt, "layer_count"), (bc, bi, bt, "blob_count")):
            if not _is_int(v):
                raise self.err(f"{what} {v[:40]!r} is not an integer (ncnn: 'parse {what} "
                               f"failed')", li_, self.col_of(li_, ti_))
            if not 0 < int(v) <= MAX_HEADER_COUNT:
                raise self.err(f"{what} must be 1..{MAX_HEADER_COUNT} (got {v}); ncnn: "
                               f"'invalid layer_count or blob_count'", li_, self.col_of(li_, ti_))
        rest = _NONWS.finditer(lines[bi])
        for k, tok in enumerate(rest):
            if k == bt + 1:  # the first layer starts on the header's line: hold it apart
                self.lines[bi:bi + 1] = [lines[bi][:tok.start()], lines[bi][tok.start():]]
                self.eols[bi:bi] = [""]
                self.split_at, self.split_col = bi + 1, tok.start()
                break
        return int(lc), int(bc), i

    # ------------------------------------------------------------------ body
    def run(self) -> Graph:
        declared_layers, declared_blobs, i = self.header()
        lines, eols, split = self.lines, self.eols, self.split
        header_text = "".join(lines[k] + eols[k] for k in range(i))
        layers: list[Layer] = []
        lead: list[str] = []
        n = len(lines)
        trailer = ""
        ignored = 0
        path = self.path
        lines, eols = self.lines, self.eols  # the header may have split its line
        n = len(lines)
        while i < n:
            line = lines[i]
            # a long line goes to record_slow, which finds its tokens lazily: split none here
            toks = split(line) if len(line) <= 255 else ([] if _NONWS.search(line) is None
                                                          else [line])
            if not toks:
                lead.append(line + eols[i])
                i += 1
                continue
            try:
                layer, i_next = self.record(i, toks)
            except ParamSyntaxError:
                if len(layers) < declared_layers:
                    raise
                # ncnn stops after layer_count layers: what follows is never parsed
                rest = "".join(lines[k] + eols[k] for k in range(i, n))
                trailer = "".join(lead) + rest
                ignored = sum(1 for k in range(i, n) if split(lines[k]))
                lead = []
                break
            if lead:
                layer.origin.lead = "".join(lead)
                lead = []
            layer.source_file = path
            layer.source_line = self.lineno(i)
            layers.append(layer)
            i = i_next
        else:
            trailer = "".join(lead)
        g = Graph._from_layers(layers)
        g.source = Source(path=path, format="param", header=header_text.encode("utf-8", "surrogateescape"),
                          declared_layers=declared_layers, declared_blobs=declared_blobs,
                          trailer=trailer.encode("utf-8", "surrogateescape"), ignored_lines=ignored)
        if len(layers) > declared_layers:  # ncnn reads only the first declared_layers
            g.source.extra["layers_read"] = len(layers)
        return g

    def record(self, i: int, toks: list[str]) -> tuple[Layer, int]:
        """Parse the layer record starting on line i; return it and the next line index."""
        line = self.lines[i]
        if len(toks) < 4:
            return self.record_slow(i)
        t2, t3 = toks[2], toks[3]
        if not (t2.isdigit() and t3.isdigit() and t2.isascii() and t3.isascii()
                and len(t2) <= MAX_COUNT_CHARS and len(t3) <= MAX_COUNT_CHARS):
            return self.record_slow(i)
        nin, nout = int(t2), int(t3)
        need = 4 + nin + nout
        if len(toks) < need or '"' in line or len(line) > 255:  # rare: the slow path checks all
            return self.record_slow(i)
        check = False
        if len(toks) > need:
            # layers repeat each other's param lists: one string per distinct list
            ptext = " " + " ".join(toks[need:])
            ptext = self.param_texts.setdefault(ptext, ptext)
            if not SAFE_PARAMS_RE.fullmatch(ptext):
                if not PARAMS_RE.fullmatch(ptext):
                    self.bad_params(i, line, need)
                check = True
        else:
            ptext = ""
        layer = Layer(toks[0], toks[1], toks[4:4 + nin], toks[4 + nin:need], Params(ptext))
        layer.origin = TextOrigin(line, self.eols[i])
        if check:
            layer.source_line = self.lineno(i)
            layer.source_file = self.path
            layer.params.check()
        return layer, i + 1

    def record_slow(self, i: int) -> tuple[Layer, int]:
        """General case: tokens with positions; blob list may continue on following lines;
        params are the rest of the line that holds the last blob (quoted strings may contain
        spaces)."""
        lines = self.lines
        start = i
        toks: list[tuple[str, int, int, int]] = []  # text, line, start col, end col
        pos_line: Iterator[re.Match[str]] | None = None

        def take(count: int, what: str) -> None:
            nonlocal i, pos_line
            while len(toks) < count:
                if pos_line is None:
                    pos_line = iter(_NONWS.finditer(lines[i]))
                m = next(pos_line, None)
                if m is None:
                    i += 1
                    pos_line = None
                    if i >= len(lines):
                        raise self.err(f"file ended while reading {what} of the layer that "
                                       f"starts on line {self.lineno(start)}", len(lines) - 1)
                    continue
                toks.append((m.group(0), i, m.start(), m.end()))

        take(4, "type, name and blob counts")
        typ, name = toks[0][0], toks[1][0]
        for (tok, li, c, _), what in zip(toks[:2], ("layer type", "layer name")):
            if len(tok.encode("utf-8", "surrogateescape")) > 255:
                raise self.err(f"{what} longer than 255 bytes (ncnn: 'parse {what.replace(' ', '_')} "
                               f"failed')", li, c + 1)
        counts = []
        for tok, li, c, _ in toks[2:4]:
            if not _is_int(tok) or int(tok) < 0:
                where = ("" if li == start else
                         f" (layer {typ!r} {name!r} starts on line {self.lineno(start)})")
                raise self.err(f"expected a blob count, found {tok[:40]!r}{where} (ncnn: 'parse "
                               f"bottom_count failed')", li, c + 1)
            counts.append(int(tok))
        nin, nout = counts
        take(4 + nin + nout, "the blob names")
        for tok, li, c, _ in toks[4:]:
            if len(tok.encode("utf-8", "surrogateescape")) > 255:
                raise self.err("blob name longer than 255 bytes (ncnn: 'parse blob_name "
                               "failed')", li, c + 1)
        last_line, last_end = toks[-1][1], toks[-1][3]
        if len(toks) == 4:
            last_line, last_end = toks[3][1], toks[3][3]
        ptext = lines[last_line][last_end:]
        if ptext.strip():
            if not PARAMS_RE.fullmatch(ptext):
                self.bad_params(last_line, lines[last_line], None, last_end)
        else:
            ptext = ""
        names = [t[0] for t in toks]
        if len(ptext) > 4096:
            # without the leading space a one-token param list is that token, so the
            # parsed entry shares this string instead of copying it
            ptext = ptext.strip(_C_WS)
        layer = Layer(names[0], names[1], names[4:4 + nin], names[4 + nin:], Params(ptext))
        layer.origin = TextOrigin("".join(lines[k] + self.eols[k] for k in range(start, last_line))
                                  + lines[last_line], self.eols[last_line])
        layer.source_line = self.lineno(start)
        layer.source_file = self.path
        if ptext:
            layer.params.check()
        return layer, last_line + 1

    def bad_params(self, i: int, line: str, need: int | None, start: int | None = None) -> None:
        """Locate the first malformed param token and raise."""
        if start is None:
            ms = list(_NONWS.finditer(line))
            start = ms[need - 1].end() if need else 0
        pos = start
        while pos < len(line):
            m = re.compile(r"[ \t\v\f]+").match(line, pos)
            if m is None:
                break
            pos = m.end()
            if pos >= len(line):
                return
            t = _TOKEN_RE.match(line, pos)
            if t is None:
                bad = _NONWS.match(line, pos)
                token = bad.group(0) if bad else line[pos:]
                raise self.err(_explain_bad_token(token), i, pos + 1)
            pos = t.end()
        raise self.err("malformed param list", i, pos + 1)


def _explain_bad_token(token: str) -> str:
    if len(token) > 80:
        token = token[:60] + "..."
    if "=" not in token:
        return f"invalid parameter {token!r}: expected id=value"
    key, _, val = token.partition("=")
    if not re.fullmatch(r"[+-]?[0-9]+", key):
        return f"invalid parameter id {key!r}"
    k = int(key)
    if not (0 <= k <= 31 or -23331 <= k <= -23300):
        return f"parameter id {k} out of range (0..31; arrays -23300..-23331)"
    if not val:
        return f"missing value after '{key}='"
    if val.startswith('"'):
        return f"unterminated or malformed quoted string {token!r}"
    if '"' in val:
        return f"stray quote in {token!r} (a quoted value must start with '\"')"
    if k <= -23300:
        return f"malformed array {token!r}: expected count,elem,..."
    if "," in val:
        return f"invalid array element in {token!r} (ints and floats cannot mix; spaces end a value)"
    return f"invalid numeric value {val!r} in {token!r}"


def _is_int(s: str) -> bool:
    """An integer token as ncnn's `%d` reads it (at most MAX_COUNT_CHARS characters, so
    `int()` never meets Python's 4,300-digit limit)."""
    return len(s) <= MAX_COUNT_CHARS and _INT_TOKEN.fullmatch(s) is not None


_INT_TOKEN = re.compile(r"[+-]?[0-9]+")


def _c_split(line: str) -> list[str]:
    return [t for t in _C_SPLIT.split(line) if t]


# =========================================================================== writer

def dump_bytes(g: Graph) -> bytes:
    """The graph as `.param` text bytes (see `write_param`)."""
    return write_param(g)


def dumps(g: Graph) -> str:
    """The graph as `.param` text."""
    return write_param(g).decode("utf-8", "surrogateescape")


def write_param(g: Graph) -> bytes:
    """Serialise a graph. Unedited layers are written exactly as read; edited and new layers
    in pnnx's layout. The header keeps its original text unless the counts changed."""
    layers = g.layers
    src = g.source
    nl, nb = len(layers), g.blob_count()
    if src.declared_layers is not None and src.extra.get("layers_read") == nl:
        # the file had layers past its header's count, which ncnn never reads; with the
        # same number of layers they are still those: keep them out of ncnn's reach
        nl = src.declared_layers
        nb = count_ncnn_blobs(layers[:nl])
    parts: list[str] = []
    header = src.header.decode("utf-8", "surrogateescape") if src.header else ""
    # The header as written stays while nothing changed; an edited graph gets the counts
    # ncnn will allocate. An empty graph keeps it too: `0 0` is no more loadable than
    # whatever the file said.
    if header and (not g.modified or not layers):
        parts.append(header)
    elif not layers and src.declared_layers:
        parts.append(f"{MAGIC}\n{src.declared_layers} {src.declared_blobs or 0}\n")
    else:  # ncnn refuses blob_count 0 even when no layer has a blob
        parts.append(f"{MAGIC}\n{nl} {max(nb, 1)}\n")
    last = len(layers) - 1
    trailer = src.trailer.decode("utf-8", "surrogateescape")
    for idx, layer in enumerate(layers):
        origin = layer.origin
        if isinstance(origin, TextOrigin):
            lead, eol = origin.lead, origin.eol
            body = layer.render() if layer.edited else origin.body
        else:  # made in memory or read from another format
            lead, eol, body = "", "\n", layer.render()
        if not eol and (idx != last or trailer):
            eol = "\n"  # a record that ended the file is no longer last
        parts.append(lead)
        parts.append(body)
        parts.append(eol)
    parts.append(trailer)
    return "".join(parts).encode("utf-8", "surrogateescape")
