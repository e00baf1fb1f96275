"""Exit codes, decided in one place (nccl_tune.errors), and refusals before anything runs.

1: a run that went ahead but compared nothing (every cell failed, or the baseline did);
2: bad input, refused before a launch (sweep, bench, validate, recommend);
127 / 126: exec of a command that does not exist / is not executable.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from conftest import subprocess_env
from unwritable import drop_overrides, unwritable_folder

from nccl_tune.cli import cli
from nccl_tune.measure import sweep as sweeplib

# The published codes (DESIGN.md section 8, shells and env(1) for 126/127), written out
# rather than imported from nccl_tune.errors: a changed constant there must fail here.
EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND = 1, 2, 126, 127

try:
    import torch

    CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a dependency
    CUDA = False


def _rec(cell, status="ok", round_=1, **extra):
    return {
        "cell": cell,
        "status": status,
        "round": round_,
        "bytes": 1024,
        "lat_us": {"p50": 10.0} if status == "ok" else {},
        **extra,
    }


# ---------------------------------------------------------------- 1: nothing compared


def test_sweep_whose_every_launch_fails_exits_1(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_PROTO=LL",
            "--backend",
            "gloo",
            "--launcher",
            "false {module} {args}",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == EXIT_RUN_FAILED, result.output
    assert "every cell failed" in result.output
    assert out.exists()  # the failures are recorded, not lost


def test_sweep_json_summary_still_printed_before_exit_1(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_PROTO=LL",
            "--backend",
            "gloo",
            "--json",
            "--launcher",
            "false {module} {args}",
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == EXIT_RUN_FAILED
    assert '"failures"' in result.output


def test_run_failure_baseline_failed_in_every_round():
    records = [
        _rec("baseline", "failed", 1),
        _rec("baseline", "timeout", 2),
        _rec("c-1", "ok", 1),
        _rec("c-1", "ok", 2),
    ]
    assert "baseline" in sweeplib.run_failure(records)


def test_run_failure_none_when_baseline_ok_in_one_round_and_superseded_ignored():
    records = [_rec("baseline", "failed", 1), _rec("baseline", "ok", 2), _rec("c-1", "failed", 1)]
    assert sweeplib.run_failure(records) is None
    # an old failed record superseded by a re-run does not count against the run
    records = [_rec("baseline", "ok", 1), _rec("c-1", "failed", 1, superseded=True), _rec("c-1", "ok", 1)]
    assert sweeplib.run_failure(records) is None
    assert sweeplib.run_failure([_rec("baseline", "ok"), _rec("c-1", "wrong", correct=False)]) is None


def test_run_failure_wrong_everywhere_is_a_failure():
    records = [_rec("baseline", "ok", correct=False), _rec("c-1", "wrong", correct=False)]
    assert "every cell failed" in sweeplib.run_failure(records)


def test_validate_run_failure_rule():
    from integration.validate_request import run_failure

    rows = [{"config": "baseline", "status": "failed"}, {"config": "profile", "status": "ok"}]
    assert "baseline" in run_failure(rows)
    rows[0]["status"] = "ok"
    assert run_failure(rows) is None
    assert "every configuration" in run_failure([{"config": "profile", "status": "timeout"}])


# ---------------------------------------------------------------- 2: refused before a launch

NOTHING_LAUNCHES = "false {module} {args}"  # any launch would record failures in --out


@pytest.mark.parametrize(
    "extra, words",
    [
        (["--mode", "graph"], "--mode graph needs"),
        (["--verify-effective"], "--verify-effective needs the NCCL backend"),
    ],
)
def test_sweep_refuses_what_gloo_cannot_run(cli_runner, tmp_path, extra, words):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--set",
            "NCCL_PROTO=LL",
            "--backend",
            "gloo",
            *extra,
            "--launcher",
            NOTHING_LAUNCHES,
            "--out",
            str(out),
        ],
    )
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert words in result.output
    assert not out.exists()


def test_sweep_refuses_unknown_variable_with_did_you_mean(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(cli, ["sweep", "--set", "NCCL_PROTOO=LL", "--backend", "sim", "--out", str(out)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "did you mean NCCL_PROTO?" in result.output and "--allow-unknown" in result.output
    assert not out.exists()
    forced = cli_runner.invoke(
        cli, ["sweep", "--set", "NCCL_PROTOO=LL", "--backend", "sim", "--allow-unknown", "--out", str(out)]
    )
    assert forced.exit_code == 0, forced.output
    assert out.exists()


def test_sweep_refuses_unknown_names_from_a_grid_file(cli_runner, tmp_path):
    grid = tmp_path / "g.toml"
    grid.write_text('[grid]\nNCCL_ALGO = ["Ring"]\n[[cells]]\nNCCL_BUFFSIZ = "4194304"\n')
    result = cli_runner.invoke(
        cli, ["sweep", "--grid", str(grid), "--backend", "sim", "--out", str(tmp_path / "r.jsonl")]
    )
    assert result.exit_code == EXIT_BAD_INPUT
    assert "NCCL_BUFFSIZ" in result.output and "did you mean NCCL_BUFFSIZE?" in result.output


@pytest.fixture
def no_torchrun(monkeypatch):
    """bench's launch, replaced: a refusal must come before it."""
    from nccl_tune.commands import bench

    def launched(argv):
        raise AssertionError(f"torchrun was started: {argv}")

    monkeypatch.setattr(bench, "stream", launched)


@pytest.mark.parametrize(
    "args, words",
    [
        (["--out", "/nonexistent/dir/r.jsonl"], "/nonexistent/dir does not exist"),
        (["--verify-effective"], "--verify-effective needs the NCCL backend"),
        (["--plan", "missing.json"], "missing.json: cannot read the plan"),
        (["--mode", "graph"], "--mode graph needs"),
    ],
)
def test_bench_refuses_before_torchrun(cli_runner, no_torchrun, tmp_path, monkeypatch, args, words):
    if CUDA and args[0] in ("--verify-effective", "--mode"):
        pytest.skip("these run on a CUDA machine")
    monkeypatch.chdir(tmp_path)  # missing.json: a relative path that is not there
    result = cli_runner.invoke(cli, ["bench", *args])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output.count(words) == 1, result.output  # said once, not once per rank


def test_bench_refuses_an_unwritable_out(cli_runner, no_torchrun, tmp_path):
    """Runs as root too (CI): a read-only bind mount or an immutable folder, else the
    command in a process without the capabilities that override mode bits."""
    with unwritable_folder(tmp_path) as made:
        out = tmp_path / "ro" / "r.jsonl"
        if made is None:
            done = subprocess.run(
                [sys.executable, "-m", "nccl_tune", "bench", "--out", str(out)],
                capture_output=True,
                text=True,
                env=subprocess_env(),
                preexec_fn=drop_overrides,
                timeout=120,
            )
            code, output = done.returncode, done.stderr
        else:
            result = cli_runner.invoke(cli, ["bench", "--out", str(out)])
            code, output = result.exit_code, result.output
        assert code == EXIT_BAD_INPUT, output
        assert f"Error: --out {out}: the folder {tmp_path / 'ro'} is not writable" in output
    assert not out.exists()


def test_bench_refuses_an_out_another_process_is_writing_before_torchrun(cli_runner, no_torchrun, tmp_path):
    out = tmp_path / "r.jsonl"
    hold = (
        "import sys, time\nfrom nccl_tune import fileio\n"
        "with fileio.ResultsLock(sys.argv[1]):\n    print('held', flush=True)\n    time.sleep(30)"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", hold, str(out)], stdout=subprocess.PIPE, text=True, env=subprocess_env()
    )
    try:
        assert holder.stdout.readline() == "held\n"
        result = cli_runner.invoke(cli, ["bench", "--out", str(out)])
    finally:
        holder.kill()
        holder.wait()
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output == (
        f"Error: --out {out}: another process (pid {holder.pid}) is writing "
        "results to this file; wait for it to finish or choose another file\n"
    )


def test_bench_refuses_an_out_under_sys_before_torchrun(cli_runner, no_torchrun):
    result = cli_runner.invoke(cli, ["bench", "--out", "/sys/foo.jsonl"])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert result.output == (
        "Error: --out /sys/foo.jsonl: is under /sys, a kernel file system, not a place for output\n"
    )


def test_check_out_refuses_a_folder_and_accepts_a_new_file(tmp_path):
    from microbench.options import check_out
    from nccl_tune.errors import NcclTuneError

    with pytest.raises(NcclTuneError, match="is a folder"):
        check_out(str(tmp_path))
    check_out(str(tmp_path / "new.jsonl"))
    assert not (tmp_path / "new.jsonl").exists()  # checked, not created


@pytest.mark.skipif(CUDA, reason="the CPU default")
def test_bench_defaults_to_two_ranks_on_cpu(cli_runner):
    result = cli_runner.invoke(cli, ["bench", "--dry-run", "--sizes", "1K"])
    assert result.exit_code == 0, result.output
    assert "--nproc-per-node=2" in result.output
    assert "no communication" not in result.output


def test_bench_says_a_world_of_one_measures_no_communication(cli_runner):
    result = cli_runner.invoke(cli, ["bench", "--nproc", "1", "--dry-run", "--sizes", "1K"])
    assert result.exit_code == 0, result.output
    assert "a world of 1 rank measures no communication" in result.output


def test_recommend_refuses_tp_1(cli_runner):
    result = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--tp", "1"])
    assert result.exit_code == EXIT_BAD_INPUT
    assert "world of one rank has no collectives" in result.output


def test_recommend_refuses_results_of_a_world_of_one(cli_runner, tmp_path):
    import json

    path = tmp_path / "r.jsonl"
    rows = [
        {
            "schema": 1,
            "cell": c,
            "env": e,
            "backend": "gloo",
            "op": "allreduce",
            "world_size": 1,
            "bytes": 14336,
            "lat_us": {"p50": 5.0},
            "samples_us": [5.0, 5.1],
            "status": "ok",
            "round": 1,
        }
        for c, e in (("baseline", {}), ("c-x", {"NCCL_PROTO": "LL"}))
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    result = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", str(path)])
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "world of one rank" in result.output


@pytest.mark.skipif(CUDA, reason="CUDA is available here")
def test_validate_refuses_a_cuda_loop_on_cpu(cli_runner, tmp_path):
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\n")
    result = cli_runner.invoke(
        cli,
        ["validate", "--profile", str(profile), "--model-args", "--backend nccl", "--out", str(tmp_path / "v.jsonl")],
    )
    assert result.exit_code == EXIT_BAD_INPUT, result.output
    assert "needs CUDA" in result.output


# ---------------------------------------------------------------- 127 / 126: exec


def test_exec_missing_command_127(cli_runner, tmp_path):
    # The one test of exit 127 (the subprocess copies in test_exec and test_cli_errors went):
    # one line on stderr naming the command and why, nothing on stdout.
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\n")
    for command, why in (
        ("nccl-tune-no-such-command", "no such command on PATH"),
        (str(tmp_path / "absent"), "no such file"),
    ):
        result = cli_runner.invoke(cli, ["exec", "--profile", str(profile), "--", command])
        assert result.exit_code == EXIT_NOT_FOUND, result.output
        assert (result.stdout, result.stderr) == ("", f"Error: cannot run '{command}': {why}\n")


def test_exec_not_executable_126(cli_runner, tmp_path):
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\n")
    plain = tmp_path / "plain.sh"
    plain.write_text("echo hi\n")
    plain.chmod(0o644)
    for command, why in ((str(plain), "not executable"), (str(tmp_path), "a directory")):
        result = cli_runner.invoke(cli, ["exec", "--profile", str(profile), "--", command])
        assert result.exit_code == EXIT_NOT_EXECUTABLE, result.output
        assert result.stderr == f"Error: cannot run '{command}': {why}\n"
    on_path = cli_runner.invoke(cli, ["exec", "--profile", str(profile), "--", "plain.sh"], env={"PATH": str(tmp_path)})
    assert on_path.exit_code == EXIT_NOT_EXECUTABLE, on_path.output
    assert on_path.stderr == f"Error: cannot run 'plain.sh': {plain} is not executable\n"


# ---------------------------------------------------------------- 130: interrupted


def test_ctrl_c_is_one_line_and_exit_130(monkeypatch, capsys):
    from nccl_tune import cli as cli_module

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli_module.cli, "main", interrupted)
    with pytest.raises(SystemExit) as info:
        cli_module.main()
    assert info.value.code == 130
    assert capsys.readouterr().err == "nccl-tune: interrupted\n"


def test_the_exit_code_table_and_the_interrupted_message():
    from nccl_tune import errors

    # DESIGN.md section 8's codes, each once, each with its words
    assert sorted(errors.EXIT_CODES) == [0, EXIT_RUN_FAILED, EXIT_BAD_INPUT, EXIT_NOT_EXECUTABLE, EXIT_NOT_FOUND, 130]
    assert str(errors.Interrupted()) == "interrupted"
    assert str(errors.Interrupted("sweep interrupted", resume="nccl-tune sweep --resume")) == (
        "sweep interrupted; resume with: nccl-tune sweep --resume"
    )
    assert errors.Interrupted().exit_code == 130


# ---------------------------------------------------------------- a full disk after the run

# A file-size limit makes every write past 256 bytes fail (EFBIG, as a full disk gives
# ENOSPC), in a child process so the limit binds only the command.
FULL_DISK_CLI = (
    "import resource, signal, sys\n"
    "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
    "resource.setrlimit(resource.RLIMIT_FSIZE, (256, 256))\n"
    "sys.argv = ['nccl-tune', *sys.argv[1:]]\n"
    "from nccl_tune.cli import main\n"
    "main()\n"
)
# One command per kind of output (fileio.OutputKind): results appended, an export
# replaced atomically, a plot. {r} is a results file, {d} the folder written to.
FULL_DISK_CASES = {
    "results (sweep --out)": (
        "sweep --backend sim --set NCCL_PROTO=LL,default --tokens 1 --rounds 3 --out {d}/new.jsonl",
        "new.jsonl",
    ),
    "export (recommend --export)": ("recommend --layers 61 --results {r} --export {d}/p.env --force", "p.env"),
    "export (profiles convert)": ("profiles convert {p} --to conf --output {d}/c.conf", "c.conf"),
    "plot (report --plot)": ("report {r} --plot {d}/p.png", "p.png"),
}


@pytest.mark.parametrize("case", list(FULL_DISK_CASES))
def test_a_file_the_run_cannot_write_is_exit_1_naming_it_and_leaves_nothing(case, cli_runner, tmp_path):
    """DESIGN.md section 8: 1 when a file that was asked for was not written; no partial
    file behind; the message names the file."""
    if "plot" in case:
        pytest.importorskip("matplotlib")
    results, profile = tmp_path / "r.jsonl", tmp_path / "p.in.env"
    profile.write_text("NCCL_PROTO=LL\n")
    made = cli_runner.invoke(
        cli,
        ["sweep", "--backend", "sim", "--set", "NCCL_PROTO=LL,default", "--tokens", "1", "--rounds", "5"]
        + ["--out", str(results)],
    )
    assert made.exit_code == 0, made.output
    out = tmp_path / "out"
    out.mkdir()
    words, name = FULL_DISK_CASES[case]
    args = words.format(r=results, p=profile, d=out).split()
    done = subprocess.run(
        [sys.executable, "-c", FULL_DISK_CLI, *args], capture_output=True, text=True, env=subprocess_env(), timeout=120
    )
    errors = [line for line in (done.stdout + done.stderr).splitlines() if line.startswith("Error:")]
    assert done.returncode == EXIT_RUN_FAILED, done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert len(errors) == 1 and str(out / name) in errors[0], errors
    assert os.listdir(out) == []
