"""Grid specs: --set, TOML files, the decode grid, pruning (lint, topology), grouping."""

from __future__ import annotations

import pytest

from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import grid as gridlib
from nccl_tune.store import BASELINE


def _envs(cells):
    return [c.env for c in cells]


def test_parse_set_values_default_and_pipe():
    assert gridlib.parse_set("NCCL_PROTO=LL,Simple,default") == ("NCCL_PROTO", ["LL", "Simple", None])
    assert gridlib.parse_set("NCCL_PROTO=LL|LL,LL128|DEFAULT") == ("NCCL_PROTO", ["LL", "LL,LL128", None])
    with pytest.raises(NcclTuneError, match="not an NCCL_"):
        gridlib.parse_set("PROTO=LL")
    with pytest.raises(NcclTuneError, match="expected NAME=VALUE"):
        gridlib.parse_set("NCCL_PROTO")
    with pytest.raises(NcclTuneError, match="instrumentation"):
        gridlib.parse_set("NCCL_DEBUG=INFO")
    with pytest.raises(NcclTuneError, match="empty value"):
        gridlib.parse_set("NCCL_PROTO=LL,,Simple")


def test_sets_expand_to_product_with_baseline_first():
    spec = gridlib.spec_from_sets(["NCCL_PROTO=LL,default", "NCCL_ALGO=Ring,Tree", "NCCL_PROTO=Simple"])
    g = gridlib.build_grid(spec)
    assert g.cells[0].id == BASELINE and g.cells[0].env == {}
    assert _envs(g.cells)[1:] == [
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
        {"NCCL_PROTO": "LL", "NCCL_ALGO": "Tree"},
        {"NCCL_ALGO": "Ring"},
        {"NCCL_ALGO": "Tree"},
        {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"},
        {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Tree"},
    ]
    assert not g.dropped and g.topology is None


def test_baseline_present_even_when_every_axis_has_default():
    g = gridlib.build_grid(gridlib.spec_from_sets(["NCCL_PROTO=default,LL"]))
    assert _envs(g.cells) == [{}, {"NCCL_PROTO": "LL"}]  # the all-default combination is the baseline


def test_toml_grid_file(tmp_path):
    path = tmp_path / "g.toml"
    path.write_text(
        '[grid]\nNCCL_PROTO = ["default", "LL"]\nNCCL_NTHREADS = [256, 512]\n'
        '[[cells]]\nNCCL_PROTO = "LL"\nNCCL_P2P_LEVEL = "SYS"\n'
        '[[cells]]\nNCCL_PROTO = "LL"\nNCCL_NTHREADS = 512\n'
    )
    g = gridlib.build_grid(gridlib.resolve_grid_option(str(path)))
    assert len(g.cells) == 1 + 4 + 1
    assert {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"} in _envs(g.cells)
    assert [(d.kind, d.env) for d in g.dropped] == [("duplicate", {"NCCL_PROTO": "LL", "NCCL_NTHREADS": "512"})]
    assert g.sources == [str(path)]


@pytest.mark.parametrize(
    "text,message,line",
    [
        ('[grid]\nNCCL_PROTO = ["LL"\n', "not a valid TOML grid", 2),
        ("[sweep]\nx = 1\n", "unknown table", None),
        ('[grid]\nPROTO = ["LL"]\n', "not an NCCL_", None),
        ("[grid]\nNCCL_PROTO = [true]\n", "strings or integers", None),
        ("# nothing\n", "the grid is empty", None),
    ],
)
def test_bad_grid_files(tmp_path, text, message, line):
    path = tmp_path / "bad.toml"
    path.write_text(text)
    with pytest.raises(NcclTuneError, match=message) as info:
        gridlib.load_grid_file(str(path))
    assert str(path) in str(info.value)
    if line is not None:
        assert info.value.line == line


def test_grid_option_unknown():
    with pytest.raises(NcclTuneError, match="neither a file nor a built-in"):
        gridlib.resolve_grid_option("no-such-grid")


def test_decode_grid_holds_the_public_winning_set():
    g = gridlib.build_grid(gridlib.resolve_grid_option("decode"))
    winning = {
        "NCCL_PROTO": "LL",
        "NCCL_ALGO": "Ring",
        "NCCL_MAX_NCHANNELS": "16",
        "NCCL_BUFFSIZE": "16777216",
        "NCCL_NTHREADS": "512",
        "NCCL_P2P_LEVEL": "SYS",
    }
    assert winning in _envs(g.cells)
    assert len(g.cells) == 4 * 3 * 3 * 2 * 3 * 2  # unknown topology: nothing pruned
    pcie = gridlib.build_grid(gridlib.resolve_grid_option("decode"), "pcie")
    assert len(pcie.cells) == 3 * 3 * 3 * 2 * 3 * 2
    assert len(pcie.dropped) == 3 * 3 * 2 * 3 * 2 and {d.kind for d in pcie.dropped} == {"topology"}


def test_lint_pruning_keeps_reasons():
    g = gridlib.build_grid(
        gridlib.spec_from_sets(["NCCL_NTHREADS=100,256", "NCCL_PROTO=LL,Fast", "NCCL_P2P_LEVEL=sys"])
    )
    reasons = {tuple(sorted(d.env.items())): d.reason for d in g.dropped}
    assert all(d.kind == "lint" for d in g.dropped) and len(g.dropped) == 3
    assert any("not a multiple of 32" in r for r in reasons.values())
    assert any("unknown protocol 'Fast'" in r for r in reasons.values())
    kept = [c for c in g.cells if c.env]
    assert kept == [gridlib.Cell({"NCCL_NTHREADS": "256", "NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "sys"}, kept[0].notes)]
    assert any("wrong case" in n for n in kept[0].notes)  # legal but ignored by NCCL: a warning


def test_topology_pruning_ll128_and_nvls():
    spec = gridlib.spec_from_sets(["NCCL_PROTO=LL128,^LL,LL", "NCCL_ALGO=NVLS,Ring"])
    pcie = gridlib.build_grid(spec, "pcie")
    assert _envs(pcie.cells) == [{}, {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"}]
    reasons = [d.reason for d in pcie.dropped]
    assert any("forces LL128 on 'pcie'" in r and "--allow-unsafe" in r for r in reasons)
    assert any("allows only NVLS, which needs NVSwitch" in r for r in reasons)
    unsafe = gridlib.build_grid(spec, "pcie", allow_unsafe=True)
    ll128 = [c for c in unsafe.cells if c.env.get("NCCL_PROTO") == "LL128"]
    assert ll128 and all(any("--allow-unsafe" in n for n in c.notes) for c in ll128)
    nvlink = gridlib.build_grid(spec, "nvlink")
    assert len(nvlink.cells) == 1 + 6 and not nvlink.dropped
    env = gridlib.build_grid(gridlib.spec_from_sets(["NCCL_NVLS_ENABLE=1,0"]), "pcie-shm")
    assert _envs(env.cells) == [{}, {"NCCL_NVLS_ENABLE": "0"}]
    with pytest.raises(NcclTuneError, match="--topology: unknown"):
        gridlib.build_grid(spec, "infiniband")


def test_unknown_topology_prunes_nothing_and_says_so(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_topology(name, *args, **kwargs):
        if name == "nccl_tune.nccl.topology" or (args and args[2] and "topology" in args[2] and name == "nccl_tune"):
            raise ImportError("absent")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_topology)
    kind, note = gridlib.detect_topology()
    assert kind is None and "nothing pruned by topology" in note
    g = gridlib.build_grid(gridlib.spec_from_sets(["NCCL_PROTO=LL128"]), kind, topology_note=note)
    assert len(g.cells) == 2 and g.notes == [note]


def test_grouping_by_process_scope():
    spec = gridlib.spec_from_sets(["NCCL_PROTO=LL,default", "NCCL_NTHREADS=256,default", "NCCL_ALGO=Ring,default"])
    groups = gridlib.build_grid(spec).groups()
    assert [g.process_env for g in groups] == [{}, {"NCCL_NTHREADS": "256"}]
    assert [len(g.cells) for g in groups] == [4, 4]
    for group in groups:  # the cell without comm-scoped settings first
        assert group.cells[0].comm_env == {} and all(c.comm_env for c in group.cells[1:])
        assert all(c.process_env == group.process_env for c in group.cells)
    cell = groups[1].cells[1]
    assert set(cell.comm_env) <= {"NCCL_PROTO", "NCCL_ALGO"} and cell.process_key == (("NCCL_NTHREADS", "256"),)
