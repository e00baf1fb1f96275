"""`nccl-tune sweep` from the command line: dry run, sim sweeps, interrupt and resume."""

from __future__ import annotations

import json
import shlex
import signal
import subprocess
import sys
import time

import pytest
from conftest import OWN_FIXTURES, REPO_ROOT, subprocess_env

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.measure import launch

FAKE = OWN_FIXTURES / "sweep" / "fake_torchrun.py"


def test_an_invalid_value_is_refused_not_dropped(cli_runner, tmp_path):
    # NCCL_NTHREADS must be a multiple of 32: refused at --set (exit 2), not measured as a
    # dropped cell beside the baseline with exit 0
    result = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_NTHREADS=256,100", "--backend", "sim", "--out", str(tmp_path / "r.jsonl")]
    )
    assert result.exit_code == 2, result.output
    assert result.output.strip().splitlines()[-1] == (
        "Error: Invalid value for '--set': NCCL_NTHREADS=100: 100 is not a multiple of 32"
    )
    assert not (tmp_path / "r.jsonl").exists()


def test_dry_run_plan_text(cli_runner):
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_PROTO=LL,LL128,default",
            "--set",
            "NCCL_NTHREADS=256,default",
            "--topology",
            "pcie",
            "--backend",
            "gloo",
            "--rounds",
            "3",
            "--tokens",
            "1,4",
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "Plan: 4 cells x 3 rounds, 2 process groups, 6 launches" in out
    assert "sizes 14336, 57344 B" in out and "baseline (NCCL defaults)" in out
    assert "forces LL128 on 'pcie'" in out
    assert "NCCL settings do not affect gloo" in out and "2 ranks on CPU" in out
    assert "Estimated time: about" in out


def test_dry_run_json_and_isolation_process(cli_runner):
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_PROTO=LL,Simple",
            "--set",
            "NCCL_ALGO=Ring,Tree",
            "--backend",
            "sim",
            "--topology",
            "nvlink",
            "--isolation",
            "process",
            "--rounds",
            "2",
            "--dry-run",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    plan = json.loads(result.stdout)
    assert plan["simulated"] is True and plan["launches"] == 5 * 2 and len(plan["groups"]) == 5
    assert plan["cells"][0]["cell"] == store.BASELINE and plan["topology"] == "nvlink"
    assert plan["estimate_s"] == 0.0  # sim launches nothing


def test_dry_run_reports_inherited_settings_and_conf_files(cli_runner, tmp_path):
    (tmp_path / ".nccl.conf").write_text("NCCL_P2P_LEVEL=SYS\n")
    result = cli_runner.invoke(
        cli,
        ["sweep", "--set", "NCCL_PROTO=LL", "--backend", "gloo", "--dry-run", "--keep-env", "NCCL_SOCKET_IFNAME"],
        env={"HOME": str(tmp_path), "NCCL_ALGO": "Tree", "NCCL_SOCKET_IFNAME": "eth0"},
    )
    assert result.exit_code == 0, result.output
    assert "inherited NCCL_* removed from every launch (the baseline sets none): NCCL_ALGO" in result.output
    assert f"conf file {tmp_path / '.nccl.conf'} still supplies NCCL_P2P_LEVEL" in result.output


@pytest.mark.parametrize(
    "args,message",
    [
        ([], "no grid"),
        (["--set", "NCCL_PROTO=LL", "--backend", "sim"], "--out FILE is required"),
        (["--set", "NCCL_PROTO=LL", "--sizes", "1K", "--tokens", "1", "--dry-run"], "cannot be combined"),
        (["--set", "NCCL_PROTO=LL", "--launcher", "srun python -m {module}", "--dry-run"], "needs {args}"),
        (["--set", "NCCL_PROTO=LL", "--nnodes", "2", "--dry-run"], "needs --rdzv-endpoint"),
        (["--set", "NCCL_PROTO=LL", "--keep-env", "PATH", "--dry-run"], "--keep-env"),
    ],
)
def test_bad_input_one_line_exit_2(cli_runner, args, message):
    result = cli_runner.invoke(cli, ["sweep", *args])
    assert result.exit_code == 2 and message in result.output and "Traceback" not in result.output


def test_no_resume_refuses_to_mix(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    out.write_text("")
    result = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_PROTO=LL", "--backend", "sim", "--out", str(out), "--no-resume"]
    )
    assert result.exit_code == 2 and "pass --resume" in result.output


def test_sim_sweep_then_report_says_simulated(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_P2P_LEVEL=SYS,default",
            "--set",
            "NCCL_PROTO=LL,Simple,default",
            "--backend",
            "sim",
            "--topology",
            "pcie-shm",
            "--rounds",
            "3",
            "--tokens",
            "1",
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["simulated"] and summary["cells_measured"] == 6 * 3 and summary["launches"] == 2 * 3
    again = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_P2P_LEVEL=SYS,default",
            "--set",
            "NCCL_PROTO=LL,Simple,default",
            "--backend",
            "sim",
            "--topology",
            "pcie-shm",
            "--rounds",
            "3",
            "--tokens",
            "1",
            "--out",
            str(out),
        ],
    )
    assert again.exit_code == 0 and "18 (cell, round) pairs already recorded" in again.output
    text = cli_runner.invoke(cli, ["report", str(out)])
    assert text.exit_code == 0 and "SIMULATED" in text.output
    rows = json.loads(cli_runner.invoke(cli, ["report", str(out), "--json"]).stdout)
    best = min((r for r in rows if r["cell"] != store.BASELINE), key=lambda r: r["p50_us"])
    assert best["env"]["NCCL_P2P_LEVEL"] == "SYS" and best["verdict"] == "faster"
    assert all(r["simulated"] for r in rows)


def _fake_sweep_cmd(out, pidfile_env=True):
    return [
        sys.executable,
        "-m",
        "nccl_tune",
        "sweep",
        "--set",
        "NCCL_PROTO=LL,Simple,default",
        "--set",
        "NCCL_NTHREADS=256,default",
        "--sizes",
        "1024,4096",
        "--backend",
        "gloo",
        "--launcher",
        f"{sys.executable} {FAKE} records {{args}}",
        "--rounds",
        "2",
        "--timeout",
        "60",
        "--out",
        str(out),
    ]


@pytest.mark.slow
def test_warnings_during_the_run_are_printed_not_dropped(tmp_path):
    out = tmp_path / "r.jsonl"
    done = subprocess.run(
        _fake_sweep_cmd(out), env=subprocess_env(FAKE_GARBAGE="1"), capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    skipped = [
        line for line in done.stderr.splitlines() if line.startswith("warning: ") and line.endswith("skipped: not JSON")
    ]
    # one line that is not a record before each cell's records, each cell in each round:
    # 3 x 2 cells (with the baseline) x 2 rounds
    assert len(skipped) == 12, done.stderr


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_interrupt_half_way_then_resume_records_each_pair_once(tmp_path, sig):
    out, pidfile = tmp_path / "r.jsonl", tmp_path / "pids"
    env = subprocess_env(FAKE_DELAY="0.4", FAKE_PIDFILE=str(pidfile))
    proc = subprocess.Popen(
        _fake_sweep_cmd(out), env=env, cwd=REPO_ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if out.exists() and len(out.read_text().splitlines()) >= 4:
            break
        time.sleep(0.05)
    proc.send_signal(sig)
    output, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, output
    last = output.strip().splitlines()[-1]
    assert last.startswith("Error: sweep interrupted: every finished cell is in"), output
    resume = last.split("; resume with: nccl-tune ", 1)[1]  # the command it names, run as is
    kept = store.read_records([str(out)])
    assert 4 <= len(kept) < 6 * 2 * 2
    pids = [int(p) for p in pidfile.read_text().split()]
    assert pids and not [p for p in pids if launch._alive(p)]
    done = subprocess.run(
        [sys.executable, "-m", "nccl_tune", *shlex.split(resume)],
        env=subprocess_env(FAKE_PIDFILE=str(pidfile)),
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "already recorded are skipped" in done.stdout
    keys = [(r["cell"], r["round"], r["bytes"]) for r in store.read_records([str(out)])]
    assert len(keys) == len(set(keys)) == 6 * 2 * 2


def test_a_simulated_multi_node_sweep_needs_no_rendezvous(cli_runner, tmp_path):
    # sim launches nothing: --nnodes 2 models a world of 2 x 8 ranks, no --rdzv-endpoint
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--nnodes",
            "2",
            "--topology",
            "pcie-shm",
            "--set",
            "NCCL_PROTO=LL",
            "--tokens",
            "1",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == 0, result.output
    assert {r["world_size"] for r in store.read_records([str(out)])} == {16}
    plan = json.loads(
        cli_runner.invoke(
            cli,
            [
                "sweep",
                "--backend",
                "sim",
                "--nnodes",
                "2",
                "--set",
                "NCCL_PROTO=LL",
                "--topology",
                "pcie-shm",
                "--dry-run",
                "--json",
            ],
        ).stdout
    )
    assert plan["launcher"] == "simulated: nothing is launched; a modelled world of 16 ranks"
    real = cli_runner.invoke(
        cli, ["sweep", "--backend", "gloo", "--nnodes", "2", "--set", "NCCL_PROTO=LL", "--dry-run"]
    )
    assert real.exit_code == 2 and "--rdzv-endpoint" in real.output  # a real launch still needs it
