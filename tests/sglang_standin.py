"""A STAND-IN for `python -m sglang.launch_server`, for the cases a real SGLang server
cannot show in the tests (tests/test_sglang_real.py runs the real one): speculative
decoding, a scripted crash at request N, a server that never becomes healthy, NCCL's
debug log. No GPU, no model.

It accepts SGLang's server arguments (reading the few it needs), prints SGLang-like log
lines (server_args, ready, prefill and decode lines), starts one child process as a "TP
worker" (so environment checks and process-group stops have a descendant to find),
serves /health and /generate (streaming SSE and plain JSON, with meta_info), and can
misbehave on request: never become healthy, or die in the middle of a request.

Also importable: `make_handler` gives the HTTP handler for an in-process test server.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class Behaviour:
    """What the stand-in does (shared by the handler threads)."""

    def __init__(
        self,
        spec_steps: int = 0,
        accepted: tuple[int, ...] = (1, 2),
        token_delay: float = 0.0,
        first_token_delay: float = 0.0,
        die_after: int | None = None,
        log=None,
        on_death=None,
    ):
        self.spec_steps = spec_steps
        # Draft tokens accepted in each verify cycle, in turn (capped at the step count):
        # the stand-in plays speculative decoding cycle by cycle, and counts its verifies
        # as SGLang does; nothing here is derived from an accept length.
        self.accepted = tuple(min(a, spec_steps) for a in accepted) or (0,)
        self.token_delay = token_delay
        self.first_token_delay = first_token_delay
        self.die_after = die_after  # requests answered in full before dying mid-request
        self.requests = 0
        self.lock = threading.Lock()
        self.log = log or (lambda line: None)
        self.on_death = on_death or (lambda: None)

    def meta(self, tokens: int, finished: bool) -> dict:
        """meta_info as SGLang returns it (spec_verify_ct only on a finished request)."""
        meta = {
            "id": "standin",
            "prompt_tokens": 12,
            "completion_tokens": tokens,
            "cached_tokens": 0,
            "finish_reason": {"type": "length", "length": tokens} if finished else None,
        }
        if finished:
            meta["e2e_latency"] = 0.0
            if self.spec_steps:
                meta["spec_verify_ct"] = self.verify_cycles(tokens)
        return meta

    def verify_cycles(self, tokens: int) -> int:
        """Verify passes to emit `tokens`: each emits its accepted drafts plus the bonus
        token (the last one's surplus is cut, as max_new_tokens cuts it)."""
        emitted = cycles = 0
        while emitted < tokens:
            emitted += self.accepted[cycles % len(self.accepted)] + 1
            cycles += 1
        return cycles

    def accept_len_logged(self) -> float:
        """What the decode line prints as `accept len`: tokens per verify over one turn."""
        return sum(a + 1 for a in self.accepted) / len(self.accepted)


def make_handler(behaviour: Behaviour):
    """An HTTP handler class speaking SGLang's /health and /generate."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, fmt, *args):  # keep test output quiet
            pass

        def _json(self, status: int, obj) -> None:
            data = json.dumps(obj).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            if self.path in ("/health", "/health_generate"):
                self._json(200, {})
            else:
                self._json(404, {"detail": "Not Found"})

        def do_POST(self):
            if self.path != "/generate":
                self._json(404, {"detail": "Not Found"})
                return
            length = int(self.headers.get("Content-Length") or 0)
            body = json.loads(self.rfile.read(length) or b"{}")
            params = body.get("sampling_params") or {}
            if params.get("temperature") != 0 or params.get("ignore_eos") is not True:
                self._json(400, {"error": {"message": "the stand-in wants temperature 0 and ignore_eos"}})
                return
            tokens = int(params.get("max_new_tokens", 16))
            with behaviour.lock:
                behaviour.requests += 1
                dying = behaviour.die_after is not None and behaviour.requests > behaviour.die_after
            behaviour.log(
                "Prefill batch. #new-seq: 1, #new-token: 12, #cached-token: 0, "
                "token usage: 0.00, #running-req: 0, #queue-req: 0"
            )
            time.sleep(behaviour.first_token_delay)
            if body.get("stream"):
                self._stream(tokens, dying)
            else:
                if dying:
                    self._die()
                time.sleep(behaviour.token_delay * tokens)
                self._json(200, {"text": "x" * tokens, "meta_info": behaviour.meta(tokens, True)})
            rate = 1.0 / behaviour.token_delay if behaviour.token_delay else 1000.0
            accept = f"accept len: {behaviour.accept_len_logged():.2f}, " if behaviour.spec_steps else ""
            behaviour.log(
                f"Decode batch, #running-req: 1, #token: {tokens}, token usage: 0.00, "
                f"{accept}cuda graph: True, gen throughput (token/s): {rate:.2f}, #queue-req: 0"
            )

        def _stream(self, tokens: int, dying: bool) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for n in range(1, tokens + 1):
                chunk = {"text": "x" * n, "meta_info": behaviour.meta(n, n == tokens)}
                self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                self.wfile.flush()
                if dying and n == max(1, tokens // 2):
                    self._die()
                time.sleep(behaviour.token_delay)
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

        def _die(self):
            behaviour.on_death()
            self.wfile.flush()
            self.connection.close()
            raise ConnectionAbortedError("stand-in server died on purpose")

    return Handler


def main() -> int:
    """Run as a stand-in server process."""
    p = argparse.ArgumentParser()
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=0)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--standin-never-healthy", action="store_true")
    p.add_argument("--standin-ready-delay", type=float, default=0.2)
    p.add_argument("--standin-token-delay", type=float, default=0.0)
    p.add_argument("--standin-die-after", type=int, default=None)
    args, _unknown = p.parse_known_args()

    def log(line: str) -> None:
        print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')} TP0] {line}", flush=True)

    algo = repr(args.speculative_algorithm) if args.speculative_algorithm else "None"
    print(
        f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] server_args=ServerArgs(model_path='standin', "
        f"tp_size={args.tp_size}, speculative_algorithm={algo}, "
        f"speculative_num_steps={args.speculative_num_steps or None}, "
        f"speculative_eagle_topk={args.speculative_eagle_topk}, "
        f"speculative_num_draft_tokens={args.speculative_num_draft_tokens})",
        flush=True,
    )
    # A "TP worker": a child that inherits the environment, as SGLang's spawned workers do.
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
    log(f"Init torch distributed begin. worker pid={worker.pid}")
    if args.standin_never_healthy:
        log("Load weight begin (this stand-in never gets ready)")
        while True:
            time.sleep(1)
    time.sleep(args.standin_ready_delay)

    server: ThreadingHTTPServer | None = None

    def die():
        worker.kill()
        os._exit(3)

    behaviour = Behaviour(
        spec_steps=args.speculative_num_steps,
        token_delay=args.standin_token_delay,
        die_after=args.standin_die_after,
        log=log,
        on_death=die,
    )
    server = ThreadingHTTPServer((args.host, args.port), make_handler(behaviour))
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}] The server is fired up and ready to roll!", flush=True)
    try:
        server.serve_forever()
    finally:
        worker.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
