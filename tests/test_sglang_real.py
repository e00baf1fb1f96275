"""Against a real SGLang server (0.5.23 on CPU, TP = 2, the tiny Llama of tests/tiny_llama.py).

SGLang runs from its own environment (./install.sh --sglang-cpu; tests/sglang_cpu) with the
test-only substitutes of tests/sglang_cpu/substitutes on its PYTHONPATH; skipped where that
environment is absent. A launch takes 30-110 s on 2 shared cores, so one server
(NGRAM speculative decoding, its verify through the test-only tree attention) serves the
check, client, output, metrics and logs tests; validate starts its own four (baseline and
profile at steps 0 and 2) and the kill test one more (plain decoding). Every server is
stopped (the whole process group) and each test ends by checking that no server process
is left.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import time

import factories
import pytest

from nccl_tune.cli import cli
from tests import sglang_cpu

pytestmark = [pytest.mark.slow, pytest.mark.skipif(sglang_cpu.missing() is not None, reason=str(sglang_cpu.missing()))]

PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
HEALTH_TIMEOUT = 900.0  # 2 shared cores: a launch has taken 30-60 s, more when others run
PLAIN_SUBSTITUTES = ["sgl_kernel", "torchvision"]
SPEC_SUBSTITUTES = ["sgl_kernel", "torch_native_tree_verify", "torchvision"]
ROLES = {
    "SGLang API server (launcher)",
    "SGLang scheduler, TP worker 0",
    "SGLang scheduler, TP worker 1",
    "SGLang detokenizer",
}


def leftovers(model: str) -> list[str]:
    """Processes of an SGLang server these tests started still running ("pid: command
    [PYTHONPATH]"): started with the model's path, or titled sglang:: with this
    checkout's substitutes on PYTHONPATH (as every server here is; another checkout's test
    server on the shared machine is not ours). One whose PYTHONPATH cannot be read counts."""
    from nccl_tune.live import procenv

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        try:
            text = " ".join(procenv.read_cmdline(pid))
            if procenv.is_zombie(pid) or not (model in text or text.startswith("sglang::")):
                continue
            path = procenv.read_process_env(pid)[0].get("PYTHONPATH")
        except (procenv.ProcessGone, OSError):
            continue  # gone meanwhile
        if model in text or path in (None, str(sglang_cpu.SUBSTITUTES)):
            found.append(f"{pid}: {text[:120]} [PYTHONPATH={path}]")
    return found


# class scope: stopped when TestLiveServer ends (a module-scoped one outlived it, so the
# validate and kill tests ran beside it and found its processes as leftovers)
@pytest.fixture(scope="class")
def live_server(tiny_llama_dir, tmp_path_factory):
    """One server under PROFILE for the tests of TestLiveServer: NGRAM at steps 3 (the
    launcher's arguments for it: 4 draft tokens)."""
    from integration.sglang import SGLangServer

    log = tmp_path_factory.mktemp("sglang-live") / "server.log"
    server = SGLangServer(
        sglang_cpu.server_args(tiny_llama_dir, ngram=True),
        profile_env=PROFILE,
        steps=3,
        log_path=str(log),
        health_timeout=HEALTH_TIMEOUT,
        command=sglang_cpu.command(),
        base_env=sglang_cpu.server_env(),
    )
    server.start()
    try:
        seconds = server.wait_ready(poll=1.0)
        print(f"\nSGLang server healthy after {seconds:.1f} s")
        yield server
    finally:
        server.stop()
        assert not leftovers(tiny_llama_dir)


class TestLiveServer:
    """check --tree, the client's two APIs, NGRAM's output, /metrics and the server's own log
    lines."""

    def test_check_tree_names_scheduler_workers_and_reads_the_profile_as_carried(
        self, live_server, tmp_path, cli_runner
    ):
        profile = tmp_path / "p.env"
        profile.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
        args = ["check", "--profile", str(profile), "--pid", str(live_server.process.pid), "--tree"]
        out = cli_runner.invoke(cli, args + ["--json"])
        procs = json.loads(out.output)
        roles = {p["role"]: p for p in procs if p["role"]}
        assert ROLES <= set(roles), sorted(roles)
        for name in ("SGLang scheduler, TP worker 0", "SGLang scheduler, TP worker 1", "SGLang detokenizer"):
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

    def test_generate_and_completions_count_their_tokens_and_verifies_in_metrics(self, live_server):
        from integration import client, metrics

        before = metrics.scrape(live_server.url)
        runs = client.benchmark(live_server.url, 12, 2, warmup=0, api="generate")
        middle = metrics.scrape(live_server.url)
        done = client.benchmark(live_server.url, 8, 1, warmup=0, api="openai")
        after = metrics.scrape(live_server.url)
        assert [r.tokens for r in runs] == [12, 12] and done[0].tokens == 8
        assert all(r.ttft_s is not None and r.ttft_s < r.seconds for r in runs + done)
        grown = after.total("sglang:generation_tokens_total") - before.total("sglang:generation_tokens_total")
        assert grown == 12 + 12 + 8
        # every token after a request's first (its prefill's) came from a verify, which
        # kept at most 1 + 3 drafts of it: 11 tokens take 3 to 11 verifies
        verifies = [r.spec_verify_ct for r in runs]
        assert all(3 <= v <= 11 for v in verifies), verifies
        # each verify accepted what it kept, and the last may have accepted more
        assert all(r.spec_verify_ct + r.spec_correct_drafts >= r.tokens - 1 for r in runs)
        # /metrics counters of the two /generate requests agree with their meta_info
        spec = metrics.speculative(metrics.delta(before, middle))
        assert (spec["verify_calls"], spec["requests"], spec["generation_tokens"]) == (sum(verifies), 2, 24)
        assert spec["accept_len"] == pytest.approx((24 - 2) / sum(verifies))
        accepted = client.summarize_runs(runs)
        assert accepted["accept_basis"] == "correct drafts"
        assert spec["accept_len"] <= accepted["accept_len"] <= 4.0
        assert accepted["accept_len"] == pytest.approx(1 + sum(r.spec_correct_drafts for r in runs) / sum(verifies))

    def test_ngram_greedy_output_is_transformers_greedy_token_for_token(self, live_server, tiny_llama_dir):
        # Greedy speculative decoding must give greedy decoding's tokens whatever it
        # accepts: a wrong tree mask in the verify attention changes the target's
        # predictions at the drafts. Reference: transformers' own Llama in float32.
        import urllib.request

        import torch
        from transformers import AutoTokenizer, LlamaForCausalLM

        from integration import client

        tokenizer = AutoTokenizer.from_pretrained(tiny_llama_dir)
        model = LlamaForCausalLM.from_pretrained(tiny_llama_dir, dtype=torch.float32).eval()
        correct = 0
        for prompt in client.PROMPTS:
            body = json.dumps(client.request_body(prompt, 24, stream=False)).encode()
            request = urllib.request.Request(live_server.url + "/generate", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(request, timeout=600) as response:
                answer = json.loads(response.read())
            ids = tokenizer(prompt, return_tensors="pt").input_ids
            with torch.no_grad():
                want = model.generate(ids, max_new_tokens=24, do_sample=False)[0, ids.shape[1] :]
            assert answer["output_ids"] == want.tolist(), prompt
            correct += answer["meta_info"]["spec_num_correct_drafts"]
        assert correct > 0  # drafts were accepted: the verify path decided tokens

    def test_logs_summarize_reads_its_decode_lines_server_args_and_metrics(self, live_server, tmp_path, cli_runner):
        from integration import client

        client.benchmark(live_server.url, 24, 1, warmup=0, api="generate")
        out = cli_runner.invoke(cli, ["logs", "summarize", live_server.log_path, "--json"])
        assert out.exit_code == 0, out.output
        (s,) = json.loads(out.output)  # one object per file
        assert s["engine"] == "sglang" and s["ready"] is True
        assert s["decode_lines"] >= 2  # 23 tokens in at least 6 verifies, a line every 4
        assert s["gen_throughput_lines"] >= 1 and s["gen_throughput_mean"] > 0
        assert s["sources"] == ["TP0"] and s["graph_share"] == 0.0  # "cpu graph: False"
        assert s["server_args"]["device"] == "cpu" and s["server_args"]["tp_size"] == 2
        assert s["server_args"]["decode_log_interval"] == 4
        assert s["speculative"]["algorithm"] == "NGRAM" and s["speculative"]["num_draft_tokens"] == 4
        # its `accept len` field: accepted tokens per verify, 1 to 4
        assert s["accept_len_lines"] == s["decode_lines"] and 1.0 <= s["accept_len_mean"] <= 4.0
        assert s["substitutes"] == SPEC_SUBSTITUTES
        text = cli_runner.invoke(cli, ["logs", "summarize", live_server.log_path])
        rows = [" ".join(line.split()) for line in text.output.splitlines()]  # table padding
        assert (
            "TEST-ONLY substitutes loaded sgl_kernel, torch_native_tree_verify, torchvision (not SGLang's own kernels)"
        ) in rows
        scrape = tmp_path / "metrics.txt"
        import urllib.request

        with urllib.request.urlopen(live_server.url + "/metrics", timeout=10) as response:
            scrape.write_bytes(response.read())
        (m,) = json.loads(cli_runner.invoke(cli, ["logs", "summarize", str(scrape), "--json"]).output)
        assert m["engine"] == "sglang" and m["kind"] == "metrics scrape" and m["samples"] > 0
        # the counters since start (SGLang's own warm-up request included)
        assert m["metrics"]["source"] == "sglang /metrics counters: tokens kept per verify"
        assert 1.0 <= m["accept_len_mean"] <= 4.0


def test_validate_end_to_end_baseline_and_profile_at_steps_0_and_2(tiny_llama_dir, tmp_path, cli_runner):
    profile = tmp_path / "ll.env"
    profile.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
    out_file = tmp_path / "validate.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "validate",
            "--engine",
            "sglang",
            "--profile",
            str(profile),
            "--server-command",
            shlex.join(sglang_cpu.command()),
            "--server-args",
            shlex.join(sglang_cpu.server_args(tiny_llama_dir, ngram=True)),
            "--steps",
            "0,2",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--max-tokens",
            "12",
            "--health-timeout",
            str(HEALTH_TIMEOUT),
            "--out",
            str(out_file),
            "--json",
        ],
        env=sglang_cpu.env_vars(),
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(r["steps"], r["config"], r["status"]) for r in data["rows"]] == [
        (0, "baseline", "ok"),
        (0, "profile", "ok"),
        (2, "baseline", "ok"),
        (2, "profile", "ok"),
    ]
    assert data["backend"] == "gloo" and data["world_size"] == 2
    assert (
        "the server loaded TEST-ONLY substitutes (sgl_kernel, torch_native_tree_verify, "
        "torchvision, tests/sglang_cpu): it did not run SGLang's own kernels, so its figures "
        "say nothing about SGLang's speed"
    ) in data["notes"]
    assert any(
        n.startswith("speculative verify at steps 2 ran through a TEST-ONLY tree attention") for n in data["notes"]
    )
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(r["steps"], r["label"]) for r in records] == [
        (0, "baseline"),
        (0, "profile"),
        (2, "baseline"),
        (2, "profile"),
    ]
    for rec in records:
        detail = rec["detail"]
        assert len(rec["runs_tok_s"]) == 2 and rec["env_ok"] is True, detail.get("env_check")
        assert [r["tokens"] for r in detail["runs"]] == [12, 12]
        procs = detail["env_check"]["processes"]
        assert ROLES <= {p["role"] for p in procs}
        if rec["label"] == "baseline":
            assert rec["env"] == {} and all(not p["extra"] for p in procs)
        else:
            assert rec["env"] == PROFILE and all(not p["missing"] for p in procs)
        if rec["steps"] == 0:  # plain decoding: every --speculative-* option removed
            assert rec["accept_len"] == 1.0 and detail["substitutes"] == PLAIN_SUBSTITUTES
            assert detail["spec_metrics"] is None and detail["log_summary"]["speculative"] is None
            assert all(r["spec_verify_ct"] is None for r in detail["runs"])
            continue
        # steps 2: NGRAM with 3 draft tokens; accept length from SGLang's own per-request counts
        assert detail["substitutes"] == SPEC_SUBSTITUTES
        assert detail["log_summary"]["speculative"]["algorithm"] == "NGRAM"
        assert detail["log_summary"]["speculative"]["num_draft_tokens"] == 3
        verifies = [r["spec_verify_ct"] for r in detail["runs"]]
        assert all(4 <= v <= 11 for v in verifies), verifies  # 11 tokens, at most 3 a verify
        assert detail["accept_source"] == "sglang /generate meta_info: 1 + correct drafts / verifies"
        assert rec["accept_len"] == pytest.approx(
            1 + sum(r["spec_correct_drafts"] for r in detail["runs"]) / sum(verifies)
        )
        # its /metrics counters over the timed runs: the same verifies, the tokens they kept
        spec = detail["spec_metrics"]
        assert (spec["verify_calls"], spec["requests"], spec["generation_tokens"]) == (sum(verifies), 2, 24)
        assert 1.0 <= spec["accept_len"] <= rec["accept_len"] <= 3.0
        # and its log's `accept len` lines
        assert 1.0 <= detail["log_summary"]["accept_len_mean"] <= 3.0
        print(
            f"\n{rec['label']} at steps 2: accept length {rec['accept_len']:.3f} (meta_info), "
            f"{spec['accept_len']:.3f} (/metrics counters), "
            f"{detail['log_summary']['accept_len_mean']:.3f} (log lines); "
            f"{rec['tok_s']:.1f} tok/s, launch to end {detail['seconds']:.0f} s"
        )
    # the Welch interval of the best rows, recomputed from their runs (tests/factories.py)
    assert data["verdict"] == factories.validate_verdict(data)[0], data["verdict_detail"]
    assert not leftovers(tiny_llama_dir)


def test_server_killed_mid_run_is_a_clear_error_and_keeps_the_finished_runs(tiny_llama_dir, tmp_path, monkeypatch):
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

    opts = lib.Options(
        profile_env=PROFILE,
        profile_name="ll",
        engine="sglang",
        steps=[0],
        runs=3,
        warmup=0,
        max_tokens=8,
        server_args=sglang_cpu.server_args(tiny_llama_dir),
        server_command=sglang_cpu.command(),
        log_dir=str(tmp_path),
        health_timeout=HEALTH_TIMEOUT,
        out=str(tmp_path / "v.jsonl"),
        on_run=kill_after_first,
    )
    result = lib.measure_server(opts, PROFILE, 0, "profile")
    assert killed and result["status"] == "failed"
    assert "run 2 of 3" in result["error"] and "the server exited" in result["error"]
    assert len(result["runs_tok_s"]) == 1 and result["runs"][0]["tokens"] == 8
    assert os.path.isfile(result["log"])
    assert not leftovers(tiny_llama_dir)
