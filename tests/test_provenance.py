"""Provenance: one field from records to every output (DESIGN.md section 8). Simulated
figures never read as "declared" or "effective"; where NCCL ran, trust is what its log said."""

from __future__ import annotations

import csv
import io
import json

import pytest

from nccl_tune.cli import cli
from nccl_tune.vocab import Provenance, provenance_of


@pytest.mark.parametrize(
    "record, expected",
    [
        ({"backend": "nccl"}, Provenance.NCCL),
        ({"backend": "gloo"}, Provenance.GLOO),
        ({"backend": "sim", "source": "modelled"}, Provenance.SIMULATED),  # what the sim backend writes
        ({"backend": "nccl-tests"}, Provenance.IMPORTED),
        ({"source": "modelled"}, Provenance.MODELLED),
        ({}, Provenance.IMPORTED),
    ],
)
def test_provenance_of_a_record(record, expected):
    assert provenance_of(record) is expected


def test_trust_words():
    # only where NCCL ran can its log confirm, contradict or not have seen the settings
    assert [Provenance.NCCL.trust(c) for c in (True, False, None)] == ["confirmed", "contradicted", "declared"]
    assert Provenance.IMPORTED.trust(None) == "declared"
    for prov in (Provenance.SIMULATED, Provenance.MODELLED, Provenance.GLOO):
        assert {prov.trust(c) for c in (True, False, None)} == {prov.value}
    assert json.dumps({"p": Provenance.SIMULATED}) == '{"p": "simulated"}'  # a str Enum


@pytest.fixture(scope="module")
def sim_results(tmp_path_factory):
    from click.testing import CliRunner

    out = tmp_path_factory.mktemp("sim") / "sim.jsonl"
    done = CliRunner().invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--topology",
            "pcie-shm",
            "--set",
            "NCCL_P2P_LEVEL=default,SYS",
            "--tokens",
            "1,4",
            "--rounds",
            "3",
            "--out",
            str(out),
        ],
    )
    assert done.exit_code == 0, done.output
    return out


def test_simulated_records_are_never_declared_in_recommend_or_its_exports(cli_runner, sim_results, tmp_path):
    env_file, csv_file = tmp_path / "p.env", tmp_path / "t.csv"
    shown = cli_runner.invoke(
        cli,
        [
            "recommend",
            "--layers",
            "61",
            "--results",
            str(sim_results),
            "--json",
            "--export",
            str(env_file),
            "--tuner-csv",
            str(csv_file),
            "--force",
        ],
    )
    assert shown.exit_code == 0, shown.output
    data = json.loads(shown.stdout)
    assert data["provenance"] == "simulated"
    assert data["recommended"]["trust"] == "simulated"
    assert {c["trust"] for c in data["cells"]} == {"simulated"}
    assert all(c["effective"] is None for c in [data["baseline"], *data["cells"]])
    header = dict(
        line[2:].split(": ", 1) for line in env_file.read_text().splitlines() if line.startswith("# ") and ": " in line
    )
    assert header["trust"] == "simulated" and header["source"] == "simulated"
    assert "declared" not in env_file.read_text()
    tuner = csv_file.read_text()
    assert "not observed" in tuner and "NCCL's log" not in tuner
    text = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", str(sim_results)])
    line = next(x for x in text.output.splitlines() if x.startswith("Recommended:"))
    assert line.endswith("; simulated: nothing ran, so no NCCL log confirms it")
    assert "declared" not in text.output


def test_report_shows_no_effective_choice_for_simulated_records(cli_runner, sim_results):
    rows = json.loads(cli_runner.invoke(cli, ["report", str(sim_results), "--json"]).stdout)
    assert {r["provenance"] for r in rows} == {"simulated"}
    assert all(r["effective"] is None and r["flag"] is None for r in rows)
    table = cli_runner.invoke(cli, ["report", str(sim_results), "--csv"]).stdout
    for row in csv.DictReader(io.StringIO(table)):
        assert row["provenance"] == "simulated" and row["effective_algo"] == ""
    text = cli_runner.invoke(cli, ["report", str(sim_results)]).output
    header = next(x for x in text.splitlines() if x.startswith("settings"))
    at = header.index("effective")
    for line in text.splitlines():
        if line.startswith(("baseline", "NCCL_")):
            assert line[at:].split()[0] == "-", line  # the effective column: nothing NCCL chose


def test_measured_nccl_records_keep_what_nccl_reported(cli_runner, tmp_path):
    from nccl_tune import stats, store

    records = []
    for rnd in (1, 2, 3):
        for env, lat in (({}, 40.0), ({"NCCL_PROTO": "LL"}, 30.0)):
            records.append(
                store.make_record(
                    env=env,
                    backend="nccl",
                    op="allreduce",
                    world_size=2,
                    bytes=14336,
                    dtype="bf16",
                    lat_us=stats.summarize([lat, lat + 0.5, lat + 1.0]),
                    samples_us=[lat, lat + 0.5, lat + 1.0],
                    round=rnd,
                    status="ok",
                    effective={"algo": "RING", "proto": "LL", "channels": 2, "confirmed": bool(env)},
                )
            )
    path = tmp_path / "r.jsonl"
    store.append_records(str(path), records)
    rows = json.loads(cli_runner.invoke(cli, ["report", str(path), "--json"]).stdout)
    cell = next(r for r in rows if r["env"])
    assert cell["provenance"] == "measured with NCCL"
    assert cell["effective"] == {"algo": "RING", "proto": "LL", "channels": 2}
    data = json.loads(cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", str(path), "--json"]).stdout)
    assert data["provenance"] == "measured with NCCL" and data["recommended"]["trust"] == "confirmed"
