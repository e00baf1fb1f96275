"""`nccl-tune model predict|fit` and --model on recommend, sweep (sim) and validate."""

from __future__ import annotations

import json

import pytest

from nccl_tune.cli import cli


@pytest.fixture
def farmshare(real_fixtures, tmp_path, cli_runner):
    """A fitted model file from the published 2x L40S default curve (import-nccl-tests)."""
    src = real_fixtures / "reference_latency" / "farmshare-2xl40s-default.txt"
    rec = tmp_path / "fs.jsonl"
    assert cli_runner.invoke(cli, ["import-nccl-tests", str(src), "--out", str(rec)]).exit_code == 0
    model = tmp_path / "m.json"
    result = cli_runner.invoke(cli, ["model", "fit", str(rec), "--topology", "pcie-direct", "--out", str(model)])
    assert result.exit_code == 0, result.output
    return rec, model, result.output


def test_predict_json_has_the_fields_and_a_published_range(cli_runner):
    result = cli_runner.invoke(
        cli, ["model", "predict", "--topology", "pcie-amd-2s", "--nranks", "8", "--sizes", "2K,16K,32K", "--json"]
    )
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)
    assert [r["bytes"] for r in rows] == [2048, 16384, 32768]
    for row in rows:
        assert {"bytes", "time_us", "algo", "proto", "channels", "calibrated", "range_us"} <= set(row)
        low, high = row["range_us"]
        assert low < row["time_us"] * 1.5 and high / low <= 4.0 + 1e-6
        assert row["calibrated"] is False and row["range"]["machines"]
    # NCCL's search fallback on two AMD sockets: LL at 2 KB, Simple from 8 KB.
    assert [r["proto"] for r in rows] == ["LL", "Simple", "Simple"]
    forced = json.loads(
        cli_runner.invoke(
            cli, ["model", "predict", "--topology", "pcie-amd-2s", "--sizes", "16K", "--env", "NCCL_PROTO=LL", "--json"]
        ).output
    )
    assert forced[0]["proto"] == "LL" and forced[0]["time_us"] < rows[1]["time_us"]
    assert forced[0]["range_us"][1] < rows[1]["range_us"][1]  # the range follows the protocol


def test_predict_text_says_calibrated_and_names_the_machines(cli_runner):
    result = cli_runner.invoke(cli, ["model", "predict", "--topology", "nvlink-mesh", "--sizes", "16K"])
    assert result.exit_code == 0 and "MODELLED" in result.output
    header = next(line for line in result.output.splitlines() if line.startswith("bytes"))
    assert header.split() == [
        "bytes",
        "model",
        "us",
        "algo",
        "proto",
        "channels",
        "transport",
        "calibrated",
        "range",
        "us",
    ]
    assert "blog-v100-dgx1" in result.output


@pytest.mark.parametrize(
    "args, message",
    [
        (["--sizes", "16K"], "--topology is required"),
        (["--topology", "pcie", "--sizes", "16Q"], "16Q"),
        (["--topology", "pcie", "--env", "PROTO=LL"], "--env"),
        (["--topology", "pcie", "--env", "NCCL_ALGO=NVLS"], "--env"),
    ],
)
def test_predict_bad_input_is_one_line_exit_2(cli_runner, args, message):
    result = cli_runner.invoke(cli, ["model", "predict", *args])
    assert result.exit_code == 2 and message in result.output
    assert "Traceback" not in result.output


def test_fit_prints_the_error_per_point_and_predict_uses_it(cli_runner, farmshare):
    _, model, text = farmshare
    assert "CALIBRATED" in text and "model/measured" in text
    assert "calibrated: Ring/LL (every other algorithm/protocol stays uncalibrated" in text
    assert text.count("defaults") >= 20  # one row per measured size
    ll = json.loads(
        cli_runner.invoke(
            cli, ["model", "predict", "--model", str(model), "--sizes", "16K", "--env", "NCCL_PROTO=LL", "--json"]
        ).output
    )
    # Published: 9.96 us for NCCL_PROTO=LL at 16 KB on this machine (Ring/LL, fitted).
    assert ll[0]["calibrated"] and 0.67 <= ll[0]["time_us"] / 9.96 <= 1.5
    simple = json.loads(
        cli_runner.invoke(
            cli, ["model", "predict", "--model", str(model), "--sizes", "16K", "--env", "NCCL_PROTO=Simple", "--json"]
        ).output
    )
    # Published: 22.82 us for NCCL_PROTO=Simple: a pair the default curve never ran at a
    # latency-bound size, so uncalibrated, with the range published machines give it.
    assert not simple[0]["calibrated"] and simple[0]["range"]["machines"]
    low, high = simple[0]["range_us"]
    assert low <= 22.82 <= high
    clash = cli_runner.invoke(cli, ["model", "predict", "--model", str(model), "--topology", "nvlink"])
    assert clash.exit_code == 2 and "differs" in clash.output


def test_fit_refusal_is_one_line(cli_runner, farmshare, tmp_path):
    rec, _, _ = farmshare
    few = tmp_path / "few.jsonl"
    few.write_text(
        "".join(
            line
            for line in rec.read_text().splitlines(keepends=True)
            if '"bytes":16384,' in line or '"bytes":8192,' in line
        )
    )
    result = cli_runner.invoke(
        cli, ["model", "fit", str(few), "--topology", "pcie-direct", "--out", str(tmp_path / "x.json")]
    )
    assert result.exit_code == 2 and "at least 3 sizes" in result.output
    assert not (tmp_path / "x.json").exists()


def test_recommend_embedded_default_prints_a_range_and_its_machines(cli_runner):
    result = cli_runner.invoke(
        cli, ["recommend", "--layers", "61", "--topology", "pcie-amd-2s", "--baseline-tok-s", "62.9"]
    )
    assert result.exit_code == 0, result.output
    line = next(x for x in result.output.splitlines() if x.startswith("range: at 14336 B"))
    assert "festr-turin" in line and "aikitoria-turin" in line
    assert "range us" in result.output
    summary = next(line for line in result.output.splitlines() if line.startswith("Recommended:"))
    assert "62.9 -> " in summary and "tok/s over the published machines' range" in summary
    out = json.loads(
        cli_runner.invoke(
            cli, ["recommend", "--layers", "61", "--topology", "pcie-amd-2s", "--baseline-tok-s", "62.9", "--json"]
        ).output
    )
    low, high = out["recommended"]["projected_tok_s_range"]
    assert low < high and out["published_range"]["machines"]
    assert out["recommended"]["calibrated"] is False and out["recommended"]["latency_range_us"]
    # The report's own 62.9 -> 88.8 tok/s lies in the projected range.
    assert low <= 88.8 <= high


def test_recommend_and_sweep_with_a_fitted_model(cli_runner, farmshare, tmp_path):
    _, model, _ = farmshare
    out = json.loads(cli_runner.invoke(cli, ["recommend", "--layers", "61", "--model", str(model), "--json"]).output)
    assert out["topology"] == "pcie-direct" and out["world_size"] == 2
    assert any("CALIBRATED" in n for n in out["notes"])
    # The fit calibrated Ring/LL only: rows running it say calibrated, with the fit's range.
    rows = [out["baseline"], *out["cells"]]
    ll = [r for r in rows if r["effective"]["algo"] == "Ring" and r["effective"]["proto"] == "LL"]
    others = [r for r in rows if r not in ll]
    assert ll and all(r["calibrated"] and r["latency_range_us"] for r in ll)
    assert others and all(r["calibrated"] is False and r["latency_range_us"] for r in others)
    sim = tmp_path / "sim.jsonl"
    result = cli_runner.invoke(
        cli,
        [
            "sweep",
            "--backend",
            "sim",
            "--model",
            str(model),
            "--set",
            "NCCL_PROTO=Simple",
            "--sizes",
            "16K",
            "--mode",
            "eager",
            "--out",
            str(sim),
        ],
    )
    assert result.exit_code == 0, result.output
    recs = [json.loads(line) for line in sim.read_text().splitlines()]
    simple = [r for r in recs if r["env"].get("NCCL_PROTO") == "Simple"]
    assert simple and all(0.67 <= r["lat_us"]["p50"] / 22.82 <= 1.5 for r in simple)
    bad = cli_runner.invoke(cli, ["sweep", "--backend", "gloo", "--model", str(model), "--dry-run"])
    assert bad.exit_code == 2 and "--backend sim" in bad.output
