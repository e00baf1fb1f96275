"""nccl-tests import: every real fixture, every layout variant of our own, garbage input."""

from __future__ import annotations

import json

import pytest
from conftest import OWN_FIXTURES

from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import importers
from nccl_tune.nccl import nccltests

OWN = OWN_FIXTURES / "nccl_tests"

# file -> (records, world size, op, first size, its out-of-place time) read off the files.
REAL = {
    "a40_4gpu_sys_boundary_p2p_disabled_table_only.txt": (4, 4, "allreduce", 1073741824, 1121937.0),
    "dgx_h100_4gpu_nvswitch_table_only.txt": (4, 4, "allreduce", 1073741824, 4367.9),
    "gcp_a3mega_h100_2node_16rank_full.txt": (31, 16, "allreduce", 8, 135.8),
    "h200_2node_g8_datacrunch_2025.txt": (11, 16, "allreduce", 1048576, 258.6),
    "nccl_tests_2.18.0_mpi_tag_output_rtx5090.txt": (8, 2, "allreduce", 1048576, 4366.46),
    "nccl_tests_2.18.0_single_gpu_tail_with_debug.txt": (12, 1, "allreduce", 65536, 2.84),
    "oke_a100_2node_2024.txt": (31, 16, "allreduce", 8, 36.47),
    "oke_a100_2node_nccl2.25.txt": (3, 16, "allreduce", 1073741824, 10776.0),
    "p5_h100_2node_efa_tagoutput_indented_eks.txt": (32, 16, "allreduce", 8, 87.96),
}


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_fixture_imports(real_fixtures, name):
    count, world, op, first_bytes, first_time = REAL[name]
    records, runs = importers.import_file(str(real_fixtures / "nccl_tests" / name))
    assert len(records) == count and len(runs) == 1
    first = records[0]
    assert (first["bytes"], first["lat_us"]["mean"]) == (first_bytes, first_time)
    assert first["lat_us"]["p50"] == first_time and first["latency_stat"] == "mean"
    assert first["world_size"] == world and first["op"] == op
    assert all(r["backend"] == "nccl-tests" and r["status"] == "ok" for r in records)
    assert all(r["correct"] is True and r["wrong"] == 0 for r in records)
    assert all(r["effective"] is None and r["samples_us"] is None for r in records)
    for key in store.FIELDS:
        assert key in first


def test_real_fixture_facts(real_fixtures):
    folder = real_fixtures / "nccl_tests"
    records, _ = importers.import_file(str(folder / "nccl_tests_2.18.0_mpi_tag_output_rtx5090.txt"))
    assert records[0]["versions"]["nccl"] == "2.29.7"  # from nccl-library=22907
    assert records[0]["versions"]["nccl_tests"] == "2.18.0"
    assert records[0]["iters"] == 50 and records[0]["mode"] == "eager"
    assert records[0]["inplace"] == {"time_us": 4365.21, "algbw_gbps": 0.24, "busbw_gbps": 0.24, "wrong": 0}
    records, _ = importers.import_file(str(folder / "oke_a100_2node_nccl2.25.txt"))
    assert records[0]["versions"]["nccl"] == "2.25.1" and records[0]["nnodes"] == 2
    # Table-only pastes: the world size comes from busbw/algbw (nccl-tests' definitions).
    records, _ = importers.import_file(str(folder / "dgx_h100_4gpu_nvswitch_table_only.txt"))
    assert records[0]["world_size_inferred"] is True
    # A 17 GB size overflowing its column, indented and tagged lines.
    records, _ = importers.import_file(str(folder / "p5_h100_2node_efa_tagoutput_indented_eks.txt"))
    assert records[-1]["bytes"] == 17179869184


def test_interleaved_debug_log(real_fixtures):
    path = real_fixtures / "nccl_debug" / "nccl2.12.7_efa_2node_nccltests_interleaved_eks.txt"
    records, runs = importers.import_file(str(path))
    assert len(records) == 29  # 29 sizes, 4 B .. 1 GiB; the two zero-byte rows left out
    assert runs[0].zero_byte_rows == 2 and all(r["bytes"] > 0 for r in records)
    assert records[0]["env"] == {"NCCL_SHM_DISABLE": "0"}  # "set by environment to 0."
    assert records[0]["env_plugin"] == {"NCCL_PROTO": "simple"}  # aws-ofi-nccl set it, not the user
    assert records[0]["versions"]["nccl"] == "2.12.7"
    assert records[0]["world_size"] == 2 and records[0]["nnodes"] == 2
    assert records[-1]["bytes"] == 1073741824 and records[-1]["lat_us"]["mean"] == 344981.0


def _load(name, **kwargs):
    return importers.import_file(str(OWN / name), **kwargs)


def test_old_layout_error_column_and_star():
    records, _ = _load("old_no_root_error_column.txt")
    assert [r["bytes"] for r in records] == [8, 32, 128, 512, 2048, 8192, 32768, 65536]
    assert records[0]["root"] is None and records[0]["redop"] == "sum"
    assert records[0]["env"] == {"NCCL_PROTO": "LL128"}  # mpirun -x NCCL_PROTO=LL128
    assert records[0]["world_size"] == 4 and records[0]["iters"] == 20
    flagged = [r for r in records if r["status"] == "wrong"]
    assert [r["bytes"] for r in flagged] == [32768] and flagged[0]["correct"] is False
    assert records[4]["status"] == "ok"  # 1e-07: a deviation within tolerance
    # the header's "iters: 20", the four "Rank N ... device" lines, no plugin-set variable
    assert records[0]["lat_us"]["n"] == 20
    assert records[0]["gpus"] == ["Tesla V100-PCIE-32GB"] * 4
    assert records[0]["world_size_inferred"] is False and records[0]["env_plugin"] is None
    assert records[0]["hosts"] == ["nodeA"] and records[0]["host"] == "nodeA"


def _old_layout_with(tmp_path, row_32768):
    text = (OWN / "old_no_root_error_column.txt").read_text()
    line = next(x for x in text.splitlines() if x.strip().startswith("32768 "))
    path = tmp_path / "oob.txt"
    path.write_text(text.replace(line, row_32768))
    return importers.import_file(str(path))[0]


def test_out_of_bounds_failure_marks_rows_only_when_no_row_is_flagged(tmp_path):
    # "Out of bounds values : 1 FAILED" and no row flagged: nothing tells the bad row, so
    # every row is wrong; one row flagged, in either column, carries the failure alone.
    clean = (
        "       32768          8192     float     sum    71.80    0.46    0.68  0e+00    70.96    0.46    0.69  0e+00"
    )
    records = _old_layout_with(tmp_path, clean)
    assert {(r["status"], r["correct"]) for r in records} == {("wrong", False)}
    assert "1 out-of-bounds values (FAILED)" in records[0]["error"]
    in_place = (
        "       32768          8192     float     sum    71.80    0.46    0.68  0e+00    70.96    0.46    0.69  3e-02*"
    )
    records = _old_layout_with(tmp_path, in_place)
    assert [r["bytes"] for r in records if r["status"] == "wrong"] == [32768]


def test_nccl1_names():
    records, _ = _load("nccl1_bytes_N_op_res.txt")
    assert len(records) == 5 and records[-1]["bytes"] == 1024
    assert records[-1]["lat_us"]["mean"] == 0.052 and records[-1]["world_size"] == 4


def test_validation_off_is_unchecked_not_failed():
    records, _ = _load("validation_off_na.txt")
    assert [r["status"] for r in records] == ["ok"] * 3
    assert all(r["correct"] is None and r["wrong"] is None for r in records)
    assert records[0]["dtype"] == "bfloat16" and records[0]["mode"] == "graph"


def test_per_iteration_columns():
    records, _ = _load("per_iter_columns.txt")
    first = records[0]
    assert first["lat_us"]["mean"] == 9.84 and first["lat_us"]["min"] == 9.12
    assert first["lat_us"]["max"] == 14.60 and first["lat_us"]["p99"] == 13.90
    assert first["lat_us"]["cv"] == pytest.approx(0.0725)
    assert first["inplace"]["time_us"] == 9.70
    assert first["versions"]["nccl"] == "2.29.3" and first["op"] == "allreduce"


def test_timestamps_and_cputime():
    records, _ = _load("timestamps_cputime.txt")
    assert [(r["bytes"], r["lat_us"]["mean"]) for r in records] == [(1024, 22.31), (2048, 22.80)]
    assert records[1]["inplace"]["wrong"] == 0


def test_two_runs_with_their_own_settings():
    records, runs = _load("two_runs_env_header.txt")
    assert len(runs) == 2 and [r["round"] for r in records] == [1, 1, 1, 2, 2, 2]
    first, second = records[0]["env"], records[3]["env"]
    assert first == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_P2P_LEVEL": "SYS"}
    assert second["NCCL_PROTO"] == "Simple" and second["NCCL_ALGO"] == "Ring"
    assert records[0]["cell"] != records[3]["cell"]
    assert records[0]["versions"]["nccl"] == "2.21.5"


def test_env_option_replaces_the_header():
    records, _ = _load("two_runs_env_header.txt", env={"NCCL_PROTO": "LL"}, label="box A")
    assert {store.cell_id(r["env"]) for r in records} == {store.cell_id({"NCCL_PROTO": "LL"})}
    assert all(r["label"] == "box A" for r in records)
    assert importers.parse_env_option("NCCL_PROTO=LL NCCL_ALGO=Ring") == {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}
    assert importers.parse_env_option("") == {}
    with pytest.raises(NcclTuneError, match="not NCCL_NAME=VALUE"):
        importers.parse_env_option("NCCL_PROTO")
    with pytest.raises(NcclTuneError, match="'PROTO' is not an NCCL_\\* variable name"):
        importers.parse_env_option("PROTO=LL")


def test_an_absurd_size_is_refused_with_its_line(cli_runner, tmp_path):
    text = (
        (OWN / "validation_off_na.txt")
        .read_text()
        .replace("       57344         28672", " 1" + "0" * 400 + "         28672")
    )
    src = tmp_path / "huge.txt"
    src.write_text(text)
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(cli, ["import-nccl-tests", str(src), "--out", str(out)])
    assert result.exit_code == 2 and not out.exists()
    assert result.output.strip() == (
        f"Error: {src}:12: a size of 1{'0' * 29}... bytes is more than one GPU holds (at most 274877906944)"
    )


def test_op_inferred_from_sizes():
    assert {r["op"] for r in _load("all_gather_2rank.txt")[0]} == {"all_gather"}
    reduce_scatter = _load("reduce_scatter_2rank.txt")[0]
    assert {r["op"] for r in reduce_scatter} == {"reduce_scatter"}
    assert _load("all_gather_2rank.txt", op="allreduce")[0][0]["op"] == "allreduce"


def test_wrong_rows_oob_and_failure_lines():
    records, runs = _load("wrong_rows_and_failure.txt")
    assert [(r["round"], r["bytes"], r["status"]) for r in records] == [
        (1, 4096, "ok"),
        (1, 8192, "wrong"),
        (1, 16384, "ok"),
        (2, 4096, "ok"),
        (2, 8192, "failed"),
    ]
    assert records[1]["wrong"] == 512 and records[1]["correct"] is False
    assert records[4]["error"].startswith("pcie8: Test NCCL failure common.cu:1005")
    assert records[4]["lat_us"] is None
    assert "Test failure common.cu:891" in runs[1].failure


def test_log_lines_inside_rows():
    records, _ = _load("bracket_prefix_interleaved_tuning.txt")
    assert [(r["bytes"], r["lat_us"]["mean"], r["inplace"]["time_us"]) for r in records] == [
        (4096, 30.12, 29.80),
        (8192, 31.44, 31.02),
    ]
    assert records[0]["env"] == {"NCCL_ALGO": "Tree"} and records[0]["world_size"] == 8


def test_srun_labels():
    records, _ = _load("srun_labelled.txt")
    assert len(records) == 1 and records[0]["nnodes"] == 2 and records[0]["bytes"] == 57344


def test_json_with_per_iteration_samples():
    records, runs = _load("json_per_iter.json")
    first, second = records
    assert first["lat_us"]["p50"] == 18.3 and first["lat_us"]["mean"] == 18.5
    assert first["latency_stat"] == "p50"
    assert first["samples_us"] == [18.3, 17.9, 19.9, 18.1, 18.3]
    assert first["env"] == {"NCCL_PROTO": "LL", "NCCL_MAX_NCHANNELS": "16"}  # NCCL_DEBUG left out
    assert first["versions"]["nccl"] == "2.27.3" and first["world_size"] == 2
    assert first["root"] == -1 and first["iters"] == 5
    assert first["lat_us"]["cv"] == pytest.approx(0.03783784)  # cv_pct 3.783784 / 100
    # out of bounds FAILED, but the second row reports its 3 wrong elements: only it is wrong
    assert first["status"] == "ok" and first["correct"] is True
    assert second["status"] == "wrong" and second["wrong"] == 3


def test_json_unchecked_cputime_all_gather():
    records, _ = _load("json_no_check.json")
    assert [r["op"] for r in records] == ["all_gather", "all_gather"]
    assert records[0]["lat_us"]["mean"] == 9.8 and records[0]["correct"] is None
    assert records[1]["inplace"] is None and records[0]["mode"] == "graph"
    assert records[0]["env"] == {"NCCL_ALGO": "Ring"} and records[0]["world_size"] == 4


@pytest.mark.parametrize(
    "name,line,message",
    [
        ("garbage_notes.txt", 1, "not nccl-tests output"),
        ("garbage_row.txt", 3, "'12.x5' is not a number"),
        ("truncated_json.json", 1, "not valid nccl-tests JSON"),
    ],
)
def test_garbage_names_the_line(name, line, message):
    with pytest.raises(NcclTuneError, match=message) as info:
        _load(name)
    assert info.value.line == line and str(info.value).startswith(f"{OWN / name}:{line}:")


def test_cli_imports_appends_and_reports(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "import-nccl-tests",
            str(OWN / "two_runs_env_header.txt"),
            str(OWN / "json_per_iter.json"),
            "--out",
            str(out),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert [f["records"] for f in summary["files"]] == [6, 2]
    records = store.read_records([str(out)])
    assert len(records) == 8 and {r["run_id"] for r in records} == {summary["run_id"]}
    report = cli_runner.invoke(cli, ["report", str(out)])
    assert report.exit_code == 0 and "wrong" in report.output


def test_cli_bad_file_exit_2_and_nothing_written(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli, ["import-nccl-tests", str(OWN / "validation_off_na.txt"), str(OWN / "garbage_row.txt"), "--out", str(out)]
    )
    assert result.exit_code == 2
    assert "garbage_row.txt:3:" in result.output and "Traceback" not in result.output
    assert not out.exists()  # every file is read before anything is written


# ---------------------------------------------------------------- checked input


def test_env_option_is_linted(cli_runner, tmp_path):
    out = tmp_path / "r.jsonl"
    bad = cli_runner.invoke(
        cli,
        [
            "import-nccl-tests",
            str(OWN / "json_per_iter.json"),
            "--env",
            "NCCL_PROTO=LLX NCCL_ALGO=Ring",
            "--out",
            str(out),
        ],
    )
    assert bad.exit_code == 2 and not out.exists()
    assert bad.output.strip().splitlines()[-1] == (
        "Error: Invalid value for '--env': NCCL_PROTO=LLX: unknown protocol 'LLX' "
        "(known: LL, LL128, Simple); did you mean LL?"
    )
    unknown = cli_runner.invoke(
        cli, ["import-nccl-tests", str(OWN / "json_per_iter.json"), "--env", "NCCL_PROTOO=LL", "--out", str(out)]
    )
    assert unknown.exit_code == 2 and not out.exists()  # an unknown name: refused, as by sweep
    assert "NCCL_PROTOO: unknown to the catalogue" in unknown.output
    assert "did you mean NCCL_PROTO?" in unknown.output
    warned = cli_runner.invoke(
        cli, ["import-nccl-tests", str(OWN / "json_per_iter.json"), "--env", "NCCL_P2P_LEVEL=sys", "--out", str(out)]
    )
    assert warned.exit_code == 0, warned.output
    assert "warning: --env: NCCL_P2P_LEVEL: 'sys' is in the wrong case" in warned.stderr
    assert len(store.read_records([str(out)])) == 2


def _json_variant(tmp_path, edit):
    data = json.loads((OWN / "json_per_iter.json").read_text())
    edit(data)
    path = tmp_path / "variant.json"
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "edit,message",
    [
        (
            lambda d: d["results"][0]["out_of_place"].update(time="x"),
            "results entry 1 out_of_place: 'time' is \"x\", not a non-negative number",
        ),
        (
            lambda d: d["results"][1]["in_place"].update(bus_bw=[1]),
            "results entry 2 in_place: 'bus_bw' is [1], not a non-negative number",
        ),
        (
            lambda d: d["results"][0]["out_of_place"].update(time=-3.0),
            "results entry 1 out_of_place: 'time' is -3.0, not a non-negative number",
        ),
        (
            lambda d: d["results"][0]["out_of_place"].update(nwrong="0"),
            "results entry 1 out_of_place: 'nwrong' is \"0\", not a non-negative number",
        ),
        (
            lambda d: d["results"][0]["out_of_place_per_iter"].update(times_us=["a"]),
            "results entry 1 out_of_place_per_iter: 'times_us' is \"a\", not a non-negative number",
        ),
        (
            lambda d: d["results"][0].update(out_of_place="fast"),
            'results entry 1 out_of_place is "fast", not an object',
        ),
        (lambda d: d["results"][0].update(type=4), "results entry 1's 'type' is 4, not a JSON string"),
        (lambda d: d["results"][0].update(actual_iterations="5"), "results entry 1's 'actual_iterations' is \"5\""),
        (lambda d: d["results"][0].update(size=-8), "results entry 1: 'size' is -8, not a byte count"),
        (lambda d: d.update(env=5), "the run's 'env' is 5, not a JSON list: not nccl-tests -J output"),
        (lambda d: d.update(args={"a": 1}), "the run's 'args' is {\"a\": 1}, not a JSON list"),
        (lambda d: d.update(config=[]), "the run's 'config' is [], not a JSON object"),
        (lambda d: d.update(errors="boom"), "the run's 'errors' is \"boom\", not a JSON list"),
        (lambda d: d.update(results=5), "'results' is 5, not a list: not nccl-tests -J output"),
        (lambda d: d.update(results={"size": 8}), "'results' is {\"size\": 8}, not a list"),
    ],
)
def test_json_fields_of_the_wrong_type_are_errors(tmp_path, cli_runner, edit, message):
    path = _json_variant(tmp_path, edit)
    with pytest.raises(NcclTuneError, match=None) as info:
        importers.import_file(str(path))
    assert str(info.value).startswith(f"{path}: ") and message in str(info.value)
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(cli, ["import-nccl-tests", str(path), "--out", str(out)])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "Traceback" not in result.output and not out.exists()


def test_zero_byte_rows_are_left_out_and_said(tmp_path, cli_runner):
    path = _json_variant(tmp_path, lambda d: d["results"][0].update(size=0, count=0))
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(cli, ["import-nccl-tests", str(path), "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert "1 row(s) of 0 bytes left out" in result.output
    assert [r["bytes"] for r in store.read_records([str(out)])] == [28672]
    only_zero = _json_variant(tmp_path, lambda d: d.update(results=[{**d["results"][0], "size": 0}]))
    with pytest.raises(NcclTuneError, match="only rows of 0 bytes"):
        importers.import_file(str(only_zero))
    # one byte (an int8 test) is a message, not an empty call
    one = _json_variant(tmp_path, lambda d: d["results"][0].update(size=1, count=1))
    records, runs = importers.import_file(str(one))
    assert [r["bytes"] for r in records] == [1, 28672] and runs[0].zero_byte_rows == 0


def test_an_absurd_size_is_refused_naming_it_cut_after_30_digits(tmp_path):
    for size, shown in ((10**29, str(10**29)), (10**30, str(10**30)[:30] + "...")):
        path = _json_variant(tmp_path, lambda d, size=size: d["results"][0].update(size=size))
        with pytest.raises(NcclTuneError) as info:
            importers.import_file(str(path))
        assert str(info.value) == (f"{path}: a size of {shown} bytes is more than one GPU holds (at most {1 << 38})")


def test_an_output_one_byte_over_32_mib_is_refused_before_reading(tmp_path):
    # The importer's cap is 32 MiB = 32 x 1024 x 1024 = 33554432 bytes (twice fileio's
    # 16 MiB for other text: NCCL's INFO lines of many ranks come with the table); a file
    # of 33554433 bytes is refused from its size alone (a sparse file: nothing is read).
    path = tmp_path / "big.txt"
    with open(path, "wb") as handle:
        handle.truncate(32 * 1024 * 1024 + 1)
    with pytest.raises(NcclTuneError, match="32 MiB: more than the 32 MiB a nccl-tests output may have"):
        importers.import_file(str(path))


# ---------------------------------------------------------------- forms found in public pastes


def test_two_processes_interleaved_are_split(cli_runner, tmp_path):
    # nccl-tests issue #107's form: a non-MPI build under mpirun -np 2 runs two 1-rank
    # tests whose headers and rows interleave (each size twice, Rank 0 twice).
    records, runs = _load("two_processes_interleaved_rank0_twice.txt")
    assert len(runs) == 2 and [len(r.rows) for r in runs] == [10, 10]
    for run in runs:
        sizes = [row["size"] for row in run.rows]
        assert sizes == sorted(set(sizes)) == [8 * 2**i for i in range(10)]
        assert len(run.gpus) == 1 and "line 19: size 8 repeats" in run.notes[0]
    assert [r.hosts for r in runs] == [["nodea"], ["nodeb"]]
    assert {r["world_size"] for r in records} == {1} and {r["host"] for r in records} == {"nodea", "nodeb"}
    out = tmp_path / "r.jsonl"
    result = cli_runner.invoke(
        cli, ["import-nccl-tests", str(OWN / "two_processes_interleaved_rank0_twice.txt"), "--out", str(out)]
    )
    assert result.exit_code == 0, result.output
    assert "2 outputs interleaved, split into 2 runs" in result.output


def test_offset_interleaved_table_is_split_by_size_order():
    # The size column runs ..., 128, 256, 8, 512, 16, 1024, ...: two runs, one started later.
    records, runs = _load("table_only_two_runs_offset_interleaved.txt")
    assert len(runs) == 2
    for run in runs:
        sizes = [row["size"] for row in run.rows]
        assert sizes == [8 * 2**i for i in range(12)]
    assert runs[0].rows[6]["line"] == 11 and runs[1].rows[0]["line"] == 10
    by_size = {}
    for record in records:
        by_size.setdefault(record["bytes"], set()).add(record["round"])
    assert all(rounds == {1, 2} for rounds in by_size.values())  # each size once per run


def test_rows_out_of_order_are_refused_naming_the_line(tmp_path):
    lines = (OWN / "allreduce_8rank_table_only_small_sizes.txt").read_text().splitlines()
    lines.insert(9, lines[5])  # one row (line 6's size) pasted again after line 9
    path = tmp_path / "shuffled.txt"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(NcclTuneError, match="repeats or goes backwards") as info:
        importers.import_file(str(path))
    assert info.value.line == 10


def test_redops_restarting_sizes_are_one_run():
    # -o all prints sum, prod, max, min, each from the smallest size (nccl-tests issue #167).
    records, runs = _load("redops_same_sizes_16rank_table_only.txt")
    assert len(runs) == 1 and not runs[0].notes
    assert [r["redop"] for r in records[::3]] == ["sum", "prod", "max", "min"]
    assert {r["world_size"] for r in records} == {16}


@pytest.mark.parametrize(
    "name, op, world",
    [
        ("reduce_scatter_8rank_table_only_small.txt", "reduce_scatter", 8),  # size / (count x 4)
        ("allreduce_8rank_table_only_small_sizes.txt", "allreduce", 8),  # every algbw < 0.5 GB/s
        ("all_gather_2rank.txt", "all_gather", 2),
    ],
)
def test_world_size_from_counts_and_printed_digits(name, op, world):
    records, _ = _load(name)
    assert {r["op"] for r in records} == {op}
    assert {r["world_size"] for r in records} == {world}
    # a table without "Rank N" lines (the *table_only* files) says its world size was inferred
    assert {r["world_size_inferred"] for r in records} == {"table_only" in name}


def test_world_size_none_when_the_digits_allow_several():
    rows = [{"size": 8, "count": 2, "type": "float", "out": {"time_us": 20.0, "algbw_gbps": 0.0, "busbw_gbps": 0.0}}]
    assert nccltests.infer_world_size(rows, "allreduce") is None  # 0.00 GB/s bounds nothing
    rows = [
        {
            "size": 1 << 20,
            "count": 1 << 18,
            "type": "float",
            "out": {"time_us": 10.0, "algbw_gbps": 104.86, "busbw_gbps": 183.50},
        }
    ]
    assert nccltests.infer_world_size(rows, "allreduce") == 8
    rows[0]["out"]["busbw_gbps"] = 250.0  # more than 2 x algbw: no world fits
    assert nccltests.infer_world_size(rows, "allreduce") is None
