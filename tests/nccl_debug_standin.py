"""Wraps tests/sglang_standin.py with what NCCL does under NCCL_DEBUG=INFO: for a test of
`validate --engine sglang`'s NCCL-log check (no GPU, no NCCL).

Like NCCL (src/debug.cc, src/misc/param.cc), it writes to NCCL_DEBUG_FILE with %h and %p
expanded, a version line and one "<NAME> set by environment to <value>" line per NCCL_*
variable of its environment, except NCCL_DEBUG* (never logged) and the names listed in
STANDIN_NCCL_UNREAD (as if NCCL never read them: a variable that did not arrive). Then it
becomes the SGLang stand-in.
"""

from __future__ import annotations

import os
import socket
import sys
from pathlib import Path


def main() -> None:
    target = os.environ.get("NCCL_DEBUG_FILE")
    if target and os.environ.get("NCCL_DEBUG") == "INFO":
        host, pid = socket.gethostname().split(".")[0], os.getpid()
        path = target.replace("%h", host).replace("%p", str(pid))
        unread = set(filter(None, os.environ.get("STANDIN_NCCL_UNREAD", "").split(",")))
        with open(path, "w", encoding="utf-8") as log:
            log.write(f"{host}:{pid}:{pid} [0] NCCL INFO NCCL version 2.27.5+cuda12.9\n")
            for name, value in sorted(os.environ.items()):
                if name.startswith("NCCL_") and not name.startswith("NCCL_DEBUG") and name not in unread:
                    log.write(f"{host}:{pid}:{pid} [0] NCCL INFO {name} set by environment to {value}\n")
    standin = Path(__file__).resolve().parent / "sglang_standin.py"
    os.execv(sys.executable, [sys.executable, str(standin), *sys.argv[1:]])


if __name__ == "__main__":
    main()
