"""Differential fuzzing against ncnn's own loader (used by test_fuzz.py).

Each mutant of a real `.param` goes through ncnn's `Net::load_param` (in child processes,
many per child: `paramsurgery.runtime.loader`) and through our command line in this process
(`lint --no-run`, `fmt`), and the outcomes are compared. Categories (all should be zero):

- `exit3`: an internal error; `hang`: a command that did not finish in time;
- `unlocated`: an exit-2 message that does not start with `path:line`;
- `rejects_loadable`: our reader refused (exit 2) a file ncnn loads (NUL bytes excepted:
  ncnn stops reading at a NUL, we refuse the file cleanly);
- `silent`: ncnn rejects and full lint (with PS112) reports no error. Lint is run with
  PS112 only on the mutants where `lint --no-run` had no error (`static_silent`, counted
  for information: those are the files only ncnn's own loader catches);
- `roundtrip`: a file we accept does not re-serialise byte for byte;
- `<cmd>_unloadable`: a graph-writing command (`fmt`, `fix`, `remove-passthrough`, and in
  turn the other passes that need only the graph) wrote an output from a file ncnn loads
  and ncnn rejects that output (a pass's refusal of the whole graph, `m.param: the graph
  has no SDPA layer`, needs no line; one that names a line must start with it);
- `input_modified`: a command changed its input; `stray_file`: a command left a file other
  than its output (and the side outputs it says it wrote) in the directory. (`fix_refused`, for information: `fix` rolled back a
  repair that could not prove itself, exit 2 with the reason in its summary, as README says.)

`.param.bin` mutants (`mutate_bin`, `check_mutants(..., binary=True)`) go through ncnn's
`load_param_bin` and the same checks; their exit-2 messages start with the path and name
a byte offset (a binary file has no lines), and commands write `.param.bin` outputs.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import os
import signal
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import paramsurgery
from paramsurgery import cli
from paramsurgery.core.errors import ParamSurgeryError
from paramsurgery.formats.param_bin import write_param_bin
from paramsurgery.formats.param_text import BINARY_MAGIC
from paramsurgery.runtime.loader import load_verdicts
from paramsurgery.formats.param_text import dump_bytes

# tokens ncnn's grammar treats specially (found by probing the wheel)
TOKENS = [b"-0=1", b"-00=2", b'0=a"b', b"0=ab\"", b"+0=1", b"031=1", b"-023300=1,5",
          b"-23300=-0", b"-23300=+1,5", b"1=1.0,2", b"1=1,2.0", b"0=1,2,", b"0=,1", b"1=e5",
          b"1=.e5", b"0=" + b"0" * 140 + b"1", b"0=" + b"9" * 5000, b"0000000000000001=1",
          b"-23331=1,1", b"31=1", b"30=1", b"-23330=4,1,1,1,1", b'6="a b"', b'6="ab"c', b"6=",
          b"2=inf", b"2=-inf", b"0=99999999999", b"1=1e39", b"1=1e-50", b"0=0x10", b"+1",
          b"-1", b"2147483648", b"1000001", b"1000000", b"0" * 40 + b"1", b"#", b"\x00",
          b"\xff", b"\xc2\xa0", b"\t", b"\r", b"\x0b"]


def _truncate_or_flip(b: bytearray, op: int, rng: random.Random) -> bytes:
    """op 0: cut the file short; op 1: overwrite 1-4 random bytes."""
    if op == 0:
        return bytes(b[: rng.randrange(len(b) + 1)])
    for _ in range(rng.randint(1, 4)):
        b[rng.randrange(len(b))] = rng.randrange(256)
    return bytes(b)


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random edit: truncation, byte flips, insertions, deletions, whitespace changes,
    line joins/swaps/duplicates, counts and special tokens."""
    b = bytearray(data)
    if not b:
        return bytes(rng.choice(TOKENS))
    op = rng.randrange(11)
    if op < 2:
        return _truncate_or_flip(b, op, rng)
    if op == 2:
        i = rng.randrange(len(b) + 1)
        ins = rng.choice([b" ", b"\n", b"=", b",", b'"', b"-", b"+", b".", b"0", b"e", b"\r",
                          b"\t", b"\x00"])
        return bytes(b[:i] + ins + b[i:])
    if op == 3:
        i, j = sorted(rng.randrange(len(b) + 1) for _ in range(2))
        return bytes(b[:i] + b[i + (j - i) % 64:])
    lines = bytes(b).split(b"\n")
    k = rng.randrange(len(lines))
    if op == 4:  # join a line with the next (header and first layer on one line, ...)
        if k + 1 < len(lines):
            lines[k:k + 2] = [lines[k] + rng.choice([b" ", b"\t", b""]) + lines[k + 1]]
        return b"\n".join(lines)
    if op == 5:  # swap two lines
        j = rng.randrange(len(lines))
        lines[k], lines[j] = lines[j], lines[k]
        return b"\n".join(lines)
    if op == 6:  # duplicate or drop a line
        if rng.random() < 0.5:
            lines.insert(k, lines[k])
        else:
            del lines[k]
        return b"\n".join(lines)
    toks = lines[k].split(b" ")
    t = rng.randrange(len(toks))
    if op == 7:  # a special token replaces or joins one
        tok = rng.choice(TOKENS)
        if rng.random() < 0.5:
            toks[t] = tok
        else:
            toks.insert(t, tok)
    elif op == 8:  # a count: header or blob counts
        m = re.search(rb"[0-9]+", toks[t])
        if m is None:
            return bytes(b)
        val = int(m.group(0)[:9] or b"0")
        new = rng.choice([val + 1, val - 1, 0, val * 2, 1000000, 1000001, 2 ** 31])
        toks[t] = toks[t][:m.start()] + str(new).encode() + toks[t][m.end():]
    elif op == 9:  # split a line at a space (blob list or params continue on the next line)
        toks[t] = b"\n" + toks[t]
    else:  # a digit run grows
        toks[t] = re.sub(rb"[0-9]", lambda m: m.group(0) * rng.randint(1, 40), toks[t], count=1)
    lines[k] = b" ".join(toks)
    return b"\n".join(lines)


@dataclass
class Report:
    mutants: int = 0
    ncnn_loads: int = 0
    ncnn_crashed: int = 0
    counts: Counter = field(default_factory=Counter)
    examples: dict = field(default_factory=dict)

    def add(self, category: str, data: bytes, detail: str = "") -> None:
        self.counts[category] += 1
        self.examples.setdefault(category, (data, detail[:300]))

    @property
    def failures(self) -> dict[str, int]:
        bad = ("exit3", "hang", "unlocated", "rejects_loadable", "silent", "roundtrip",
               "input_modified", "stray_file")
        return {k: v for k, v in self.counts.items()
                if v and (k in bad or k.endswith("_unloadable"))}

    def merge(self, other: "Report") -> None:
        self.mutants += other.mutants
        self.ncnn_loads += other.ncnn_loads
        self.ncnn_crashed += other.ncnn_crashed
        self.counts.update(other.counts)
        for k, v in other.examples.items():
            self.examples.setdefault(k, v)

    def summary(self) -> str:
        cats = ", ".join(f"{k}={v}" for k, v in sorted(self.counts.items())) or "none"
        return (f"{self.mutants} mutants, ncnn loads {self.ncnn_loads}, ncnn crashed "
                f"{self.ncnn_crashed}; categories: {cats}")


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: object) -> None:
    raise _Timeout


_PARSER: list = []


def run_cli(argv: list[str], timeout: int = 20,
            reuse_parser: bool = False) -> tuple[int | str, str, str]:
    """Our command line in this process: (exit code or "hang", stdout, stderr).
    `reuse_parser`: build the argument parser once (the fuzz loops call this 100,000s of
    times; building it is most of the cost of a small file)."""
    out, err = io.StringIO(), io.StringIO()
    if reuse_parser and not _PARSER:
        _PARSER.append(cli.build_parser())
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code: int | str = cli.main(argv, _PARSER[0] if reuse_parser else None)
    except _Timeout:
        code = "hang"
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


# text-only graph-writing commands that are cheap enough to run on every mutant
WRITE_COMMANDS: tuple[tuple[str, ...], ...] = (("fix",), ("remove-passthrough",))
# the other passes that need nothing but the graph: one of them per mutant, in turn
ROTATING_COMMANDS: tuple[tuple[str, ...], ...] = (
    ("fix-slice",), ("fix-reduction",), ("lower",), ("fix-batch-reshape",),
    ("fold-explicit-cache",), ("add-kvcache",), ("fold-gqa",), ("fuse-codebooks",))


def check_mutants(mutants: list[bytes], workdir: Path, full_lint: bool = True, *,
                  binary: bool = False, writers_every: int = 1) -> Report:
    """Compare ncnn and paramsurgery on every mutant (see the module doc). `binary`: the
    mutants are `.param.bin`. `writers_every`: run WRITE_COMMANDS on every n-th mutant we
    accept (`fmt` runs on all of them)."""
    rep = Report(mutants=len(mutants))
    verdicts = load_verdicts(mutants)
    workdir = workdir / ("bin" if binary else "text")
    workdir.mkdir(exist_ok=True)
    suffix = ".param.bin" if binary else ".param"
    path = workdir / f"m{suffix}"
    out_path = workdir / f"out{suffix}"
    expected = {path.name, out_path.name}
    if binary:  # a .param.bin output keeps its names in x.id.h beside it (README, Pictures)
        expected.add("out.id.h")
    located = re.compile(rf"{re.escape(str(path))}:" + ("" if binary else "[0-9]+"))
    outputs: list[tuple[str, bytes, bytes]] = []  # (command, input, output) to load
    static_silent: list[bytes] = []
    accepted = 0
    for data, v in zip(mutants, verdicts):
        rep.ncnn_loads += v.loads
        rep.ncnn_crashed += v.status in ("crashed", "hung")
        path.write_bytes(data)
        code, out, err = run_cli(["lint", "--no-run", str(path)], reuse_parser=True)
        if code in (3, "hang"):
            rep.add("exit3" if code == 3 else "hang", data, f"lint: {err}")
            continue
        if code == 2:
            if not located.match(err):
                rep.add("unlocated", data, err)
            if v.loads and b"\x00" not in data:
                rep.add("rejects_loadable", data, err)
            continue
        # we accept the file: byte-exact round trip
        try:
            again = (write_param_bin(paramsurgery.load(path)) if binary
                     else dump_bytes(paramsurgery.loads(data)))
            if again != data:
                rep.add("roundtrip", data)
        except ParamSurgeryError as exc:
            rep.add("roundtrip", data, f"lint loads it but load() raises {exc}")
        if v.rejects and " error " not in out:
            rep.counts["static_silent"] += 1
            static_silent.append(data)
        commands = [("fmt",)] if v.loads else []
        if accepted % writers_every == 0:
            turn = accepted // writers_every
            commands += [*WRITE_COMMANDS, ROTATING_COMMANDS[turn % len(ROTATING_COMMANDS)]]
        accepted += 1
        for cmd in commands:
            out_path.unlink(missing_ok=True)
            ccode, cout, cerr = run_cli([*cmd, str(path), "-o", str(out_path)],
                                        reuse_parser=True)
            name = cmd[0]
            if ccode in (3, "hang"):
                rep.add("exit3" if ccode == 3 else "hang", data, f"{name}: {cerr}")
            elif ccode == 2 and name == "fix" and not cerr and "refused (rolled back)" in cout:
                rep.counts["fix_refused"] += 1  # a repair that cannot prove itself: README
            elif ccode == 2 and not located.match(cerr) and not (
                    name != "fmt" and _whole_graph_refusal(cerr, path)):
                rep.add("unlocated", data, f"{name}: {cerr}")
            if path.read_bytes() != data:
                rep.add("input_modified", data, name)
                path.write_bytes(data)
            # a command's own side outputs (fuse-codebooks' manifest) are named where it
            # says what it wrote
            wrote = " ".join(re.findall(r"^wrote (.*)$", cout + cerr, re.M))
            stray = {f for f in set(os.listdir(workdir)) - expected
                     if not re.search(rf"(?:^|[\s,/]){re.escape(f)}(?:$|[\s,])", wrote)}
            if stray:
                rep.add("stray_file", data, f"{name}: {sorted(stray)}")
            for f in set(os.listdir(workdir)) - expected:
                (workdir / f).unlink()
            if v.loads and out_path.exists():
                outputs.append((name, data, out_path.read_bytes()))
    if outputs:
        for (name, data, _), ov in zip(outputs, load_verdicts([o for _, _, o in outputs])):
            if not ov.loads:
                rep.add(f"{name}_unloadable", data, ov.message)
    if full_lint:  # PS112 must speak where the static rules are silent
        for data in static_silent:
            path.write_bytes(data)
            code, out, err = run_cli(["lint", str(path)], timeout=60)
            if code != 1 or "PS112 error" not in out:
                rep.add("silent", data, f"lint exit {code}: {out[-300:]} {err[-300:]}")
    return rep


def _whole_graph_refusal(err: str, path: Path) -> bool:
    """A pass's refusal about the graph as a whole (`m.param: the graph has no SDPA
    layer`): the path, then a reason that names no line (one that does must lead with it)."""
    p = re.escape(str(path))
    return re.match(rf"{p}: ", err) is not None and re.search(rf"{p}:[0-9]+", err) is None


def seeds(paths: list[Path], max_bytes: int = 64 << 10) -> list[bytes]:
    out = []
    for p in paths:
        data = p.read_bytes()
        if 0 < len(data) <= max_bytes and data[:4] != b"\xdd\x85\x76\x00":
            out.append(data)
    return out


def mutants_of(seed_files: list[bytes], n: int, rng: random.Random,
               mutator=None) -> list[bytes]:
    mutator = mutator or mutate
    out = []
    for _ in range(n):
        data = rng.choice(seed_files)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            data = mutator(data, rng)
        out.append(data)
    return out


# ---------------------------------------------------------------- .param.bin

def binary_seeds(paths: list[Path], max_bytes: int = 64 << 10) -> list[bytes]:
    """`.param.bin` seeds: every `.param.bin` given, and every text `.param` given that we
    can load, as ncnn2mem would write it."""
    out = []
    for p in paths:
        data = p.read_bytes()
        if not 0 < len(data) <= max_bytes:
            continue
        if data[:4] == BINARY_MAGIC:
            out.append(data)
            continue
        try:
            out.append(write_param_bin(paramsurgery.loads(data)))
        except ParamSurgeryError:
            pass
    return out


def _word(v: int) -> bytes:
    return struct.pack("<i", v)


# int32 values the binary grammar treats specially: the end of a param list, array and
# string param ids, counts at and past ncnn's limits, the magic, custom type indexes
WORDS = [0, 1, 2, -1, -233, -23300, -23301, -23331, -23332, -23400, -23401, -23431, 31, 32,
         65536, 65537, 1000000, 2 ** 31 - 1, -2 ** 31, 7767517, 256, 257, 0x7F800000,
         0x7FC00000]


def mutate_bin(data: bytes, rng: random.Random) -> bytes:
    """One random edit of a `.param.bin`: truncation, byte flips, and int32-word edits
    (special values, +-1, deletions, insertions, duplicated runs) at word boundaries."""
    b = bytearray(data)
    if len(b) < 4:
        return bytes(b + _word(rng.choice(WORDS)))
    words = len(b) // 4
    op = rng.randrange(8)
    w = rng.randrange(words)
    if op < 2:
        return _truncate_or_flip(b, op, rng)
    if op == 2:  # a special value
        b[4 * w:4 * w + 4] = _word(rng.choice(WORDS))
    elif op == 3:  # off by one
        (v,) = struct.unpack_from("<i", b, 4 * w)
        b[4 * w:4 * w + 4] = _word(max(-2 ** 31, min(2 ** 31 - 1, v + rng.choice((-1, 1)))))
    elif op == 4:
        del b[4 * w:4 * w + 4]
    elif op == 5:
        b[4 * w:4 * w] = _word(rng.choice(WORDS))
    elif op == 6:  # a run of words repeated (a layer record twice, a param twice)
        n = rng.randint(1, 12)
        b[4 * w:4 * w] = b[4 * w:4 * w + 4 * n]
    else:  # the header counts
        k = rng.choice((1, 2))
        if words > k:
            (v,) = struct.unpack_from("<i", b, 4 * k)
            new = rng.choice((v + 1, v - 1, 0, 2 * v, 1000000, 1000001, 2 ** 31 - 1))
            b[4 * k:4 * k + 4] = _word((new + 2 ** 31) % 2 ** 32 - 2 ** 31)
    return bytes(b)
