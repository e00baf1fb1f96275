"""Processes that rewrote their environment block (setproctitle), roles, inheritance."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import pytest

from nccl_tune.cli import cli
from nccl_tune.live import procenv, procmem
from tests.conftest import subprocess_env

PROFILE = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}

# What setproctitle does on Linux (its src/spt_status.c, save_ps_display_args and
# set_ps_display), done with ctypes so the test needs no extra package: copy every
# environment string with strdup into a new array, point `environ` at it, then pad the
# whole argument+environment area with NUL and write the title at its start.
CLOBBER = r"""
import ctypes, os, sys, time
libc = ctypes.CDLL(None)
libc.strdup.restype = ctypes.c_void_p
libc.strdup.argtypes = [ctypes.c_void_p]
environ = ctypes.c_void_p.in_dll(libc, "environ")
old = ctypes.cast(environ.value, ctypes.POINTER(ctypes.c_void_p))
n = 0
while old[n]:
    n += 1
new = (ctypes.c_void_p * (n + 1))()
for i in range(n):
    new[i] = libc.strdup(old[i])
environ.value = ctypes.addressof(new)
stat = open("/proc/self/stat").read()
fields = stat[stat.rfind(")") + 2:].split()
arg_start, env_end = int(fields[45]), int(fields[48])
ctypes.memset(arg_start, 0, env_end - arg_start)
title = sys.argv[1].encode()
ctypes.memmove(arg_start, title, len(title))
os.environ["SET_AFTER_START"] = "yes"   # putenv: seen in memory, never in the old block
print("ready", flush=True)
time.sleep(60)
"""


def _start(code: str, *args: str, env=None) -> subprocess.Popen:
    proc = subprocess.Popen(
        [sys.executable, "-c", code, *args], stdout=subprocess.PIPE, text=True, env=env or subprocess_env(**PROFILE)
    )
    assert proc.stdout.readline().strip() == "ready"
    return proc


@pytest.fixture
def clobbered():
    proc = _start(CLOBBER, "VLLM::Worker_TP3")
    yield proc
    proc.kill()
    proc.wait(timeout=10)


def test_rewritten_block_is_recognised():
    assert not procenv.rewritten_block(b"A=1\0B=2\0")
    assert not procenv.rewritten_block(b"")
    assert procenv.rewritten_block(b"\0\0\0\0B=2\0")  # NUL padding
    assert procenv.rewritten_block(b"VLLM::Worker_TP0\0")  # title text, no '='


def test_roles_of_both_engines():
    role = procenv.role_of
    assert role(["VLLM::EngineCore"]) == "vLLM engine core"
    assert role(["VLLM::Worker_TP1"]) == "vLLM TP worker 1"
    assert role(["VLLM::Worker_DP1_PP0_TP5_EP5"]) == "vLLM TP worker 5"
    assert role([], comm="VLLM::Worker_TP") == "vLLM TP worker ?"  # comm is cut at 15 bytes
    assert role(["VLLM::Worker"]) == "vLLM TP worker 0"  # TP size 1
    assert role(["python", "-m", "vllm.entrypoints.openai.api_server", "--model", "m"]) == "vLLM API server"
    assert role(["/usr/bin/vllm", "serve", "m"]) == "vLLM API server"
    assert role(["sglang::scheduler_TP2"]) == "SGLang scheduler, TP worker 2"
    assert role(["sglang::scheduler_DP1_TP0"]) == "SGLang scheduler, TP worker 0"
    assert role(["sglang::detokenizer"]) == "SGLang detokenizer"
    assert role(["python3", "-m", "sglang.launch_server", "--model-path", "m"]).startswith("SGLang API server")
    assert role(["python", "-c", "from multiprocessing.resource_tracker import main;main(9)"]) == "resource tracker"
    assert role(["bash"]) is None


def test_clobbered_environment_is_read_back_from_memory(clobbered):
    raw = open(f"/proc/{clobbered.pid}/environ", "rb").read()
    assert procenv.rewritten_block(raw) and b"NCCL_PROTO" not in raw  # the block lost it
    env = procmem.read_environ_from_memory(clobbered.pid)
    assert env["NCCL_PROTO"] == "LL" and env["SET_AFTER_START"] == "yes"
    result = procenv.check_process(PROFILE, clobbered.pid)
    assert result.ok and result.rewritten and result.env_source == "memory"
    assert result.role == "vLLM TP worker 3" and "setproctitle" in result.note


def test_without_memory_access_the_confirmed_parent_stands_in(clobbered, monkeypatch):
    def refuse(pid):
        raise procmem.MemoryReadError("cannot open its memory: Permission denied")

    monkeypatch.setattr(procmem, "read_environ_from_memory", refuse)
    import os

    # the test process is the parent; give the profile to the comparison via its own env
    monkeypatch.setattr(
        procenv,
        "read_environ",
        lambda pid: dict(PROFILE) if pid == os.getpid() else procenv._parse_block(procenv._read_bytes(pid, "environ")),
    )
    result = procenv.check_process(PROFILE, clobbered.pid)
    assert result.env_source == "inherited" and result.inherited_from == os.getpid()
    assert result.inheritance == ["spawned"]  # fork + exec: a new stack
    assert [v.status for v in result.variables] == ["inherited", "inherited"] and result.ok
    assert "nccl-tune logs nccl" in result.note and "Permission denied" in result.note
    # a parent without the profile proves nothing: missing, not inherited
    monkeypatch.setattr(
        procenv,
        "read_environ",
        lambda pid: {} if pid == os.getpid() else procenv._parse_block(procenv._read_bytes(pid, "environ")),
    )
    again = procenv.check_process(PROFILE, clobbered.pid)
    assert [v.status for v in again.variables] == ["missing", "missing"] and not again.ok


def test_fork_without_exec_is_told_from_spawn():
    code = (
        "import os, sys, time\n"
        "pid = os.fork()\n"
        "if pid == 0:\n    time.sleep(60)\n    os._exit(0)\n"
        "print(pid, flush=True)\nprint('ready', flush=True)\ntime.sleep(60)\n"
    )
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=subprocess_env())
    try:
        child = int(proc.stdout.readline())
        assert proc.stdout.readline().strip() == "ready"
        assert procenv._hop(proc.pid, child) == "forked"
        import os

        assert procenv._hop(os.getpid(), proc.pid) == "spawned"
    finally:
        subprocess.run(["kill", str(child)], check=False)
        proc.kill()
        proc.wait(timeout=10)


def test_check_cli_shows_role_and_source(clobbered, tmp_path, cli_runner):
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\nNCCL_ALGO=Ring\n")
    out = cli_runner.invoke(cli, ["check", "--profile", str(profile), "--pid", str(clobbered.pid)])
    assert out.exit_code == 0, out.output
    assert "vLLM TP worker 3" in out.output and "memory (rewritten block)" in out.output
    js = json.loads(
        cli_runner.invoke(cli, ["check", "--profile", str(profile), "--pid", str(clobbered.pid), "--json"]).stdout
    )
    assert js[0]["env_source"] == "memory" and js[0]["rewritten"] is True


@pytest.mark.skipif(
    importlib.util.find_spec("setproctitle") is None, reason="setproctitle is not installed (vLLM and SGLang bring it)"
)
def test_real_setproctitle_is_read_back():
    proc = _start(
        "import setproctitle, time\nsetproctitle.setproctitle('sglang::scheduler_TP1')\n"
        "print('ready', flush=True)\ntime.sleep(60)\n"
    )
    try:
        result = procenv.check_process(PROFILE, proc.pid)
        assert result.rewritten and result.env_source == "memory" and result.ok
        assert result.role == "SGLang scheduler, TP worker 1"
    finally:
        proc.kill()
        proc.wait(timeout=10)
