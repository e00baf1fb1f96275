"""A stand-in for an inference server, to try `nccl-tune check` without a GPU.

    python examples/server_with_two_workers.py [--detach] [--pid-file FILE] [SECONDS]

Starts two "workers" (processes that only sleep), as a server spawns its TP workers:
the first inherits this process's environment; the second is started with
NCCL_P2P_LEVEL removed, as a launcher that rewrites its workers' environment would do.
Prints "server PID, workers PID PID", then waits SECONDS (default 30) and stops them;
SIGTERM (`kill PID`) stops them too.

`--detach` runs the server in the background and returns once its workers run (it
prints the same line first), as a server started with `&` that you wait for;
`--pid-file FILE` writes the server's pid there, for the next command:

    nccl-tune exec --clean --profile pcie-8gpu-decode -- \\
        python examples/server_with_two_workers.py --detach --pid-file server.pid 60
    nccl-tune check --profile pcie-8gpu-decode --pid $(cat server.pid) --tree   # the second worker: MISMATCH
    kill $(cat server.pid)
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def parse(argv: list[str]) -> argparse.Namespace:
    """The options above."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    parser.add_argument("seconds", nargs="?", type=float, default=30.0)
    parser.add_argument("--detach", action="store_true", help="run in the background once ready")
    parser.add_argument("--pid-file", help="write the server's pid to this file")
    return parser.parse_args(argv)


def serve(seconds: float, pid_file: str | None, ready_fd: int | None) -> int:
    """Start the two workers, say so (on stdout, or through `ready_fd` when detached),
    wait, stop them."""
    # argv[0] "python3", as a shell would start them, so that their command line reads
    # the same on every machine (the interpreter is still this one)
    sleeper = ["python3", "-c", f"import time; time.sleep({seconds})"]
    first = subprocess.Popen(sleeper, executable=sys.executable)
    dropped = {k: v for k, v in os.environ.items() if k != "NCCL_P2P_LEVEL"}
    second = subprocess.Popen(sleeper, executable=sys.executable, env=dropped)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))  # so that `finally` stops the workers
    try:
        if pid_file:
            with open(pid_file + ".tmp", "w") as f:
                f.write(f"{os.getpid()}\n")
            os.replace(pid_file + ".tmp", pid_file)  # whole, or not there yet
        line = f"server {os.getpid()}, workers {first.pid} {second.pid}\n"
        if ready_fd is None:
            print(line, end="", flush=True)
        else:
            os.write(ready_fd, line.encode())
            os.close(ready_fd)
        time.sleep(seconds)
    finally:
        for worker in (first, second):
            worker.kill()
            worker.wait()
    return 0


def detach(seconds: float, pid_file: str | None) -> int:
    """Fork the server, wait for its ready line, print it and return; the server keeps
    running with its output closed (nothing holds this command's output open)."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the server
        os.close(read_fd)
        devnull = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(devnull, fd)
        try:
            serve(seconds, pid_file, write_fd)
        finally:
            os._exit(0)  # never back into the caller's code
    os.close(write_fd)
    with os.fdopen(read_fd) as ready:
        line = ready.read()
    if not line:
        print("error: the server ended before its workers started", file=sys.stderr)
        return 1
    print(line, end="", flush=True)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Serve in the foreground, or detached."""
    args = parse(sys.argv[1:] if argv is None else argv)
    if args.detach:
        return detach(args.seconds, args.pid_file)
    return serve(args.seconds, args.pid_file, None)


if __name__ == "__main__":
    sys.exit(main())
