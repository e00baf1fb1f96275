"""The results store: wrongly typed fields are skipped like corrupt lines, torn lines repaired."""

from __future__ import annotations

import json

import pytest

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.measure import grid as gridlib
from nccl_tune.measure import launch, simbackend
from nccl_tune.measure import sweep as sweeplib

NBYTES = 14336


def _good(**fields) -> dict:
    record = store.make_record(
        run_id="r1",
        env={"NCCL_PROTO": "LL"},
        backend="nccl",
        op="allreduce",
        mode="eager",
        world_size=2,
        nnodes=1,
        bytes=NBYTES,
        dtype="bf16",
        iters=3,
        lat_us={
            "min": 9.0,
            "p10": 9.5,
            "p50": 10.0,
            "p90": 11.0,
            "p99": 12.0,
            "max": 12.0,
            "mean": 10.2,
            "cv": 0.05,
            "n": 3,
        },
        samples_us=[9.0, 10.0, 12.0],
        algbw_gbps=1.4,
        busbw_gbps=1.4,
        correct=True,
        wrong=0,
        effective={"algo": "Ring", "proto": "LL", "channels": 2, "confirmed": True, "detail": "x"},
        versions={"nccl": "2.21.5", "torch": "2.4", "cuda": None},
        gpus=["H100"],
        hosts=["h"],
        topology="nvlink",
        round=1,
        label="l",
        rung=0,
        final=True,
        superseded=False,
        strategy="exhaustive",
        isolation="group",
        source_file="a.txt",
        conf_files={"/etc/nccl.conf": {"NCCL_DEBUG": "WARN"}},
    )
    record.update(fields)
    return record


# Every checked field with a value of the wrong type (or out of range).
BAD_FIELDS = [
    ("run_id", 5),
    ("cell", ["x"]),
    ("env", [1]),
    ("env", {"NCCL_PROTO": 5}),
    ("backend", 1),
    ("op", {}),
    ("mode", 2),
    ("world_size", "eight"),
    ("world_size", 0),
    ("world_size", True),
    ("world_size", 10**20),  # past the option vocabulary's bounds (nccl_tune.vocab): a typo, not a machine
    ("nnodes", 1.5),
    ("nnodes", 10**6),
    ("bytes", "abc"),
    ("bytes", 0),
    ("bytes", -4),
    ("bytes", 10**30),
    ("dtype", 2),
    ("iters", -1),
    ("iters", 10**12),
    ("lat_us", "zz"),
    ("lat_us", {"p50": "zz"}),
    ("lat_us", {"p50": -1.0}),
    ("lat_us", {"p50": float("nan")}),
    ("lat_us", {"p50": float("inf")}),
    ("lat_us", {"n": 2.5}),
    ("lat_us", {"p50": 0.0}),
    ("lat_us", {"cv": "x"}),
    ("samples_us", ["a"]),
    ("samples_us", "abc"),
    ("samples_us", [1.0, float("nan")]),
    ("algbw_gbps", "x"),
    ("busbw_gbps", -1),
    ("correct", "yes"),
    ("wrong", "3"),
    ("wrong", -1),
    ("effective", "Ring"),
    ("effective", {"channels": ["x"]}),
    ("effective", {"algo": 1}),
    ("effective", {"confirmed": "y"}),
    ("versions", "2.21"),
    ("versions", {"nccl": 2}),
    ("host", 7),
    ("hosts", "h"),
    ("gpus", "H100"),
    ("gpus", [1]),
    ("topology", 3),
    ("status", "bogus"),
    ("status", 1),
    ("error", 5),
    ("time", 1),
    ("round", "x"),
    ("round", 1.5),
    ("label", 3),
    ("rung", "0"),
    ("final", "no"),
    ("superseded", 1),
    ("strategy", 3),
    ("isolation", 1),
    ("source_file", 2),
    ("conf_files", {"/etc/nccl.conf": ["NCCL_DEBUG"]}),
    ("conf_files", "x"),
    ("sweep", "x"),
]


def test_the_schema_table_covers_every_contract_field_readers_use():
    missing = [f for f in store.FIELDS if f not in store.FIELD_TYPES and f != "schema"]
    assert missing == []
    assert {name for name, _ in BAD_FIELDS} == set(store.FIELD_TYPES)


def test_a_good_record_and_nulls_pass():
    assert store.field_problem(_good()) is None
    assert store.field_problem(_good(status="timeout", lat_us={"p50": 0.0})) is None
    assert store.field_problem(store.make_record(env={})) is None
    assert store.field_problem({name: None for name in store.FIELD_TYPES}) is None


@pytest.mark.parametrize("name,value", BAD_FIELDS, ids=[f"{n}={v!r}" for n, v in BAD_FIELDS])
def test_wrongly_typed_field_is_skipped_with_a_warning(tmp_path, name, value):
    path = tmp_path / "r.jsonl"
    good = _good()
    lines = [json.dumps(good), json.dumps(_good(**{name: value})), json.dumps(_good(round=2))]
    path.write_text("\n".join(lines) + "\n")
    warnings = []
    records = list(store.iter_records(str(path), warnings.append))
    assert [r["round"] for r in records] == [1, 2]
    assert len(warnings) == 1
    assert warnings[0].startswith(f"{path}:2: skipped: field {name} ")


def test_schema_of_the_wrong_type_is_skipped(tmp_path):
    path = tmp_path / "r.jsonl"
    path.write_text(json.dumps(_good(schema="1")) + "\n" + json.dumps(_good()) + "\n")
    warnings = []
    assert len(list(store.iter_records(str(path), warnings.append))) == 1
    assert warnings == [f'{path}:1: skipped: field schema is "1", expected a positive integer']


def _sim_results(path, rounds=3):
    land = simbackend.make_landscape("nccl", "pcie-shm", seed=3)
    engine = sweeplib.SweepEngine(
        sweeplib.MeasureOptions("sim", (NBYTES,), iters=50), launch.Launcher(nproc=8), str(path), landscape=land
    )
    cells = gridlib.build_grid(gridlib.spec_from_sets(["NCCL_PROTO=LL"]), None, False).cells
    sweeplib.run_rounds(engine, cells, rounds=rounds, seed=1)
    return cells, land


BAD_LINES = [
    {"bytes": "abc"},
    {"lat_us": {"p50": "zz"}},
    {"env": [1]},
    {"cell": ["x"]},
    {"round": "x"},
    {"samples_us": ["a"]},
    {"world_size": "eight"},
    {"lat_us": {"p50": -3.0}},
    {"bytes": 0},
]


def _with_bad_lines(path):
    template = json.loads(path.read_text().splitlines()[0])
    with open(path, "a") as handle:
        for bad in BAD_LINES:
            handle.write(json.dumps({**template, **bad}) + "\n")
        handle.write(json.dumps({**template, "lat_us": {"p50": float("nan")}}) + "\n")


@pytest.mark.parametrize(
    "command", [["report"], ["report", "--json"], ["report", "--csv"], ["recommend", "--layers", "61"]]
)
def test_readers_skip_wrongly_typed_lines_instead_of_crashing(tmp_path, cli_runner, command):
    path = tmp_path / "r.jsonl"
    _sim_results(path)
    _with_bad_lines(path)
    args = [*command, str(path)] if command[0] == "report" else [*command, "--results", str(path)]
    result = cli_runner.invoke(cli, args)
    assert result.exception is None or isinstance(result.exception, SystemExit), result.output
    assert result.exit_code == 0, result.output
    assert result.stderr.count("skipped: field ") == len(BAD_LINES) + 1


def test_sweep_resume_skips_wrongly_typed_lines(tmp_path):
    path = tmp_path / "r.jsonl"
    cells, land = _sim_results(path, rounds=1)
    _with_bad_lines(path)
    warnings = []
    engine = sweeplib.SweepEngine(
        sweeplib.MeasureOptions("sim", (NBYTES,), iters=50),
        launch.Launcher(nproc=8),
        str(path),
        landscape=land,
        warn=warnings.append,
    )
    sweeplib.run_rounds(engine, cells, rounds=1, seed=1)
    assert engine.stats.cells_reused == len(cells) and engine.stats.cells_measured == 0
    assert len(warnings) == len(BAD_LINES) + 1


def test_append_after_a_torn_last_line_starts_a_new_line(tmp_path):
    path = tmp_path / "r.jsonl"
    store.append_record(str(path), _good())
    with open(path, "a") as handle:
        handle.write('{"schema": 1, "cell": "tr')  # a crash mid-write: no newline
    store.append_record(str(path), _good(round=2))
    warnings = []
    assert [r["round"] for r in store.iter_records(str(path), warnings.append)] == [1, 2]
    assert len(warnings) == 1 and warnings[0].startswith(f"{path}:2: skipped: not JSON")


def test_sweep_resume_after_a_torn_line_loses_no_new_record(tmp_path):
    path = tmp_path / "r.jsonl"
    cells, land = _sim_results(path, rounds=1)
    text = path.read_text()
    path.write_text(text[:-40])  # the last record cut mid-line, as a crash leaves it
    warnings = []
    engine = sweeplib.SweepEngine(
        sweeplib.MeasureOptions("sim", (NBYTES,), iters=50),
        launch.Launcher(nproc=8),
        str(path),
        landscape=land,
        warn=warnings.append,
    )
    sweeplib.run_rounds(engine, cells, rounds=2, seed=1)
    assert engine.stats.cells_reused == len(cells) - 1
    records = store.read_records([str(path)], warnings.append)
    keys = [(r["cell"], r["round"]) for r in records]
    assert sorted(keys) == sorted({(c.id, rnd) for c in cells for rnd in (1, 2)})
    assert all("not JSON" in w for w in warnings)
