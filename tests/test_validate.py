"""nccl-tune validate: end to end on the builtin engine (gloo), the SGLang path with a
stand-in server, the prediction from results records, and bad input."""

from __future__ import annotations

import importlib.util
import json
import sys

import factories
import pytest

from integration import validate as lib
from nccl_tune import store
from nccl_tune.cli import cli
from tests.conftest import REPO_ROOT

TINY = "--layers 2 --hidden 32 --heads 2 --vocab 64 --prompt-len 6"
PROFILE_ENV = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}


@pytest.fixture
def profile_file(tmp_path):
    path = tmp_path / "ll-ring.env"
    path.write_text("# nccl-tune profile\n# source: test\nNCCL_PROTO=LL\nNCCL_ALGO=Ring\n")
    return str(path)


_records = factories.read_records


@pytest.mark.slow
def test_builtin_end_to_end_on_gloo(cli_runner, profile_file, tmp_path):
    out = tmp_path / "val.jsonl"
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--engine",
            "builtin",
            "--steps",
            "0,2",
            "--runs",
            "2",
            "--warmup",
            "0",
            "--max-tokens",
            "12",
            "--model-args",
            TINY,
            "--out",
            str(out),
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{") :])
    assert data["engine"] == "builtin" and data["backend"] == "gloo" and data["world_size"] == 2
    assert [(r["steps"], r["config"]) for r in data["rows"]] == [
        (0, "baseline"),
        (0, "profile"),
        (2, "baseline"),
        (2, "profile"),
    ]
    for row in data["rows"]:
        assert row["status"] == "ok" and len(row["runs_tok_s"]) == 2 and row["tok_s"] > 0
        assert row["env_ok"] is True  # the loop saw exactly the intended NCCL_* (none / profile)
        assert 1.0 <= row["accept_len"] <= 3.0
    prof2 = data["rows"][3]
    assert prof2["speedup"] == pytest.approx(prof2["tok_s"] / data["rows"][2]["tok_s"])
    assert prof2["measured_saving_ms"] == pytest.approx(1000 / data["rows"][2]["tok_s"] - 1000 / prof2["tok_s"])
    # Modelled on the default machine (pcie-amd-2s, 2 ranks, hidden 32 in float64: 256 B a
    # token), NCCL's estimate picks Ring/LL for the baseline too: Ring/LL 6.6 + 2 x 1.0 +
    # 256 B / (1 channel x 0.1 GB/s x .5) = 13.7 us beats Ring/Simple 8.4 + 2 x 5.7 + 2.6 =
    # 22.4, Tree/Simple 22.6 and Tree/LL 29.9 (and at 768 B, 3 tokens, 24.0 against 27.5);
    # the profile forces the same pair on the same transport, so the model predicts no saving.
    assert [r["predicted_saving_ms"] for r in data["rows"][1::2]] == pytest.approx([0.0, 0.0], abs=1e-9)
    assert prof2["prediction_error_ms"] == pytest.approx(prof2["measured_saving_ms"] - prof2["predicted_saving_ms"])
    # The verdict is the Welch interval of the best profile row against the best baseline
    # row, each the step count with the highest mean tok/s, recomputed here from their
    # runs (scipy directly, not the project's helper).
    assert data["best_steps"] == {
        c: max((r for r in data["rows"] if r["config"] == c), key=lambda r: r["tok_s"])["steps"]
        for c in ("baseline", "profile")
    }
    expected, lo, hi = factories.validate_verdict(data)
    assert data["verdict"] == expected, (data["verdict_detail"], lo, hi)
    assert f"[{lo:+.1f}, {hi:+.1f}] tok/s" in data["verdict_detail"]
    assert data["prediction_source"].startswith("modelled: nccl_tune.model.costmodel")
    assert any("gloo" in note and "cannot change" in note for note in data["notes"])
    assert data["model"]["dtype"] == "float64"
    records = _records(out)  # one record per configuration, appended as measured
    assert [(r["label"], r["steps"]) for r in records] == [
        ("baseline", 0),
        ("profile", 0),
        ("baseline", 2),
        ("profile", 2),
    ]
    assert records[0]["env"] == {} and records[1]["env"] == PROFILE_ENV
    assert records[1]["cell"] == store.cell_id(PROFILE_ENV) and records[0]["cell"] == "baseline"
    assert all(r["op"] == "spec_decode" and r["source"] == "measured" for r in records)


STANDIN = f"{sys.executable} {REPO_ROOT / 'tests' / 'sglang_standin.py'}"


@pytest.mark.slow
def test_text_table(cli_runner, profile_file, tmp_path):
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--engine",
            "sglang",
            "--server-command",
            STANDIN,
            "--server-args",
            "--model-path m --tp 4",
            "--steps",
            "0",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--max-tokens",
            "6",
            "--health-timeout",
            "30",
            "--out",
            str(tmp_path / "t.jsonl"),
        ],
    )
    assert res.exit_code == 0, res.output
    for text in (
        "tok/s mean [95% CI]",
        "speedup vs baseline",
        "predicted",
        "best step count:",
        "verdict: no verdict",
        "at least 2 runs",
        "(nccl, 4 ranks)",
        "note: no prediction: give --layers and --hidden",
    ):
        assert text in res.output


@pytest.mark.slow
def test_sglang_engine_with_standin_server(cli_runner, tmp_path):
    out = tmp_path / "sg.jsonl"
    profile_file = tmp_path / "sys-ll.env"
    profile_file.write_text("NCCL_P2P_LEVEL=SYS\nNCCL_PROTO=LL\n")
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            str(profile_file),
            "--engine",
            "sglang",
            "--steps",
            "0,2",
            "--runs",
            "2",
            "--warmup",
            "1",
            "--max-tokens",
            "10",
            "--server-args",
            "--model-path m --tp 2 --speculative-algorithm EAGLE3 --speculative-draft-model-path d",
            "--server-command",
            STANDIN,
            "--layers",
            "61",
            "--hidden",
            "7168",
            "--topology",
            "pcie-shm",
            "--out",
            str(out),
            "--health-timeout",
            "30",
            "--json",
        ],
    )
    assert res.exit_code == 0, res.output
    data = json.loads(res.output[res.output.index("{") :])
    assert [r["status"] for r in data["rows"]] == ["ok"] * 4
    assert all(r["env_ok"] for r in data["rows"])  # the stand-in's worker carried each env
    spec = [r for r in data["rows"] if r["steps"] == 2]
    # the stand-in's cycles accept 1 then 2 drafts (2 and 3 tokens): 10 tokens in 4 verifies
    assert all(r["accept_len"] == pytest.approx(10 / 4) for r in spec)
    assert data["model"] == {"layers": 61, "hidden": 7168, "dtype": "bf16", "draft_layers": 1}
    # P2P through host memory (default on pcie-shm) vs P2P at SYS level: a modelled saving.
    # By hand, 2 ranks, 2 channels of 24 GB/s over PCI and 10 over host memory (the model's
    # figures): Ring/LL either way (NCCL's estimate 8.6 + 14336 B / 24 GB/s = 9.2 us against
    # Tree/LL 12.3, Tree/Simple 17.2, Ring/Simple 20.1), one channel at 14336 B (< 2 x 512
    # x 16), two at 43008 B (+0.04 us): host memory 6.6 + 2 x 1.3 + 14336 / (2 x 10 GB/s x
    # .5) = 10.634 us, P2P 6.6 + 2 x 1.0 + 14336 / 24 GB/s = 9.197 us, 1.4363 us less; at
    # 43008 B (3 tokens) 9.2 + 4.301 + 0.04 = 13.541 against 8.6 + 1.792 + 0.04 = 10.432,
    # 3.1088 less. Steps 0: 123 allreduces x 1.4363 = 0.1767 ms. Steps 2 (accept length
    # 2.5): a 3-token verify, 123 x 3.1088, plus 2 one-layer draft steps, 2 x 3 x 1.4363,
    # over 2.5 tokens: (382.38 + 8.62) / 2.5 us = 0.1564 ms.
    assert data["world_size"] == 2
    assert data["rows"][1]["predicted_saving_ms"] == pytest.approx(0.1767, abs=1e-4)
    assert data["rows"][3]["predicted_saving_ms"] == pytest.approx(0.1564, abs=1e-4)
    records = _records(out)
    assert len(records) == 4 and records[3]["detail"]["log_summary"]["speculative"]["num_steps"] == 2
    assert records[0]["detail"]["log_summary"]["speculative"] is None


def test_sglang_missing_is_one_line_exit_2(cli_runner, profile_file, monkeypatch):
    from integration import validate_request as command

    real_find_spec = importlib.util.find_spec  # the patch below must not call itself
    monkeypatch.setattr(
        command.importlib.util,
        "find_spec",
        lambda name, package=None: None if name == "sglang" else real_find_spec(name, package),
    )
    res = cli_runner.invoke(
        cli, ["validate", "--profile", profile_file, "--engine", "sglang", "--server-args", "--model-path m"]
    )
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "engine sglang needs NVIDIA GPUs and SGLang" in lines[0]
    assert "sglang package is not installed" in lines[0]


@pytest.mark.parametrize(
    "args, message",
    [
        (["--steps", "a,b"], "--steps"),
        (["--steps", "-1"], "--steps"),
        (["--model-args", "--steps 3"], "--model-args: --steps is set by validate"),
        (["--model-args", "--layers 'unclosed"], "--model-args: cannot split"),
        (["--results", "/nonexistent/r.jsonl"], "/nonexistent/r.jsonl: no such file"),
        (["--engine", "sglang", "--server-command", "x"], "needs --server-args"),
    ],
)
def test_bad_input_is_one_line_exit_2(cli_runner, profile_file, args, message):
    res = cli_runner.invoke(cli, ["validate", "--profile", profile_file, *args])
    assert res.exit_code == 2
    assert message in res.output


def test_empty_or_missing_profile(cli_runner, tmp_path):
    empty = tmp_path / "empty.env"
    empty.write_text("# nothing\n")
    res = cli_runner.invoke(cli, ["validate", "--profile", str(empty)])
    assert res.exit_code == 2 and "sets no variables" in res.output
    res = cli_runner.invoke(cli, ["validate", "--profile", str(tmp_path / "none.env")])
    assert res.exit_code == 2 and "no such file or shipped profile" in res.output


def test_each_configuration_is_appended_before_the_next(monkeypatch, tmp_path):
    calls = []

    def fake(opts, env, steps):
        calls.append((env, steps))
        if len(calls) == 3:
            raise KeyboardInterrupt  # Ctrl-C during the third launch
        return {"status": "ok", "runs_tok_s": [100.0, 102.0], "accept_len": 1.0, "backend": "gloo", "world_size": 2}

    monkeypatch.setattr(lib, "measure_builtin", fake)
    opts = lib.Options(profile_env=PROFILE_ENV, profile_name="p", steps=[0, 1], out=str(tmp_path / "o.jsonl"))
    with pytest.raises(KeyboardInterrupt):
        lib.run(opts)
    records = _records(tmp_path / "o.jsonl")
    assert [(r["label"], r["steps"], r["tok_s"]) for r in records] == [("baseline", 0, 101.0), ("profile", 0, 101.0)]


def _latency_records(path, world=2):
    # baseline 40 us flat; profile 30 us at 256 B rising to 34 us at 1024 B (float64, hidden 32)
    rows = [({}, 256, 40.0), ({}, 1024, 40.0), (PROFILE_ENV, 256, 30.0), (PROFILE_ENV, 1024, 34.0)]
    for env, nbytes, lat in rows:
        for rnd in range(3):
            store.append_record(
                str(path),
                store.make_record(
                    env=env,
                    backend="nccl",
                    op="allreduce",
                    world_size=world,
                    bytes=nbytes,
                    lat_us={"p50": lat},
                    samples_us=[lat] * 5,
                    round=rnd,
                ),
            )


def test_prediction_from_results_records(tmp_path):
    path = tmp_path / "lat.jsonl"
    _latency_records(path)
    curves = lib.curves_from_results(str(path), PROFILE_ENV, 2)
    assert curves.measured and "cells baseline and c-" in curves.source
    # one token: 256 B, 5 allreduces x 10 us = 0.05 ms per target forward (2 layers)
    assert lib.forward_saving_ms(curves, 1, 2, 32, "float64") == pytest.approx(0.05)
    # 3 tokens (768 B): profile latency interpolated log-log between 30 and 34 us
    lat768 = curves.profile.at(768)
    assert 30 < lat768 < 34
    verify = 5 * (40 - lat768) / 1000
    draft = 3 * 10 / 1000  # 1-layer draft, one token
    assert lib.predicted_ms_per_token(curves, 2, 2.5, 2, 32, "float64", 1) == pytest.approx((verify + 2 * draft) / 2.5)
    # bf16 at hidden 128 is the same 256 B (2 B x 128): the same 5 x 10 us = 0.05 ms
    assert lib.forward_saving_ms(curves, 1, 2, 128, "bf16") == pytest.approx(0.05)
    # and 4 tokens of it, 1024 B, 5 x (40 - 34) us = 0.03 ms
    assert lib.forward_saving_ms(curves, 4, 2, 128, "bf16") == pytest.approx(0.03)


def test_prediction_needs_the_profile_cell(tmp_path):
    from nccl_tune.errors import NcclTuneError

    path = tmp_path / "lat.jsonl"
    _latency_records(path)
    with pytest.raises(NcclTuneError, match="no allreduce records for this profile"):
        lib.curves_from_results(str(path), {"NCCL_PROTO": "Simple"}, 2)


def test_rows_and_verdicts_from_measurements():
    measured = {
        ("baseline", 0): {"status": "ok", "runs_tok_s": [100.0, 101.0, 99.0]},
        ("profile", 0): {"status": "ok", "runs_tok_s": [120.0, 121.0, 119.0]},
        ("baseline", 2): {"status": "ok", "runs_tok_s": [150.0, 151.0, 149.0], "accept_len": 2.0},
        ("profile", 2): {"status": "ok", "runs_tok_s": [149.0, 151.0, 150.0], "accept_len": 2.0},
    }
    rows = lib.build_rows(measured, [0, 2], None, None)
    assert rows[1]["verdict"] == "helps" and rows[1]["speedup"] == pytest.approx(1.2)
    assert rows[1]["measured_saving_ms"] == pytest.approx(10 - 1000 / 120)
    assert rows[3]["verdict"] == "no significant difference"
    best = lib.best_steps(rows)
    assert best == {"baseline": 2, "profile": 2}
    verdict, detail = lib.overall_verdict(rows, best)
    assert verdict == "no significant difference" and "steps 2" in detail


def test_notes_name_the_test_only_substitutes_and_the_steps_their_verify_path_ran():
    plain = ["sgl_kernel", "torchvision"]
    verify = ["sgl_kernel", "torch_native_tree_verify", "torchvision"]  # a speculative run's log
    measured = {
        (label, k): {
            "status": "ok",
            "runs_tok_s": [10.0, 11.0],
            "backend": "gloo",
            "accept_len": 1.0 if k == 0 else 2.5,
            "substitutes": plain if k == 0 else verify,
        }
        for label in ("baseline", "profile")
        for k in (0, 2)
    }
    opts = lib.Options(profile_env=PROFILE_ENV, profile_name="p", engine="sglang", steps=[0, 2])
    notes = lib.finish(opts, measured)["notes"]
    assert (
        "the server loaded TEST-ONLY substitutes (sgl_kernel, torch_native_tree_verify, "
        "torchvision, tests/sglang_cpu): it did not run SGLang's own kernels, so its figures "
        "say nothing about SGLang's speed"
    ) in notes
    assert (
        "speculative verify at steps 2 ran through a TEST-ONLY tree attention "
        "(torch_native_tree_verify, tests/sglang_cpu), not SGLang's attention kernels: accept "
        "lengths are SGLang's own counts, its speed is not SGLang's"
    ) in notes
    for m in measured.values():
        m["substitutes"] = plain
    assert not any("tree attention" in n for n in lib.finish(opts, measured)["notes"])


def test_results_without_the_profile_cell_are_refused_before_any_launch(
    cli_runner, profile_file, tmp_path, monkeypatch
):
    path = tmp_path / "lat.jsonl"
    _latency_records(path)
    other = tmp_path / "other.env"
    other.write_text("NCCL_PROTO=Simple\n")
    monkeypatch.setattr(lib, "measure_builtin", lambda *a: pytest.fail("launched"))
    res = cli_runner.invoke(
        cli, ["validate", "--profile", str(other), "--results", str(path), "--out", str(tmp_path / "o.jsonl")]
    )
    assert res.exit_code == 2 and "no allreduce records for this profile" in res.output
    assert not (tmp_path / "o.jsonl").exists()


# ---------------------------------------------------------------- audit fixes (item 10)


def _no_launch(monkeypatch):
    monkeypatch.setattr(lib, "measure_builtin", lambda *a: pytest.fail("launched"))


def test_prediction_source_says_simulated_or_modelled(tmp_path):
    sim = tmp_path / "sim.jsonl"
    for env, lat in (({}, 40.0), (PROFILE_ENV, 30.0)):
        for nbytes in (256, 1024):
            store.append_record(
                str(sim),
                store.make_record(
                    env=env,
                    backend="sim",
                    op="allreduce",
                    world_size=2,
                    bytes=nbytes,
                    lat_us={"p50": lat},
                    samples_us=[lat] * 5,
                    round=0,
                ),
            )
    curves = lib.curves_from_results(str(sim), PROFILE_ENV, 2)
    assert curves.kind == "simulated" and not curves.measured
    assert curves.source.startswith("simulated: ")
    modelled = tmp_path / "modelled.jsonl"
    for record in store.read_records([str(sim)]):
        store.append_record(str(modelled), {**record, "backend": "nccl", "source": "modelled"})
    curves = lib.curves_from_results(str(modelled), PROFILE_ENV, 2)
    assert curves.kind == "modelled" and curves.source.startswith("modelled: ")
    measured = tmp_path / "lat.jsonl"
    _latency_records(measured)
    assert lib.curves_from_results(str(measured), PROFILE_ENV, 2).kind == "measured"


def test_results_of_another_world_size_are_refused_unless_accepted(cli_runner, profile_file, tmp_path, monkeypatch):
    from nccl_tune.errors import NcclTuneError

    path = tmp_path / "w8.jsonl"
    _latency_records(path, world=8)
    with pytest.raises(NcclTuneError, match="world size 8, this run has 2 ranks"):
        lib.curves_from_results(str(path), PROFILE_ENV, 2)
    curves = lib.curves_from_results(str(path), PROFILE_ENV, 2, any_world=True)
    assert "world size 8 applied to 2 ranks" in curves.source
    _no_launch(monkeypatch)
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--results",
            str(path),
            "--nproc",
            "2",
            "--out",
            str(tmp_path / "o.jsonl"),
        ],
    )
    assert res.exit_code == 2 and not (tmp_path / "o.jsonl").exists()
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and "world size 8" in lines[0] and "2 ranks" in lines[0]
    assert "--results-any-world" in lines[0]


@pytest.mark.parametrize(
    "model_args, message",
    [
        ("--hidden 100 --heads 3", "--model-args: hidden 100 is not a multiple of heads 3"),
        ("--hidden 96 --heads 3", "--model-args: heads 3 is not a multiple of the world size 2"),
        ("--bogus 1", "--model-args: unrecognized arguments: --bogus 1"),
        ("--layers 0", "--model-args: --layers must be at least 1"),
        ("--layers 2 --draft-layers 5", "--model-args: draft layers 5 must be between 1 and 2"),
    ],
)
def test_model_args_are_checked_before_any_launch(cli_runner, profile_file, tmp_path, monkeypatch, model_args, message):
    _no_launch(monkeypatch)
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--nproc",
            "2",
            "--model-args",
            model_args,
            "--out",
            str(tmp_path / "o.jsonl"),
        ],
    )
    assert res.exit_code == 2, res.output
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_topology_and_out_are_checked_before_any_launch(cli_runner, profile_file, tmp_path, monkeypatch):
    _no_launch(monkeypatch)
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--topology",
            "pcie-nvl",
            "--model-args",
            TINY,
            "--out",
            str(tmp_path / "o.jsonl"),
        ],
    )
    assert res.exit_code == 2 and "--topology" in res.output and "pcie-shm" in res.output
    for bad, why in (
        (tmp_path / "missing" / "o.jsonl", "does not exist"),
        (tmp_path / "ll-ring.env" / "o.jsonl", "is not a folder"),
    ):
        res = cli_runner.invoke(cli, ["validate", "--profile", profile_file, "--model-args", TINY, "--out", str(bad)])
        assert res.exit_code == 2
        assert res.output == f"Error: Invalid value for '--out': {bad}: the folder {bad.parent} {why}\n"
    ok = tmp_path / "fine.jsonl"
    lib_opts = []
    monkeypatch.setattr(lib, "run", lambda opts, on_config=None: lib_opts.append(opts) or lib.finish(opts, {}))
    res = cli_runner.invoke(cli, ["validate", "--profile", profile_file, "--model-args", TINY, "--out", str(ok)])
    assert lib_opts and not ok.exists()  # the check leaves no empty file behind
    assert res.exit_code == 1  # nothing succeeded (nothing ran)


TORCHRUN_FAILURE = """
*****************************************
Setting OMP_NUM_THREADS environment variable for each process to be 1 in default, to avoid your system being overloaded, please further tune the variable for optimal performance in your application as needed.
*****************************************
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/work/integration/spec_loop.py", line 401, in main
    group, rank, world, backend, device = _setup(args)
                                          ^^^^^^^^^^^^
RuntimeError: the rank's own words
E1129 10:29:26.453000 19877 torch/distributed/elastic/multiprocessing/api.py:1002] failed (exitcode: 1) local_rank: 0 (pid: 19882) of binary: /venv/bin/python
Traceback (most recent call last):
  File "<frozen runpy>", line 198, in _run_module_as_main
  File "/venv/lib/python3.11/site-packages/torch/distributed/run.py", line 1032, in <module>
    main()
torch.distributed.elastic.multiprocessing.errors.ChildFailedError:
============================================================
integration.spec_loop FAILED
------------------------------------------------------------
Failures:
  <NO_OTHER_FAILURES>
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  rank      : 0 (local_rank: 0)
  exitcode  : 1 (pid: 19882)
  error_file: <N/A>
  traceback : To enable traceback see: https://pytorch.org/docs/stable/elastic/errors.html
============================================================
"""


def test_a_failed_launch_keeps_the_ranks_last_error_line(cli_runner, profile_file, tmp_path, monkeypatch):
    # torchrun's failure output as captured from a real failed launch (shortened)
    assert lib.last_error_line(TORCHRUN_FAILURE) == "RuntimeError: the rank's own words"
    assert (
        lib.last_error_line(
            "spec_loop: KV cache full\n" + TORCHRUN_FAILURE.split("RuntimeError: the rank's own words\n")[1]
        )
        == "spec_loop: KV cache full"
    )
    # torch installed outside a virtual environment prints its agent's source path with
    # the directory above (seen in CI: "... 7676 site-packages/torch/distributed/...")
    prefixed = TORCHRUN_FAILURE.replace(" 19877 torch/distributed/", " 19877 site-packages/torch/distributed/")
    assert prefixed != TORCHRUN_FAILURE
    assert lib.last_error_line(prefixed) == "RuntimeError: the rank's own words"
    monkeypatch.setattr(lib, "_run_group", lambda argv, env, timeout: (1, "", TORCHRUN_FAILURE))
    out = tmp_path / "o.jsonl"
    res = cli_runner.invoke(
        cli, ["validate", "--profile", profile_file, "--steps", "0", "--model-args", TINY, "--out", str(out)]
    )
    assert res.exit_code == 1, res.output
    assert "failed: baseline at steps 0: RuntimeError: the rank's own words (exit code 1)" in res.output
    errors = [r["error"] for r in _records(out)]
    assert errors == ["RuntimeError: the rank's own words (exit code 1)"] * 2


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="needs torch")
def test_a_real_failed_launch_reports_the_rank_error(cli_runner, profile_file, tmp_path, monkeypatch):
    import torch

    from integration import validate_request as checks

    if torch.cuda.is_available():
        pytest.skip("needs a machine where --device cuda fails")
    # validate refuses --device cuda up front without GPUs; pretend one is visible so the
    # launch happens and fails on the ranks, as a real runtime failure does
    monkeypatch.setattr(checks, "gpu_count", lambda: 1)
    out = tmp_path / "o.jsonl"
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--steps",
            "0",
            "--runs",
            "1",
            "--max-tokens",
            "4",
            "--model-args",
            TINY + " --device cuda",
            "--nproc",
            "2",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 1, res.output
    for record in _records(out):
        assert record["status"] == "failed"
        assert "Error" in record["error"] and "torch/distributed" not in record["error"]
        assert "error_file" not in record["error"] and "====" not in record["error"]
    assert "failed: profile at steps 0: " in res.output


def test_sglang_launches_log_nccl_privately_and_report_the_check(cli_runner, tmp_path, monkeypatch):
    # The wrapped stand-in logs as NCCL does; NCCL_PROTO is "not read" by it: flagged.
    monkeypatch.setenv("STANDIN_NCCL_UNREAD", "NCCL_PROTO")
    wrapper = f"{sys.executable} {REPO_ROOT / 'tests' / 'nccl_debug_standin.py'}"
    out = tmp_path / "sg.jsonl"
    profile_file = tmp_path / "sys-ll.env"
    profile_file.write_text("NCCL_P2P_LEVEL=SYS\nNCCL_PROTO=LL\n")
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            str(profile_file),
            "--engine",
            "sglang",
            "--steps",
            "0",
            "--runs",
            "1",
            "--warmup",
            "0",
            "--max-tokens",
            "4",
            "--server-args",
            "--model-path m --tp 2",
            "--server-command",
            wrapper,
            "--out",
            str(out),
            "--health-timeout",
            "30",
        ],
    )
    assert res.exit_code == 0, res.output
    assert "NCCL log, baseline at steps 0: 1 process(es) logged NCCL; every profile variable" in res.output
    assert "NCCL log, profile at steps 0: 1 process(es) logged NCCL; NCCL_PROTO missing in 1" in res.output
    assert "NCCL's own log did not confirm every profile variable" in res.output
    records = _records(out)
    check = records[1]["detail"]["nccl_check"]
    assert check["ok"] is False and check["versions"] == ["2.27.5"]
    assert {v["name"]: v["status"] for v in check["variables"]} == {
        "NCCL_P2P_LEVEL": "confirmed",
        "NCCL_PROTO": "missing",
    }
    assert list(tmp_path.glob("*-profile-k0.nccl.*"))  # the private NCCL_DEBUG_FILE


# ---------------------------------------------------------------- the contract (issue 20)


def test_tok_s_intervals_never_go_below_zero():
    # 91.0 [-110, 292] on the plain t interval; on the log scale (as latencies): t(0.975, 2)
    # = 4.302653 over ln(10, 91, 172): mean 3.98698, sd 1.49275 -> exp(3.98698 -+ 3.70822)
    mean, ci = lib._ci([91.0, 10.0, 172.0])
    assert mean == pytest.approx(91.0)
    assert ci == pytest.approx([1.3216, 2201.3], rel=1e-3)
    assert lib._ci([100.0]) == (100.0, None)


def test_no_speedup_or_verdict_from_a_configuration_that_did_not_finish():
    measured = {
        ("baseline", 0): {"status": "ok", "runs_tok_s": [100.0, 101.0, 99.0]},
        ("profile", 0): {"status": "failed", "runs_tok_s": [300.0, 301.0]},  # partial runs
        ("baseline", 2): {"status": "timeout", "runs_tok_s": [150.0, 151.0]},
        ("profile", 2): {"status": "ok", "runs_tok_s": [149.0, 151.0, 150.0]},
    }
    rows = lib.build_rows(measured, [0, 2], None, None)
    assert all(r["speedup"] is None and r["verdict"] is None for r in rows)
    best = lib.best_steps(rows)
    assert best == {"baseline": 0, "profile": 2}  # the failed runs' higher tok/s decide nothing
    measured[("profile", 2)]["status"] = "failed"
    rows = lib.build_rows(measured, [0, 2], None, None)
    best = lib.best_steps(rows)
    assert best == {"baseline": 0, "profile": None}
    assert lib.overall_verdict(rows, best)[0] == "unknown"


@pytest.fixture
def listening():
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_a_port_that_already_answers_is_refused_before_any_launch(
    cli_runner, profile_file, tmp_path, monkeypatch, listening
):
    monkeypatch.setattr(lib, "measure_server", lambda *a: pytest.fail("launched"))
    out = tmp_path / "o.jsonl"
    res = cli_runner.invoke(
        cli,
        [
            "validate",
            "--profile",
            profile_file,
            "--engine",
            "vllm",
            "--server-command",
            "vllm-standin",
            "--steps",
            "0",
            "--server-args",
            f"--model m --port {listening}",
            "--out",
            str(out),
        ],
    )
    assert res.exit_code == 2, res.output
    assert res.output.strip().startswith(
        f"Error: --server-args: --port {listening}: something already answers on 127.0.0.1:{listening}"
    )
    assert not out.exists()


def test_a_server_does_not_start_on_a_port_that_answers(listening, tmp_path):
    from integration.server import Server, ServerError

    server = Server(
        lib.engine_of("vllm"),
        ["--model", "m", "--port", str(listening)],
        log_path=str(tmp_path / "s.log"),
        command=[sys.executable, "-c", "pass"],
    )
    with pytest.raises(ServerError, match=f"port {listening} on 127.0.0.1 already answers"):
        server.start()
    assert server.process is None
