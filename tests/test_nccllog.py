"""NCCL's log as proof: new line forms (2.30 WARN, RCCL, opCount attribution) and the
per-rank report of `nccl-tune logs nccl` on real and own fixtures."""

from __future__ import annotations

import json

from conftest import OWN_FIXTURES

from nccl_tune.cli import cli
from nccl_tune.nccl import debuglog, nccllog

LOGS = OWN_FIXTURES / "nccl_log"
PROFILE = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS"}


# ---------------------------------------------------------------- line forms


def test_warn_line_with_function_2_30():
    e = debuglog.parse_log_line("h:1:2 [3] transport/net.cc:812 (sendConnect) NCCL WARN NET/IB : x")
    assert (e.kind, e.dev, e.message) == ("warn", 3, "NET/IB : x")
    assert e.data == {
        "source": "transport/net.cc:812",
        "file": "transport/net.cc",
        "line": 812,
        "function": "sendConnect",
    }
    lam = debuglog.parse_log_line("h:1:2 [0] init.cc:99 (operator()) NCCL WARN boom")
    assert lam.data["function"] == "operator()" and lam.message == "boom"
    old = debuglog.parse_log_line("h:1:2 [0] misc/cudawrap.cc:36 NCCL WARN Cuda failure 3")
    assert old.data["source"] == "misc/cudawrap.cc:36" and old.data["function"] is None


def test_rccl_banner_and_via_comm_suffix():
    banner = debuglog.parse_log_line("RCCL version : 2.27.7-HEAD:5e3c2a1")
    assert banner.kind == "version"
    assert banner.data == {"version": "2.27.7", "cuda": None, "library": "RCCL", "hip": None, "git": "5e3c2a1"}
    assert debuglog.parse_log_line("RCCL version 2.6.4+hip3.5").data["hip"] == "3.5"
    assert "library" not in debuglog.parse_log_line("NCCL version 2.21.5+cuda12.4").data
    t = debuglog.parse_log_line(
        "g:1:6 [3] NCCL INFO Channel 00/0 : 7[ce000] -> 5[c6000] via P2P/IPC comm 0x2bc1f840 nRanks 02"
    )
    assert (t.data["transport"], t.data["via"], t.data["comm"], t.data["nranks"]) == (
        "P2P/IPC",
        "P2P/IPC",
        "0x2bc1f840",
        2,
    )
    n = debuglog.parse_log_line(
        "g:1:6 [1] NCCL INFO Channel 02/0 : 1[c6000] -> 4[c1000] [receive] via NET/Socket/1 comm 0x95cdeb0 nRanks 08"
    )
    assert n.data["transport"] == "NET/Socket" and n.data["direction"] == "receive"


def test_numeric_trace_choice_takes_the_collective_of_its_api_call_line():
    entries = debuglog.parse_log((LOGS / "nccl2.21_trace_broadcast_after_allreduce.txt").read_text())
    choices = [(e.pid, e.data["func"], e.data["bytes"], e.data["proto"]) for e in entries if e.kind == "choice"]
    assert choices == [
        (7001, "AllReduce", 14336, "LL"),
        (7001, "AllReduce", 14336, "LL"),
        (7001, "Broadcast", 16384, "Simple"),
        (7002, "Broadcast", 16384, "Simple"),
        (7001, None, 999, "LL"),
    ]  # 999 B fits no call: left unnamed
    summary = debuglog.summarize_log(entries)
    # The Broadcast's Simple is no longer read as a contradicted AllReduce.
    assert debuglog.confirm_effective({"NCCL_PROTO": "LL"}, summary, "allreduce", 14336)["confirmed"]
    assert all(c["func"] == "AllReduce" for c in debuglog.choices_for(summary, "allreduce", 14336))
    assert debuglog.choices_for(summary, "allreduce", 16384) == []


def test_tuner_graph_and_comm_lines():
    kinds = {
        m: debuglog.parse_log_line(f"h:1:2 [0] NCCL INFO {m}")
        for m in (
            "TUNER/Plugin: Using Example (v6)",
            "TUNER/Plugin: Using tuner plugin Example",
            "TUNER/Plugin: Failed to find ncclTunerPlugin_v2, using internal tuner instead.",
            "Pattern 4, crossNic 0, nChannels 16, bw 20.000000/20.000000, type NVL/PIX, sameChannels 1",
            "comm 0x5967f7993f30 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0",
        )
    }
    values = list(kinds.values())
    assert values[0].data == {"loaded": True, "name": "Example", "interface": 6}
    assert values[1].data["name"] == "Example" and values[2].data["loaded"] is False
    assert values[3].kind == "graph" and values[3].data["intra"] == "NVL"
    assert values[4].kind == "comm" and values[4].data["nnodes"] == 1


# ---------------------------------------------------------------- the report


def test_rccl_report_per_rank(tmp_path):
    report = nccllog.analyze([str(LOGS / "rccl2.21_banner_via_comm.txt")], PROFILE)
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert set(ranks) == {0, 1} and all(r["library"] == "RCCL" and r["version"] == "2.21.5" for r in ranks.values())
    assert ranks[0]["transports"] == [
        {"peer": 1, "transport": "P2P/IPC", "channels": [0]},
        {"peer": 1, "transport": "SHM/direct", "channels": [1]},
    ]
    assert ranks[0]["channels"] == 2
    check = {v["name"]: v for v in report["profile_check"]["variables"]}
    assert check["NCCL_P2P_LEVEL"]["status"] == "confirmed"
    assert check["NCCL_PROTO"]["status"] == "missing" and len(check["NCCL_PROTO"]["missing"]) == 2
    assert any(w["kind"] == "p2p_not_used" for w in report["warnings"])


def test_warnings_of_the_2_30_log():
    report = nccllog.analyze([str(LOGS / "nccl2.30_warn_function_tuner_plugin.txt")])
    kinds = [w["kind"] for w in report["warnings"]]
    assert kinds == ["ll128_pcie", "tuner_and_env", "nccl_warn"]  # no P2P asked: SHM is fine
    asked = nccllog.analyze([str(LOGS / "nccl2.30_warn_function_tuner_plugin.txt")], PROFILE)
    assert "p2p_not_used" in [w["kind"] for w in asked["warnings"]]
    rank = report["ranks"][0]
    assert rank["tuner_plugin"]["loaded"] and rank["choices"][0]["proto"] == "LL128"
    assert next(w for w in report["warnings"] if w["kind"] == "nccl_warn")["source"] == "misc/cudawrap.cc:283"


def test_real_interleaved_2_12_log_two_ranks(real_fixtures):
    log = real_fixtures / "nccl_debug" / "nccl2.12.7_efa_2node_nccltests_interleaved_eks.txt"
    report = nccllog.analyze([str(log)], {"NCCL_SHM_DISABLE": "0", "NCCL_PROTO": "simple"})
    ranks = {r["rank"]: r for r in report["ranks"]}
    assert set(ranks) == {0, 1} and {r["version"] for r in ranks.values()} == {"2.12.7"}
    assert ranks[0]["transports"][0]["peer"] == 1 and ranks[1]["transports"][0]["peer"] == 0
    assert ranks[0]["transports"][0]["transport"] == "NET/AWS Libfabric"
    check = {v["name"]: v["status"] for v in report["profile_check"]["variables"]}
    # The OFI plugin SET NCCL_PROTO (env_plugin), NCCL did not read it from the environment.
    assert check == {"NCCL_SHM_DISABLE": "confirmed", "NCCL_PROTO": "missing"}
    assert ranks[0]["env_plugin"].get("NCCL_PROTO") == "simple"


def test_real_2_29_logs(real_fixtures):
    single = nccllog.analyze([str(real_fixtures / "nccl_debug" / "nccl2.29.7_single_gpu_init_first50.txt")])
    assert single["ranks"][0]["channels"] == 64 and single["ranks"][0]["nnodes"] == 1
    table = nccllog.analyze(
        [str(real_fixtures / "nccl_debug" / "nccl2.29.7_tuning_table_bytes_algo_proto.txt")], {"NCCL_P2P_DISABLE": "1"}
    )
    choices = table["ranks"][0]["choices"]
    assert {c["func"] for c in choices} == {"Broadcast"}
    at = {c["bytes"]: (c["algo"], c["proto"], c["channels"]) for c in choices}
    assert at[16384] == ("Ring", "LL", 2) and at[32768] == ("Ring", "Simple", 1)
    assert table["profile_check"]["ok"]


def test_one_file_per_process_and_the_restarted_server(tmp_path):
    good = (
        "h:{pid}:{pid} [{d}] NCCL INFO NCCL version 2.27.5+cuda12.9\n"
        "h:{pid}:{pid} [{d}] NCCL INFO NCCL_PROTO set by environment to LL\n"
        "h:{pid}:{pid} [{d}] NCCL INFO NCCL_BUFFSIZE set by environment to 16777216.\n"
    )
    lost = "h:{pid}:{pid} [{d}] NCCL INFO NCCL version 2.27.5+cuda12.9\n"
    paths = []
    for i, text in enumerate([good, good, lost]):
        path = tmp_path / f"nccl.h.{100 + i}.log"
        path.write_text(text.format(pid=100 + i, d=i))
        paths.append(str(path))
    report = nccllog.analyze(paths, {"NCCL_PROTO": "LL", "NCCL_BUFFSIZE": "0x1000000", "NCCL_DEBUG": "INFO"})
    check = {v["name"]: v for v in report["profile_check"]["variables"]}
    assert check["NCCL_PROTO"]["missing"] == ["h:102"] and check["NCCL_PROTO"]["status"] == "missing"
    assert check["NCCL_BUFFSIZE"]["confirmed"] == ["h:100", "h:101"]  # 0x1000000 == 16777216
    assert check["NCCL_DEBUG"]["status"] == "not_logged"
    assert not report["profile_check"]["ok"]


def test_cli_json_keys_and_exit_codes(tmp_path, cli_runner):
    log = LOGS / "nccl2.24_named_choice_ray_prefix.txt"
    prof = tmp_path / "p.env"
    prof.write_text("NCCL_PROTO=LL\nNCCL_ALGO=Ring\n")
    result = cli_runner.invoke(cli, ["logs", "nccl", str(log), "--profile", str(prof), "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.output)
    assert {"ranks", "profile_check", "warnings"} <= set(report)
    rank = report["ranks"][0]
    assert {"rank", "version", "env", "channels", "transports", "choices"} <= set(rank)
    assert rank["env"]["NCCL_MAX_NCHANNELS"] == "4" and rank["version"] == "2.24.3"
    prof.write_text("NCCL_PROTO=Simple\n")
    text = cli_runner.invoke(cli, ["logs", "nccl", str(log), "--profile", str(prof)])
    assert text.exit_code == 1 and "NCCL_PROTO=Simple: different" in text.output
    assert "AllReduce" in text.output and "Ring/LL" in text.output
    empty = tmp_path / "empty.log"
    empty.write_text("nothing here\n")
    bad = cli_runner.invoke(cli, ["logs", "nccl", str(empty)])
    assert bad.exit_code == 2 and "no NCCL log line" in bad.output
    assert len(bad.output.strip().splitlines()) == 1
    missing = cli_runner.invoke(cli, ["logs", "nccl", str(tmp_path / "nope.log")])
    assert missing.exit_code == 2 and "Traceback" not in missing.output


def test_rank_check_for_validate(tmp_path):
    log = tmp_path / "server.log"
    log.write_text(
        "[2026-01-01 10:00:00 TP0] loading\n"
        "h:5:5 [0] NCCL INFO NCCL_P2P_LEVEL set by environment to SYS\n"
        "h:6:6 [1] NCCL INFO NCCL version 2.27.5+cuda12.9\n"
    )
    out = nccllog.rank_check(str(log), {"NCCL_P2P_LEVEL": "SYS"})
    assert out["ok"] is False and out["ranks"] == 2 and "NCCL_P2P_LEVEL missing in 1" in out["summary"]
    none = tmp_path / "quiet.log"
    none.write_text("no nccl\n")
    assert nccllog.rank_check(str(none), {"NCCL_P2P_LEVEL": "SYS"})["ok"] is None
