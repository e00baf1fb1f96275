"""The tool's own errors, each reported in one line (never a traceback), and their exit codes.

Every exit code a command can end with is decided here, by the kind of error it raises;
the CLI group (nccl_tune.cli) maps each kind to its code and nothing else picks one.
`EXIT_CODES` is the table (README's "Exit codes" section prints it; a test compares them):

- 0: done;
- 1 (EXIT_RUN_FAILED): the run went ahead but its outcome is a failure: every measurement
  failed, or the baseline did, so nothing can be compared (`RunFailed`; the results file
  keeps what was written), or a file that was asked for was not written (`NotWritten`;
  `WriteFailed` when the write itself failed: a full disk, a quota);
- 2 (EXIT_BAD_INPUT): bad input or usage (`NcclTuneError`, click's usage errors), refused
  before anything runs;
- 127 / 126: `exec` could not start its command: not found / not executable
  (`CannotExecute`), as shells and env(1) report them;
- 130 (EXIT_INTERRUPTED): interrupted (Ctrl-C, SIGTERM), in every command
  (`Interrupted`, which names the command that resumes the work where one does).
"""

from __future__ import annotations

EXIT_RUN_FAILED = 1
EXIT_BAD_INPUT = 2
EXIT_NOT_EXECUTABLE = 126
EXIT_NOT_FOUND = 127
EXIT_INTERRUPTED = 130
EXIT_DONE = 0

# code -> when a command ends with it (README's table; tests/test_cli_contract.py checks
# that README says the same).
EXIT_CODES: dict[int, str] = {
    EXIT_DONE: "done",
    EXIT_RUN_FAILED: "ran, but the outcome is a failure: every measurement failed (or the "
    "baseline did), or a file that was asked for was not written",
    EXIT_BAD_INPUT: "bad input or usage, refused before anything runs (one `Error:` line)",
    EXIT_NOT_EXECUTABLE: "`exec`: the command exists but cannot be executed",
    EXIT_NOT_FOUND: "`exec`: no such command",
    EXIT_INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); the message names the command that "
    "resumes, where the work can be resumed",
}


class ToolError(Exception):
    """Base of the errors the CLI prints on one line; `exit_code` is the process's exit code."""

    exit_code = EXIT_RUN_FAILED


class RunFailed(ToolError):
    """A run whose every measurement failed (or whose baseline did): one line, exit 1."""

    exit_code = EXIT_RUN_FAILED


class NotWritten(RunFailed):
    """A file that was asked for (an export, a plot) was not written: exit 1, after the
    command has printed what it found and why it wrote nothing."""


class Interrupted(ToolError):
    """Ctrl-C or SIGTERM: exit 130. `resume` is the command that continues the work, when
    the work can be resumed (a sweep); the message then names it."""

    exit_code = EXIT_INTERRUPTED

    def __init__(self, message: str = "interrupted", *, resume: str | None = None):
        super().__init__(message + (f"; resume with: {resume}" if resume else ""))
        self.resume = resume


class CannotExecute(ToolError):
    """A command `exec` cannot start: exit 127 when it does not exist, 126 when it is not
    executable (a directory, no execute permission, a bad binary)."""

    def __init__(self, message: str, *, found: bool):
        super().__init__(message)
        self.exit_code = EXIT_NOT_EXECUTABLE if found else EXIT_NOT_FOUND


class NcclTuneError(ToolError):
    """Bad input (a file, a line, an option): the CLI prints it on one line and exits 2.

    `path` and `line` locate the problem when it is in a file; str() gives
    ``path:line: message`` so every caller reports it the same way.
    """

    exit_code = EXIT_BAD_INPUT

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


class WriteFailed(NcclTuneError, NotWritten):
    """A file the run was writing could not be written (a full disk, a quota, an I/O
    error): one line naming the file like NcclTuneError, but exit 1, because the command
    ran and the file that was asked for is what failed (fileio leaves the old file as it
    was and no partial one behind)."""

    exit_code = EXIT_RUN_FAILED
