"""`nccl-tune recommend`: ranking, the pick, the embedded default, exports, planning."""

from __future__ import annotations

import json
import subprocess

import factories
import pytest
from conftest import python_cmd, subprocess_env

from nccl_tune import stats, store
from nccl_tune.cli import cli
from nccl_tune.decide import export, recommendation, tuner_rows
from nccl_tune.live import profile
from nccl_tune.nccl import tuner

SIZES = (8192, 14336, 28672, 57344)
P2P = {"NCCL_P2P_LEVEL": "SYS"}
P2P_LL = {"NCCL_P2P_LEVEL": "SYS", "NCCL_PROTO": "LL"}
TREE = {"NCCL_ALGO": "Tree"}


def synth(cells, rounds=5, noise=0.4, drift_sd=1.5, seed=0, samples=25, backend="nccl", sizes=SIZES):
    """Records of a sweep on the public report's 8-GPU box (factories.sweep_records):
    cells = [(env, lat_fn(bytes) -> us, extra record fields)]; every round drifts."""
    return factories.sweep_records(
        cells,
        sizes,
        rounds=rounds,
        noise=noise,
        drift_sd=drift_sd,
        seed=seed,
        samples=samples,
        backend=backend,
        versions={"nccl": "2.21.5", "torch": "2.5", "cuda": "12.4"},
        gpus=["NVIDIA RTX PRO 6000"] * 8,
        topology="pcie-shm",
    )


def flat(us, slope=1 / 2000):
    return lambda b: us + b * slope


def confirmed(algo="Ring", proto="LL", channels=1):
    return {"effective": {"algo": algo, "proto": proto, "channels": channels, "confirmed": True, "detail": "log"}}


def write(tmp_path, records, name="results.jsonl"):
    return factories.write_records(tmp_path, records, name)


def run(cli_runner, *args):
    return cli_runner.invoke(cli, ["recommend", *args], catch_exceptions=False)


def analyze(records, **kw):
    kw.setdefault("nbytes", 14336)
    kw.setdefault("collectives", 123)
    return recommendation.analyze_records(records, **kw)


def test_picks_the_truly_best_cell():
    records = synth(
        [
            ({}, flat(60), {}),
            (P2P, flat(24), confirmed()),
            (TREE, flat(50), confirmed("Tree")),
            ({"NCCL_PROTO": "Simple"}, flat(90), confirmed("Tree", "Simple")),
        ]
    )
    a = analyze(records)
    assert a.source == "measured" and a.recommended.env == P2P
    assert a.recommended.saving.saving_ms == pytest.approx(36 * 123 / 1000, abs=0.15)
    assert [c.env for c in a.cells][:2] == [P2P, TREE]
    simple = next(c for c in a.cells if c.env.get("NCCL_PROTO") == "Simple")
    assert simple.verdict == stats.SLOWER and not simple.eligible


def test_declares_no_winner_on_noise(tmp_path, cli_runner):
    records = synth([({}, flat(30), {}), (P2P, flat(30), {}), (TREE, flat(30), {})], noise=1.0, seed=5)
    a = analyze(records)
    assert a.recommended is None
    path = write(tmp_path, records)
    out = tmp_path / "p.env"
    result = run(cli_runner, "--layers", "61", "--results", path, "--export", str(out))
    assert result.exit_code == 1, result.output  # an export asked for and not written: exit 1
    assert "Keep NCCL's defaults" in result.output and not out.exists()
    assert "not written: no recommendation" in result.output


@pytest.mark.parametrize(
    "bad",
    [
        {"status": "wrong", "wrong": 12, "correct": False},
        {"status": "failed", "error": "NCCL error: unhandled cuda error"},
        {"status": "timeout", "error": "timed out after 120 s"},
        {
            "effective": {
                "algo": "Ring",
                "proto": "Simple",
                "channels": 2,
                "confirmed": False,
                "detail": "requested LL, ran Simple",
            }
        },
        {"final": False},
    ],
)
def test_never_picks_a_bad_cell(bad):
    fastest = {"NCCL_PROTO": "LL", "NCCL_P2P_LEVEL": "SYS", "NCCL_NTHREADS": "256"}
    records = synth([({}, flat(60), {}), (fastest, flat(15), bad), (P2P, flat(24), confirmed())])
    a = analyze(records)
    assert a.recommended is not None and a.recommended.env == P2P
    bad_rows = [c for c in a.cells + a.pruned if c.env == fastest]
    assert bad_rows and not bad_rows[0].eligible


@pytest.mark.parametrize(
    "env",
    [
        {"NCCL_PROTO": "$(touch /tmp/nccl-tune-pwned)"},
        {"NCCL_PROTO": "LL;touch /tmp/nccl-tune-pwned"},
        {"NCCL_PROTO": "LL\nLD_PRELOAD=/tmp/x.so"},
        {"LD_PRELOAD": "/tmp/x.so"},
        {"NCCL_NET_PLUGIN": "/tmp/evil.so"},
    ],
)
def test_settings_a_profile_refuses_never_reach_an_export_even_forced(tmp_path, cli_runner, env):
    """DESIGN.md section 8: what the profile grammar refuses, every export refuses; a
    results file is input like any other (hand-edited, from another tool)."""
    path = write(tmp_path, synth([({}, flat(60), {}), (env, flat(15), {})]))
    outs = {option: tmp_path / name for option, name in (("--export", "p.env"), ("--export-conf", "p.conf"))}
    words = [w for option, out in outs.items() for w in (option, str(out))]
    result = run(cli_runner, "--layers", "61", "--results", path, "--force", *words)
    assert result.exit_code == 1, result.output  # files asked for and not written
    assert "every cell that saves time is refused" in result.output
    assert not any(out.exists() for out in outs.values())


def test_declared_cells_can_win_but_say_so():
    records = synth([({}, flat(60), {}), (P2P, flat(24), {})])  # no NCCL log (effective null)
    a = analyze(records)
    assert a.recommended.env == P2P and a.recommended.trust == "declared"


def test_ties_go_to_fewer_variables():
    # Same true latency; the bigger cell happens to look 0.2 us faster.
    records = synth(
        [
            ({}, flat(60), {}),
            (P2P, flat(24), confirmed()),
            ({**P2P, "NCCL_NTHREADS": "512", "NCCL_BUFFSIZE": "16777216"}, flat(23.8), confirmed()),
        ],
        seed=2,
    )
    a = analyze(records)
    assert a.recommended.env == P2P


def test_a_clearly_better_bigger_cell_still_wins():
    records = synth([({}, flat(60), {}), (P2P, flat(30), confirmed()), (P2P_LL, flat(20), confirmed())])
    assert analyze(records).recommended.env == P2P_LL


def test_projection_matches_the_public_report(tmp_path, cli_runner):
    # The public report: 62.9 -> 88.8 tok/s is 4.64 ms per token; over 123 allreduces
    # (61 x 2 + 1, the defaults) that is 37.7 us less per allreduce.
    records = synth([({}, lambda b: 60.0, {}), (P2P, lambda b: 60.0 - 37.7, confirmed())], noise=0.2, drift_sd=0.5)
    path = write(tmp_path, records)
    result = run(cli_runner, "--layers", "61", "--results", path, "--baseline-tok-s", "62.9", "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    rec = out["recommended"]
    assert out["source"] == "measured" and out["collectives_per_token"] == 123
    assert out["message_bytes"] == 14336
    assert rec["saving_ms_per_token"] == pytest.approx(4.636, abs=0.05)
    assert rec["projected_tok_s"] == pytest.approx(88.8, abs=0.4)
    lo, hi = rec["saving_ci_ms"]
    assert lo < rec["saving_ms_per_token"] < hi
    assert {"cell", "env", "saving_ms_per_token", "saving_ci_ms", "projected_tok_s"} <= set(rec)
    assert all(
        {"cell", "env", "saving_ms_per_token", "saving_ci_ms", "projected_tok_s"} <= set(c) for c in out["cells"]
    )


@pytest.mark.slow
def test_embedded_default_runs_with_no_gpu_and_says_modelled():
    proc = subprocess.run(
        python_cmd("-m", "nccl_tune", "recommend", "--layers", "61"),
        capture_output=True,
        text=True,
        env=subprocess_env(CUDA_VISIBLE_DEVICES=""),
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("MODELLED, not measured") and "--results" in lines[0]
    # constants fitted to published tables: the header says so
    assert "fitted to published tables" in lines[0]
    assert lines[1].startswith("topology: pcie-amd-2s ASSUMED")
    # The advice follows from the topology it assumed: on the two-socket AMD kind NCCL picks
    # Simple for small messages and crosses sockets through host memory, so LL wins.
    rec = next(line for line in proc.stdout.splitlines() if line.startswith("Recommended:"))
    assert "NCCL_PROTO=LL" in rec and "MODELLED" in rec


@pytest.mark.parametrize("topology", ["nvlink", "pcie", "pcie-shm"])
def test_embedded_default_json(cli_runner, topology):
    result = run(cli_runner, "--layers", "61", "--topology", topology, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.output)
    assert out["source"] == "modelled" and out["collectives_per_token"] == 123
    assert out["topology"] == topology and topology in out["topology_note"]
    assert "fitted to published tables" in out["model_calibration"]
    if topology == "pcie-shm":
        # host memory costs ~0.3 us per LL step more than P2P: the profile saves a little.
        # By hand (2 channels on this kind; the model's figures for host memory, 1.3 us a
        # LL ring step and 10 GB/s a channel, against PCI's 1.0 us and 24 GB/s), NCCL picks
        # Ring/LL at 14336 B either way: through host memory 6.6 + 14 x 1.3 + 14336 B /
        # (2 x 10 GB/s x .5 x 8/14 = 5.714 GB/s) = 27.31 us, with P2P at SYS 6.6 + 14 x 1.0
        # + 14336 B / 13.71 GB/s = 21.65 us: 5.663 us less, x 123 allreduces = 0.6966 ms.
        assert out["recommended"]["env"] == P2P  # ties with the public profile: fewer variables
        assert out["baseline"]["latency_us"] == pytest.approx(27.31, abs=0.005)
        assert out["recommended"]["saving_ms_per_token"] == pytest.approx(0.6966, abs=0.0001)
    else:
        assert out["recommended"] is None and out["keep_defaults"]


def test_assumed_topology_is_named(cli_runner, monkeypatch):
    import sys
    import types

    import nccl_tune.nccl

    fake = types.ModuleType("nccl_tune.nccl.topology")
    fake.detect_kind = lambda: None  # no GPU
    monkeypatch.setitem(sys.modules, "nccl_tune.nccl.topology", fake)
    monkeypatch.setattr(nccl_tune.nccl, "topology", fake, raising=False)
    result = run(cli_runner, "--layers", "61")
    assert "pcie-amd-2s ASSUMED (no GPU found)" in result.output
    fake.detect_kind = lambda: "nvlink"
    assert "nvlink (detected)" in run(cli_runner, "--layers", "61").output

    def broken():
        raise OSError("nvidia-smi hung")

    fake.detect_kind = broken
    assert (
        "pcie-amd-2s ASSUMED (topology detection failed: nvidia-smi hung)" in run(cli_runner, "--layers", "61").output
    )


def test_exported_profile_lints_clean_and_round_trips(tmp_path, cli_runner):
    records = synth([({}, flat(60), {}), (P2P_LL, flat(22), confirmed())])
    path = write(tmp_path, records)
    out = tmp_path / "tp8.env"
    result = run(cli_runner, "--layers", "61", "--results", path, "--export", str(out), "--baseline-tok-s", "62.9")
    assert result.exit_code == 0, result.output
    prof = profile.load_profile(str(out))
    assert prof.env == P2P_LL
    assert recommendation.lint_problems(prof.env) == []
    assert export.lint_findings(out.read_text(), str(out)) == []
    for key in ("source", "what", "where", "nccl", "when", "saving", "command", "trust", "predicted"):
        assert key in prof.provenance, key
    assert prof.provenance["source"] == "measured with NCCL" and prof.provenance["nccl"] == "2.21.5"
    assert "CI" in prof.provenance["saving"] and "8x NVIDIA RTX PRO 6000" in prof.provenance["where"]
    assert prof.provenance["command"].startswith("nccl-tune recommend --layers 61 --results")
    assert not list(tmp_path.glob(".nccl-tune-*"))  # no temporary file left behind


def test_modelled_export_needs_force(tmp_path, cli_runner):
    out = tmp_path / "m.env"
    result = run(cli_runner, "--layers", "61", "--topology", "pcie-shm", "--export", str(out))
    assert not out.exists() and "pass --force" in result.output
    result = run(cli_runner, "--layers", "61", "--topology", "pcie-shm", "--export", str(out), "--force")
    prof = profile.load_profile(str(out))
    assert prof.env == P2P and prof.provenance["source"] == "modelled" and "forced" in prof.provenance


def test_force_exports_the_best_cell_without_a_significant_saving(tmp_path, cli_runner):
    records = synth([({}, flat(30), {}), (P2P, flat(29.9), {})], noise=1.0, seed=5)
    path = write(tmp_path, records)
    out = tmp_path / "f.env"
    run(cli_runner, "--layers", "61", "--results", path, "--export", str(out), "--force")
    prof = profile.load_profile(str(out))
    assert prof.env == P2P and "NOT significant" in prof.provenance["forced"]


def test_tuner_csv_has_explicit_channels_and_valid_names(tmp_path, cli_runner):
    def tree_small(b):
        return confirmed("Tree", "LL", 2) if b <= 14336 else confirmed("Ring", "LL", 1)

    records = synth([({}, flat(60), {}), (P2P, flat(24), tree_small)])
    path = write(tmp_path, records)
    csv = tmp_path / "nccl_tuner.conf"
    result = run(cli_runner, "--layers", "61", "--results", path, "--tuner-csv", str(csv))
    assert result.exit_code == 0, result.output
    text = csv.read_text()
    rules = tuner.parse(text)
    at = {b: tuner.first_match(rules, "allreduce", b, 1, 8) for b in SIZES}
    assert (at[14336].algorithm, at[14336].protocol, at[14336].channels) == ("tree", "ll", 2)
    assert (at[57344].algorithm, at[57344].protocol, at[57344].channels) == ("ring", "ll", 1)
    for coll in tuner.COLLECTIVES:  # every size of every collective has a rule
        assert tuner.gaps(rules, coll, 1, 8) == []
    assert all(r.channels >= 1 and r.nranks == 8 and r.nnodes == 1 for r in rules)
    assert "NCCL_TUNER_PLUGIN" in text and "NCCL_TUNER_CONFIG_FILE" in text
    assert all(len(line) < 255 for line in text.splitlines())


def test_tuner_csv_without_the_log_uses_forced_names_and_modelled_channels(tmp_path, cli_runner):
    records = synth([({}, flat(60), {}), ({**P2P, "NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}, flat(24), {})])
    path = write(tmp_path, records)
    csv = tmp_path / "t.csv"
    # NCCL_ALGO=Tree leaves allgather & co. without an algorithm the model knows: --force.
    run(cli_runner, "--layers", "61", "--results", path, "--tuner-csv", str(csv), "--force")
    text = csv.read_text()
    assert "NO RULE (runs on ONE channel): every allgather" in text
    assert "channel counts MODELLED" in text and "algorithm/protocol MODELLED" not in text
    rules = tuner.parse(text)
    assert {
        (
            tuner.first_match(rules, "allreduce", b, 1, 8).algorithm,
            tuner.first_match(rules, "allreduce", b, 1, 8).protocol,
        )
        for b in SIZES[1:]
    } == {("tree", "ll")}
    # Settings that force no algorithm: the model's choice fills in, and the header says so.
    records = synth([({}, flat(60), {}), (P2P, flat(24), {})])
    run(cli_runner, "--layers", "61", "--results", write(tmp_path, records, "b.jsonl"), "--tuner-csv", str(csv))
    text = csv.read_text()
    assert "algorithm/protocol MODELLED" in text and tuner.parse(text)


def test_simulated_records_say_simulated(tmp_path, cli_runner):
    records = synth([({}, flat(60), {}), (P2P, flat(24), {})], backend="sim")
    result = run(cli_runner, "--layers", "61", "--results", write(tmp_path, records))
    assert result.output.startswith("SIMULATED, not measured")
    assert analyze(records).source == "simulated"


def test_spec_steps_plan_under_baseline_and_recommended(tmp_path, cli_runner):
    sizes = tuple(14336 * n for n in (1, 2, 4, 8, 11))
    records = synth([({}, lambda b: 55 + b / 1500, {}), (P2P, lambda b: 22 + b / 9000, confirmed())], sizes=sizes)
    path = write(tmp_path, records)
    result = run(
        cli_runner,
        "--layers",
        "61",
        "--results",
        path,
        "--baseline-tok-s",
        "62.9",
        "--spec-steps",
        "1-10",
        "--accept-len",
        "2.9@4",
        "--draft-ms",
        "1.5",
        "--json",
    )
    assert result.exit_code == 0, result.output
    spec = json.loads(result.output)["spec"]
    assert spec["best_k_baseline"] >= 1 and spec["best_k_recommended"] >= 1
    assert spec["best_tok_s_recommended"] > spec["best_tok_s_baseline"]
    # Each verified token adds 14336 B to 123 allreduces: by the records' slopes 123 x
    # 14336 / 1500 us = 1.1755 ms a token on the baseline, 123 x 14336 / 9000 us = 0.1959 ms
    # under the cell (verify compute is flat, dense-like), so the cell flattens the verify
    # curve and its best step count is no lower (DESIGN.md section 6).
    for rows, slope in ((spec["baseline"], 1.1755), (spec["recommended"], 0.1959)):
        assert (rows[10]["verify_ms"] - rows[1]["verify_ms"]) / 9 == pytest.approx(slope, rel=0.03)
    assert spec["best_k_recommended"] >= spec["best_k_baseline"]
    plain = spec["baseline"][0]
    assert plain["k"] == 0 and plain["tok_s"] == pytest.approx(62.9, rel=1e-6)
    text = run(
        cli_runner,
        "--layers",
        "61",
        "--results",
        path,
        "--baseline-tok-s",
        "62.9",
        "--spec-steps",
        "1-10",
        "--accept-len",
        "2.9@4",
    ).output
    assert "decision under the baseline: speculate with k =" in text and "ASSUMED" in text  # draft assumed


def test_spec_steps_on_the_model_and_size_limits(tmp_path, cli_runner):
    result = run(
        cli_runner,
        "--layers",
        "61",
        "--topology",
        "pcie-shm",
        "--spec-steps",
        "1-6",
        "--accept-rate",
        "0.7",
        "--baseline-tok-s",
        "62.9",
    )
    assert result.exit_code == 0, result.output
    assert "under the recommended cell" in result.output
    records = synth([({}, flat(60), {}), (P2P, flat(24), {})], sizes=(14336, 28672))
    result = run(
        cli_runner,
        "--layers",
        "61",
        "--results",
        write(tmp_path, records),
        "--baseline-tok-s",
        "62.9",
        "--spec-steps",
        "1-4",
        "--accept-rate",
        "0.7",
    )
    assert "steps left out" in result.output and "2, 3, 4" in result.output


def test_plot(tmp_path, cli_runner):
    pytest.importorskip("matplotlib")
    png = tmp_path / "s.png"
    result = run(
        cli_runner,
        "--layers",
        "61",
        "--topology",
        "pcie-shm",
        "--plot",
        str(png),
        "--spec-steps",
        "1-4",
        "--accept-rate",
        "0.7",
        "--baseline-tok-s",
        "60",
    )
    assert result.exit_code == 0, result.output
    assert png.read_bytes()[:4] == b"\x89PNG"


@pytest.mark.slow
@pytest.mark.parametrize(
    "args,needle",
    [
        (["--results", "missing.jsonl"], "missing.jsonl"),
        (["--dtype", "int3"], "int3"),
        (["--spec-steps", "1-4", "--accept-len", "9@4", "--baseline-tok-s", "60"], "accept length"),
        (["--spec-steps", "1-4"], "--accept-len"),
        (["--spec-steps", "1-4", "--accept-rate", "0.5"], "--baseline-tok-s"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path, args, needle):
    proc = subprocess.run(
        python_cmd("-m", "nccl_tune", "recommend", "--layers", "61", *args),
        capture_output=True,
        text=True,
        env=subprocess_env(),
        cwd=tmp_path,
        timeout=120,
    )
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr


def test_results_without_baseline_or_wrong_world(tmp_path, cli_runner):
    only_cell = synth([(P2P, flat(24), {})])
    result = run(cli_runner, "--layers", "61", "--results", write(tmp_path, only_cell, "a.jsonl"))
    assert result.exit_code == 2 and "no baseline" in result.output
    both = synth([({}, flat(60), {}), (P2P, flat(24), {})])
    result = run(cli_runner, "--layers", "61", "--tp", "4", "--results", write(tmp_path, both, "b.jsonl"))
    assert result.exit_code == 2 and "world size 4" in result.output


def test_corrupt_lines_are_skipped_with_a_warning(tmp_path, cli_runner):
    path = write(tmp_path, synth([({}, flat(60), {}), (P2P, flat(24), {})]))
    with open(path, "a") as handle:
        handle.write("{not json\n")
    result = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", path])
    assert result.exit_code == 0 and "skipped" in result.output


def test_flat_sim_sweeps_keep_the_defaults(cli_runner, tmp_path):
    # 26 equal cells: the largest of 26 per-cell 95% intervals excludes zero by chance in
    # most sweeps; the family-wise (Bonferroni) interval must not, in any of six seeds.
    from nccl_tune.cli import cli

    kept = 0
    for seed in range(1, 7):
        out = tmp_path / f"flat{seed}.jsonl"
        sweep = cli_runner.invoke(
            cli,
            [
                "sweep",
                "--backend",
                "sim",
                "--topology",
                "pcie",
                "--sim-landscape",
                "flat",
                "--seed",
                str(seed),
                "--set",
                "NCCL_PROTO=default,LL,Simple",
                "--set",
                "NCCL_ALGO=default,Ring,Tree",
                "--set",
                "NCCL_NTHREADS=default,256,512",
                "--tokens",
                "1",
                "--rounds",
                "3",
                "--out",
                str(out),
            ],
        )
        assert sweep.exit_code == 0, sweep.output
        result = cli_runner.invoke(cli, ["recommend", "--layers", "61", "--results", str(out), "--json"])
        assert result.exit_code == 0, result.output
        payload = json.loads(result.output)
        assert payload["family_size"] == 26
        kept += payload["recommended"] is None
    assert kept == 6


NCCL_TESTS_HEADER = """# nccl-tests version 2.13.8 nccl-headers=21903 nccl-library=21903
# Collective test starting: all_reduce_perf
# nThread 1 nGpus 1 minBytes 0 maxBytes 65536 step: 2(factor) warmup iters: 5 iters: 20 agg iters: 1 validation: 1 graph: 0
#
# Using devices
#  Rank  0 Group  0 Pid  1 on h device  0 [0x01] NVIDIA A40
#  Rank  1 Group  0 Pid  2 on h device  1 [0x02] NVIDIA A40
#
#                                                              out-of-place                       in-place
#       size         count      type   redop    root     time   algbw   busbw #wrong     time   algbw   busbw #wrong
#        (B)    (elements)                               (us)  (GB/s)  (GB/s)            (us)  (GB/s)  (GB/s)
"""


def _nccl_tests_text(scale):
    # nccl-tests' default -b 0 run starts with a 0-byte row (a latency of nothing).
    rows = [
        "           0             0     float     sum      -1     0.30    0.00    0.00"
        "      0     0.30    0.00    0.00      0"
    ]
    for b in (4096, 8192, 16384, 32768, 65536):
        t = scale * (20 + b / 4000)
        rows.append(
            f"{b:12d} {b // 4:13d}     float     sum      -1  {t:7.2f}    0.10    0.10"
            f"      0  {t:7.2f}    0.10    0.10      0"
        )
    return NCCL_TESTS_HEADER + "\n".join(rows) + "\n# Out of bounds values : 0 OK\n#\n"


def test_imported_nccl_tests_with_a_zero_byte_row(tmp_path, cli_runner):
    from nccl_tune.measure import importers

    records = []
    for name, scale, env in (("base", 1.0, {}), ("p2p", 0.5, P2P)):
        src = tmp_path / f"{name}.txt"
        src.write_text(_nccl_tests_text(scale))
        records += importers.import_file(str(src), env=env)[0]
    # The importer leaves 0-byte rows out (NCCL returns at once for count 0); a record file
    # written by hand or by an older version may still hold one, as may a NaN p50 or a
    # string size: none of them may break the curves.
    assert not any(r["bytes"] == 0 for r in records)
    zero = dict(records[0], bytes=0, lat_us={**records[0]["lat_us"], "p50": 0.3})
    odd = dict(records[1], bytes=8192, lat_us={"p50": float("nan")})
    records += [zero, odd, dict(records[2], bytes="8192")]
    path = write(tmp_path, records)
    result = run(cli_runner, "--layers", "61", "--results", path, "--json")
    assert result.exit_code == 0, result.output
    out = json.loads(result.stdout)  # the reader's warnings about the three bad lines: stderr
    assert result.stderr.count("skipped: field") == 3
    assert out["source"] == "measured" and out["backend"] == "nccl-tests"
    p2p = next(c for c in out["cells"] if c["env"] == P2P)
    base_lat = 20 + 14336 / 4000  # between 8192 and 16384 B: log-log interpolated
    assert out["baseline"]["latency_us"] == pytest.approx(base_lat, rel=0.02)
    assert p2p["latency_us"] == pytest.approx(base_lat / 2, rel=0.02)
    # Library level too: the p50 points of the 0-byte rows never reach a curve.
    from nccl_tune.model import per_token as model

    assert 0 not in model.pooled_samples(records)
    assert all(0 not in sizes for sizes in model.round_points(records).values())


def test_spec_plan_marks_extrapolated_verify_sizes(tmp_path, cli_runner):
    records = synth([({}, flat(60), {}), (P2P, flat(24), {})], sizes=(14336, 28672))
    path = write(tmp_path, records)
    args = [
        "--layers",
        "61",
        "--results",
        path,
        "--baseline-tok-s",
        "62.9",
        "--spec-steps",
        "1-4",
        "--accept-rate",
        "0.7",
    ]
    spec = json.loads(run(cli_runner, *args, "--json").output)["spec"]
    assert [p["k"] for p in spec["baseline"]] == [0, 1] and spec["skipped_steps"] == [2, 3, 4]
    assert spec["extrapolation_note"] is None
    spec = json.loads(run(cli_runner, *args, "--extrapolate", "--json").output)["spec"]
    assert [p["k"] for p in spec["baseline"]] == [0, 1, 2, 3, 4]
    assert [p["extrapolated"] for p in spec["baseline"]] == [False, False, True, True, True]
    assert [p["extrapolated"] for p in spec["recommended"]] == [False, False, True, True, True]
    assert spec["extrapolated_bytes"] == {"2": 43008, "3": 57344, "4": 71680}
    text = run(cli_runner, *args, "--extrapolate").output
    assert "EXTRAPOLATED" in text and "43008 B (k = 2), 57344 B (k = 3), 71680 B (k = 4)" in text
    rows = [line for line in text.splitlines() if line[:1] in "01234" and "." in line]
    assert [line.count("*") for line in rows[-5:]] == [0, 0, 2, 2, 2]
    # --verify-ms points beyond which the verify time is extrapolated: the same contract
    wide = write(tmp_path, synth([({}, flat(60), {}), (P2P, flat(24), {})]), "wide.jsonl")
    args = [
        "--layers",
        "61",
        "--results",
        wide,
        "--spec-steps",
        "1-3",
        "--accept-rate",
        "0.7",
        "--verify-ms",
        "15.9,16.2@1,2",
    ]
    spec = json.loads(run(cli_runner, *args, "--json").output)["spec"]
    assert spec["skipped_steps_verify"] == [2, 3] and [p["k"] for p in spec["baseline"]] == [0, 1]
    spec = json.loads(run(cli_runner, *args, "--extrapolate", "--json").output)["spec"]
    assert spec["extrapolated_verify_tokens"] == {"2": 3, "3": 4} and not spec["extrapolated_bytes"]


def test_export_header_names_the_family_wise_interval(tmp_path, cli_runner):
    records = synth(
        [
            ({}, flat(60), {}),
            (P2P, flat(24), confirmed()),
            (TREE, flat(50), confirmed("Tree")),
            (P2P_LL, flat(40), confirmed()),
        ]
    )
    path = write(tmp_path, records)
    out = tmp_path / "fw.env"
    result = run(cli_runner, "--layers", "61", "--results", path, "--export", str(out))
    assert result.exit_code == 0, result.output
    saving = profile.load_profile(str(out)).provenance["saving"]
    assert "98.33% CI " in saving and "(family-wise 95%, Bonferroni over 3 cells)" in saving
    assert "(95% CI" not in saving
    a = analyze(records)
    lo, hi = a.recommended.saving.ci_ms
    assert f"98.33% CI {lo:.3f} to {hi:.3f} (family-wise 95%" in saving
    # One cell compared: the plain level, no family words.
    one = write(tmp_path, synth([({}, flat(60), {}), (P2P, flat(24), confirmed())]), "one.jsonl")
    run(cli_runner, "--layers", "61", "--results", one, "--export", str(out))
    saving = profile.load_profile(str(out)).provenance["saving"]
    assert "(95% CI " in saving and "family-wise" not in saving


def test_plain_decoding_in_the_spec_table_matches_the_projection(tmp_path, cli_runner):
    records = synth([({}, flat(60), {}), (P2P, flat(24), confirmed())], noise=3.0, drift_sd=4.0, samples=9, seed=3)
    path = write(tmp_path, records)
    out = json.loads(
        run(
            cli_runner,
            "--layers",
            "61",
            "--results",
            path,
            "--baseline-tok-s",
            "62.9",
            "--spec-steps",
            "1-3",
            "--accept-rate",
            "0.7",
            "--json",
        ).output
    )
    rec = out["recommended"]
    # The table's saving (paired by round) is not the difference of its pooled-p50 columns:
    # the spec plan must follow the former, not re-derive it from the curves.
    assert abs(rec["saving_ms_per_token"] - (out["baseline"]["comm_ms_per_token"] - rec["comm_ms_per_token"])) > 0.01
    plain = out["spec"]["recommended"][0]
    assert plain["k"] == 0 and plain["tok_s"] == pytest.approx(rec["projected_tok_s"], rel=1e-9)
    assert out["spec"]["baseline"][0]["tok_s"] == pytest.approx(62.9, rel=1e-9)
    text = run(
        cli_runner,
        "--layers",
        "61",
        "--results",
        path,
        "--baseline-tok-s",
        "62.9",
        "--spec-steps",
        "1-3",
        "--accept-rate",
        "0.7",
    ).output
    assert f"-> {rec['projected_tok_s']:.1f} tok/s" in text
    plain_row = next(line for line in text.splitlines() if line.startswith("0 (plain)"))
    assert plain_row.split()[-1] == f"{rec['projected_tok_s']:.1f}"


def test_tuner_rules_come_from_the_exported_cell_at_the_family_wise_level(tmp_path, cli_runner):
    # P2P wins at the decode size (ties go to fewer variables); the bigger Tree cell is tied
    # there but much faster at 57344 B, and neither beats the baseline at 8192 B. The old
    # writer took each size's fastest cell and report's uncorrected verdicts.
    tree_cell = {**P2P, "NCCL_ALGO": "Tree", "NCCL_PROTO": "LL"}

    def p2p_lat(b):
        return 60.0 if b == 8192 else 24.0

    def tree_lat(b):
        return 60.0 if b == 8192 else 10.0 if b == 57344 else 24.0

    records = synth(
        [
            ({}, lambda b: 60.0, {}),
            (P2P, p2p_lat, confirmed("Ring", "LL", 1)),
            (tree_cell, tree_lat, confirmed("Tree", "LL", 2)),
        ],
        seed=4,
    )
    path = write(tmp_path, records)
    env_out, csv = tmp_path / "p.env", tmp_path / "t.csv"
    result = run(cli_runner, "--layers", "61", "--results", path, "--export", str(env_out), "--tuner-csv", str(csv))
    assert result.exit_code == 0, result.output
    assert profile.load_profile(str(env_out)).env == P2P
    text = csv.read_text()
    rules = tuner.parse(text)
    assert {
        (r.algorithm, r.protocol, r.channels)
        for r in rules
        if r.collective == "allreduce" and r.min_bytes <= 57344 and r.max_bytes >= 8192
    } == {("ring", "ll", 1)}
    text = text.replace("\n#    ", " ")  # comment lines wrapped for the plugin's line buffer
    assert "rules describe one cell, the exported profile's: NCCL_P2P_LEVEL=SYS" in text
    assert "97.5% CI above zero (family-wise 95%, Bonferroni over 2 cells)" in text
    assert "not faster: NCCL's own choice, from NCCL's log (measured at 8192 B)" in text
    # The per-cell level decides: a saving significant at 95% alone but not at the
    # family-wise level gives no rule (checked on the library function directly).
    a = analyze(records)
    row = a.recommended
    a.cell_confidence = 1 - 1e-12  # an interval so wide nothing excludes zero
    points, notes = tuner_rows.tuner_points(a, "pcie-shm", row)
    measured = [p for p in points if p.measured]
    assert measured and all(p.origin.startswith("not faster") for p in measured)


def test_a_search_stopped_before_its_final_rung_says_so(tmp_path, cli_runner):
    out = tmp_path / "capped.jsonl"
    sweep = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--topology",
            "pcie-shm",
            "--set",
            "NCCL_P2P_LEVEL=default,SYS",
            "--set",
            "NCCL_PROTO=default,LL,Simple",
            "--set",
            "NCCL_ALGO=default,Ring,Tree",
            "--tokens",
            "1",
            "--search",
            "halving",
            "--budget",
            "10",
            "--out",
            str(out),
        ],
    )
    assert sweep.exit_code == 0, sweep.output
    assert all(r.get("final") is False for r in store.read_records([str(out)]))
    env_out = tmp_path / "p.env"
    result = run(cli_runner, "--layers", "61", "--results", str(out), "--export", str(env_out))
    assert result.exit_code == 2 and not env_out.exists()
    message = result.output.strip()
    assert len(message.splitlines()) == 1 and "no baseline" not in message
    assert "never reached its final rung" in message and "larger --budget" in message
    assert "nothing is recommended" in message
    assert "best pruned cells at 14336 B (simulated): NCCL_P2P_LEVEL=SYS" in message
