"""The published figures shipped with the package (nccl_tune/data/references.json).

The figures are facts with their sources, written by the project; these tests check
that every figure with a verbatim copy under ../shared/fixtures/real/ is that copy's
number at that size (the nccl-tests out-of-place time, or the table cell), and that
the file is complete enough for the ranges built on it.
"""

from __future__ import annotations

import json
import re
from importlib import resources

import pytest

from nccl_tune.model import costmodel
from nccl_tune.nccl import nccltests

REQUIRED = (
    "name",
    "machine",
    "kind",
    "gpus",
    "n_gpus",
    "mode",
    "gpus_per_process",
    "settings",
    "settings_stated",
    "p2p",
    "source",
    "points",
)


@pytest.fixture(scope="module")
def shipped() -> list[dict]:
    text = (resources.files("nccl_tune") / "data" / "references.json").read_text(encoding="utf-8")
    doc = json.loads(text)
    assert doc["schema"] == "nccl-tune-references/1"
    return doc["references"]


def test_every_reference_is_complete_and_named_once(shipped):
    names = [r["name"] for r in shipped]
    assert len(names) == len(set(names))
    for ref in shipped:
        assert all(key in ref for key in REQUIRED), ref["name"]
        assert ref["kind"] in costmodel.TOPOLOGIES, ref["name"]
        assert ref["mode"] in ("graph", "eager", None)
        assert ref["source"].strip()
        sizes = [b for b, _ in ref["points"]]
        assert sizes == sorted(set(sizes)) and all(t > 0 for _, t in ref["points"]), ref["name"]
        assert all(k.startswith("NCCL_") for k in ref["settings"]), ref["name"]


def test_one_machine_and_gpu_count_is_one_kind(shipped):
    kinds: dict[tuple, set] = {}
    for ref in shipped:
        kinds.setdefault((ref["machine"], ref["n_gpus"]), set()).add(ref["kind"])
    assert all(len(k) == 1 for k in kinds.values())


def test_figures_derived_from_bus_bandwidth_say_so_and_have_no_verbatim_table(shipped):
    derived = [r for r in shipped if r.get("derived")]
    assert derived and all(r["derived"] == "busbw" and r["fixture"] is None for r in derived)


_SIZE_RE = re.compile(r"^(\d+(?:\.\d+)?)\s*(B|KB|K|MB|M)$", re.IGNORECASE)
_UNIT = {"b": 1, "k": 1024, "kb": 1024, "m": 1 << 20, "mb": 1 << 20}


def _cell_bytes(cell: str) -> int | None:
    match = _SIZE_RE.match(cell.strip())
    return int(float(match.group(1)) * _UNIT[match.group(2).lower()]) if match else None


def _cell_number(cell: str) -> float | None:
    match = re.fullmatch(r"\**\s*([\d.]+)\s*(?:us|µs)?\s*\**", cell.strip())
    return float(match.group(1)) if match else None


def _markdown_tables(text: str) -> list[dict[int, list[float]]]:
    """Each table as {bytes: the numbers in its row}."""
    tables, current = [], {}
    for line in text.splitlines() + [""]:
        if line.strip().startswith("|"):
            cells = line.strip().strip("|").split("|")
            size = _cell_bytes(cells[0])
            if size is not None:
                current[size] = [v for v in map(_cell_number, cells[1:]) if v is not None]
        elif current:
            tables.append(current)
            current = {}
    return tables


def _nccl_tests_tables(text: str, path: str) -> list[dict[int, list[float]]]:
    runs, _ = nccltests.parse_text(text, path)
    return [{row["size"]: [row["out"]["time_us"]] for row in run.rows if row.get("out")} for run in runs]


def _matches(ref: dict, tables: list[dict[int, list[float]]]) -> bool:
    return any(all(any(abs(v - t) < 0.006 for v in table.get(b, ())) for b, t in ref["points"]) for table in tables)


def test_shipped_figures_are_the_verbatim_tables_numbers(shipped, real_fixtures):
    """Every figure of a reference with a verbatim copy is one table's number at that size."""
    checked = 0
    for ref in shipped:
        if not ref.get("fixture"):
            continue
        path = real_fixtures / ref["fixture"]
        if not path.is_file():
            continue
        text = path.read_text(encoding="utf-8")
        tables = _nccl_tests_tables(text, str(path)) if "float     sum" in text else _markdown_tables(text)
        assert _matches(ref, tables), f"{ref['name']}: figures differ from {ref['fixture']}"
        checked += 1
    if not checked:
        pytest.skip(f"no verbatim tables under {real_fixtures} (../shared absent)")


def test_a_changed_figure_is_caught(shipped, real_fixtures):
    ref = next(r for r in shipped if r["name"] == "asus-4xrtxpro6000-p2pmark-default")
    path = real_fixtures / ref["fixture"]
    if not path.is_file():
        pytest.skip(f"{path} absent (../shared not beside this checkout)")
    tables = _markdown_tables(path.read_text(encoding="utf-8"))
    assert _matches(ref, tables)
    bad = dict(ref, points=[[b, t + 0.1] for b, t in ref["points"]])
    assert not _matches(bad, tables)
