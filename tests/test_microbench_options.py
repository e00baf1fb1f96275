"""microbench options, plans, environment helpers and output formatting (no processes)."""

from __future__ import annotations

import json

import pytest

from microbench import allreduce, options, output
from nccl_tune.errors import NcclTuneError
from nccl_tune.store import cell_id

# ---------------------------------------------------------------- sizes and dtypes


def test_parse_size_units_follow_nccl_tests():
    assert [options.parse_size(s) for s in ("14336", "1K", "64k", "1M", "2G", "8KB")] == [
        14336,
        1024,
        65536,
        1 << 20,
        2 << 30,
        8192,
    ]


@pytest.mark.parametrize("bad", ["", "1.5K", "-4", "0", "K", "12Q", "1 2"])
def test_parse_size_rejects_bad_text(bad):
    with pytest.raises(NcclTuneError, match="--sizes"):
        options.parse_size(bad)


def test_default_sizes_are_the_decode_sizes():
    sizes = options.resolve_sizes(None, None, None, "bf16")
    assert sizes == [t * 7168 * 2 for t in (1, 2, 3, 4, 6, 8)]
    assert sizes[0] == 14336 and sizes[3] == 57344


def test_tokens_hidden_dtype():
    assert options.resolve_sizes(None, "1,4", 4096, "fp32") == [16384, 65536]
    assert options.resolve_sizes(None, "2", None, "fp16") == [28672]
    assert options.resolve_sizes("1K,1K,2K", None, None, "bf16") == [1024, 2048]


@pytest.mark.parametrize(
    "sizes,tokens,hidden,dtype,match",
    [
        ("1K", "1", None, "bf16", "cannot be combined"),
        (None, "1,,2", None, "bf16", "--tokens"),
        (None, "0", None, "bf16", "--tokens"),
        (None, "1", -5, "bf16", "--hidden"),
        ("1001", None, None, "bf16", "multiple of the 2-byte"),
        ("1K", None, None, "int3", "unknown dtype"),
    ],
)
def test_resolve_sizes_errors(sizes, tokens, hidden, dtype, match):
    with pytest.raises(NcclTuneError, match=match):
        options.resolve_sizes(sizes, tokens, hidden, dtype)


def test_dtype_aliases():
    assert [options.canonical_dtype(n) for n in ("BF16", "bfloat16", "half", "float")] == [
        "bf16",
        "bf16",
        "fp16",
        "fp32",
    ]


def test_parse_args_errors_are_one_message():
    for argv, match in (
        (["--iters", "0"], "--iters"),
        (["--op", "alltoall"], "invalid choice"),
        (["--timeout", "0"], "--timeout"),
        (["--bogus"], "unrecognized"),
        (["--backend", "gloo", "--verify-effective"], "needs the NCCL backend"),
    ):
        with pytest.raises(NcclTuneError, match=match):
            options.parse_args(argv)


def test_parse_args_defaults():
    args = options.parse_args([])
    assert (args.op, args.backend, args.mode, args.check, args.verify) == ("allreduce", "auto", "auto", True, None)
    assert args.sizes_bytes[0] == 14336 and args.dtype == "bf16"


# ---------------------------------------------------------------- plans


def _plan(**cell):
    base = {
        "cell": "c-1",
        "env": {"NCCL_PROTO": "LL", "NCCL_NTHREADS": "256"},
        "comm_env": {"NCCL_PROTO": "LL"},
        "round": 2,
        "iters": None,
        "warmup": 5,
        "extra": {"isolation": "group", "rung": 1},
    }
    base.update(cell)
    return {"run_id": "r1", "cells": [base]}


def test_parse_plan_valid():
    plan = options.parse_plan(_plan())
    cell = plan.cells[0]
    assert plan.run_id == "r1"
    assert (cell.cell, cell.round, cell.iters, cell.warmup) == ("c-1", 2, None, 5)
    assert cell.extra == {"isolation": "group", "rung": 1}


@pytest.mark.parametrize(
    "change,match",
    [
        ({"comm_env": {}}, "not the communicator-scoped part"),
        ({"comm_env": {"NCCL_PROTO": "LL", "NCCL_NTHREADS": "256"}}, "process-scoped"),
        ({"env": {"PATH": "/x"}, "comm_env": {}}, "not an NCCL_"),
        ({"env": {"NCCL_PROTO": 3}}, "must be a string"),
        ({"cell": ""}, "cell must be"),
        ({"round": "1"}, "round must be"),
        ({"iters": -1}, "iters must be"),
        ({"extra": []}, "extra must be"),
    ],
)
def test_parse_plan_errors(change, match):
    with pytest.raises(NcclTuneError, match=match):
        options.parse_plan(_plan(**change), "plan.json")


def test_load_plan_file_errors(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text('{"cells": [\n oops')
    with pytest.raises(NcclTuneError) as info:
        options.load_plan(str(bad))
    assert str(info.value).startswith(f"{bad}:2: not JSON")
    with pytest.raises(NcclTuneError, match="non-empty list"):
        options.parse_plan({"cells": []})
    good = tmp_path / "plan.json"
    good.write_text(json.dumps(_plan()))
    assert options.load_plan(str(good)).cells[0].cell == "c-1"


def test_settings_env_drops_the_debug_family():
    environ = {"NCCL_PROTO": "LL", "NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/x", "PATH": "/bin"}
    assert options.settings_env(environ) == {"NCCL_PROTO": "LL"}
    cell = options.single_cell(environ)
    assert cell.cell == cell_id({"NCCL_PROTO": "LL"}) and cell.comm_env == {"NCCL_PROTO": "LL"}
    assert options.single_cell({"NCCL_DEBUG": "INFO"}).cell == "baseline"


def test_apply_comm_env_sets_and_removes_communicator_vars_only():
    environ = {"NCCL_PROTO": "Simple", "NCCL_THREAD_THRESHOLDS": "8", "NCCL_NTHREADS": "256"}
    options.apply_comm_env({"NCCL_ALGO": "Ring"}, environ)
    assert environ == {"NCCL_ALGO": "Ring", "NCCL_NTHREADS": "256"}


def test_process_env_mismatch():
    assert options.process_env_mismatch({"NCCL_PROTO": "LL"}, {}) is None  # comm-scoped: set by us
    assert options.process_env_mismatch({"NCCL_NTHREADS": "256"}, {"NCCL_NTHREADS": "256"}) is None
    text = options.process_env_mismatch({"NCCL_NTHREADS": "256"}, {})
    assert "NCCL_NTHREADS=256" in text and "(unset)" in text


def test_fault_hook_parsing(monkeypatch):
    monkeypatch.setenv(allreduce.FAULT_VAR, "1:raise:c-2")
    assert allreduce._fault(1, "raise", "c-2") and not allreduce._fault(1, "raise", "c-1")
    assert not allreduce._fault(0, "raise", "c-2")
    monkeypatch.setenv(allreduce.FAULT_VAR, "0:wrong")
    assert allreduce._fault(0, "wrong", "anything") and not allreduce._fault(0, "raise")


# ---------------------------------------------------------------- output


def _record(**extra):
    record = {
        "bytes": 14336,
        "count": 7168,
        "dtype": "bf16",
        "status": "ok",
        "wrong": 0,
        "lat_us": {"p50": 20.5, "p99": 31.25, "cv": 0.123},
        "algbw_gbps": 0.699,
        "busbw_gbps": 1.224,
        "effective": {"algo": "Ring", "proto": "LL", "channels": 1, "confirmed": True},
    }
    record.update(extra)
    return record


def test_row_columns():
    line = output.row(_record())
    assert line.split() == ["14336", "7168", "bfloat16", "20.50", "31.25", "12.3", "0.699", "1.224", "0", "Ring/LL/1"]
    assert output.row(_record(effective=None)).split()[-1] == "-"
    assert output.effective_text({"algo": "Ring", "proto": "LL", "channels": 2, "confirmed": False}) == "Ring/LL/2!"
    assert output.effective_text({"algo": "Tree", "proto": "LL", "channels": None, "confirmed": None}) == "Tree/LL/-?"
    failed = output.row(_record(status="failed", error="rank 1: boom"))
    assert failed.endswith("failed: rank 1: boom")


def test_header_lines():
    lines = output.header_lines(
        {
            "run_id": "r",
            "world_size": 2,
            "nnodes": 1,
            "hosts": ["a", "a"],
            "backend": "gloo",
            "mode": "eager",
            "op": "allreduce",
            "dtype": "bf16",
            "warmup": 1,
            "iters": 2,
            "versions": {"torch": "2.13"},
            "env_process": {"NCCL_PROTO": "LL"},
            "verify_note": "off",
        }
    )
    assert all(line.startswith("# ") for line in lines)
    text = "\n".join(lines)
    assert "world 2 rank(s) on 1 node(s): a x2" in text and "NCCL_* at start: NCCL_PROTO=LL" in text
    assert "nccl -" in text


def test_read_conf_files(tmp_path):
    conf = tmp_path / "nccl.conf"
    conf.write_text("# comment\nNCCL_PROTO=LL\n\nNCCL_P2P_LEVEL = SYS\n")
    found = output.read_conf_files({"NCCL_CONF_FILE": str(conf)})
    assert found[str(conf)] == {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}
