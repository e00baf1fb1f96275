"""The SGLang launcher with a STAND-IN server script (tests/sglang_standin.py), for what a real
server (tests/test_sglang_real.py, SGLang 0.5.23 on CPU) cannot show here: EAGLE3 (it needs
a draft model; the real server runs NGRAM, with the test-only verify attention of
tests/sglang_cpu/substitutes/README.md), a server that never becomes healthy or exits
early, and Ctrl-C inside the block. The fast tests need no server at all."""

from __future__ import annotations

import sys

import pytest

from integration import client, logs, sglang
from tests.conftest import REPO_ROOT, subprocess_env

STANDIN = [sys.executable, str(REPO_ROOT / "tests" / "sglang_standin.py")]
PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
SPEC_ARGS = [
    "--model-path",
    "m",
    "--tp",
    "2",
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    "d",
    "--speculative-num-steps",
    "7",
    "--speculative-num-draft-tokens=9",
]


def _base_env():
    # the caller's environment holds a stale NCCL_* that must not reach the server
    return subprocess_env(NCCL_P2P_LEVEL="SYS", NCCL_DEBUG="INFO")


def test_speculative_flags_replace_given_ones_with_topk_1():
    args = sglang.server_args_for_steps(SPEC_ARGS, 2)
    assert args[-6:] == [
        "--speculative-num-steps",
        "2",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "3",
    ]
    assert args.count("--speculative-num-steps") == 1 and "--speculative-num-draft-tokens=9" not in args
    assert sglang.option_value(args, "--speculative-algorithm") == "EAGLE3"


def test_zero_steps_removes_every_speculative_option():
    args = sglang.server_args_for_steps(SPEC_ARGS + ["--disable-cuda-graph"], 0)
    assert args == ["--model-path", "m", "--tp", "2", "--disable-cuda-graph"]


def test_steps_without_an_algorithm_is_refused():
    with pytest.raises(ValueError, match="needs --speculative-algorithm"):
        sglang.server_args_for_steps(["--model-path", "m"], 1)


def test_environment_drops_every_nccl_variable_then_applies_the_profile():
    base = {"PATH": "/bin", "NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "Simple"}
    assert sglang.server_env(base, None) == {"PATH": "/bin"}
    assert sglang.server_env(base, PROFILE) == {"PATH": "/bin", **PROFILE}


def test_env_check_flags_missing_different_and_extra():
    import os

    here = os.getpid()
    own = {k: v for k, v in os.environ.items() if k.startswith("NCCL_")}
    check = sglang.check_processes([here], {**own, "NCCL_NOT_SET_ANYWHERE": "1"})
    assert not check.ok and "missing NCCL_NOT_SET_ANYWHERE" in check.problems()[0]
    gone = sglang.check_processes([2**22 + 12345], {})
    assert not gone.ok and gone.processes[0]["error"] == "the process is gone"
    stale = sglang.check_processes([here], {})
    assert stale.ok == (not own)  # for the baseline any NCCL_* at all is unexpected
    # a real process started with other values: "different" (and "unexpected" for extras)
    import subprocess

    proc = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(60)"],
        env=subprocess_env(NCCL_PROTO="Simple", NCCL_ALGO="Ring", NCCL_P2P_LEVEL="SYS"),
    )
    try:  # Popen returns once the child has exec'd: its environ is the new one
        check = sglang.check_processes([proc.pid], PROFILE)
        (entry,) = check.processes
        assert not check.ok and entry["different"] == {"NCCL_PROTO": "Simple"}
        assert entry["missing"] == [] and entry["extra"] == {"NCCL_P2P_LEVEL": "SYS"}
        assert "different NCCL_PROTO=Simple" in check.problems()[0]
        assert "unexpected NCCL_P2P_LEVEL=SYS" in check.problems()[0]
    finally:
        proc.kill()
        proc.wait()


@pytest.mark.slow
def test_start_ready_profile_carried_by_workers_stop_leaves_nothing(tmp_path):
    log = tmp_path / "server.log"
    server = sglang.SGLangServer(
        SPEC_ARGS,
        profile_env=PROFILE,
        steps=2,
        log_path=str(log),
        health_timeout=30,
        command=STANDIN,
        base_env=_base_env(),
    )
    with server:
        assert server.wait_ready(poll=0.1) < 30
        pids = server.processes()
        assert len(pids) >= 2  # the server and its "TP worker"
        check = server.check_env()
        assert check.ok, check.problems()
        worker = check.processes[-1]
        assert "time.sleep" in worker["cmd"] and not worker["extra"]  # no stale NCCL_P2P_LEVEL
        run = client.generate_once(server.url, "hello", 6, stream=True, timeout=10)
        assert run.tokens == 6 and run.spec_verify_ct is not None
    assert not any(sglang.alive(pid) for pid in pids)
    summary = logs.summarize_file(str(log))
    assert summary["ready"] is True
    assert summary["speculative"]["num_steps"] == 2 and summary["speculative"]["num_draft_tokens"] == 3
    assert summary["speculative"]["eagle_topk"] == 1


@pytest.mark.slow
def test_never_healthy_times_out_with_log_tail_and_no_process_left(tmp_path):
    server = sglang.SGLangServer(
        ["--model-path", "m", "--standin-never-healthy"],
        log_path=str(tmp_path / "stuck.log"),
        health_timeout=2.0,
        command=STANDIN,
        base_env=_base_env(),
    )
    server.start()
    with pytest.raises(sglang.ServerError) as info:
        server.wait_ready(poll=0.1)
    assert "not healthy after 2 s" in info.value.short
    assert "this stand-in never gets ready" in info.value.log_tail
    assert server._seen and not any(server._ours(p) for p in server._seen)
    assert server.process.returncode is not None


@pytest.mark.slow
def test_server_that_exits_early_is_reported(tmp_path):
    server = sglang.SGLangServer(
        ["--model-path", "m"],
        log_path=str(tmp_path / "gone.log"),
        health_timeout=30,
        command=[sys.executable, "-c", "print('boom'); raise SystemExit(4)"],
        base_env=_base_env(),
    )
    server.start()
    with pytest.raises(sglang.ServerError, match="exited with code 4") as info:
        server.wait_ready(poll=0.1)
    assert "boom" in info.value.log_tail


@pytest.mark.slow
def test_ctrl_c_inside_the_block_still_stops_everything(tmp_path):
    server = sglang.SGLangServer(
        ["--model-path", "m"],
        log_path=str(tmp_path / "int.log"),
        health_timeout=30,
        command=STANDIN,
        base_env=_base_env(),
    )
    with pytest.raises(KeyboardInterrupt):
        with server:
            server.wait_ready(poll=0.1)
            pids = server.processes()
            raise KeyboardInterrupt
    assert pids and not any(sglang.alive(pid) for pid in pids)
