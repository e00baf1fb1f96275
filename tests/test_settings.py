"""The NCCL variable catalogue: every variable the issue names, and each grammar rule."""

from __future__ import annotations

import re

import pytest

from nccl_tune.nccl import settings
from nccl_tune.nccl.settings import ERROR, WARNING, check_value

ISSUE_VARIABLES = """NCCL_PROTO NCCL_ALGO NCCL_MAX_NCHANNELS NCCL_MIN_NCHANNELS NCCL_MAX_NRINGS
NCCL_MIN_NRINGS NCCL_MAX_CTAS NCCL_MIN_CTAS NCCL_BUFFSIZE NCCL_LL_BUFFSIZE NCCL_LL128_BUFFSIZE
NCCL_NTHREADS NCCL_LL128_NTHREADS NCCL_P2P_LEVEL NCCL_P2P_DISABLE NCCL_SHM_DISABLE
NCCL_NVLS_ENABLE NCCL_CUMEM_ENABLE NCCL_GRAPH_REGISTER NCCL_CTA_POLICY NCCL_THREAD_THRESHOLDS
NCCL_NO_CACHE NCCL_TUNER_PLUGIN NCCL_TUNER_CONFIG_FILE NCCL_DEBUG NCCL_DEBUG_SUBSYS
NCCL_DEBUG_FILE NCCL_NET_GDR_LEVEL NCCL_SOCKET_IFNAME NCCL_IB_HCA""".split()


def severities(name, value, version=None):
    return [sev for sev, _ in check_value(name, value, version)]


# DESIGN.md section 5: re-read at every communicator init; everything else is read once
# per process (cached NCCL_PARAMs, or process-wide like NCCL_P2P_LEVEL and NCCL_DEBUG*).
COMMUNICATOR_SCOPED = {"NCCL_PROTO", "NCCL_ALGO", "NCCL_THREAD_THRESHOLDS"}
# Defaults NCCL publishes (docs/env.rst: BUFFSIZE 4194304, DEBUG_SUBSYS INIT,BOOTSTRAP,ENV,
# NVLS_ENABLE 2, CUMEM_ENABLE 1 since 2.19, GRAPH_REGISTER 1, CTA_POLICY 0; P2P_DISABLE
# and SHM_DISABLE 0; tuning.cc's LL128 maximum of 640 threads). The rest are unset.
PUBLISHED_DEFAULTS = {
    "NCCL_BUFFSIZE": "4194304",
    "NCCL_DEBUG_SUBSYS": "INIT,BOOTSTRAP,ENV",
    "NCCL_NVLS_ENABLE": "2",
    "NCCL_CUMEM_ENABLE": "1",
    "NCCL_GRAPH_REGISTER": "1",
    "NCCL_CTA_POLICY": "0",
    "NCCL_P2P_DISABLE": "0",
    "NCCL_SHM_DISABLE": "0",
    "NCCL_LL128_NTHREADS": "unset: 640",
}


@pytest.mark.parametrize("name", ISSUE_VARIABLES)
def test_every_issue_variable_is_catalogued(name):
    setting = settings.lookup(name)
    assert setting.name == name
    assert setting.scope == ("communicator" if name in COMMUNICATOR_SCOPED else "process")
    expected = PUBLISHED_DEFAULTS.get(name, "unset")
    assert re.match(rf"{re.escape(expected)}\b", setting.default), setting.default
    assert setting.meaning.endswith(".") and len(setting.meaning) > 20


def test_scopes_follow_design():
    # Re-read at every communicator init (DESIGN.md section 5).
    for name in ("NCCL_PROTO", "NCCL_ALGO", "NCCL_THREAD_THRESHOLDS"):
        assert settings.scope_of(name) == "communicator"
    for name in (
        "NCCL_NTHREADS",
        "NCCL_BUFFSIZE",
        "NCCL_MAX_NCHANNELS",
        "NCCL_P2P_LEVEL",
        "NCCL_CUMEM_ENABLE",
        "NCCL_DEBUG",
    ):
        assert settings.scope_of(name) == "process"
    assert settings.scope_of("NCCL_NOT_A_THING") == "process"


def test_catalogue_names_are_read_by_the_installed_libnccl():
    # The library's own strings list the variables it reads; the tuner config file is
    # read by the tuner plugin, not by libnccl.
    from nccl_tune.live.lint import installed_names

    known = installed_names()
    if known.names is None:
        pytest.skip("no libnccl installed")
    missing = [n for n in settings.CATALOGUE if n not in known.names]
    assert missing == ["NCCL_TUNER_CONFIG_FILE"]


def test_split_by_scope_keeps_order():
    env = {"NCCL_NTHREADS": "256", "NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "1048576", "NCCL_ALGO": "Ring"}
    process, communicator = settings.split_by_scope(env)
    assert list(process) == ["NCCL_NTHREADS", "NCCL_BUFFSIZE"]
    assert list(communicator) == ["NCCL_PROTO", "NCCL_ALGO"]


# ------------------------------------------------------------------ PROTO / ALGO grammar


@pytest.mark.parametrize(
    "value,expected",
    [
        ("LL", {"LL"}),
        ("ll,simple", {"LL", "Simple"}),  # case-insensitive
        ("^LL", {"LL128", "Simple"}),  # ^ excludes
        ("^LL128", {"LL", "Simple"}),
        ("Simple;allreduce:LL", {"LL"}),  # per collective (2.24+)
        ("LL;broadcast:Simple", {"LL"}),
        ("allreduce:^LL", {"LL128", "Simple"}),
    ],
)
def test_allowed_protocols_for_allreduce(value, expected):
    assert settings.allowed_protocols(value) == frozenset(expected)


def test_allowed_protocols_unset_is_all():
    assert settings.allowed_protocols(None) == frozenset(settings.PROTOCOLS)
    assert settings.allowed_protocols("LL;allreduce:Simple", func="broadcast") == {"LL"}


def test_allowed_algorithms():
    assert settings.allowed_algorithms("ring") == {"Ring"}
    assert settings.allowed_algorithms("^NVLS,NVLSTree") == frozenset(settings.ALGORITHMS) - {"NVLS", "NVLSTree"}
    assert settings.allowed_algorithms("Tree;allreduce:Ring,Tree") == {"Ring", "Tree"}


@pytest.mark.parametrize(
    "value", ["LL128", "^LL", "^Simple", "LL;allreduce:LL128", "^LL,Simple", "simple;reduce:ll128"]
)
def test_enables_ll128(value):
    assert settings.enables_ll128(value)
    assert WARNING in severities("NCCL_PROTO", value)


@pytest.mark.parametrize("value", ["LL", "Simple", "LL,Simple", "^LL128", "LL;allreduce:Simple"])
def test_does_not_enable_ll128(value):
    assert not settings.enables_ll128(value)
    assert severities("NCCL_PROTO", value) == []


@pytest.mark.parametrize(
    "name,value,why",
    [
        ("NCCL_PROTO", "LL,Fast", "unknown protocol"),
        ("NCCL_PROTO", "", "empty"),
        ("NCCL_PROTO", "LL;sendrecv:Simple", "unknown collective"),  # not one of NCCL's five
        ("NCCL_PROTO", "allreduce:LL;Simple", "only the first list"),
        ("NCCL_PROTO", "^LL,LL128,Simple", "leaves no protocol"),
        ("NCCL_ALGO", "CollNet", "unknown algorithm"),
        ("NCCL_ALGO", "Ring,,Tree", "empty"),
    ],
)
def test_proto_algo_errors(name, value, why):
    found = check_value(name, value)
    assert [sev for sev, _ in found] == [ERROR]
    assert why in found[0][1]


def test_per_collective_form_needs_2_24():
    assert severities("NCCL_PROTO", "LL;allreduce:Simple", (2, 23, 4)) == [WARNING]
    assert severities("NCCL_PROTO", "LL;allreduce:Simple", (2, 24, 3)) == []
    assert severities("NCCL_ALGO", "Ring;allreduce:Tree", (2, 21, 5)) == [WARNING]


# ------------------------------------------------------------------ P2P level


@pytest.mark.parametrize("value", settings.P2P_LEVELS)
def test_p2p_level_names(value):
    assert severities("NCCL_P2P_LEVEL", value) == []
    assert severities("NCCL_NET_GDR_LEVEL", value) == []


def test_p2p_level_wrong_case_is_a_warning():
    found = check_value("NCCL_P2P_LEVEL", "sys")
    assert [sev for sev, _ in found] == [WARNING]
    assert "case" in found[0][1] and "SYS" in found[0][1]


@pytest.mark.parametrize("value,means", [("0", "LOC"), ("2", "PXB"), ("4", "SYS"), ("9", "SYS")])
def test_p2p_level_legacy_integers(value, means):
    found = check_value("NCCL_P2P_LEVEL", value)
    assert [sev for sev, _ in found] == [WARNING]
    assert f"means {means}" in found[0][1]


@pytest.mark.parametrize("value", ["NODE", "PCI", "2x", ""])
def test_p2p_level_invalid(value):
    assert severities("NCCL_P2P_LEVEL", value) == [ERROR]


# ------------------------------------------------------------------ integers and ranges


@pytest.mark.parametrize(
    "name,good,bad",
    [
        ("NCCL_NTHREADS", ["64", "96", "256", "512"], ["32", "100", "544", "x", "-64"]),
        ("NCCL_LL128_NTHREADS", ["160", "640"], ["128", "672", "170"]),
        ("NCCL_MAX_NCHANNELS", ["1", "16", "64"], ["0", "65", "sixteen"]),
        ("NCCL_MIN_NCHANNELS", ["1", "32"], ["0"]),
        ("NCCL_MAX_CTAS", ["1", "64"], ["0", "65"]),
        ("NCCL_BUFFSIZE", ["16777216", "0x400000"], ["0", "-1", "4M"]),
        ("NCCL_P2P_DISABLE", ["0", "1"], ["2", "yes"]),
        ("NCCL_NVLS_ENABLE", ["0", "1", "2"], ["3"]),
        ("NCCL_CTA_POLICY", ["0", "2", "EFFICIENCY"], ["3", "FAST"]),
        ("NCCL_DEBUG", ["INFO", "warn", "TRACE"], ["DEBUG"]),
        ("NCCL_THREAD_THRESHOLDS", ["8 8 64 8 8 64", "512"], ["a b", "1 2 3 4 5 6 7"]),
        ("NCCL_SOCKET_IFNAME", ["eth0", "^docker,lo", "=eth0"], ["^", ","]),
    ],
)
def test_ranges(name, good, bad):
    for value in good:
        assert ERROR not in severities(name, value), value
    for value in bad:
        assert ERROR in severities(name, value), value


def test_channels_above_32_warn_before_2_25():
    assert severities("NCCL_MAX_NCHANNELS", "48", (2, 24, 3)) == [WARNING]
    assert severities("NCCL_MAX_NCHANNELS", "48", (2, 25, 1)) == []


def test_version_notes_for_recent_variables():
    assert severities("NCCL_NO_CACHE", "ALL", (2, 28, 0)) == [WARNING]
    assert severities("NCCL_NO_CACHE", "ALL", (2, 29, 7)) == []
    assert severities("NCCL_CTA_POLICY", "1", (2, 26, 0)) == [WARNING]


def test_debug_subsys_unknown_is_a_warning():
    assert severities("NCCL_DEBUG_SUBSYS", "INIT,TUNING,ENV") == []
    assert severities("NCCL_DEBUG_SUBSYS", "^NET") == []
    assert severities("NCCL_DEBUG_SUBSYS", "INIT,TUNNING") == [WARNING]


def test_unknown_names_and_validity():
    assert check_value("NCCL_NOT_A_THING", "whatever") == []
    assert settings.is_valid("NCCL_PROTO", "^LL")  # a warning is still valid
    assert not settings.is_valid("NCCL_PROTO", "Fast")
