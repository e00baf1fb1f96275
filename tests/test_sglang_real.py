"""Against a real SGLang server (0.5.23 on CPU, TP = 2, the tiny Llama of tests/tiny_llama.py).

SGLang runs from its own environment (./install.sh --sglang-cpu; tests/sglang_cpu) with the
test-only substitutes of tests/sglang_cpu/substitutes on its PYTHONPATH; skipped where that
environment is absent. A launch takes 30-60 s on 2 shared cores, so one module-wide server
serves the check, client, metrics and logs tests; validate starts its own two (baseline
and profile) and the kill test one more. Every server is stopped (the whole process
group) and each test ends by checking that no server process is left.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time

import pytest

import factories
from nccl_tune.cli import cli
from tests import sglang_cpu

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(sglang_cpu.missing() is not None, reason=str(sglang_cpu.missing()))]

PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
HEALTH_TIMEOUT = 900.0  # 2 shared cores: a launch has taken 30-60 s, more when others run
ROLES = {"SGLang API server (launcher)", "SGLang scheduler, TP worker 0",
         "SGLang scheduler, TP worker 1", "SGLang detokenizer"}


def leftovers(model: str) -> list[int]:
    """Processes of an SGLang server of this model still running (titled sglang:: or
    started with the model's path)."""
    from nccl_tune.live import procenv

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        text = " ".join(procenv.read_cmdline(pid))
        if (model in text or text.startswith("sglang::")) and not procenv.is_zombie(pid):
            found.append(pid)
    return found


@pytest.fixture(scope="module")
def live_server(tiny_llama_dir, tmp_path_factory):
    """One server under PROFILE (plain decoding) for the tests of TestLiveServer."""
    from integration.sglang import SGLangServer

    log = tmp_path_factory.mktemp("sglang-live") / "server.log"
    server = SGLangServer(sglang_cpu.server_args(tiny_llama_dir), profile_env=PROFILE,
                          log_path=str(log), health_timeout=HEALTH_TIMEOUT,
                          command=sglang_cpu.command(), base_env=sglang_cpu.server_env())
    server.start()
    try:
        seconds = server.wait_ready(poll=1.0)
        print(f"\nSGLang server healthy after {seconds:.1f} s")
        yield server
    finally:
        server.stop()
        assert not leftovers(tiny_llama_dir)


class TestLiveServer:
    """check --tree, the client's two APIs, /metrics and the server's own log lines."""

    def test_check_tree_names_scheduler_workers_and_reads_the_profile_as_carried(
            self, live_server, tmp_path, cli_runner):
        profile = tmp_path / "p.env"
        profile.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
        args = ["check", "--profile", str(profile), "--pid", str(live_server.process.pid), "--tree"]
        out = cli_runner.invoke(cli, args + ["--json"])
        procs = json.loads(out.output)
        roles = {p["role"]: p for p in procs if p["role"]}
        assert ROLES <= set(roles), sorted(roles)
        for name in ("SGLang scheduler, TP worker 0", "SGLang scheduler, TP worker 1",
                     "SGLang detokenizer"):
            p = roles[name]
            # setproctitle rewrote the block; the environment was read back from memory
            assert p["rewritten"] and p["env_source"] == "memory" and p["ok"], p
            assert {v["name"]: v["actual"] for v in p["variables"]} == PROFILE
        assert roles["SGLang API server (launcher)"]["env_source"] == "environ"
        text = cli_runner.invoke(cli, args)
        assert "SGLang scheduler, TP worker: 2 of 2 carry the profile" in text.output.splitlines()

    def test_server_env_check_allows_only_what_sglang_sets_itself(self, live_server):
        from integration import sglang

        check = live_server.check_env()
        assert check.ok, check.problems()
        workers = [p for p in check.processes if (p["role"] or "").startswith("SGLang scheduler")]
        assert len(workers) == 2
        for w in workers:  # SGLang 0.5.23 sets these in its children when they are unset
            assert w["server_set"] == {"NCCL_CUMEM_ENABLE": "0", "NCCL_NVLS_ENABLE": "0"}, w
        # a profile it was not launched with is missing in every process
        other = {"NCCL_P2P_LEVEL": "SYS"}
        wrong = sglang.check_processes(live_server.processes(), other)
        assert not wrong.ok and all(p["missing"] == list(other) for p in wrong.processes)

    def test_generate_and_completions_count_exactly_their_tokens_in_metrics(self, live_server):
        from integration import client, metrics

        before = metrics.scrape(live_server.url)
        runs = client.benchmark(live_server.url, 12, 2, warmup=0, api="generate")
        done = client.benchmark(live_server.url, 8, 1, warmup=0, api="openai")
        after = metrics.scrape(live_server.url)
        assert [r.tokens for r in runs] == [12, 12] and done[0].tokens == 8
        assert all(r.ttft_s is not None and r.ttft_s < r.seconds for r in runs + done)
        assert all(r.accept_len is None for r in runs)  # no spec_verify_ct: plain decoding
        grown = (after.total("sglang:generation_tokens_total")
                 - before.total("sglang:generation_tokens_total"))
        assert grown == 12 + 12 + 8
        # its spec gauges stand at 0 without speculative decoding: no accept length
        assert after.total(metrics.SGLANG_ACCEPT_LENGTH) == 0.0
        assert metrics.speculative(metrics.delta(before, after)) is None

    def test_logs_summarize_reads_its_decode_lines_server_args_and_metrics(
            self, live_server, tmp_path, cli_runner):
        from integration import client, metrics  # noqa: F401

        client.benchmark(live_server.url, 24, 1, warmup=0, api="generate")
        out = cli_runner.invoke(cli, ["logs", "summarize", live_server.log_path, "--json"])
        assert out.exit_code == 0, out.output
        s = json.loads(out.output)
        assert s["engine"] == "sglang" and s["ready"] is True
        assert s["decode_lines"] >= 5  # 24 tokens, a line every 4 decode steps
        assert s["gen_throughput_lines"] >= 1 and s["gen_throughput_mean"] > 0
        assert s["sources"] == ["TP0"] and s["graph_share"] == 0.0  # "cpu graph: False"
        assert s["server_args"]["device"] == "cpu" and s["server_args"]["tp_size"] == 2
        assert s["server_args"]["decode_log_interval"] == 4 and s["speculative"] is None
        assert s["substitutes"] == ["sgl_kernel", "torchvision"]
        text = cli_runner.invoke(cli, ["logs", "summarize", live_server.log_path])
        rows = [" ".join(line.split()) for line in text.output.splitlines()]  # table padding
        assert "TEST-ONLY substitutes loaded sgl_kernel, torchvision (not SGLang's own kernels)" in rows
        scrape = tmp_path / "metrics.txt"
        import urllib.request

        with urllib.request.urlopen(live_server.url + "/metrics", timeout=10) as response:
            scrape.write_bytes(response.read())
        m = json.loads(cli_runner.invoke(cli, ["logs", "summarize", str(scrape), "--json"]).output)
        assert m["engine"] == "sglang" and m["kind"] == "metrics scrape" and m["samples"] > 0
        assert m["accept_len_mean"] is None and m["metrics"] is None


def test_validate_end_to_end_baseline_and_profile_at_steps_0(tiny_llama_dir, tmp_path, cli_runner):
    profile = tmp_path / "ll.env"
    profile.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
    out_file = tmp_path / "validate.jsonl"
    result = cli_runner.invoke(cli, [
        "validate", "--engine", "sglang", "--profile", str(profile),
        "--server-command", shlex.join(sglang_cpu.command()),
        "--server-args", shlex.join(sglang_cpu.server_args(tiny_llama_dir)),
        "--steps", "0", "--runs", "2", "--warmup", "1", "--max-tokens", "12",
        "--health-timeout", str(HEALTH_TIMEOUT), "--out", str(out_file), "--json"],
        env=sglang_cpu.env_vars())
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(r["steps"], r["config"], r["status"]) for r in data["rows"]] == [
        (0, "baseline", "ok"), (0, "profile", "ok")]
    assert data["backend"] == "gloo" and data["world_size"] == 2
    assert any(n.startswith("the server loaded TEST-ONLY substitutes (sgl_kernel, torchvision")
               for n in data["notes"])
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(records) == 2
    for rec in records:
        assert len(rec["runs_tok_s"]) == 2 and rec["env_ok"] is True, rec["detail"].get("env_check")
        assert rec["accept_len"] == 1.0 and rec["detail"]["substitutes"] == ["sgl_kernel", "torchvision"]
        assert [r["tokens"] for r in rec["detail"]["runs"]] == [12, 12]
        procs = rec["detail"]["env_check"]["processes"]
        assert ROLES <= {p["role"] for p in procs}
        if rec["label"] == "baseline":
            assert rec["env"] == {} and all(not p["extra"] for p in procs)
        else:
            assert rec["env"] == PROFILE and all(not p["missing"] for p in procs)
    # the Welch interval of the best rows, recomputed from their runs (tests/factories.py)
    assert data["verdict"] == factories.validate_verdict(data)[0], data["verdict_detail"]
    assert not leftovers(tiny_llama_dir)


def test_server_killed_mid_run_is_a_clear_error_and_keeps_the_finished_runs(
        tiny_llama_dir, tmp_path, monkeypatch):
    from integration import validate as lib

    for key, value in sglang_cpu.env_vars().items():
        monkeypatch.setenv(key, value)
    killed = []

    def kill_after_first(server, run):
        if not killed:
            killed.append(server.process.pid)
            os.killpg(server.process.pid, signal.SIGKILL)
            deadline = time.monotonic() + 30
            while server.running() and time.monotonic() < deadline:
                time.sleep(0.1)

    opts = lib.Options(profile_env=PROFILE, profile_name="ll", engine="sglang", steps=[0], runs=3,
                       warmup=0, max_tokens=8, server_args=sglang_cpu.server_args(tiny_llama_dir),
                       server_command=sglang_cpu.command(), log_dir=str(tmp_path),
                       health_timeout=HEALTH_TIMEOUT, out=str(tmp_path / "v.jsonl"),
                       on_run=kill_after_first)
    result = lib.measure_server(opts, PROFILE, 0, "profile")
    assert killed and result["status"] == "failed"
    assert "run 2 of 3" in result["error"] and "the server exited" in result["error"]
    assert len(result["runs_tok_s"]) == 1 and result["runs"][0]["tokens"] == 8
    assert os.path.isfile(result["log"])
    assert not leftovers(tiny_llama_dir)
