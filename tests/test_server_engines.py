"""Engine descriptions (integration/sglang.py, integration/vllm.py) on integration/server.py,
the OpenAI completions client, and validate's refusals for engine vllm."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from integration import client, server, sglang, vllm
from integration import validate as lib
from nccl_tune.cli import cli

SPEC = {"method": "eagle3", "model": "draft", "num_speculative_tokens": 5}
ARGS = ["--model", "m", "--tensor-parallel-size", "8", "--speculative-config", json.dumps(SPEC)]


def _spec(args: list[str]) -> dict:
    return json.loads(server.option_value(args, "--speculative-config"))


def test_vllm_steps_set_num_speculative_tokens_and_keep_the_users_method():
    args = vllm.server_args_for_steps(ARGS, 2)
    assert _spec(args) == {**SPEC, "num_speculative_tokens": 2}
    assert args[:4] == ARGS[:4] and args.count("--speculative-config") == 1
    assert vllm.server_args_for_steps(ARGS, 0) == ARGS[:4]  # plain decoding: the option goes


def test_vllm_equals_and_dotted_forms_are_folded_into_one_json():
    args = [
        "--model",
        "m",
        '--speculative-config={"method": "ngram", "prompt_lookup_max": 4}',
        "--speculative-config.prompt_lookup_min",
        "2",
    ]
    out = vllm.server_args_for_steps(args, 3)
    assert _spec(out) == {
        "method": "ngram",
        "prompt_lookup_max": 4,
        "prompt_lookup_min": 2,
        "num_speculative_tokens": 3,
    }
    assert not any(a.startswith("--speculative-config.") for a in out)
    assert vllm.server_args_for_steps(args, 0) == ["--model", "m"]


@pytest.mark.parametrize(
    "args, why",
    [
        (["--model", "m"], "needs --speculative-config"),
        (["--model", "m", "--speculative-config", "{not json"], "not JSON"),
        (["--model", "m", "--speculative-config", "[1, 2]"], "JSON object"),
        (["--model", "m", "--speculative-config", '{"num_speculative_tokens": 3}'], "with a method"),
    ],
)
def test_vllm_refuses_steps_it_cannot_apply(args, why):
    with pytest.raises(ValueError, match=why):
        vllm.server_args_for_steps(args, 1)


def test_sglang_keeps_its_step_options_and_both_engines_share_the_server():
    args = sglang.server_args_for_steps(["--model-path", "m", "--speculative-algorithm", "EAGLE3"], 3)
    assert server.option_value(args, "--speculative-num-draft-tokens") == "4"
    s = server.Server(
        vllm.ENGINE,
        ARGS,
        profile_env={"NCCL_PROTO": "LL"},
        steps=1,
        log_path="/dev/null",
        command=["python", "-m", "x"],
        base_env={"PATH": "/bin", "NCCL_ALGO": "Tree"},
    )
    assert s.argv[:3] == ["python", "-m", "x"] and s.argv[-4] == "--host"
    assert s.env == {"PATH": "/bin", "NCCL_PROTO": "LL"}  # every stray NCCL_* removed
    assert isinstance(sglang.SGLangServer(["--model-path", "m"], log_path="/dev/null"), server.Server)


def test_tp_size_of_each_engine():
    assert server.tp_size(vllm.ENGINE, ["--model", "m", "-tp", "4"]) == 4
    assert server.tp_size(vllm.ENGINE, ARGS) == 8
    assert server.tp_size(sglang.ENGINE, ["--tp", "2"]) == 2
    assert server.tp_size(vllm.ENGINE, ["--model", "m"]) is None


# --- OpenAI completions client against a small server written from the OpenAI API ------


class _Completions(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    seen: list = []
    die_after = None

    def log_message(self, *a):
        pass

    def _send(self, status, obj):
        data = json.dumps(obj).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})
        else:
            self._send(404, {})

    def do_POST(self):
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).seen.append(body)
        if body["model"] != "tiny":
            self._send(404, {"object": "error", "message": f"model {body['model']} does not exist"})
            return
        n = body["max_tokens"]
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        if not body.get("stream"):
            self._send(200, {"choices": [{"text": "a" * n, "finish_reason": "length"}], "usage": usage})
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Connection", "close")
        self.end_headers()
        for i in range(n):
            if type(self).die_after is not None and len(type(self).seen) > type(self).die_after and i == 2:
                self.connection.close()
                return
            chunk = {
                "choices": [{"index": 0, "text": "a", "finish_reason": "length" if i == n - 1 else None}],
                "usage": None,
            }
            self.wfile.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
        if body.get("stream_options", {}).get("include_usage"):
            self.wfile.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")
        self.close_connection = True


@pytest.fixture
def completions():
    _Completions.seen, _Completions.die_after = [], None
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Completions)
    httpd.daemon_threads = True
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


def test_openai_stream_counts_tokens_from_usage_and_times_the_first(completions):
    runs = client.benchmark(completions, 7, 3, warmup=1, api="openai")
    assert [r.tokens for r in runs] == [7, 7, 7] and all(r.finish_reason == "length" for r in runs)
    assert all(r.ttft_s is not None and 0 <= r.ttft_s <= r.seconds for r in runs)
    sent = _Completions.seen
    assert len(sent) == 4 and {b["model"] for b in sent} == {"tiny"}
    assert all(b["temperature"] == 0 and b["ignore_eos"] is True and b["stream"] for b in sent)
    assert all(b["stream_options"] == {"include_usage": True} for b in sent)
    assert [b["prompt"] for b in sent[1:]] == list(client.PROMPTS[:3])  # fixed prompt set
    summary = client.summarize_runs(runs)
    assert summary["tokens"] == 21 and summary["tok_s_ci"] is not None


def test_openai_plain_answer_and_errors(completions):
    run = client.complete_once(completions, "tiny", "hi", 4, stream=False)
    assert run.tokens == 4 and run.ttft_s is None
    with pytest.raises(client.ClientError, match="HTTP 404.*does not exist"):
        client.complete_once(completions, "other", "hi", 4)
    _Completions.seen, _Completions.die_after = [], 1  # answers one request, dies in the 2nd
    with pytest.raises(client.ClientError, match="run 2 of 3.*stream ended") as info:
        client.benchmark(completions, 5, 3, warmup=0, api="openai", model="tiny")
    assert len(info.value.completed) == 1


def test_validate_vllm_refusals_are_one_line_exit_2(cli_runner, tmp_path, monkeypatch):
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\n")
    monkeypatch.setattr("importlib.util.find_spec", lambda name, *a: None if name == "vllm" else object())
    out = cli_runner.invoke(
        cli, ["validate", "--engine", "vllm", "--profile", str(profile), "--server-args", "--model m"]
    )
    assert out.exit_code == 2 and "./install.sh --vllm" in out.output and "Traceback" not in out.output
    out = cli_runner.invoke(
        cli,
        [
            "validate",
            "--engine",
            "vllm",
            "--profile",
            str(profile),
            "--server-args",
            "--model m",
            "--steps",
            "0,2",
            "--server-command",
            "python -m nothing",
            "--out",
            str(tmp_path / "o.jsonl"),
        ],
    )
    assert out.exit_code == 2 and "--server-args: steps > 0 needs --speculative-config" in out.output
    assert "(--steps 2)" in out.output and not (tmp_path / "o.jsonl").exists()
    out = cli_runner.invoke(
        cli, ["validate", "--engine", "vllm", "--profile", str(profile), "--server-command", "python -m nothing"]
    )
    assert out.exit_code == 2 and "needs --server-args" in out.output


def test_accept_length_source_order():
    spec = {"accept_len": 2.5, "source": "vllm /metrics"}
    summary = {"accept_len": 3.0}
    assert lib._spec_figures("vllm", 2, spec, summary, {}) == (2.5, "vllm /metrics")
    assert lib._spec_figures("sglang", 2, None, summary, {})[0] == 3.0
    assert lib._spec_figures("vllm", 2, None, {"accept_len": None}, {"accept_len_mean": 1.8}) == (1.8, "vllm log")
    assert lib._spec_figures("vllm", 0, spec, summary, {}) == (1.0, "plain decoding")
