"""The /generate benchmark client against a small SGLang-speaking server on 127.0.0.1."""

from __future__ import annotations

import json
import threading
from http.server import ThreadingHTTPServer

import pytest

from integration import client
from tests.sglang_standin import Behaviour, make_handler


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address):  # a planned death is not a test error
        pass


@pytest.fixture
def serve():
    servers = []

    def start(**kw) -> tuple[str, Behaviour]:
        holder = {}

        def die():
            # the server stops answering: close the listening socket from another thread
            threading.Thread(target=holder["server"].shutdown, daemon=True).start()
            holder["server"].socket.close()

        behaviour = Behaviour(on_death=die, **kw)
        server = _QuietServer(("127.0.0.1", 0), make_handler(behaviour))
        holder["server"] = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
        return f"http://127.0.0.1:{server.server_address[1]}", behaviour

    yield start
    for server in servers:
        server.shutdown()
        server.server_close()


def test_request_body_is_greedy_with_eos_ignored():
    body = client.request_body("hi", 7, True)
    assert body == {
        "text": "hi",
        "sampling_params": {"max_new_tokens": 7, "temperature": 0, "ignore_eos": True},
        "stream": True,
    }


def test_streaming_runs_figures_ttft_and_accept_length(serve):
    # Cycles accept 1 then 3 drafts (2 and 4 tokens): 20 tokens = 3 x (2 + 4) + 2, so
    # 7 verifies, and the accept length is 20 / 7 (not the 3.0 of a whole number of turns).
    url, behaviour = serve(spec_steps=3, accepted=(1, 3), token_delay=0.002, first_token_delay=0.05)
    seen = []
    runs = client.benchmark(url, max_tokens=20, num_runs=3, warmup=1, stream=True, on_run=seen.append)
    assert behaviour.requests == 4  # one warm-up, three timed
    assert [r.index for r in runs] == [0, 1, 2] and seen == runs
    assert [r.prompt_index for r in runs] == [0, 1, 2]
    for r in runs:
        assert r.tokens == 20 and r.finish_reason == "length"
        assert r.ttft_s >= 0.05 and r.seconds >= 0.05 + 19 * 0.002
        assert r.tok_s == pytest.approx(20 / r.seconds)
        assert r.decode_tok_s == pytest.approx(19 / (r.seconds - r.ttft_s), rel=1e-6)
        assert r.spec_verify_ct == 7 and r.accept_len == pytest.approx(20 / 7)
    s = client.summarize_runs(runs)
    rates = [r.tok_s for r in runs]
    assert s["tok_s_mean"] == pytest.approx(sum(rates) / 3)
    assert s["tok_s_ci"][0] < s["tok_s_mean"] < s["tok_s_ci"][1]
    assert s["overall_tok_s"] == pytest.approx(60 / sum(r.seconds for r in runs))
    assert s["accept_len"] == pytest.approx(60 / 21) and s["ttft_s_mean"] >= 0.05


def test_non_streaming_has_no_ttft_and_no_accept_length_without_speculation(serve):
    url, _ = serve(spec_steps=0)
    runs = client.benchmark(url, max_tokens=9, num_runs=2, warmup=0, stream=False)
    assert [r.tokens for r in runs] == [9, 9]
    assert all(r.ttft_s is None and r.accept_len is None for r in runs)
    s = client.summarize_runs(runs)
    assert s["accept_len"] is None and s["ttft_s_mean"] is None and s["runs"] == 2


@pytest.mark.parametrize("stream", [True, False])
def test_server_dying_mid_run_keeps_finished_runs(serve, stream):
    url, _ = serve(die_after=3)  # warm-up + 2 timed runs answered, the 3rd timed run dies
    with pytest.raises(client.ClientError) as info:
        client.benchmark(url, max_tokens=10, num_runs=5, warmup=1, stream=stream)
    message = str(info.value)
    assert message.startswith("run 3 of 5: ")
    assert ("did the server die?" in message) if stream else ("/generate failed" in message)
    assert [r.index for r in info.value.completed] == [0, 1]
    # and nothing is listening any more: the next request fails cleanly too
    with pytest.raises(client.ClientError, match="/generate failed"):
        client.generate_once(url, "x", 4, stream=True, timeout=5)


def test_http_error_and_bad_url_are_clear(serve):
    url, _ = serve()
    with pytest.raises(client.ClientError, match="bad server URL"):
        client.generate_once("localhost:30000", "x", 4)
    conn_url = url + "/nope"
    with pytest.raises(client.ClientError, match="HTTP 404"):
        client.generate_once(conn_url, "x", 4)


def test_command_line_json(serve, capsys):
    url, _ = serve(spec_steps=3, accepted=(3,))  # every draft accepted: 4 tokens a verify
    assert client.main(["--url", url, "--max-tokens", "8", "--num-runs", "2", "--warmup", "0", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["error"] is None and len(out["runs"]) == 2
    assert out["summary"]["accept_len"] == pytest.approx(8 / 2)


def test_accept_length_counts_accepted_tokens_per_verify_from_sglangs_correct_drafts():
    from integration.client import RunResult, accept_length, summarize_runs

    # a real SGLang 0.5.23 NGRAM answer (4 draft tokens, 32 tokens): spec_verify_ct 13,
    # spec_correct_drafts_histogram [6, 1, 1, 5] -> 0*6 + 1*1 + 2*1 + 3*5 = 18 correct drafts,
    # spec_num_correct_drafts 18, and its own spec_accept_length 32 / 13 = 2.4615...
    assert accept_length(32, 13, 18) == pytest.approx(1 + 18 / 13)
    # 13 verifies made 13 + 18 = 31 tokens; the 32nd came from the prefill
    assert 13 * accept_length(32, 13, 18) == pytest.approx(32 - 1)
    assert accept_length(32, 13, None) == pytest.approx(32 / 13)  # releases without the count
    assert accept_length(32, 0, 0) is None and accept_length(1, None, None) is None
    runs = [
        RunResult(0, 0, 32, 1.0, 32.0, accept_len=None, spec_verify_ct=13, spec_correct_drafts=18),
        RunResult(1, 1, 32, 1.0, 32.0, accept_len=None, spec_verify_ct=17, spec_correct_drafts=14),
    ]
    assert summarize_runs(runs)["accept_len"] == pytest.approx(1 + 32 / 30)
    runs[1].spec_correct_drafts = None  # one run without the count: tokens / verifies for all
    assert summarize_runs(runs)["accept_len"] == pytest.approx(64 / 30)
