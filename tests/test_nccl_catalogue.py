"""The shipped per-release NCCL catalogue against the libnccl installed here.

CI does not download every nvidia-nccl-cu12 wheel (tools/nccl_catalogue.py does, by
hand); it checks the one wheel installed in this Python, both ways: the names the data
says that release reads are exactly the NCCL_* strings of its libnccl.so.2, the names
the project itself knows are among them, and the tuner plugin interfaces agree. The
expected sets are read here from the JSON file and the library's bytes, not through
nccl_tune.nccl.releases, so a wrong entry or a wrong reader fails.
"""

from __future__ import annotations

import importlib.util
import json
import re

import pytest
from conftest import REPO_ROOT

from nccl_tune.nccl import ncclinfo, settings

DATA = REPO_ROOT / "nccl_tune" / "data" / "nccl_releases.json"


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(p) for p in text.split("."))


@pytest.fixture(scope="module")
def data() -> dict:
    return json.loads(DATA.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def installed(data) -> tuple[str, str, bytes]:
    """(version, path, bytes) of nvidia-nccl-cu12's libnccl in this Python."""
    libs = [lib for lib in ncclinfo.find_libraries() if lib.source == "nvidia-nccl-cu12" and lib.version]
    if not libs:
        pytest.skip("nvidia-nccl-cu12 is not installed in this Python")
    lib = libs[0]
    if lib.version not in data["releases"] and _version(lib.version) > _version(data["releases"][-1]):
        pytest.skip(
            f"nvidia-nccl-cu12 {lib.version} is newer than the catalogue "
            f"({data['releases'][-1]}): rerun tools/nccl_catalogue.py"
        )
    with open(lib.path, "rb") as handle:
        return lib.version, lib.path, handle.read()


def _read_by(data: dict, version: str) -> set[str]:
    """Names whose span covers `version` (with the full list where the span has gaps)."""
    out = set()
    for name, span in data["names"].items():
        if "in" in span:
            if version in span["in"]:
                out.add(name)
        elif _version(span["first"]) <= _version(version) <= _version(span["last"]):
            out.add(name)
    return out


def test_installed_release_is_catalogued(data, installed):
    version, path, _ = installed
    assert version in data["releases"], f"{path} is NCCL {version}, missing from {DATA.name}"


def test_names_of_installed_release_match_its_strings(data, installed):
    version, _, blob = installed
    strings = {m.decode() for m in re.findall(rb"NCCL_[A-Z0-9_]{2,}", blob)}
    listed = _read_by(data, version)
    assert sorted(listed - strings) == [], "the data says these are read, the library lacks them"
    assert sorted(strings - listed) == [], "the library holds these, the data misses them"


def test_names_the_project_knows_are_catalogued(data, installed):
    version, _, blob = installed
    strings = {m.decode() for m in re.findall(rb"NCCL_[A-Z0-9_]{2,}", blob)}
    known = set(settings.CATALOGUE)
    for setting in settings.CATALOGUE.values():
        known.update(setting.aliases)
    read_here = known & strings
    assert read_here, "the project's catalogue shares no name with the installed libnccl"
    assert sorted(read_here - _read_by(data, version)) == []


def test_tuner_interfaces_of_installed_release(data, installed):
    version, _, blob = installed
    found = sorted({int(v) for v in re.findall(rb"ncclTunerPlugin_v(\d+)", blob)})
    assert data["tuner_plugin"][version] == found


def test_settings_since_agrees_with_first_release(data):
    """A hand-written `since` in the project's catalogue names the release that first
    reads the variable, to the precision it is written in (2.17 -> 2.17.x)."""
    checked = 0
    for name, setting in settings.CATALOGUE.items():
        if not setting.since or name not in data["names"]:
            continue
        since = setting.since.split(".")
        first = data["names"][name]["first"].split(".")
        assert first[: len(since)] == since, f"{name}: since {setting.since}, first read in {first}"
        checked += 1
    assert checked >= 3  # NCCL_MAX_CTAS, NCCL_MIN_CTAS, NCCL_CTA_POLICY, NCCL_NO_CACHE


def test_every_release_has_tuner_entry_and_spans_are_releases(data):
    releases = data["releases"]
    assert releases == sorted(releases, key=_version)
    assert set(data["tuner_plugin"]) == set(releases)
    assert set(data["wheels"].values()) == set(releases)
    for name, span in data["names"].items():
        assert span["first"] in releases and span["last"] in releases, name
        assert _version(span["first"]) <= _version(span["last"]), name


def test_changes_name_catalogued_releases_and_sources(data):
    for change in data["changes"]:
        assert change["since"] in data["releases"], change["id"]
        assert change["sources"], change["id"]
        for name in change["names"]:
            assert name in data["names"], (change["id"], name)


def _tool():
    spec = importlib.util.spec_from_file_location("nccl_catalogue", REPO_ROOT / "tools" / "nccl_catalogue.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_tool_build_spans_gaps_and_repacked_wheels():
    """Built by hand: NCCL_A in all three releases, NCCL_B in the first and last only (a
    gap, listed), NCCL_C only in the last; 2.2.0.post1 repacks 2.2.0."""
    tool = _tool()
    cache = {
        "2.1.0": {"version": "2.1.0", "names": ["NCCL_A", "NCCL_B"], "tuner": []},
        "2.2.0": {"version": "2.2.0", "names": ["NCCL_A"], "tuner": [2]},
        "2.2.0.post1": {"version": "2.2.0", "names": ["NCCL_A"], "tuner": [2]},
        "2.3.0": {"version": "2.3.0", "names": ["NCCL_A", "NCCL_B", "NCCL_C"], "tuner": [2, 3]},
    }
    built = tool.build(cache, [])
    assert built["releases"] == ["2.1.0", "2.2.0", "2.3.0"]
    assert built["wheels"]["2.2.0.post1"] == "2.2.0"
    assert built["names"]["NCCL_A"] == {"first": "2.1.0", "last": "2.3.0"}
    assert built["names"]["NCCL_B"] == {"first": "2.1.0", "last": "2.3.0", "in": ["2.1.0", "2.3.0"]}
    assert built["names"]["NCCL_C"] == {"first": "2.3.0", "last": "2.3.0"}
    assert built["tuner_plugin"] == {"2.1.0": [], "2.2.0": [2], "2.3.0": [2, 3]}
    assert json.loads(tool.render(built)) == built
