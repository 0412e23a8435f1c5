"""Case files: one behaviour per file, holding the command, the input graph and the expected
graph or message (filecheck style), collected from tests/cases/**/*.case.

    # RUN: rewrite %s --rule %dir/gelu_tanh.rule --inputshape in0=[T,16] -o %t
    # EXIT: 0                      (optional; default 0)
    --- input
    7767517
    ...
    --- expect                     (the written graph, exactly; or:)
    --- stdout / --- stderr        (every line must appear in that stream, in order)

`%s` is the input section written to a file, `%t` the output path, `%dir` the case file's
directory, `%repo` the repository. The command runs in-process through `paramsurgery.cli.main`.
"""

from __future__ import annotations

import contextlib
import io
import shlex
import tempfile
from pathlib import Path

import pytest

SECTIONS = ("input", "expect", "stdout", "stderr")


def parse_case(text: str) -> tuple[list[str], int, dict[str, str]]:
    run: list[str] = []
    exit_code = 0
    sections: dict[str, list[str]] = {}
    current: str | None = None
    for line in text.splitlines():
        if line.startswith("--- "):
            name = line[4:].strip()
            if name not in SECTIONS:
                raise ValueError(f"unknown section {name!r}")
            current = name
            sections[current] = []
        elif current is not None:
            sections[current].append(line)
        elif line.startswith("# RUN:"):
            run = shlex.split(line[len("# RUN:"):])
        elif line.startswith("# EXIT:"):
            exit_code = int(line[len("# EXIT:"):])
    if not run:
        raise ValueError("no '# RUN:' line")
    return run, exit_code, {k: "\n".join(v).strip("\n") + "\n" for k, v in sections.items()}


def _in_order(expected: str, actual: str) -> str | None:
    pos = 0
    for want in (w.strip() for w in expected.splitlines()):
        if not want:
            continue
        at = actual.find(want, pos)
        if at < 0:
            return want
        pos = at + len(want)
    return None


class CaseItem(pytest.Item):
    def runtest(self) -> None:
        run, want_exit, sections = parse_case(self.path.read_text())
        with tempfile.TemporaryDirectory() as tmp:
            self._run(run, want_exit, sections, Path(tmp))

    def _run(self, run: list[str], want_exit: int, sections: dict[str, str], tmp: Path) -> None:
        from paramsurgery.cli import main

        src, out = tmp / "input.param", tmp / "out.param"
        if "input" in sections:
            src.write_text(sections["input"])
        repo = Path(__file__).resolve().parent.parent
        argv = [a.replace("%s", str(src)).replace("%t", str(out)).replace("%dir", str(self.path.parent))
                .replace("%repo", str(repo)) for a in run]
        stdout, stderr = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            code = main(argv)
        detail = f"\n--- stdout\n{stdout.getvalue()}--- stderr\n{stderr.getvalue()}"
        assert code == want_exit, f"exit {code}, expected {want_exit}{detail}"
        if "expect" in sections:
            assert out.exists(), f"no output written{detail}"
            assert out.read_text() == sections["expect"], f"output differs{detail}\n--- got\n{out.read_text()}"
        elif want_exit != 0:
            assert not out.exists(), f"exit {code} but {out.name} was written"
        for stream, got in (("stdout", stdout.getvalue()), ("stderr", stderr.getvalue())):
            if stream in sections:
                missing = _in_order(sections[stream], got)
                assert missing is None, f"{stream} lacks {missing!r}{detail}"

    def reportinfo(self):
        return self.path, 0, f"case: {self.path.name}"


class CaseFile(pytest.File):
    def collect(self):
        yield CaseItem.from_parent(self, name=self.path.stem)
