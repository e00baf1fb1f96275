"""recommend says what its figures are, the same way in the table, --json and the exports:
gloo results named as such, one trust word, --force writing what its help promises, the
Recommended line after --force, implausible baselines flagged, one default topology
(shared with validate), and validate records refused by report and recommend by name."""

from __future__ import annotations

import json

import factories
import pytest

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.model import costmodel


def _records(backend="gloo", gain=0.0, rounds=3, seed=1):
    """Latency records of a sweep on `backend`: a baseline and one cell `gain` us faster."""
    cells = [({}, lambda b: 60.0 + b / 4000), ({"NCCL_PROTO": "LL"}, lambda b: 60.0 - gain + b / 4000)]
    return factories.sweep_records(
        cells,
        (8192, 14336, 28672),
        rounds=rounds,
        first_round=1,
        noise=3.0,
        samples=20,
        seed=seed,
        backend=backend,
        world_size=2,
    )


_write = factories.write_records


def _header(path) -> dict:
    lines = [line[2:].rstrip("\n") for line in open(path) if line.startswith("# ") and ": " in line]
    return dict(line.split(": ", 1) for line in lines)


def test_gloo_results_carry_the_gloo_note_and_the_export_says_measured_on_gloo(cli_runner, tmp_path):
    results = _write(tmp_path, _records("gloo", gain=0.5))
    out = tmp_path / "p.env"
    shown = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", results, "--json"])
    assert shown.exit_code == 0, shown.output
    assert any("NCCL settings do not affect gloo" in n for n in json.loads(shown.output)["notes"])
    text = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", results])
    assert "NCCL settings do not affect gloo" in text.output
    forced = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", results, "--export", str(out), "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert _header(out)["source"].startswith("measured on gloo")


def test_nccl_results_are_plainly_measured(cli_runner, tmp_path):
    results = _write(tmp_path, _records("nccl", gain=20.0))
    out = tmp_path / "p.env"
    done = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", results, "--export", str(out)])
    assert done.exit_code == 0, done.output
    assert _header(out)["source"] == "measured with NCCL"
    assert "do not affect gloo" not in done.output


def test_trust_is_one_word_in_json_and_in_the_exported_header(cli_runner, tmp_path):
    out = tmp_path / "m.env"
    shown = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-shm", "--json", "--export", str(out), "--force"]
    )
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.output)
    assert data["recommended"]["trust"] == "modelled"
    assert {c["trust"] for c in data["cells"]} == {"modelled"}
    assert _header(out)["trust"] == data["recommended"]["trust"]
    # measured: declared (no NCCL log) in both
    results = _write(tmp_path, _records("nccl", gain=20.0))
    out2 = tmp_path / "d.env"
    measured = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", results, "--json", "--export", str(out2)]
    )
    assert json.loads(measured.output)["recommended"]["trust"] == _header(out2)["trust"] == "declared"


def test_force_writes_the_tuner_csv_without_a_significant_winner(cli_runner, tmp_path):
    results = _write(tmp_path, _records("nccl", gain=0.3))  # a small, noisy gain: not significant
    csv_path = tmp_path / "t.csv"
    plain = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", results, "--tuner-csv", str(csv_path)])
    assert "Keep NCCL's defaults" in plain.output and not csv_path.exists()
    assert plain.exit_code == 1  # a file asked for and not written
    forced = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", results, "--tuner-csv", str(csv_path), "--force", "--json"]
    )
    assert forced.exit_code == 0, forced.output
    files = json.loads(forced.output)["files"]["tuner_csv"]
    assert files["written"] and files["forced"], files
    text = csv_path.read_text()
    assert "NOT significant" in text
    assert any(line.startswith("allreduce,") for line in text.splitlines())


def test_recommended_line_after_force_does_not_ask_for_force(cli_runner, tmp_path):
    out = tmp_path / "m.env"
    plain = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--topology", "pcie-shm"])
    assert "export needs --force" in plain.output
    forced = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-shm", "--export", str(out), "--force"]
    )
    line = next(x for x in forced.output.splitlines() if x.startswith("Recommended:"))
    assert "needs --force" not in line and "--force" in line
    results = _write(tmp_path, _records("nccl", gain=0.0))
    kept = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", results, "--force", "--export", str(tmp_path / "k.env")]
    )
    line = next(x for x in kept.output.splitlines() if x.startswith("Keep NCCL's defaults"))
    assert "write nothing without --force" not in line


def test_collectives_longer_than_the_whole_token_are_flagged(cli_runner, tmp_path):
    # 123 allreduces x ~2.5 ms (gloo on a busy CPU) = 308 ms of collectives per token,
    # against 15.9 ms per token at 62.9 tok/s
    records = [
        {
            **r,
            "lat_us": {**r["lat_us"], "p50": r["lat_us"]["p50"] * 40},
            "samples_us": [x * 40 for x in r["samples_us"]],
        }
        for r in _records("gloo")
    ]
    results = _write(tmp_path, records)
    shown = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", results, "--baseline-tok-s", "62.9", "--json"]
    )
    notes = json.loads(shown.output)["notes"]
    assert any(n.startswith("IMPLAUSIBLE") and "15.9 ms per token" in n for n in notes), notes
    sane = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--results", results, "--baseline-tok-s", "0.1", "--json"]
    )
    assert not any(n.startswith("IMPLAUSIBLE") for n in json.loads(sane.output)["notes"])
    modelled = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-shm", "--baseline-tok-s", "500"]
    )
    assert "IMPLAUSIBLE" in modelled.output


def test_validate_and_recommend_model_the_same_machine_by_default(cli_runner, tmp_path, monkeypatch):
    from integration import validate as lib
    from nccl_tune.nccl import topology

    monkeypatch.setattr(topology, "detect_kind", lambda: None)  # no GPU found
    shown = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--json"])
    assert json.loads(shown.output)["topology"] == costmodel.DEFAULT_TOPOLOGY
    seen = {}

    def fake_run(opts, on_config=None):
        seen["topology"] = opts.topology
        raise SystemExit(0)

    monkeypatch.setattr(lib, "run", fake_run)
    profile = tmp_path / "p.env"
    profile.write_text("NCCL_PROTO=LL\n")
    cli_runner.invoke(cli, ["validate", "--profile", str(profile), "--nproc", "2", "--out", str(tmp_path / "v.jsonl")])
    assert seen["topology"] == costmodel.DEFAULT_TOPOLOGY
    assert (
        lib.Options(profile_env={}, profile_name="p", engine="builtin", steps=[0]).topology
        == costmodel.DEFAULT_TOPOLOGY
    )


def _validate_records(path):
    for label, env in (("baseline", {}), ("profile", {"NCCL_PROTO": "LL"})):
        store.append_record(
            str(path),
            store.make_record(
                env=env,
                backend="gloo",
                op="spec_decode",
                world_size=2,
                status="ok",
                label=label,
                engine="builtin",
                steps=0,
                tok_s=50.0,
                runs_tok_s=[50.0, 51.0],
            ),
        )


@pytest.mark.parametrize("command", [["report"], ["recommend", "--layers", "61", "--results"]])
def test_report_and_recommend_name_validate_records(cli_runner, tmp_path, command):
    path = tmp_path / "validate.jsonl"
    _validate_records(path)
    result = cli_runner.invoke(cli, [*command, str(path)])
    assert result.exit_code == 2, result.output
    assert "validate records" in result.output and "nccl-tune validate" in result.output


def test_report_sets_validate_records_aside_beside_latency_records(cli_runner, tmp_path):
    path = tmp_path / "mixed.jsonl"
    _validate_records(path)
    store.append_records(str(path), _records("gloo"))
    result = cli_runner.invoke(cli, ["report", str(path)])
    assert result.exit_code == 0, result.output
    assert "2 validate records" in result.output and "baseline (NCCL defaults)" in result.output
