"""Isolation nocache: the catalogue's NCCL_NO_CACHE facts, grouping, the plan the
microbench gets, confirmation from NCCL's log, and the engine's re-runs and fall-back."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import factories
import pytest
from conftest import OWN_FIXTURES, REPO_ROOT, subprocess_env

from microbench import options
from nccl_tune import store
from nccl_tune.cli import cli
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import grid as gridlib
from nccl_tune.measure import launch
from nccl_tune.measure import sweep as sweeplib
from nccl_tune.nccl import debuglog, settings

MIRROR = "/work/.mirror/NVIDIA+nccl/repo"
FAKE = OWN_FIXTURES / "sweep" / "fake_torchrun.py"
PREFIX = "gpu1:4242:4242 [0] NCCL INFO "


_grid = factories.grid


# ---------------------------------------------------------------- the catalogue

# DESIGN.md section 5: PROTO/ALGO/THREAD_THRESHOLDS re-read at every communicator init
# (ncclGetEnv in tuning.cc); NTHREADS, BUFFSIZE, MIN/MAX_NCHANNELS, MIN/MAX_CTAS and
# NVLS_ENABLE cached NCCL_PARAMs; P2P_LEVEL, P2P_DISABLE, CTA_POLICY and NCCL_DEBUG* read
# once per process outside the param system; CUMEM_ENABLE an NCCL_PARAM read at every
# allocation (src/misc/cudawrap.cc ncclCuMemEnable), so not safe to re-read mid-process.
DESIGN_READS = {
    "init": {"NCCL_PROTO", "NCCL_ALGO", "NCCL_THREAD_THRESHOLDS"},
    "param": {
        "NCCL_NTHREADS",
        "NCCL_BUFFSIZE",
        "NCCL_MIN_NCHANNELS",
        "NCCL_MAX_NCHANNELS",
        "NCCL_MIN_CTAS",
        "NCCL_MAX_CTAS",
        "NCCL_NVLS_ENABLE",
    },
    "static": {
        "NCCL_P2P_LEVEL",
        "NCCL_P2P_DISABLE",
        "NCCL_CTA_POLICY",
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
    },
    "param-hot": {"NCCL_CUMEM_ENABLE"},
}


def test_catalogue_says_how_each_variable_is_read_with_its_source():
    for kind, names in DESIGN_READS.items():
        for name in names:
            assert settings.REREADS[name].kind == kind, name
    for name in settings.CATALOGUE:
        fact = settings.REREADS[name]
        # read at each init exactly when the variable is communicator-scoped
        assert (fact.kind == settings.REREAD_INIT) == (settings.scope_of(name) == "communicator")
        if fact.kind == settings.REREAD_INIT:
            assert fact.source.startswith("src/graph/tuning.cc"), name
        elif fact.kind in (settings.REREAD_PARAM, settings.REREAD_HOT):
            assert fact.source.startswith("NCCL_PARAM"), name
        else:
            assert "src/" in fact.source or "plugin" in fact.source, name


@pytest.mark.parametrize(
    "name,version,no_cache,expected",
    [
        ("NCCL_NTHREADS", (2, 29, 7), True, True),
        ("NCCL_NTHREADS", (2, 30, 7), True, True),
        ("NCCL_NTHREADS", (2, 29, 3), True, False),  # before NCCL_NO_CACHE
        ("NCCL_NTHREADS", None, True, None),
        ("NCCL_NTHREADS", (2, 30, 7), False, False),
        ("NCCL_BUFFSIZE", (2, 30, 7), True, True),
        ("NCCL_MAX_NCHANNELS", (2, 30, 7), True, True),
        ("NCCL_P2P_LEVEL", (2, 30, 7), True, False),  # static in paths.cc
        ("NCCL_P2P_DISABLE", (2, 30, 7), True, False),
        ("NCCL_CTA_POLICY", (2, 30, 7), True, False),
        ("NCCL_CUMEM_ENABLE", (2, 30, 7), True, False),  # read at every allocation
        ("NCCL_GRAPH_REGISTER", (2, 30, 7), True, False),  # read at every enqueue
        ("NCCL_PROTO", (2, 20, 3), False, True),
        ("NCCL_UNKNOWN_THING", (2, 30, 7), True, False),
    ],
)
def test_per_communicator(name, version, no_cache, expected):
    assert settings.per_communicator(name, version, no_cache) is expected


SOURCE_FACTS = OWN_FIXTURES / "nccl_source" / "facts.json"


def test_catalogue_matches_nccl_source():
    """Against the facts read from NCCL's own tags (tests/nccl_source_facts.py): shipped,
    so this runs everywhere, CI included (no mirror, no network to GitHub)."""
    tags = json.loads(SOURCE_FACTS.read_text())["tags"]
    assert tags["v2.29.3-1"]["no_cache_files"] == []  # not yet there
    assert "src/misc/param.cc" in tags["v2.29.7-1"]["no_cache_files"]
    assert "src/param/param.cc" in tags["v2.30.7-1"]["no_cache_files"]
    for tag in ("v2.29.7-1", "v2.30.7-1"):
        params = set(tags[tag]["param_names"])
        for name, fact in settings.REREADS.items():
            defined = name[len("NCCL_") :] in params
            assert defined == (fact.kind in (settings.REREAD_PARAM, settings.REREAD_HOT)), (tag, name)
        assert tags[tag]["static_p2p_level"]


@pytest.mark.skipif(
    not os.path.isdir(MIRROR) or shutil.which("git") is None,
    reason="NCCL's source mirror is not on this machine (the shipped facts are checked above)",
)
def test_shipped_nccl_source_facts_match_the_mirror():
    import nccl_source_facts

    assert json.loads(SOURCE_FACTS.read_text()) == nccl_source_facts.all_facts(MIRROR)


# ---------------------------------------------------------------- grouping and planning


def test_decode_grid_launches_under_each_isolation():
    g = gridlib.build_grid(gridlib.resolve_grid_option("decode"))
    counts = sweeplib.launches_by_isolation(g.cells, rounds=1)
    assert counts == {"process": len(g.cells), "group": 36, "nocache": 2}
    assert counts["nocache"] * 20 <= counts["process"]
    groups = gridlib.group_cells(g.cells, "nocache")
    assert [grp.process_env for grp in groups] == [{}, {"NCCL_P2P_LEVEL": "SYS"}]
    for grp in groups:
        assert grp.no_cache == ("NCCL_BUFFSIZE", "NCCL_MAX_NCHANNELS", "NCCL_NTHREADS")
        assert grp.launch_env["NCCL_NO_CACHE"] == "NCCL_BUFFSIZE,NCCL_MAX_NCHANNELS,NCCL_NTHREADS"
        assert not grp.cells[0].split("nocache")[1]  # the clean cell first
        assert all(c.split("nocache")[1] for c in grp.cells[1:])


def test_grid_of_communicator_scoped_variables_needs_no_no_cache():
    groups = gridlib.group_cells(_grid("NCCL_PROTO=LL,Simple").cells, "nocache")
    assert len(groups) == 1 and groups[0].no_cache == () and "NCCL_NO_CACHE" not in groups[0].launch_env


@pytest.mark.parametrize(
    "requested,backend,version,verify,expected,note",
    [
        ("auto", "nccl", (2, 30, 7), None, "nocache", "honours NCCL_NO_CACHE"),
        ("auto", "nccl", (2, 29, 7), None, "nocache", "honours"),
        ("auto", "nccl", (2, 29, 3), None, "group", "predates NCCL_NO_CACHE"),
        ("auto", "nccl", None, None, "group", "no NCCL version known"),
        ("auto", "gloo", None, None, "group", "backend gloo loads no NCCL"),
        ("auto", "gloo", (2, 30, 7), None, "nocache", "no cell can be confirmed"),
        ("auto", "nccl", (2, 30, 7), False, "process", "--no-verify-effective"),
        ("nocache", "nccl", (2, 28, 9), None, "nocache", "ignores NCCL_NO_CACHE"),
        ("group", "nccl", (2, 30, 7), None, "group", ""),
    ],
)
def test_resolve_isolation(requested, backend, version, verify, expected, note):
    isolation, notes = sweeplib.resolve_isolation(requested, backend, version, verify)
    assert isolation == expected
    assert note in " ".join(notes)


def test_dry_run_shows_launches_per_isolation(cli_runner):
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--grid",
            "decode",
            "--topology",
            "none",
            "--backend",
            "gloo",
            "--nccl-version",
            "2.30.7",
            "--dry-run",
        ],
    )
    assert result.exit_code == 0, result.output
    out = result.output
    assert "isolation nocache (auto): NCCL 2.30.7 (--nccl-version) honours NCCL_NO_CACHE" in out
    assert "no cell can be confirmed" in out
    assert "  process     432" in out and "  group        36" in out
    assert "  nocache       2  <- --isolation" in out
    assert "launch sets NCCL_P2P_LEVEL=SYS NCCL_NO_CACHE=NCCL_BUFFSIZE,NCCL_MAX_NCHANNELS,NCCL_NTHREADS" in out
    old = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--grid",
            "decode",
            "--topology",
            "none",
            "--backend",
            "gloo",
            "--nccl-version",
            "2.28.9",
            "--dry-run",
            "--json",
        ],
    )
    plan = json.loads(old.stdout)
    assert plan["isolation"] == "group" and plan["launches"] == 36
    assert plan["launches_by_isolation"]["nocache"] == 2


def test_no_cache_is_not_a_grid_axis(cli_runner):
    result = cli_runner.invoke(cli, ["sweep", "--set", "NCCL_NO_CACHE=ALL", "--dry-run"])
    assert result.exit_code == 2 and "set by the sweep itself" in result.output


@pytest.mark.parametrize("value", ["2.30", "two", "2.30.7.1", ""])
def test_bad_nccl_version_is_one_line_exit_2(cli_runner, value):
    result = cli_runner.invoke(cli, ["sweep", "--set", "NCCL_NTHREADS=256", "--nccl-version", value, "--dry-run"])
    assert result.exit_code == 2 and "--nccl-version" in result.output
    assert "Traceback" not in result.output


# ---------------------------------------------------------------- the plan the microbench gets


def _plan(no_cache, cells):
    return {"run_id": "r", "no_cache": no_cache, "cells": cells}


def test_plan_accepts_listed_cached_variables_per_cell():
    plan = options.parse_plan(
        _plan(
            ["NCCL_NTHREADS"],
            [
                {
                    "cell": "a",
                    "env": {"NCCL_NTHREADS": "256", "NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"},
                    "comm_env": {"NCCL_NTHREADS": "256", "NCCL_PROTO": "LL"},
                }
            ],
        )
    )
    assert plan.no_cache == ("NCCL_NTHREADS",)


@pytest.mark.parametrize(
    "no_cache,comm_env,message",
    [
        ([], {"NCCL_NTHREADS": "256"}, "process-scoped"),  # not listed: cannot change per cell
        (["NCCL_P2P_LEVEL"], {}, "no_cache must list"),  # a static: NCCL_NO_CACHE cannot help
        (["NCCL_NTHREADS"], {}, "not the communicator-scoped part"),  # listed but left to the launcher
    ],
)
def test_plan_refuses_what_cannot_vary_per_cell(no_cache, comm_env, message):
    with pytest.raises(NcclTuneError, match=message):
        options.parse_plan(_plan(no_cache, [{"cell": "a", "env": {"NCCL_NTHREADS": "256"}, "comm_env": comm_env}]))


def test_apply_comm_env_sets_and_unsets_listed_variables():
    environ = {"NCCL_NTHREADS": "512", "NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS", "NCCL_BUFFSIZE": "1"}
    options.apply_comm_env({"NCCL_MAX_NCHANNELS": "4"}, environ, no_cache=("NCCL_NTHREADS", "NCCL_MAX_NCHANNELS"))
    # NCCL_BUFFSIZE is not listed: it belongs to the launch and stays.
    assert environ == {"NCCL_MAX_NCHANNELS": "4", "NCCL_P2P_LEVEL": "SYS", "NCCL_BUFFSIZE": "1"}
    assert options.process_env_mismatch({"NCCL_NTHREADS": "256"}, {}, ("NCCL_NTHREADS",)) is None
    assert "launcher must set" in options.process_env_mismatch({"NCCL_NTHREADS": "256"}, {})


# ---------------------------------------------------------------- confirmation from NCCL's log


def _observed(*messages):
    return debuglog.summarize_log(debuglog.parse_log([PREFIX + m for m in messages]))


def test_parser_reads_no_cache_lines_of_2_29_and_2_30():
    seen = _observed(
        "Disabling caching for environment variable NCCL_NTHREADS.",
        "PARAM: Disabling caching for environment variable NCCL_BUFFSIZE.",
        "NCCL_NTHREADS set by environment to 256.",
        "NCCL_NTHREADS set by environment to 256.",
    )
    assert seen["no_cache"] == ["NCCL_NTHREADS", "NCCL_BUFFSIZE"]
    assert seen["env_reads"] == [("NCCL_NTHREADS", "256"), ("NCCL_NTHREADS", "256")]
    assert seen["env"] == {"NCCL_NTHREADS": "256"}


NAMES = ("NCCL_NTHREADS", "NCCL_BUFFSIZE")


@pytest.mark.parametrize(
    "env,lines,disabled,expected,phrase",
    [
        (
            {"NCCL_NTHREADS": "256", "NCCL_BUFFSIZE": "0x1000000"},
            ["NCCL_NTHREADS set by environment to 256.", "NCCL_BUFFSIZE set by environment to 16777216."],
            (),
            True,
            "NCCL_BUFFSIZE=0x1000000 read",
        ),
        (
            {"NCCL_NTHREADS": "256"},
            ["NCCL_NTHREADS set by environment to 256."],
            NAMES,
            True,
            "NCCL_BUFFSIZE unset (re-read)",
        ),
        (
            {"NCCL_NTHREADS": "256"},
            ["NCCL_NTHREADS set by environment to 256."],
            (),
            None,
            "never said it stopped caching",
        ),
        ({"NCCL_NTHREADS": "256"}, [], NAMES, None, "no 'set by environment' line for NCCL_NTHREADS=256"),
        (
            {"NCCL_NTHREADS": "256"},
            ["NCCL_NTHREADS set by environment to 512."],
            NAMES,
            False,
            "NCCL read NCCL_NTHREADS=512, the cell sets 256",
        ),
        ({}, ["NCCL_NTHREADS set by environment to 512."], NAMES, False, "the cell leaves it unset"),
    ],
)
def test_confirm_reread(env, lines, disabled, expected, phrase):
    result = debuglog.confirm_reread(env, _observed(*lines), NAMES, disabled)
    assert result["confirmed"] is expected and phrase in result["detail"]


def test_confirm_reread_without_log_or_names():
    assert debuglog.confirm_reread({}, None, NAMES) is None
    assert debuglog.confirm_reread({}, _observed("NCCL_NTHREADS set by environment to 1."), ()) is None


def test_microbench_folds_the_reread_check_into_confirmed(tmp_path):
    """Bench._confirm_no_cache on log files as NCCL writes them: the 'Disabling caching'
    lines sit in the first communicator's stretch only, and are found by looking back."""
    allreduce = pytest.importorskip("microbench.allreduce")
    from microbench import nccllog

    capture = nccllog.NcclLogCapture(str(tmp_path))
    log = tmp_path / "nccl.0000.host.1.log"
    log.write_text(
        "".join(
            PREFIX + m + "\n"
            for m in (
                "PARAM: Disabling caching for environment variable NCCL_NTHREADS.",
                "NCCL_NTHREADS set by environment to 512.",
            )
        )
    )
    bench = allreduce.Bench.__new__(allreduce.Bench)
    bench.plan = options.Plan("r", [], ("NCCL_NTHREADS",))
    bench.capture, bench.no_cache_seen = capture, set()
    snapshot = capture.snapshot()
    with log.open("a") as handle:  # the second cell's communicator: nothing logged for it
        handle.write(PREFIX + "AllReduce: 1024 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..0}\n")
    observed = debuglog.summarize_log(debuglog.parse_log(capture.read_since(snapshot)))
    cell = options.Cell("baseline", {}, {})
    os.environ["NCCL_NO_CACHE"] = "NCCL_NTHREADS"
    try:
        effective = debuglog.confirm_effective({}, observed, "allreduce", 1024, 2)
        effective = bench._confirm_no_cache(cell, observed, effective)
        assert effective["confirmed"] is True and effective["reread"]["confirmed"] is True
        assert "NCCL_NTHREADS unset (re-read)" in effective["detail"]
        os.environ["NCCL_NO_CACHE"] = "NCCL_BUFFSIZE"  # the launcher forgot the variable
        effective = bench._confirm_no_cache(
            cell, observed, debuglog.confirm_effective({}, observed, "allreduce", 1024, 2)
        )
        assert effective["confirmed"] is False and "lacks NCCL_NTHREADS" in effective["detail"]
    finally:
        os.environ.pop("NCCL_NO_CACHE", None)


# ---------------------------------------------------------------- the engine (test double)


def _engine(tmp_path, backend="nccl", isolation="nocache", **fake_env):
    env = subprocess_env(**{k: str(v) for k, v in fake_env.items()})
    launcher = launch.Launcher(nproc=2, template=f"{sys.executable} {FAKE} records {{args}}")
    options_ = sweeplib.MeasureOptions(backend, (1024,), iters=5)
    return sweeplib.SweepEngine(
        options_, launcher, str(tmp_path / "r.jsonl"), isolation=isolation, timeout=30.0, base_env=env
    )


@pytest.mark.slow
def test_nocache_launch_sets_no_cache_and_each_cells_values(tmp_path):
    g = _grid("NCCL_NTHREADS=256,512,default", "NCCL_PROTO=LL,default", "NCCL_P2P_LEVEL=SYS,default")
    engine = _engine(tmp_path, FAKE_CONFIRM="true", FAKE_REREAD="true")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    assert engine.stats.launches == 2 and engine.stats.reruns == 0
    for record in store.read_records([str(tmp_path / "r.jsonl")]):
        seen = dict(record["seen_env"])
        assert seen.pop("NCCL_NO_CACHE") == "NCCL_NTHREADS"
        assert seen == record["env"] and record["isolation"] == "nocache"


@pytest.mark.slow
def test_unconfirmed_nocache_cells_rerun_alone_saying_why(tmp_path):
    g = _grid("NCCL_NTHREADS=256,512")
    engine = _engine(tmp_path, FAKE_CONFIRM="true", FAKE_REREAD="false")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    records = store.read_records([str(tmp_path / "r.jsonl")])
    superseded = [r for r in records if r.get("superseded")]
    final = [r for r in records if not r.get("superseded")]
    assert {r["cell"] for r in superseded} == {c.id for c in g.cells if c.env}
    assert all("isolation nocache" in r["note"] and "fake reread False" in r["note"] for r in superseded)
    assert {r["cell"]: r["isolation"] for r in final} == {
        "baseline": "nocache",
        **{c.id: "process" for c in g.cells if c.env},
    }
    assert all(
        "unconfirmed in a shared process (isolation nocache)" in r["rerun"] for r in final if r["cell"] != "baseline"
    )
    # Alone, the launcher sets the cached variable itself (no NCCL_NO_CACHE needed).
    assert all(r["seen_env"] == r["env"] for r in final if r["cell"] != "baseline")
    # Nothing was ever seen re-read: the rest of the sweep runs grouped by process scope.
    assert engine.isolation == "group" and "switched to group" in engine.stats.notes[0]


@pytest.mark.slow
def test_gloo_nocache_mechanics_without_confirmation(tmp_path):
    g = _grid("NCCL_NTHREADS=256,default", "NCCL_PROTO=LL,default")
    engine = _engine(tmp_path, backend="gloo", FAKE_CONFIRM="null", FAKE_REREAD="null")
    sweeplib.run_rounds(engine, g.cells, rounds=1, seed=0)
    assert engine.stats.launches == 1 and engine.stats.reruns == 0 and engine.isolation == "nocache"


# ---------------------------------------------------------------- gloo, real microbench


@pytest.mark.slow
def test_gloo_nocache_sweep_end_to_end(tmp_path):
    pytest.importorskip("torch")
    out = tmp_path / "r.jsonl"
    cmd = [
        sys.executable,
        "-m",
        "nccl_tune",
        "sweep",
        "--set",
        "NCCL_NTHREADS=256,512,default",
        "--set",
        "NCCL_BUFFSIZE=16777216,default",
        "--set",
        "NCCL_PROTO=LL,default",
        "--sizes",
        "1024",
        "--iters",
        "3",
        "--warmup",
        "1",
        "--backend",
        "gloo",
        "--nproc",
        "2",
        "--topology",
        "none",
        "--isolation",
        "nocache",
        "--out",
        str(out),
        "--json",
    ]
    done = subprocess.run(cmd, env=subprocess_env(), cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout + done.stderr
    summary = json.loads(done.stdout)
    assert summary["launches"] == 1 and summary["cells_measured"] == 12 and summary["reruns"] == 0
    assert any("no cell can be confirmed" in n for n in summary["notes"])
    records = store.read_records([str(out)])
    assert len(records) == 12
    for r in records:
        assert r["isolation"] == "nocache" and r["status"] == "ok" and r["effective"] is None
        assert r["env_process"] == {"NCCL_NO_CACHE": "NCCL_BUFFSIZE,NCCL_NTHREADS"}
        # What the rank's environment held as the cell's communicator was created.
        applied = {k: v for k, v in r["env_at_init"].items() if v is not None}
        assert applied == r["env"]
