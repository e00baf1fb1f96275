"""The report: aggregation details, multiplicity adjustment, flags and the command's outputs."""

from __future__ import annotations

import csv
import io
import json

import numpy as np
import pytest

from nccl_tune import report, store
from nccl_tune.cli import cli

NBYTES = 14336


def _record(env, round_, p50, *, backend="nccl", status="ok", confirmed=True, error=None, **extra):
    rng = np.random.default_rng(abs(hash((tuple(env.items()), round_))) % 2**32)
    samples = list(p50 * rng.lognormal(0, 0.01, 50))
    effective = None if backend in ("gloo",) else {"algo": "Ring", "proto": "LL", "channels": 2,
                                                    "confirmed": confirmed, "detail": "test"}
    return store.make_record(env=env, backend=backend, op="allreduce", world_size=8, nnodes=1,
                             bytes=NBYTES, lat_us={"p50": p50}, samples_us=samples, round=round_,
                             status=status, error=error, effective=effective, **extra)


def _write(tmp_path, records, name="r.jsonl"):
    path = tmp_path / name
    store.append_records(str(path), records)
    return path


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
        records += [_record({"NCCL_NTHREADS": str(64 + 32 * k)}, r, 50.0 + 0.3 * np.cos(r * (k + 1)))
                    for r in range(1, 6)]
    rows = [s for s in report.summarize(records) if s.cell != store.BASELINE]
    assert all(s.p_adjusted is not None and s.p_adjusted >= s.p_value for s in rows)
    raw = [s for s in report.summarize(records, adjust="none") if s.cell != store.BASELINE]
    assert all(a.p_adjusted == a.p_value for a in raw)


def test_single_values_give_a_difference_but_no_interval_or_verdict():
    base = store.make_record(env={}, backend="nccl-tests", bytes=NBYTES, lat_us={"p50": 60.0}, round=1)
    cell = store.make_record(env={"NCCL_PROTO": "LL"}, backend="nccl-tests", bytes=NBYTES,
                             lat_us={"p50": 22.0}, round=1)
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
    from nccl_tune.commands.report import observation_flag

    assert observation_flag(rows[store.BASELINE]) is None
    assert observation_flag(rows[store.cell_id({"NCCL_ALGO": "Tree"})]).startswith("unverified")
    assert observation_flag(rows[store.cell_id({"NCCL_PROTO": "LL"})]).startswith("contradicted")
    assert observation_flag(rows[store.cell_id({"NCCL_PROTO": "Simple"})]) is None


def _mixed(tmp_path):
    records = [_record({}, r, 50.0) for r in (1, 2, 3)]
    records += [_record({"NCCL_PROTO": "LL"}, r, 42.0, confirmed=None) for r in (1, 2, 3)]
    records += [_record({"NCCL_PROTO": "LL128"}, r, 30.0, status="wrong", correct=False,
                        error="1024 wrong elements") for r in (1, 2, 3)]
    records.append(_record({"NCCL_ALGO": "Tree"}, 1, 0.0, status="timeout",
                           error="launch timed out; last lines of output:\nNCCL WARN stuck"))
    return _write(tmp_path, records)


def test_report_text_lists_failures_and_flags(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["report", str(_mixed(tmp_path))])
    assert result.exit_code == 0, result.output
    out = result.output
    assert "allreduce, 14336 B, world 8, backend nccl" in out
    assert "wrong    NCCL_PROTO=LL128 @ 14336 B: 1024 wrong elements" in out
    assert "timeout  NCCL_ALGO=Tree @ 14336 B: launch timed out; last lines of output:" in out
    assert "! unverified" in out and "flagged '!'" in out
    assert "SIMULATED" not in out


def test_report_json_keys(cli_runner, tmp_path):
    result = cli_runner.invoke(cli, ["report", str(_mixed(tmp_path)), "--json"])
    rows = json.loads(result.stdout)
    for key in ("cell", "env", "bytes", "p50_us", "ci_us", "delta_us", "delta_ci_us", "verdict",
                "status", "flag", "simulated", "p_value", "p_adjusted", "effective", "errors"):
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
    gloo = _write(tmp_path, [_record({}, 1, 50.0, backend="gloo"),
                             _record({"NCCL_PROTO": "LL"}, 1, 51.0, backend="gloo")], "gloo.jsonl")
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
