"""model fit: only what the records identify is calibrated; errors per point; refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import factories
import pytest

from nccl_tune.errors import NcclTuneError
from nccl_tune.model import calibrate, ranges, references
from nccl_tune.model import costmodel as cm

SIZES = [1 << p for p in range(10, 23)]


def _records(env, sizes, params, topo="pcie", nranks=8, mode="eager", host="box", gpus=None):
    """Records a machine with known constants would produce (the model as the machine)."""
    out = []
    for b in sizes:
        t = cm.predict("allreduce", b, nranks, env, cm.topology(topo), params, mode).time_us
        out.append(
            factories.record(
                dict(env),
                b,
                p50=t,
                round_=None,
                run_id="r",
                backend="nccl-tests",
                mode=mode,
                world_size=nranks,
                nnodes=1,
                host=host,
                gpus=gpus or ["GPU"] * nranks,
                topology=topo,
            )
        )
    return out


RING_SIMPLE = {"NCCL_PROTO": "Simple", "NCCL_ALGO": "Ring"}
TRUTH = replace(
    cm.NCCL_PARAMS,
    pair_lat_scale={"Ring/LL": 1.4, "Ring/Simple": 0.7, "Tree/LL": 3.0},
    pair_bw_scale={"Ring/LL": 2.0, "Ring/Simple": 0.6},
)


def test_a_default_curve_calibrates_the_pairs_nccl_ran_and_nothing_else():
    cal = calibrate.fit(_records({}, SIZES, TRUTH))
    # NCCL's defaults on pcie, 8 ranks: Ring/LL to 1 MB, then Ring/Simple where bandwidth
    # alone decides the time: Simple's latency is not seen, so it is not calibrated.
    assert [(pt.algo, pt.proto) for pt in cal.points][-1] == ("Ring", "Simple")
    assert cal.calibrated_pairs == ["Ring/LL"]
    assert "seen at 0 size(s)" in cal.held["Ring/Simple"]
    p = cal.params
    assert p.pair_lat_scale == {"Ring/LL": pytest.approx(1.4, rel=0.05)}
    assert p.pair_bw_scale["Ring/LL"] == pytest.approx(2.0, rel=0.05)
    assert p.lat_scale == 1.0 and p.bw_scale == cm.NCCL_PARAMS.bw_scale


def test_an_uncalibrated_pair_keeps_the_models_time_and_gets_the_published_range():
    cal = calibrate.fit(_records({}, SIZES, TRUTH))
    model = calibrate.LoadedModel("m", "pcie", 8, "eager", cal.params, tuple(cal.calibrated_pairs), cal.pair_error())
    refs = references.shipped()
    tree, ring = calibrate.predict_rows(
        "pcie", 8, [16384], {"NCCL_ALGO": "Tree"}, "eager", model, refs
    ) + calibrate.predict_rows("pcie", 8, [16384], {}, "eager", model, refs)
    assert (tree["algo"], tree["proto"], tree["calibrated"]) == ("Tree", "LL", False)
    plain = cm.predict("allreduce", 16384, 8, {"NCCL_ALGO": "Tree"}, cm.topology("pcie"), mode="eager").time_us
    assert tree["time_us"] == pytest.approx(plain, abs=1e-3)
    found = ranges.kind_range(refs, "pcie", 8, 16384, {"NCCL_ALGO": "Tree"}, "eager")
    assert tree["range_us"] == found.rounded()
    assert ring["calibrated"] and ring["range"]["calibrated"]
    low, high = ring["range_us"]
    assert low < ring["time_us"] < high and high / low == pytest.approx(1.21, rel=0.02)  # +-10%


def test_eager_records_alone_hold_the_launch_time_and_say_why():
    cal = calibrate.fit(_records({}, SIZES, TRUTH))
    assert "launch_us" in cal.held and "cannot tell host launch time" in cal.held["launch_us"]
    assert cal.params.launch_us == cm.NCCL_PARAMS.launch_us


def test_graph_and_eager_runs_together_identify_the_launch_time():
    truth = replace(TRUTH, launch_us=9.0)
    cal = calibrate.fit(_records({}, SIZES, truth) + _records({}, SIZES, truth, mode="graph"))
    assert "launch_us" in cal.fitted and cal.params.launch_us == pytest.approx(9.0, rel=0.05)
    graph = calibrate.fit(_records({}, SIZES, TRUTH, mode="graph"))
    assert graph.params.launch_us == 0.0 and "graph replay" in graph.held["launch_us"]


def test_a_pair_seen_at_one_latency_bound_size_stays_uncalibrated():
    recs = _records({}, SIZES, TRUTH) + _records(RING_SIMPLE, [16384], TRUTH)
    cal = calibrate.fit(recs)
    assert cal.calibrated_pairs == ["Ring/LL"]
    assert "seen at 1 size(s)" in cal.held["Ring/Simple"]


def test_several_settings_calibrate_each_pair_they_ran():
    recs = (
        _records({}, SIZES, TRUTH)
        + _records(RING_SIMPLE, SIZES[:8], TRUTH)
        + _records({"NCCL_ALGO": "Tree"}, SIZES[:8], TRUTH)
    )
    cal = calibrate.fit(recs)
    assert cal.calibrated_pairs == ["Ring/LL", "Ring/Simple", "Tree/LL"]
    for pair, truth in TRUTH.pair_lat_scale.items():
        assert cal.params.pair_lat_scale[pair] == pytest.approx(truth, rel=0.05)
    assert cal.worst_ratio() < 1.01


@pytest.mark.parametrize(
    "records, message",
    [
        (lambda: _records({}, [8192, 16384], cm.NCCL_PARAMS), "at least 3 sizes"),
        (
            lambda: _records({}, SIZES[:4], cm.NCCL_PARAMS) + _records({}, SIZES[4:8], cm.NCCL_PARAMS, host="other"),
            "more than one machine",
        ),
        (
            lambda: _records({}, SIZES[:4], cm.NCCL_PARAMS) + _records({}, SIZES[:4], cm.NCCL_PARAMS, nranks=4),
            "several world sizes",
        ),
        (lambda: [dict(r, status="failed") for r in _records({}, SIZES, cm.NCCL_PARAMS)], "no usable records"),
        (lambda: [dict(r, backend="sim") for r in _records({}, SIZES, cm.NCCL_PARAMS)], "no usable records"),
        (lambda: [dict(r, topology=None) for r in _records({}, SIZES, cm.NCCL_PARAMS)], "--topology"),
        (lambda: _records({}, SIZES[-3:], cm.NCCL_PARAMS), "nothing to calibrate"),
    ],
)
def test_fit_refuses_what_cannot_determine_a_model(records, message):
    with pytest.raises(NcclTuneError, match=message):
        calibrate.fit(records())


def test_log_reported_choice_is_used_instead_of_the_models():
    recs = _records({}, SIZES[:6], cm.NCCL_PARAMS)
    for r in recs:
        r["effective"] = {"algo": "RING", "proto": "SIMPLE", "channels": 2}
    cal = calibrate.fit(recs)
    assert {(pt.algo, pt.proto, pt.from_log) for pt in cal.points} == {("Ring", "Simple", True)}
    assert cal.calibrated_pairs == ["Ring/Simple"]


def test_model_file_round_trip_older_files_and_bad_files(tmp_path):
    cal = calibrate.fit(_records({}, SIZES, TRUTH))
    path = tmp_path / "m.json"
    calibrate.save(cal, str(path))
    data = json.loads(path.read_text())
    assert data["schema"] == calibrate.SCHEMA and data["calibrated_pairs"] == ["Ring/LL"]
    loaded = calibrate.load(str(path))
    assert loaded.topology == "pcie" and loaded.nranks == 8
    assert loaded.is_calibrated("Ring", "LL") and not loaded.is_calibrated("Tree", "LL")
    assert loaded.params.pair_lat_scale == pytest.approx(cal.params.pair_lat_scale)
    older = {
        "schema": "nccl-tune-model/1",
        "topology": "pcie",
        "nranks": 8,
        "mode": "eager",
        "params": {"launch_us": 5.0, "lat_scale": 1.2, "bw_scale": {"LL": 1.0, "LL128": 1.0, "Simple": 1.0}},
    }
    path.write_text(json.dumps(older))
    old = calibrate.load(str(path))  # one factor for every pair: every pair calibrated
    assert old.calibrated_pairs is None and old.is_calibrated("Tree", "Simple")
    for text, what in (
        ("{", "1: not JSON (Expecting property name enclosed in double quotes, column 2); a model file is JSON"),
        ('{"schema": "x"}', "not a `nccl-tune model fit` file (schema is not nccl-tune-model/2)"),
        (
            json.dumps(dict(data, params=dict(data["params"], lat_scale=-1))),
            "field params.lat_scale is -1, expected a positive number",
        ),
        (json.dumps(dict(data, params={})), "field params.launch_us is null, expected a non-negative number"),
        (
            json.dumps(dict(data, topology=["pcie"])),
            'field topology is ["pcie"], expected one of ' + ", ".join(cm.TOPOLOGIES),
        ),
        (json.dumps(dict(data, nranks=True)), "field nranks is true, expected an integer from 2 to 4096"),
        # a world of 0 ranks is refused, never passed on as --tp 0
        (json.dumps(dict(data, nranks=0)), "field nranks is 0, expected an integer from 2 to 4096"),
        (
            json.dumps(dict(data, calibrated_pairs=["Warp/LL"])),
            'field calibrated_pairs is ["Warp/LL"], expected a list of ALGO/PROTO pairs',
        ),
        ("[" * 50 + "]" * 50, "nested 50 levels deep: a model file nests at most 6"),
    ):
        path.write_text(text)
        with pytest.raises(NcclTuneError) as err:
            calibrate.load(str(path))
        assert str(err.value) == f"{path}:{what}" if what[0].isdigit() else f"{path}: {what}"


def test_a_real_default_curve_predicts_that_machines_other_settings_or_says_it_cannot():
    """2x and 4x L40S, published under several settings: fit the default curve only; each
    other setting is calibrated within [0.67, 1.5] or uncalibrated inside the range that
    published machines other than this one give it."""
    refs = references.shipped()
    for nranks in (2, 4):
        mine = [r for r in refs if r.machine == "farmshare-oat-l40s" and r.n_gpus == nranks]
        default = next(r for r in mine if not r.env)
        cal = calibrate.fit(default.records(), default.kind)
        model = calibrate.LoadedModel(
            "m", cal.topology, cal.nranks, cal.mode, cal.params, tuple(cal.calibrated_pairs), cal.pair_error()
        )
        assert len(mine) >= 6 and cal.calibrated_pairs == ["Ring/LL"]
        for ref in mine:
            for nbytes, measured in ref.points:
                if 8 << 10 <= nbytes <= 64 << 10:
                    row = calibrate.predict_rows(ref.kind, nranks, [nbytes], ref.env, "eager", model)[0]
                    if row["calibrated"]:
                        assert 0.67 <= row["time_us"] / measured <= 1.5, (ref.name, nbytes)
                    else:
                        found = ranges.kind_range(
                            refs,
                            ref.kind,
                            nranks,
                            nbytes,
                            ref.env,
                            "eager",
                            ref.gpus_per_process,
                            exclude_machine=ref.machine,
                        )
                        assert found.covers(measured), (ref.name, nbytes, found.to_dict())
