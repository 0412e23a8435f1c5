"""Differential fuzzing against ncnn's own loader (used by test_fuzz.py).

Each mutant of a real `.param` goes through ncnn's `Net::load_param` (in child processes,
many per child: `paramsurgery.ncnn_loader`) and through our command line in this process
(`lint --no-run`, `fmt`), and the outcomes are compared. Categories (all should be zero):

- `exit3`: an internal error; `hang`: a command that did not finish in time;
- `unlocated`: an exit-2 message that does not start with `path:line`;
- `rejects_loadable`: our reader refused (exit 2) a file ncnn loads (NUL bytes excepted:
  ncnn stops reading at a NUL, we refuse the file cleanly);
- `silent`: ncnn rejects and full lint (with PS112) reports no error. Lint is run with
  PS112 only on the mutants where `lint --no-run` had no error (`static_silent`, counted
  for information: those are the files only ncnn's own loader catches);
- `roundtrip`: a file we accept does not re-serialise byte for byte;
- `fmt_unloadable`: `fmt` succeeded on a file ncnn loads and ncnn rejects its output.
"""

from __future__ import annotations

import contextlib
import io
import random
import re
import signal
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import paramsurgery
from paramsurgery import cli
from paramsurgery.errors import ParamSurgeryError
from paramsurgery.ncnn_loader import load_verdicts

# tokens ncnn's grammar treats specially (found by probing the wheel)
TOKENS = [b"-0=1", b"-00=2", b'0=a"b', b"0=ab\"", b"+0=1", b"031=1", b"-023300=1,5",
          b"-23300=-0", b"-23300=+1,5", b"1=1.0,2", b"1=1,2.0", b"0=1,2,", b"0=,1", b"1=e5",
          b"1=.e5", b"0=" + b"0" * 140 + b"1", b"0=" + b"9" * 5000, b"0000000000000001=1",
          b"-23331=1,1", b"31=1", b"30=1", b"-23330=4,1,1,1,1", b'6="a b"', b'6="ab"c', b"6=",
          b"2=inf", b"2=-inf", b"0=99999999999", b"1=1e39", b"1=1e-50", b"0=0x10", b"+1",
          b"-1", b"2147483648", b"1000001", b"1000000", b"0" * 40 + b"1", b"#", b"\x00",
          b"\xff", b"\xc2\xa0", b"\t", b"\r", b"\x0b"]


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One random edit: truncation, byte flips, insertions, deletions, whitespace changes,
    line joins/swaps/duplicates, counts and special tokens."""
    b = bytearray(data)
    if not b:
        return bytes(rng.choice(TOKENS))
    op = rng.randrange(11)
    if op == 0:
        return bytes(b[: rng.randrange(len(b) + 1)])
    if op == 1:
        for _ in range(rng.randint(1, 4)):
            b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b)
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
        self.examples.setdefault(category, (data[:400], detail[:300]))

    @property
    def failures(self) -> dict[str, int]:
        bad = ("exit3", "hang", "unlocated", "rejects_loadable", "silent", "roundtrip",
               "fmt_unloadable")
        return {k: self.counts[k] for k in bad if self.counts[k]}

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


def check_mutants(mutants: list[bytes], workdir: Path, full_lint: bool = True) -> Report:
    """Compare ncnn and paramsurgery on every mutant (see the module doc)."""
    rep = Report(mutants=len(mutants))
    verdicts = load_verdicts(mutants)
    path = workdir / "m.param"
    out_path = workdir / "out.param"
    fmt_outputs: list[tuple[bytes, bytes]] = []
    static_silent: list[bytes] = []
    for data, v in zip(mutants, verdicts):
        rep.ncnn_loads += v.loads
        rep.ncnn_crashed += v.status in ("crashed", "hung")
        path.write_bytes(data)
        code, out, err = run_cli(["lint", "--no-run", str(path)], reuse_parser=True)
        if code in (3, "hang"):
            rep.add("exit3" if code == 3 else "hang", data, f"lint: {err}")
            continue
        if code == 2:
            if not re.match(rf"{re.escape(str(path))}:[0-9]+", err):
                rep.add("unlocated", data, err)
            if v.loads and b"\x00" not in data:
                rep.add("rejects_loadable", data, err)
            continue
        # we accept the file: byte-exact round trip
        try:
            if paramsurgery.loads(data).dump_bytes() != data:
                rep.add("roundtrip", data)
        except ParamSurgeryError as exc:
            rep.add("roundtrip", data, f"lint loads it but loads() raises {exc}")
        if v.rejects and " error " not in out:
            rep.counts["static_silent"] += 1
            static_silent.append(data)
        if v.loads:
            fcode, _, ferr = run_cli(["fmt", str(path), "-o", str(out_path)], reuse_parser=True)
            if fcode in (3, "hang"):
                rep.add("exit3" if fcode == 3 else "hang", data, f"fmt: {ferr}")
            elif fcode == 0:
                fmt_outputs.append((data, out_path.read_bytes()))
            elif fcode == 2 and not re.match(rf"{re.escape(str(path))}:[0-9]+", ferr):
                rep.add("unlocated", data, ferr)
    if fmt_outputs:
        for (data, _), fv in zip(fmt_outputs, load_verdicts([f for _, f in fmt_outputs])):
            if not fv.loads:
                rep.add("fmt_unloadable", data, fv.message)
    if full_lint:  # PS112 must speak where the static rules are silent
        for data in static_silent:
            path.write_bytes(data)
            code, out, err = run_cli(["lint", str(path)], timeout=60)
            if code != 1 or "PS112 error" not in out:
                rep.add("silent", data, f"lint exit {code}: {out[-300:]} {err[-300:]}")
    return rep


def seeds(paths: list[Path], max_bytes: int = 64 << 10) -> list[bytes]:
    out = []
    for p in paths:
        data = p.read_bytes()
        if 0 < len(data) <= max_bytes and data[:4] != b"\xdd\x85\x76\x00":
            out.append(data)
    return out


def mutants_of(seed_files: list[bytes], n: int, rng: random.Random) -> list[bytes]:
    out = []
    for _ in range(n):
        data = rng.choice(seed_files)
        for _ in range(rng.choice((1, 1, 1, 2, 3))):
            data = mutate(data, rng)
        out.append(data)
    return out
