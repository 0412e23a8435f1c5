"""Typed errors. Every error a user can cause carries a location so the CLI prints
``file:line:col: message`` and exits 2 instead of showing a traceback."""

from __future__ import annotations


class ParamSurgeryError(Exception):
    """Base of every error paramsurgery raises on purpose (bad input, refused rewrite)."""

    exit_code = 2

    def __init__(self, message: str, *, file: str | None = None, line: int | None = None,
                 col: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.file = file
        self.line = line
        self.col = col

    def location(self) -> str:
        parts = [self.file or "<input>"]
        if self.line is not None:
            parts.append(str(self.line))
            if self.col is not None:
                parts.append(str(self.col))
        return ":".join(parts)

    def __str__(self) -> str:
        if self.file is None and self.line is None:  # no file involved: just the message
            return self.message
        return f"{self.location()}: {self.message}"


class ParamSyntaxError(ParamSurgeryError):
    """A `.param` / `.param.bin` file that ncnn's loader would reject or misread."""


class BinLayoutError(ParamSurgeryError):
    """A `.bin` whose bytes do not match what the `.param` makes ncnn read."""


class GraphError(ParamSurgeryError):
    """An IR edit that would break an invariant (unknown layer, blob produced twice, ...)."""


class PassRefused(ParamSurgeryError):
    """A pass whose precondition does not hold, or whose result could not be proven."""


class VerificationError(ParamSurgeryError):
    """A numeric check through ncnn that failed."""


class MissingDependency(ParamSurgeryError):
    """An optional dependency (torch, pnnx, qwen-tts) is needed but not installed."""


def cannot_open(exc: OSError) -> str:
    """What a file that could not be opened or read is, in the words every reader uses."""
    if isinstance(exc, FileNotFoundError):
        return "no such file"
    if isinstance(exc, IsADirectoryError):
        return "is a directory, not a file"
    if isinstance(exc, PermissionError):
        return "permission denied"
    return f"cannot read: {exc.strerror or exc}"
