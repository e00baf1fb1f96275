"""A target NCCL release for every decision: --nccl-version on lint, exec, check, exports.

Expected values come from NCCL's own source, not from the catalogue under test:
NCCL_NO_CACHE is first read by 2.29.7 (v2.29.3-1 has no NCCL_NO_CACHE anywhere in src/;
v2.29.7-1 src/misc/param.cc reads it); NCCL 2.31 disables the algorithms of the
collectives an NCCL_ALGO value does not name (src/tuning/cost_model.cc at 2.31.0a7,
vLLM PR #58179), 2.30.7 leaves them enabled (src/graph/tuning.cc); the tuner plugin
interface v5 appears in v2.28.3-1 (src/include/plugin/tuner/tuner_v5.h) and v6 in
v2.30.3-1, and v2 is the oldest 2.28 still loads (src/plugin/tuner.cc).
"""

from __future__ import annotations

import json

import pytest

from nccl_tune.cli import cli
from nccl_tune.errors import NcclTuneError
from nccl_tune.nccl import releases
from nccl_tune.nccl.ncclinfo import NcclLibrary

ALGO_2_31 = (
    "measured on NCCL 2.30.7, targeted at 2.31.2: from 2.31 NCCL_ALGO disables every "
    "algorithm of the collectives it does not name"
)


def _profile(tmp_path, body: str, nccl: str | None = None):
    path = tmp_path / "p.env"
    head = "# nccl-tune profile\n" + (f"# nccl: {nccl}\n" if nccl else "")
    path.write_text(head + "\n" + body)
    return path


def _lint(cli_runner, path, *extra):
    result = cli_runner.invoke(cli, ["lint", "--json", str(path), *extra])
    return result, json.loads(result.stdout)


def test_no_cache_linted_for_2_28_9_is_an_error(tmp_path, cli_runner):
    path = _profile(tmp_path, "NCCL_PROTO=LL\nNCCL_NO_CACHE=ALL\n")
    result, found = _lint(cli_runner, path, "--nccl-version", "2.28.9")
    assert result.exit_code == 1
    assert found == [
        {
            "path": str(path),
            "line": 4,
            "variable": "NCCL_NO_CACHE",
            "severity": "error",
            "message": "NCCL 2.28.9 does not read NCCL_NO_CACHE: it would have no effect (it reads it from 2.29.7 on)",
        }
    ]
    assert result.stderr.strip().endswith(
        "checked against the catalogue and NCCL 2.28.9 (--nccl-version), names from nccl-tune's "
        "release catalogue: 1 error(s), 0 warning(s)"
    )


def test_no_cache_from_2_29_7_on_is_fine(tmp_path, cli_runner):
    path = _profile(tmp_path, "NCCL_NO_CACHE=ALL\n")
    for version in ("2.29.7", "2.31.2"):
        result, found = _lint(cli_runner, path, "--nccl-version", version)
        assert (result.exit_code, found) == (0, []), version


def test_per_collective_algo_measured_2_30_7_targeted_2_31_2_warns(tmp_path, cli_runner):
    path = _profile(tmp_path, "NCCL_ALGO=allreduce:ring\n", nccl="2.30.7+cuda12.9")
    result, found = _lint(cli_runner, path, "--nccl-version", "2.31.2")
    assert result.exit_code == 0
    assert [(f["line"], f["variable"], f["severity"]) for f in found] == [(4, "NCCL_ALGO", "warning")]
    assert found[0]["message"].startswith(ALGO_2_31)
    assert "ring,tree;allreduce:ring" in found[0]["message"]


@pytest.mark.parametrize(
    "value, measured, target, warns",
    [
        ("ring,tree;allreduce:ring", "2.30.7", "2.31.2", False),  # a leading list for every collective
        ("allreduce:ring", "2.30.4", "2.30.7", False),  # no release between them changed it
        ("allreduce:ring", "2.31.2", "2.30.7", True),  # either direction crosses the change
        ("Ring", "2.30.7", "2.31.2", False),  # one list for every collective: same meaning
    ],
)
def test_algo_change_applies_only_where_it_changes_meaning(tmp_path, cli_runner, value, measured, target, warns):
    path = _profile(tmp_path, f"NCCL_ALGO={value}\n", nccl=measured)
    _, found = _lint(cli_runner, path, "--nccl-version", target)
    assert any("from 2.31 NCCL_ALGO" in f["message"] for f in found) is warns


def test_bad_version_is_a_usage_error(tmp_path, cli_runner):
    path = _profile(tmp_path, "NCCL_PROTO=LL\n")
    result = cli_runner.invoke(cli, ["lint", str(path), "--nccl-version", "2.30"])
    assert result.exit_code == 2 and "'2.30' is not X.Y.Z" in result.output


def test_exec_refuses_a_variable_the_target_does_not_read(tmp_path, cli_runner):
    path = _profile(tmp_path, "NCCL_NO_CACHE=ALL\n")
    result = cli_runner.invoke(cli, ["exec", "--profile", str(path), "--nccl-version", "2.28.9", "--", "true"])
    assert result.exit_code == 2
    assert "NCCL 2.28.9 does not read NCCL_NO_CACHE" in result.output


def test_profiles_convert_refuses_and_names_target(tmp_path, cli_runner):
    path = _profile(tmp_path, "NCCL_NO_CACHE=ALL\n")
    result = cli_runner.invoke(
        cli,
        ["profiles", "convert", str(path), "--to", "conf", "--nccl-version", "2.28.9", "-o", str(tmp_path / "p.conf")],
    )
    assert result.exit_code == 2 and not (tmp_path / "p.conf").exists()
    ok = cli_runner.invoke(cli, ["profiles", "convert", str(path), "--to", "conf", "--nccl-version", "2.30.7"])
    assert ok.exit_code == 0
    assert ok.stderr.strip() == f"converted {path} (checked against NCCL 2.30.7 (--nccl-version))"


def test_check_export_refuses_and_returns_warnings():
    with pytest.raises(NcclTuneError, match="not exported: NCCL 2.28.9 does not read NCCL_NO_CACHE"):
        releases.check_export({"NCCL_NO_CACHE": "ALL"}, "2.30.7", releases.Target("2.28.9", "--nccl-version"))
    notes = releases.check_export(
        {"NCCL_ALGO": "allreduce:ring"}, "2.30.7", releases.Target("2.31.2", "--nccl-version")
    )
    assert len(notes) == 1 and notes[0].startswith("NCCL_ALGO: " + ALGO_2_31)


def test_tuner_csv_header_names_the_target_interfaces(tmp_path, cli_runner):
    out = tmp_path / "rules.csv"
    result = cli_runner.invoke(
        cli,
        [
            "recommend",
            "--layers",
            "61",
            "--topology",
            "pcie-shm",
            "--force",
            "--tuner-csv",
            str(out),
            "--nccl-version",
            "2.28.9",
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["nccl_target"] == {"version": "2.28.9", "source": "--nccl-version"}
    lines = out.read_text().splitlines()
    assert (
        "# Target: NCCL 2.28.9 (--nccl-version). NCCL 2.28.9 loads tuner plugins of interface "
        "v2, v3, v4, v5 (ncclTunerPlugin_v5 first); the plugin reading this file must export one "
        "of them."
    ) in lines


def test_catalogue_edges():
    catalogue = releases.load_catalogue()
    assert catalogue.reads("NCCL_NO_CACHE", "2.29.3") is False
    assert catalogue.reads("NCCL_NO_CACHE", "2.29.7") is True
    assert catalogue.reads("NCCL_NO_CACHE", "2.40.1") is True  # newer: judged as the newest
    assert catalogue.reads("NCCL_NO_CACHE", "2.12.12") is None  # older than the catalogue
    assert catalogue.reads("NCCL_TUNER_CONFIG_FILE", "2.30.7") is None  # the plugin's, not libnccl's
    assert catalogue.tuner_versions("2.30.3") == (2, 3, 4, 5, 6)


def test_target_defaults_to_the_installed_library_or_says_none():
    lib = NcclLibrary("/x/libnccl.so.2", "nvidia-nccl-cu12", "2.27.5")
    assert releases.resolve_target(None, find=lambda: lib) == releases.Target("2.27.5", "libnccl /x/libnccl.so.2")
    assert releases.resolve_target("2.30.7", find=lambda: lib).source == "--nccl-version"
    none = releases.resolve_target(None, find=lambda: None)
    assert none.version is None
    assert releases.check([(1, "NCCL_NO_CACHE", "ALL")], none) == []


def test_a_name_with_a_gap_is_not_read_in_the_gap():
    data = {
        "releases": ["2.1.0", "2.2.0", "2.3.0"],
        "tuner_plugin": {},
        "changes": [],
        "names": {"NCCL_B": {"first": "2.1.0", "last": "2.3.0", "in": ["2.1.0", "2.3.0"]}},
    }
    catalogue = releases.parse_catalogue(data)
    assert [catalogue.reads("NCCL_B", v) for v in data["releases"]] == [True, False, True]
