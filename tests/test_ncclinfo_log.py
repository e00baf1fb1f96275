"""The NCCL log parser (nccl_tune.nccl.debuglog) and the requested-vs-observed comparison."""

from __future__ import annotations

from hypothesis import given
from hypothesis import settings as hsettings
from hypothesis import strategies as st

from nccl_tune.nccl import debuglog
from tests.conftest import OWN_FIXTURES

LOGS = OWN_FIXTURES / "nccl_log"


def _summary(path):
    return debuglog.summarize_log(debuglog.parse_log(path.read_text()))


# ---------------------------------------------------------------- single lines


def test_info_line_with_prefix_fields():
    entry = debuglog.parse_log_line("lab:1425048:1425050 [3] NCCL INFO Connected all rings")
    assert (entry.kind, entry.level, entry.host, entry.pid, entry.dev) == ("connected", "INFO", "lab", 1425048, 3)
    assert entry.data == {"what": "rings"}


def test_version_line_bare_and_as_info():
    bare = debuglog.parse_log_line("NCCL version 2.12.7+cuda11.4")
    info = debuglog.parse_log_line("h:1:1 [0] NCCL INFO NCCL version 2.29.7+cuda12.9")
    assert bare.kind == info.kind == "version"
    assert bare.data == {"version": "2.12.7", "cuda": "11.4"}
    assert info.data == {"version": "2.29.7", "cuda": "12.9"}


def test_set_by_environment_strips_the_sentence_dot_of_integers_only():
    assert debuglog.parse_log_line("h:1:1 [0] NCCL INFO NCCL_SHM_DISABLE set by environment to 0.").data == {
        "var": "NCCL_SHM_DISABLE",
        "value": "0",
    }
    assert debuglog.parse_log_line("h:1:1 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS").data == {
        "var": "NCCL_P2P_LEVEL",
        "value": "SYS",
    }


def test_transport_lines_of_every_kind():
    cases = {
        "Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read": "P2P/CUMEM",
        "Channel 01/0 : 8[0] -> 15[7] via P2P/IPC/read": "P2P/IPC",
        "Channel 06 : 15[e7000] -> 14[e1000] via P2P/direct pointer/read": "P2P/direct pointer",
        "Channel 00/0 : 0[0] -> 1[1] via SHM/direct/direct": "SHM/direct",
        "Channel 07/0 : 0[0] -> 2[0] [receive] via NET/IB/3/GDRDMA": "NET/IB",
        "Ring 00 : 12[41000] -> 11[2d000] via P2P/IPC": "P2P/IPC",
    }
    for message, transport in cases.items():
        entry = debuglog.parse_log_line(f"h:1:2 [0] NCCL INFO {message}")
        assert entry.kind == "transport", message
        assert entry.data["transport"] == transport


def test_ring_and_trees_lines():
    ring = debuglog.parse_log_line("h:1:2 [0] NCCL INFO Channel 05/16 :    0   7   6   5")
    assert ring.kind == "ring" and ring.data == {"channel": 5, "of": 16, "ranks": [0, 7, 6, 5]}
    trees = debuglog.parse_log_line("h:1:2 [0] NCCL INFO Trees [0] 1/-1/-1->0->-1 [1] -1/-1/-1->0->1")
    assert trees.kind == "trees" and [t for _, t in trees.data["trees"]] == ["1/-1/-1->0->-1", "-1/-1/-1->0->1"]


def test_per_collective_choice_named_form():
    entry = debuglog.parse_log_line(
        "h:1:1 [0] NCCL INFO AllReduce: 14336 Bytes -> Algo RING proto LL channel{Lo..Hi}={0..1}"
    )
    d = entry.data
    assert entry.kind == "choice"
    assert (d["func"], d["bytes"], d["algo"], d["proto"], d["channels"]) == ("AllReduce", 14336, "Ring", "LL", 2)


def test_per_collective_choice_numeric_form_uses_nccl_enum_order():
    # NCCL_ALGO_TREE 0, RING 1, ..., PAT 6; NCCL_PROTO_LL 0, LL128 1, SIMPLE 2.
    entry = debuglog.parse_log_line("h:1:1 [0] NCCL INFO 14336 Bytes -> Algo 1 proto 0 time 12.300000")
    assert (entry.data["algo"], entry.data["proto"], entry.data["time_us"]) == ("Ring", "LL", 12.3)
    assert entry.data["func"] is None
    pat = debuglog.parse_log_line("h:1:1 [0] NCCL INFO 64 Bytes -> Algo 6 proto 2 time 3.0")
    assert (pat.data["algo"], pat.data["proto"]) == ("PAT", "Simple")
    old = debuglog.parse_log_line("h:1:1 [0] NCCL INFO 64 Bytes -> Algo 2 proto 1 time 3.0", version=(2, 12, 7))
    assert old.data["algo"] == "CollNetDirect" and old.data["proto"] == "LL128"
    unknown = debuglog.parse_log_line("h:1:1 [0] NCCL INFO 64 Bytes -> Algo 9 proto 7 time 3.0")
    assert unknown.data["algo"] is None and unknown.data["proto"] is None


def test_warn_line_keeps_source_and_message():
    entry = debuglog.parse_log_line(
        "[2025-04-08 08:39:46] dev:589012:591652 [0] transport/nvls.cc:254 NCCL WARN Cuda failure 1 'invalid argument'"
    )
    assert entry.kind == "warn" and entry.data["source"] == "transport/nvls.cc:254"
    assert entry.message == "Cuda failure 1 'invalid argument'"


def test_launcher_prefixes_are_skipped():
    for prefix in ("[1,0]<stdout>:", "[0] ", "[rank3]:", "(worker pid=5) 2024-01-01 00:00:00.1 ", "node-1: "):
        entry = debuglog.parse_log_line(prefix + "h:1:1 [0] NCCL INFO Connected all rings")
        assert entry is not None and entry.kind == "connected", prefix


def test_non_nccl_lines_are_none():
    for line in ("", "#  Rank  0 Group  0 Pid 1 on lab device 0", "hello [0] world", "NCCL INFO without a device"):
        assert debuglog.parse_log_line(line) is None


@given(st.text(max_size=300))
@hsettings(max_examples=300, deadline=None)
def test_random_text_never_raises(text):
    entries = debuglog.parse_log(text)
    summary = debuglog.summarize_log(entries)
    debuglog.confirm_effective({"NCCL_PROTO": "LL"}, summary, "allreduce", 14336, 2)


@given(
    st.lists(
        st.sampled_from(
            [
                "h:1:1 [0] NCCL INFO ",
                "Algorithm |",
                "Protocol |",
                " Max NThreads |",
                " AllReduce |",
                "1.0/ 2.0 |",
                "Latency/AlgBw |",
                "Tree/ LL |",
                "Bytes -> Algo ",
                "RING proto LL",
                "channel{Lo..Hi}={0..",
                "9}",
                "x",
                "|",
            ]
        ),
        max_size=12,
    )
)
@hsettings(max_examples=300, deadline=None)
def test_fragments_of_real_lines_never_raise(parts):
    text = "".join(parts)
    debuglog.summarize_log(debuglog.parse_log([text, "h:1:1 [0] NCCL INFO " + text]))


# ---------------------------------------------------------------- real fixtures


def test_real_2_12_interleaved_mpi_log(real_fixtures):
    s = _summary(real_fixtures / "nccl_debug" / "nccl2.12.7_efa_2node_nccltests_interleaved_eks.txt")
    assert (s["version"], s["cuda"]) == ("2.12.7", "11.4")
    assert s["env"] == {"NCCL_SHM_DISABLE": "0"}
    assert s["env_plugin"] == {"NCCL_PROTO": "simple"}
    assert s["channels"] == 2
    assert s["transports"] == ["NET/AWS Libfabric"]
    assert s["connected"] == ["rings", "trees"]
    assert sorted(c["rank"] for c in s["comms"]) == [0, 1]


def test_real_2_29_single_gpu_init(real_fixtures):
    entries = debuglog.parse_log((real_fixtures / "nccl_debug" / "nccl2.29.7_single_gpu_init_first50.txt").read_text())
    s = debuglog.summarize_log(entries)
    assert s["version"] == "2.29.7"
    assert s["channels"] == 64  # from "Channel 22/64 : 0"
    assert len(s["rings"]) == 23
    assert any(e.kind == "init" and e.data["event"] == "Init START" for e in entries)
    assert s["comms"] == []  # the excerpt ends before Init COMPLETE


def test_real_2_29_tuning_table_and_choices(real_fixtures):
    s = _summary(real_fixtures / "nccl_debug" / "nccl2.29.7_tuning_table_bytes_algo_proto.txt")
    assert s["env"] == {"NCCL_P2P_DISABLE": "1"}
    assert s["tuning"]["AllReduce"]["Ring/LL"] == [16.6, 1.2]
    assert s["tuning"]["AllReduce"]["NVLS/Simple"] == [0.0, 0.0]
    # The PAT block's protocol row lists 3 groups, its data rows one: columns are PAT x 3 protocols.
    assert s["tuning"]["AllGather"]["PAT/Simple"] == [17.6, 3.6]
    assert len(s["choices"]) == 72
    first = s["choices"][0]
    assert (first["func"], first["bytes"], first["algo"], first["proto"], first["channels"]) == (
        "Broadcast",
        1024,
        "Ring",
        "LL",
        1,
    )
    big = debuglog.choices_for({"choices": s["choices"]}, "broadcast", 131072)
    assert {(c["proto"], c["channels"]) for c in big} == {("Simple", 4)}


# ---------------------------------------------------------------- own fixtures (other versions)


def test_own_2_21_numeric_form_with_mpi_rank_prefix():
    s = _summary(LOGS / "nccl2.21_numeric_choice_mpi_prefix.txt")
    assert s["version"] == "2.21.5"
    assert s["env"] == {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}
    assert s["channels"] == 2 and s["transports"] == ["P2P/CUMEM"]
    assert [(c["bytes"], c["algo"], c["proto"]) for c in s["choices"]] == [
        (14336, "Ring", "LL"),
        (14336, "Ring", "LL"),
        (57344, "Tree", "Simple"),
    ]
    assert s["warnings"] == ["Cuda failure 'peer access is not supported between these two devices'"]
    assert len(s["comms"]) == 2


def test_own_2_8_old_table_and_transports():
    s = _summary(LOGS / "nccl2.8_latency_algbw_table_old_transports.txt")
    assert s["version"] == "2.8.3"
    assert s["tuning"]["AllReduce"]["Ring/LL"] == [8.2, 1.6]
    assert s["tuning"]["AllReduce"]["CollNetDirect/Simple"] == [0.0, 0.0]
    assert s["transports"] == ["P2P/IPC", "P2P/direct pointer", "SHM/direct"]
    assert s["env"] == {"NCCL_SHM_DISABLE": "0"}


def test_own_2_24_named_form_behind_ray_prefix():
    s = _summary(LOGS / "nccl2.24_named_choice_ray_prefix.txt")
    assert s["version"] == "2.24.3" and s["channels"] == 4
    assert s["transports"] == ["NET/IB", "SHM/direct"]
    assert s["env"]["NCCL_MAX_NCHANNELS"] == "4"
    assert len(debuglog.choices_for(s, "allreduce", 14336)) == 2
    # all_gather / reduce_scatter: NCCL 2.24+ logs bytes per rank.
    assert len(debuglog.choices_for(s, "all_gather", 14336, world=2)) == 1
    assert debuglog.choices_for(s, "all_gather", 14336, world=1) == []


# ---------------------------------------------------------------- requested vs observed


def test_confirm_effective_obeyed():
    s = _summary(LOGS / "nccl2.24_named_choice_ray_prefix.txt")
    env = {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring", "NCCL_MAX_NCHANNELS": "4"}
    eff = debuglog.confirm_effective(env, s, "allreduce", 14336, 2)
    assert eff["confirmed"] is True
    assert (eff["algo"], eff["proto"], eff["channels"]) == ("Ring", "LL", 1)
    assert "NCCL 2.24.3" in eff["detail"] and "obeyed" in eff["detail"]


def test_confirm_effective_contradiction_on_protocol():
    s = _summary(LOGS / "nccl2.24_named_choice_ray_prefix.txt")
    eff = debuglog.confirm_effective({"NCCL_PROTO": "LL"}, s, "reduce_scatter", 14336, 2)
    assert eff["confirmed"] is False and eff["proto"] == "Simple"
    assert "contradicted" in eff["detail"] and "protocol Simple" in eff["detail"]


def test_confirm_effective_exclusion_and_per_collective_syntax():
    # The fixture's env lines say NCCL_PROTO=LL; drop them so only the choices are compared.
    s = dict(_summary(LOGS / "nccl2.24_named_choice_ray_prefix.txt"), env={})
    assert debuglog.confirm_effective({"NCCL_PROTO": "^Simple"}, s, "allreduce", 14336, 2)["confirmed"] is True
    assert debuglog.confirm_effective({"NCCL_PROTO": "^LL"}, s, "allreduce", 14336, 2)["confirmed"] is False
    per_coll = {"NCCL_PROTO": "Simple;allreduce:LL"}
    assert debuglog.confirm_effective(per_coll, s, "allreduce", 14336, 2)["confirmed"] is True


def test_confirm_effective_channel_bound_and_env_read():
    s = _summary(LOGS / "nccl2.24_named_choice_ray_prefix.txt")
    eff = debuglog.confirm_effective({"NCCL_MAX_NCHANNELS": "2"}, s, "allreduce", 14336, 2)
    assert eff["confirmed"] is False  # NCCL reports reading 4 and built 4 channels
    assert "NCCL_MAX_NCHANNELS" in eff["detail"]
    # 57344 bytes ran on 2 channels: within a bound of 4, beyond a bound of 1
    assert debuglog.confirm_effective({"NCCL_MAX_NCHANNELS": "4"}, s, "allreduce", 57344, 2)["confirmed"] is True


def test_confirm_effective_baseline_and_unknowns():
    s = _summary(LOGS / "nccl2.21_numeric_choice_mpi_prefix.txt")
    eff = debuglog.confirm_effective({}, s, "allreduce", 57344, 2)
    assert eff["confirmed"] is True and (eff["algo"], eff["proto"]) == ("Tree", "Simple")
    assert "nothing requested" in eff["detail"]
    none_seen = debuglog.confirm_effective({"NCCL_PROTO": "LL"}, s, "allreduce", 1024, 2)
    assert none_seen["confirmed"] is None and none_seen["algo"] is None and none_seen["channels"] == 2
    assert debuglog.confirm_effective({"NCCL_PROTO": "LL"}, None) is None
    assert debuglog.confirm_effective({}, debuglog.summarize_log([])) is None


def test_confirm_effective_env_mismatch_without_choice_is_a_contradiction():
    s = _summary(LOGS / "nccl2.21_numeric_choice_mpi_prefix.txt")
    eff = debuglog.confirm_effective({"NCCL_P2P_LEVEL": "PIX"}, s, "allreduce", 1024, 2)
    assert eff["confirmed"] is False and "NCCL_P2P_LEVEL=SYS" in eff["detail"]
