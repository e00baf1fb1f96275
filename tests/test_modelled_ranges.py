"""Every modelled output prints its range and whether it is calibrated: spec-plan's
comm(n) from --layers and validate's prediction from the cost model, the same way
`model predict` prints a modelled time.

Expected values are worked here from `model predict --json` (the per-allreduce time,
NCCL's choice and its range) and by hand: 61 layers give 2 x 61 + 1 = 123 allreduces per
forward, one draft layer 2 x 1 + 1 = 3; n tokens of hidden 7168 in bf16 are n x 14336 B.
The machines a range names are looked up in the shipped reference data itself.
"""

from __future__ import annotations

import json
from importlib import resources

import pytest

from integration import validate as lib
from nccl_tune.cli import cli
from nccl_tune.commands.validate_render import render

SPEC = [
    "spec-plan",
    "--accept-len",
    "3.2@4",
    "--decode-ms",
    "20",
    "--draft-ms",
    "1.5",
    "--verify-ms",
    "22,26@2,5",
    "--verify-model",
    "dense",
    "--layers",
    "61",
    "--steps",
    "1-2",
    "--topology",
    "pcie-shm",
]


def _predict(cli_runner, sizes, *extra) -> tuple[list[dict], list[str]]:
    """`model predict` at `sizes` in graph mode (no launch time: what comm(n) and validate's
    prediction model) as JSON rows, and its text lines after the table."""
    args = [
        "model",
        "predict",
        "--topology",
        "pcie-shm",
        "--nranks",
        "8",
        "--mode",
        "graph",
        "--sizes",
        ",".join(map(str, sizes)),
        *extra,
    ]
    rows = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    text = cli_runner.invoke(cli, args).stdout.splitlines()
    return rows, text[4 + len(sizes) :]  # two header lines, the table's head and rule, its rows


def _shipped_machines() -> dict[str, set[str]]:
    data = json.loads((resources.files("nccl_tune") / "data" / "references.json").read_text())
    out: dict[str, set[str]] = {}
    for ref in data["references"]:
        out.setdefault(ref["machine"], set()).add(ref["kind"])
    return out


def test_spec_plan_prints_comm_ranges_as_model_predict_does(cli_runner):
    result = cli_runner.invoke(cli, SPEC)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    head = lines.index(
        "comm(n), MODELLED (uncalibrated: no fit of your machine): 123 allreduces "
        "per forward of n tokens at the model's time per allreduce"
    )
    predicted, notes = _predict(cli_runner, [28672, 43008])  # k = 1, 2: 2 and 3 tokens
    assert lines[head + 1].split() == [
        "tokens",
        "bytes",
        "model",
        "us",
        "algo",
        "proto",
        "calibrated",
        "range",
        "us",
        "comm",
        "ms",
        "comm",
        "range",
        "ms",
    ]
    for line, tokens, p in zip(lines[head + 3 : head + 5], (2, 3), predicted):
        low, high = p["range_us"]
        assert line.split() == [
            str(tokens),
            str(tokens * 14336),
            f"{p['time_us']:.2f}",
            p["algo"],
            p["proto"],
            "no",
            f"{low:.1f}-{high:.1f}",
            f"{123 * p['time_us'] / 1000:.3f}",
            f"{123 * low / 1000:.3f}-{123 * high / 1000:.3f}",
        ]
    # the range notes are model predict's own lines for the same sizes
    assert lines[head + 5 : head + 5 + len(notes)] == notes

    out = json.loads(cli_runner.invoke(cli, [*SPEC, "--json"]).stdout)
    comm = out["comm_model"]
    assert (comm["collectives"], comm["calibrated"]) == (123, False)
    shipped = _shipped_machines()
    for row, tokens, p in zip(comm["rows"], (2, 3), predicted):
        assert (row["tokens"], row["bytes"], row["calibrated"]) == (tokens, tokens * 14336, False)
        assert {k: v for k, v in row.items() if k in p and k != "mode"} == {k: v for k, v in p.items() if k != "mode"}
        assert row["comm_ms"] == pytest.approx(123 * p["time_us"] / 1000, abs=1e-4)
        assert row["comm_range_ms"] == pytest.approx([123 * v / 1000 for v in p["range_us"]])
        found = row["range"]
        assert found["machines"] and all(shipped[m] & set(found["kinds"]) for m in found["machines"])


def test_spec_plan_without_modelled_comm_prints_no_comm_range(cli_runner):
    flat = [a if a != "22,26@2,5" else "24" for a in SPEC if a not in ("--verify-model", "dense")]
    for args in (flat, [a for a in SPEC[: SPEC.index("--layers")]] + ["--steps", "1-2"]):
        result = cli_runner.invoke(cli, [*args, "--json"])
        assert result.exit_code == 0, result.output
        assert json.loads(result.stdout)["comm_model"] is None  # comm(n) priced nothing
        assert "comm(n), MODELLED" not in cli_runner.invoke(cli, args).stdout


def _measured(accept: float) -> dict:
    out = {}
    for k in (0, 2):
        for label, tok_s in (("baseline", [50.0, 51.0]), ("profile", [52.0, 53.0])):
            out[(label, k)] = {
                "status": "ok",
                "runs_tok_s": tok_s,
                "world_size": 8,
                "backend": "nccl",
                "accept_len": accept if k else 1.0,
            }
    return out


def _options(tmp_path, env, **kw) -> lib.Options:
    return lib.Options(
        profile_env=env,
        profile_name="p",
        steps=[0, 2],
        out=str(tmp_path / "o.jsonl"),
        topology="pcie-shm",
        layers=61,
        hidden=7168,
        dtype="bf16",
        draft_layers=1,
        **kw,
    )


def _expected_range(base: list[dict], prof: list[dict], accept: float) -> list[float]:
    """k = 2: one target forward of 3 tokens (123 allreduces of 43008 B) and two draft
    forwards of one token (3 allreduces of 14336 B each), per accepted token; each saves
    the model's relative saving at its size times the defaults' range there."""
    one, three = (
        [n * lat * (1 - p["time_us"] / b["time_us"]) / 1000 for lat in b["range_us"]]
        for n, b, p in ((2 * 3, base[0], prof[0]), (123, base[1], prof[1]))
    )
    return [(one[0] + three[0]) / accept, (one[1] + three[1]) / accept]


def test_validate_prints_the_modelled_predictions_range_and_calibration(cli_runner, tmp_path):
    env = {"NCCL_P2P_LEVEL": "SYS"}
    result = lib.finish(_options(tmp_path, env), _measured(2.5))
    base, _ = _predict(cli_runner, [14336, 43008])
    prof, _ = _predict(cli_runner, [14336, 43008], "--env", "NCCL_P2P_LEVEL=SYS")
    rows = {(r["config"], r["steps"]): r for r in result["rows"]}
    assert rows[("baseline", 2)]["predicted_saving_range_ms"] is None
    spec = rows[("profile", 2)]
    assert spec["prediction_calibrated"] is False
    assert spec["predicted_saving_range_ms"] == pytest.approx(_expected_range(base, prof, 2.5), rel=1e-3)
    low, high = spec["predicted_saving_range_ms"]
    assert low <= spec["predicted_saving_ms"] <= high
    assert rows[("profile", 0)]["prediction_calibrated"] is False
    text = render(result).splitlines()
    assert text[1].split()[-4:] == ["difference", "predicted", "range", "calibrated"]
    line = next(x for x in text if x.split()[:2] == ["2", "profile"])
    assert line.split()[-4:] == [f"{low:+.3f}", "to", f"{high:+.3f}", "no"]
    at = text.index(next(x for x in text if x.startswith("predicted range: the model's relative")))
    # the range notes for the sizes predicted (1 to 3 tokens) are model predict's lines
    every, notes = _predict(cli_runner, [14336, 28672, 43008])
    assert text[at + 1 : at + 1 + len(notes)] == notes
    assert [r["bytes"] for r in result["prediction_ranges"]] == [14336, 28672, 43008]
    assert [r["range_us"] for r in result["prediction_ranges"]] == [r["range_us"] for r in every]


def test_validate_from_results_has_no_modelled_range(tmp_path):
    from nccl_tune import store

    records = [
        store.make_record(
            env=env, backend="nccl", op="allreduce", world_size=8, nnodes=1, bytes=b, lat_us={"p50": lat}, status="ok"
        )
        for env, lat in (({}, 40.0), ({"NCCL_P2P_LEVEL": "SYS"}, 30.0))
        for b in (14336, 28672, 43008)
    ]
    path = tmp_path / "r.jsonl"
    store.append_records(str(path), records)
    result = lib.finish(_options(tmp_path, {"NCCL_P2P_LEVEL": "SYS"}, results=str(path)), _measured(2.5))
    spec = next(r for r in result["rows"] if (r["config"], r["steps"]) == ("profile", 2))
    assert spec["predicted_saving_ms"] is not None and spec["prediction_calibrated"] is None
    assert result["prediction_ranges"] is None and "predicted range" not in render(result)


@pytest.fixture
def fitted(real_fixtures, tmp_path, cli_runner):
    """A `model fit` of the published 2x L40S default curve: it calibrates Ring/LL only."""
    rec, model = tmp_path / "fs.jsonl", tmp_path / "m.json"
    src = real_fixtures / "reference_latency" / "farmshare-2xl40s-default.txt"
    assert cli_runner.invoke(cli, ["import-nccl-tests", str(src), "--out", str(rec)]).exit_code == 0
    assert (
        cli_runner.invoke(cli, ["model", "fit", str(rec), "--topology", "pcie-direct", "--out", str(model)]).exit_code
        == 0
    )
    return str(model)


@pytest.mark.parametrize("setting, calibrated", [("NCCL_P2P_LEVEL=SYS", True), ("NCCL_PROTO=Simple", False)])
def test_validate_with_a_fit_is_calibrated_only_where_every_time_is(cli_runner, tmp_path, fitted, setting, calibrated):
    key, value = setting.split("=")
    measured = {key_: {**m, "world_size": 2} for key_, m in _measured(2.5).items()}
    result = lib.finish(_options(tmp_path, {key: value}, model_file=fitted), measured)
    args = ["model", "predict", "--model", fitted, "--mode", "graph", "--sizes", "14336,43008"]
    base = json.loads(cli_runner.invoke(cli, [*args, "--json"]).stdout)
    prof = json.loads(cli_runner.invoke(cli, [*args, "--env", setting, "--json"]).stdout)
    # defaults on this machine run Ring/LL, the pair the fit calibrated; Simple is not
    assert [(r["algo"], r["proto"], r["calibrated"]) for r in base] == [("Ring", "LL", True)] * 2
    assert all(r["calibrated"] is calibrated for r in prof)
    spec = next(r for r in result["rows"] if (r["config"], r["steps"]) == ("profile", 2))
    assert spec["prediction_calibrated"] is calibrated
    if calibrated:  # both times are the fit's: the range is the fit's error on the defaults
        assert spec["predicted_saving_range_ms"] == pytest.approx(_expected_range(base, prof, 2.5), rel=1e-3)
    line = next(x for x in render(result).splitlines() if x.split()[:2] == ["2", "profile"])
    assert line.split()[-1] == ("yes" if calibrated else "no")
