"""SGLang as a serving engine (integration/server.py does the launching).

    with SGLangServer(["--model-path", "m", "--tp", "8"], profile_env={"NCCL_PROTO": "LL"},
                      steps=2, log_path="server.log") as server:
        server.wait_ready()
        report = server.check_env()      # do the TP workers (schedulers) carry the profile?

The server runs as `python -m sglang.launch_server ARGS --host H --port P`; its TP
workers are the schedulers (`sglang::scheduler_TP0`, ...), which rename themselves with
setproctitle (nccl_tune.live.procenv handles the rewritten environment block). Its native API
is `/generate` (integration/client.py speaks it and the OpenAI one); with
`--enable-metrics` it also serves `/metrics` (integration/metrics.py).

Speculative decoding (DESIGN.md section 6): with topk 1 SGLang's draft token count is
steps + 1; both are passed explicitly, with `--speculative-eagle-topk 1`, replacing any
such values in the given arguments. Steps 0 removes every `--speculative-*` option, so
the same argument list serves plain decoding.
"""

from __future__ import annotations

import sys

from integration import server as _server
from integration.server import (  # noqa: F401 - re-exported: the names this module always had
    Engine,
    EnvCheck,
    Server,
    ServerError,
    alive,
    free_port,
    option_value,
    remove_options,
    server_env,
    start_time,
)

# Set by SGLang itself up to 0.5.4 whatever the environment says (DESIGN.md section 5).
SERVER_MANAGED = frozenset({"NCCL_CUMEM_ENABLE", "NCCL_NVLS_ENABLE"})
STEP_OPTIONS = ("--speculative-num-steps", "--speculative-eagle-topk", "--speculative-num-draft-tokens")
DEFAULT_COMMAND = (sys.executable, "-m", "sglang.launch_server")


def server_args_for_steps(args: list[str], steps: int) -> list[str]:
    """The server arguments for `steps` draft steps (0: plain decoding).

    ValueError when steps > 0 and the arguments name no speculative algorithm.
    """
    if steps < 0:
        raise ValueError("steps must not be negative")
    if steps == 0:
        return remove_options(args, ["--speculative-*"])
    if not option_value(args, "--speculative-algorithm"):
        raise ValueError("steps > 0 needs --speculative-algorithm (and its draft model) in the server arguments")
    return remove_options(args, STEP_OPTIONS) + [
        "--speculative-num-steps",
        str(steps),
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        str(steps + 1),
    ]


ENGINE = Engine(
    name="sglang",
    command=DEFAULT_COMMAND,
    args_for_steps=server_args_for_steps,
    api="generate",
    server_managed=SERVER_MANAGED,
)


def check_processes(pids: list[int], expected: dict[str, str]) -> EnvCheck:
    """server.check_processes with SGLang's own variables allowed."""
    return _server.check_processes(pids, expected, SERVER_MANAGED)


def check_tree(root: int, expected: dict[str, str]) -> EnvCheck:
    """server.check_tree with SGLang's own variables allowed."""
    return _server.check_tree(root, expected, SERVER_MANAGED)


class SGLangServer(Server):
    """A Server of engine SGLang (the constructor this module always had)."""

    def __init__(
        self,
        server_args: list[str],
        profile_env: dict[str, str] | None = None,
        steps: int = 0,
        log_path: str = "sglang-server.log",
        **kw,
    ):
        super().__init__(ENGINE, server_args, profile_env, steps, log_path, **kw)
