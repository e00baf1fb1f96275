"""What a failed smoke step says about itself, out of everything it printed.

After a worker fails, the last lines of a torchrun launch's stderr are torchrun's own
ChildFailedError block, which names the exit code and nothing else. The worker's reason
is higher up: its own one-line error (`microbench.allreduce: rank 0: error: ...`), the
last line of a Python traceback (`RuntimeError: CUDA error: ...`), a C++ `what():` line,
NCCL's `Last error:` detail, and NCCL's WARN lines (on stderr with NCCL_DEBUG=WARN, or
in the microbench's captured NCCL log, kept with --keep-nccl-log). `digest` keeps those
lines, in order, without repeats, and the exit code torchrun reports.

    python -m bench.smoke.digest FILE_OR_FOLDER...   prints the digest of those files
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Iterable

# Programs of this project that name themselves at the start of their error lines.
OWN_PREFIXES = ("microbench.allreduce:", "spec_loop:", "preflight:", "nocache check:", "nocache gate:")
_EXCEPTION = re.compile(r"^(?:[A-Za-z_][\w]*\.)*[A-Z]\w*(?:Error|Exception|Exit|Interrupt)\b:?")
_TORCHRUN_OWN = ("ChildFailedError",)
_TORCHRUN_FAILED = re.compile(r"failed \(exitcode: -?\d+\) local_rank: \d+")
_SIGNAL = re.compile(r"Signal \d+ \(SIG\w+\) received")
_NCCL_LOG_PREFIX = re.compile(r"^# nccl-log \S+ \S+: ")
MAX_LINES = 30
MAX_CHARS = 300


def _clip(line: str) -> str:
    line = line.rstrip()
    return line if len(line) <= MAX_CHARS else line[: MAX_CHARS - 3] + "..."


def digest(lines: Iterable[str]) -> list[str]:
    """The lines of a failed step's output that say why it failed (see the module
    docstring), in order, each once, at most MAX_LINES of them."""
    out: list[str] = []
    after_last_error = False
    for raw in lines:
        line = _NCCL_LOG_PREFIX.sub("", raw.rstrip("\n"))
        text = line.strip()
        keep = (
            after_last_error
            and text
            or text.startswith(OWN_PREFIXES)
            or "NCCL WARN" in text
            or text.startswith(("what():", "terminate called", "Last error:"))
            or bool(_TORCHRUN_FAILED.search(text))
            or bool(_SIGNAL.search(text))
            or (bool(_EXCEPTION.match(text)) and not any(t in text for t in _TORCHRUN_OWN))
        )
        after_last_error = text.startswith("Last error:")
        failed = _TORCHRUN_FAILED.search(text)
        if failed and not text.startswith(OWN_PREFIXES):  # torchrun's log line: its gist
            text = f"torchrun: {failed.group(0)}"
        if keep and _clip(text) not in out:
            out.append(_clip(text))
    if len(out) > MAX_LINES:  # the first causes and the last words
        out = out[: MAX_LINES // 2] + [f"... {len(out) - MAX_LINES} more ..."] + out[-MAX_LINES // 2 :]
    return out


def read_lines(paths: Iterable[str]) -> list[str]:
    """Every line of the files `paths`; a folder contributes its *.log files (NCCL's log
    files), sorted; unreadable paths are skipped."""
    lines: list[str] = []
    for path in paths:
        files = (
            [os.path.join(d, f) for d, _, names in sorted(os.walk(path)) for f in sorted(names) if f.endswith(".log")]
            if os.path.isdir(path)
            else [path]
        )
        for name in files:
            try:
                with open(name, encoding="utf-8", errors="replace") as handle:
                    lines.extend(handle)
            except OSError:
                continue
    return lines


def main(argv: list[str]) -> int:
    """Print the digest of the files and folders named in `argv`."""
    for line in digest(read_lines(argv)) or ["(nothing in the output says why)"]:
        print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
