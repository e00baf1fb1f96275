"""The report: aggregation details, multiplicity adjustment, flags and the command's outputs."""

from __future__ import annotations

import csv
import io
import json
import zlib
from pathlib import Path

import factories
import numpy as np
import pytest

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.decide import report

NBYTES = 14336


def _record(env, round_, p50, *, backend="nccl", status="ok", confirmed=True, error=None, **extra):
    # crc32, not hash(): str hashes are salted per process, so data would differ run to run.
    rng = np.random.default_rng(zlib.crc32(repr((sorted(env.items()), round_)).encode()))
    samples = list(p50 * rng.lognormal(0, 0.01, 50))
    effective = (
        None
        if backend in ("gloo",)
        else {"algo": "Ring", "proto": "LL", "channels": 2, "confirmed": confirmed, "detail": "test"}
    )
    return factories.record(
        env,
        NBYTES,
        p50=p50,
        samples_us=samples,
        round_=round_,
        backend=backend,
        nnodes=1,
        status=status,
        error=error,
        effective=effective,
        **extra,
    )


def _write(tmp_path, records, name="r.jsonl"):
    return Path(factories.write_records(tmp_path, records, name))


def test_adjust_p_bh_and_bonferroni():
    assert report.adjust_p([0.01, 0.04, 0.03, 0.5], "bh") == pytest.approx([0.04, 0.04 * 4 / 3, 0.04 * 4 / 3, 0.5])
    assert report.adjust_p([0.01, 0.04, 0.03, 0.5], "bonferroni") == pytest.approx([0.04, 0.16, 0.12, 1.0])
    assert report.adjust_p([0.2], "bh") == [0.2]
    with pytest.raises(ValueError):
        report.adjust_p([0.1, 0.2], "holm")


def test_superseded_records_are_left_out():
    records = [_record({}, r, 50.0) for r in (1, 2, 3)]
    records += [_record({"NCCL_PROTO": "LL"}, r, 40.0, isolation="process") for r in (1, 2, 3)]
    records += [_record({"NCCL_PROTO": "LL"}, r, 99.0, superseded=True, final=False) for r in (1, 2, 3)]
    rows = report.summarize(records)
    assert [(s.cell == store.BASELINE, s.final) for s in rows] == [(True, True), (False, True)]
    assert rows[1].p50_us == pytest.approx(40.0) and rows[1].verdict == "faster"


def test_multiplicity_adjustment_is_recorded():
    records = [_record({}, r, 50.0 + 0.3 * np.sin(r)) for r in range(1, 6)]
    for k in range(8):
        records += [
            _record({"NCCL_NTHREADS": str(64 + 32 * k)}, r, 50.0 + 0.3 * np.cos(r * (k + 1))) for r in range(1, 6)
        ]
    rows = [s for s in report.summarize(records) if s.cell != store.BASELINE]
    pvalues = [s.p_value for s in rows]
    assert len(rows) == 8 and None not in pvalues
    # Benjamini-Hochberg from its definition: p_i adjusted = min over p_j >= p_i of p_j m / rank_j.
    ranked = sorted(pvalues)
    expected = [min(1.0, min(q * len(ranked) / (k + 1) for k, q in enumerate(ranked) if q >= p)) for p in pvalues]
    assert [s.p_adjusted for s in rows] == pytest.approx(expected)
    assert any(s.p_adjusted > s.p_value for s in rows)  # the adjustment did something
    raw = [s for s in report.summarize(records, adjust="none") if s.cell != store.BASELINE]
    assert all(a.p_adjusted == a.p_value for a in raw)


def test_single_values_give_a_difference_but_no_interval_or_verdict():
    base = store.make_record(env={}, backend="nccl-tests", bytes=NBYTES, lat_us={"p50": 60.0}, round=1)
    cell = store.make_record(
        env={"NCCL_PROTO": "LL"}, backend="nccl-tests", bytes=NBYTES, lat_us={"p50": 22.0}, round=1
    )
    rows = report.summarize([base, cell])
    assert rows[0].ci_us is None and rows[1].ci_us is None
    assert rows[1].delta_us == pytest.approx(-38.0)
    assert rows[1].delta_ci_us is None and rows[1].verdict is None


def test_observation_flags():
    base = [_record({}, r, 50.0, confirmed=None) for r in (1, 2, 3)]
    unverified = [_record({"NCCL_ALGO": "Tree"}, r, 49.0, confirmed=None) for r in (1, 2, 3)]
    contradicted = [_record({"NCCL_PROTO": "LL"}, r, 48.0, confirmed=False) for r in (1, 2, 3)]
    confirmed = [_record({"NCCL_PROTO": "Simple"}, r, 60.0, confirmed=True) for r in (1, 2, 3)]
    rows = {s.cell: s for s in report.summarize(base + unverified + contradicted + confirmed)}
    from nccl_tune.decide.report import observation_flag

    assert observation_flag(rows[store.BASELINE]) is None
    assert observation_flag(rows[store.cell_id({"NCCL_ALGO": "Tree"})]).startswith("unverified")
    assert observation_flag(rows[store.cell_id({"NCCL_PROTO": "LL"})]).startswith("contradicted")
    assert observation_flag(rows[store.cell_id({"NCCL_PROTO": "Simple"})]) is None


def _mixed(tmp_path):
    records = [_record({}, r, 50.0) for r in (1, 2, 3)]
    records += [_record({"NCCL_PROTO": "LL"}, r, 42.0, confirmed=None) for r in (1, 2, 3)]
    records += [
        _record({"NCCL_PROTO": "LL128"}, r, 30.0, status="wrong", correct=False, error="1024 wrong elements")
        for r in (1, 2, 3)
    ]
    records.append(
        _record(
            {"NCCL_ALGO": "Tree"},
            1,
            0.0,
            status="timeout",
            error="launch timed out; last lines of output:\nNCCL WARN stuck",
        )
    )
    return _write(tmp_path, records)


def test_report_text_lists_failures_and_flags(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["report", str(_mixed(tmp_path))])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "allreduce, 14336 B, world 8, backend nccl" in out
    assert "wrong    NCCL_PROTO=LL128 @ 14336 B: 1024 wrong elements" in out
    assert "timeout  NCCL_ALGO=Tree @ 14336 B: launch timed out: NCCL WARN stuck" in out
    assert "! unverified" in out and "flagged '!'" in out
    assert "SIMULATED" not in out


def test_report_json_keys(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["report", str(_mixed(tmp_path)), "--json"])
    rows = json.loads(result.stdout)
    for key in (
        "cell",
        "env",
        "bytes",
        "p50_us",
        "ci_us",
        "delta_us",
        "delta_ci_us",
        "verdict",
        "status",
        "flag",
        "simulated",
        "p_value",
        "p_adjusted",
        "effective",
        "errors",
    ):
        assert all(key in row for row in rows)
    by_cell = {r["cell"]: r for r in rows}
    ll = by_cell[store.cell_id({"NCCL_PROTO": "LL"})]
    assert ll["verdict"] == "faster" and ll["delta_us"] == pytest.approx(-8.0, abs=0.5)
    assert ll["flag"].startswith("unverified")
    wrong = by_cell[store.cell_id({"NCCL_PROTO": "LL128"})]
    assert wrong["status"] == "wrong" and wrong["verdict"] is None  # never a candidate


def test_report_csv(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["report", str(_mixed(tmp_path)), "--csv"])
    rows = list(csv.DictReader(io.StringIO(result.stdout)))
    assert len(rows) == 4 and rows[0]["cell"] == store.BASELINE
    assert {r["status"] for r in rows} == {"ok", "wrong", "timeout"}
    ll = next(r for r in rows if r["env"] == "NCCL_PROTO=LL")
    assert ll["verdict"] == "faster" and float(ll["delta_ci_hi_us"]) < 0


def test_report_corrupt_line_is_skipped_with_a_warning(cli_runner, tmp_path):
    path = _mixed(tmp_path)
    lines = path.read_text().splitlines()
    lines.insert(2, '{"schema": 1, "cell": "trunc')
    path.write_text("\n".join(lines) + "\n")
    result = cli_runner.invoke(cli, ["report", str(path), "--json"])
    assert result.exit_code == 0
    assert f"{path}:3: skipped: not JSON" in result.stderr
    assert len(json.loads(result.stdout)) == 4


def test_report_simulated_and_gloo_notes(cli_runner, tmp_path):
    sim = _write(tmp_path, [_record({}, 1, 50.0, backend="sim", source="modelled")], "sim.jsonl")
    assert "SIMULATED" in cli_runner.invoke(cli, ["report", str(sim)]).output
    gloo = _write(
        tmp_path,
        [_record({}, 1, 50.0, backend="gloo"), _record({"NCCL_PROTO": "LL"}, 1, 51.0, backend="gloo")],
        "gloo.jsonl",
    )
    out = cli_runner.invoke(cli, ["report", str(gloo)]).output
    assert "NCCL settings do not affect gloo" in out and "! " not in out


def test_report_without_baseline_and_empty(cli_runner, tmp_path):
    path = _write(tmp_path, [_record({"NCCL_PROTO": "LL"}, 1, 50.0)])
    assert "no baseline records" in cli_runner.invoke(cli, ["report", str(path)]).output
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    result = cli_runner.invoke(cli, ["report", str(empty)])
    assert result.exit_code == 2 and "no records" in result.output


def test_plot(cli_runner, tmp_path):
    pytest.importorskip("matplotlib")
    records = []
    for nbytes, scale in ((14336, 1.0), (57344, 1.4)):
        for env, p50 in (({}, 50.0), ({"NCCL_PROTO": "LL"}, 40.0)):
            for r in (1, 2, 3):
                rec = _record(env, r, p50 * scale)
                rec["bytes"] = nbytes
                records.append(rec)
    png = tmp_path / "lat.png"
    result = cli_runner.invoke(cli, ["report", str(_write(tmp_path, records)), "--plot", str(png)])
    assert result.exit_code == 0 and "plot:" in result.output
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_so(cli_runner, tmp_path, monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.startswith("matplotlib"):
            raise ImportError("no matplotlib")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    result = cli_runner.invoke(cli, ["report", str(_mixed(tmp_path)), "--plot", str(tmp_path / "x.png")])
    assert result.exit_code == 2 and "--plot needs matplotlib: pip install 'nccl-tune[plot]'" in result.output


# ---------------------------------------------------------------- comparison families


def test_records_of_two_machines_mode_or_dtype_are_never_compared():
    records = []
    for host, gpu, base, cell in (("box-a", "NVIDIA A40", 80.0, 60.0), ("box-b", "NVIDIA H100", 20.0, 25.0)):
        records += [_record({}, r, base, host=host, hosts=[host], gpus=[gpu] * 8) for r in (1, 2, 3)]
        records += [_record({"NCCL_PROTO": "LL"}, r, cell, host=host, hosts=[host], gpus=[gpu] * 8) for r in (1, 2, 3)]
    rows = report.summarize(records)
    assert [(s.machine, s.cell == store.BASELINE) for s in rows] == [
        ("host box-a (NVIDIA A40)", True),
        ("host box-a (NVIDIA A40)", False),
        ("host box-b (NVIDIA H100)", True),
        ("host box-b (NVIDIA H100)", False),
    ]
    assert [s.verdict for s in rows if s.cell != store.BASELINE] == ["faster", "slower"]
    assert rows[0].p50_us == pytest.approx(80.0, rel=0.01)  # not a blend of the two machines
    same_host = [_record({}, r, 50.0, mode="graph", dtype="bf16") for r in (1, 2, 3)]
    same_host += [_record({}, r, 70.0, mode="eager", dtype="bf16") for r in (1, 2, 3)]
    same_host += [_record({}, r, 90.0, mode="graph", dtype="fp32") for r in (1, 2, 3)]
    rows = report.summarize(same_host)
    assert sorted((s.mode, s.dtype, round(s.p50_us)) for s in rows) == [
        ("eager", "bf16", 70),
        ("graph", "bf16", 50),
        ("graph", "fp32", 90),
    ]


def test_a_sweeps_records_with_a_failed_filler_stay_one_family():
    ok = [
        _record(env, r, 50.0, host="h", hosts=["h"], gpus=["G"] * 8, mode="graph", dtype="bf16")
        for env in ({}, {"NCCL_PROTO": "LL"})
        for r in (1, 2, 3)
    ]
    # The engine's own record for a crashed cell: no GPU names (no rank reported any).
    filler = _record(
        {"NCCL_ALGO": "Tree"},
        2,
        1.0,
        host="h",
        status="failed",
        mode="graph",
        dtype="bf16",
        error="launch exited with code 3",
    )
    rows = report.summarize(ok + [filler])
    assert {s.machine for s in rows} == {"host h (G)"} and len(rows) == 3
    assert {s.status for s in rows} == {"ok", "failed"}


def test_imported_files_of_two_machines_are_reported_apart(cli_runner, tmp_path, real_fixtures):
    folder = real_fixtures / "nccl_tests"
    a40 = folder / "a40_4gpu_sys_boundary_p2p_disabled_table_only.txt"
    dgx = folder / "dgx_h100_4gpu_nvswitch_table_only.txt"
    out = tmp_path / "r.jsonl"
    assert cli_runner.invoke(cli, ["import-nccl-tests", str(a40), str(dgx), "--out", str(out)]).exit_code == 0
    rows = json.loads(cli_runner.invoke(cli, ["report", str(out), "--json"]).stdout)
    assert len(rows) == 8 and all(r["n_rounds"] == 1 for r in rows)
    at_1g = sorted((r["machine"], r["p50_us"]) for r in rows if r["bytes"] == 1073741824)
    assert at_1g == [(f"file {a40.name}", 1121937.0), (f"file {dgx.name}", 4367.9)]
    text = cli_runner.invoke(cli, ["report", str(out)]).output
    assert f"allreduce, 1073741824 B, world 4, backend nccl-tests, float; file {a40.name}" in text
    assert f"; file {dgx.name}" in text
    # The same machine named at import (--host): files are compared with each other.
    both = tmp_path / "both.jsonl"
    for env in ("", "NCCL_PROTO=LL"):
        result = cli_runner.invoke(
            cli, ["import-nccl-tests", str(a40), "--env", env, "--host", "box", "--out", str(both)]
        )
        assert result.exit_code == 0, result.output
    rows = json.loads(cli_runner.invoke(cli, ["report", str(both), "--json"]).stdout)
    assert {r["machine"] for r in rows} == {"host box"}
    assert all(r["delta_us"] == 0.0 for r in rows if r["cell"] != store.BASELINE)


def test_imported_rank_lines_name_the_machine(real_fixtures):
    from nccl_tune.measure import importers

    records, _ = importers.import_file(str(real_fixtures / "nccl_tests" / "oke_a100_2node_nccl2.25.txt"))
    (row,) = [s for s in report.summarize(records) if s.bytes == records[0]["bytes"]]
    assert row.machine.startswith("hosts ") and "NVIDIA A100" in row.machine


def test_report_csv_and_json_carry_the_context(cli_runner, tmp_path):
    path = str(_mixed(tmp_path))
    rows = json.loads(cli_runner.invoke(cli, ["report", path, "--json"]).stdout)
    assert all("machine" in r and "mode" in r and "dtype" in r for r in rows)
    text = cli_runner.invoke(cli, ["report", path, "--csv"]).stdout
    first = next(csv.DictReader(io.StringIO(text)))
    assert first["machine"].startswith("host ")


def test_reduction_ops_are_compared_apart(tmp_path, cli_runner):
    # nccl-tests -o all: max and min rows at the same size are different measurements.
    rows = [
        store.make_record(
            env={},
            backend="nccl-tests",
            op="allreduce",
            world_size=16,
            bytes=196608,
            dtype="float",
            redop=redop,
            lat_us={"p50": p50},
            round=1,
        )
        for redop, p50 in (("max", 125.6), ("min", 131.1))
    ]
    summaries = report.summarize(rows)
    assert [(s.redop, s.p50_us) for s in summaries] == [("max", 125.6), ("min", 131.1)]
    result = cli_runner.invoke(cli, ["report", str(_write(tmp_path, rows))])
    assert result.exit_code == 0, result.output
    assert "float, redop max" in result.output and "float, redop min" in result.output
