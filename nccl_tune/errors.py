"""The tool's own error: bad input reported in one line, never as a traceback."""

from __future__ import annotations


class NcclTuneError(Exception):
    """Bad input (a file, a line, an option): the CLI prints it on one line and exits 2.

    `path` and `line` locate the problem when it is in a file; str() gives
    ``path:line: message`` so every caller reports it the same way.
    """

    def __init__(self, message: str, *, path: str | None = None, line: int | None = None):
        super().__init__(message)
        self.message = message
        self.path = path
        self.line = line

    def __str__(self) -> str:
        where = ""
        if self.path is not None:
            where = f"{self.path}:{self.line}: " if self.line is not None else f"{self.path}: "
        return where + self.message
