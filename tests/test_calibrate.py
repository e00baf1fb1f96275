"""model fit: constants fitted to one machine's records, errors per point, refusals."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

import factories
from nccl_tune.model import calibrate, costmodel as cm, references
from nccl_tune.errors import NcclTuneError

SIZES = [1 << p for p in range(10, 23)]


def _records(env, sizes, params, topo="pcie", nranks=8, mode="eager", host="box", gpus=None):
    """Records a machine with known constants would produce (the model as the machine)."""
    out = []
    for b in sizes:
        t = cm.predict("allreduce", b, nranks, env, cm.topology(topo), params, mode).time_us
        out.append(factories.record(
            dict(env), b, p50=t, round_=None, run_id="r", backend="nccl-tests", mode=mode,
            world_size=nranks, nnodes=1, host=host, gpus=gpus or ["GPU"] * nranks, topology=topo))
    return out


def test_fit_recovers_known_constants_from_a_two_protocol_default_curve():
    truth = replace(cm.NCCL_PARAMS, launch_us=7.0, lat_scale=1.4,
                    bw_scale={"LL": 2.0, "LL128": 1.0, "Simple": 0.6})
    cal = calibrate.fit(_records({}, SIZES, truth))
    protos = {pt.proto for pt in cal.points}
    assert protos == {"LL", "Simple"}  # NCCL's default switches protocol along the curve
    assert cal.params.launch_us == pytest.approx(7.0, rel=0.05)
    assert cal.params.lat_scale == pytest.approx(1.4, rel=0.05)
    assert cal.params.bw_scale["LL"] == pytest.approx(2.0, rel=0.05)
    assert cal.params.bw_scale["Simple"] == pytest.approx(0.6, rel=0.05)
    assert "bw_scale.LL128" in cal.held and cal.worst_ratio() < 1.01
    assert set(cal.fitted) == {"launch_us", "lat_scale", "bw_scale.LL", "bw_scale.Simple"}


def test_one_protocol_eager_curve_holds_the_latency_scale_and_says_why():
    truth = replace(cm.NCCL_PARAMS, launch_us=30.0)
    small = [1 << p for p in range(10, 15)]  # all Ring/LL on pcie
    cal = calibrate.fit(_records({}, small, truth))
    assert "lat_scale" in cal.held and "cannot separate launch time" in cal.held["lat_scale"]
    assert cal.params.launch_us == pytest.approx(30.0, rel=0.05)


def test_graph_mode_has_no_launch_time_to_fit():
    truth = replace(cm.NCCL_PARAMS, lat_scale=0.8)
    cal = calibrate.fit(_records({}, SIZES, truth, mode="graph"))
    assert "launch_us" in cal.held and cal.params.launch_us == 0.0
    assert cal.params.lat_scale == pytest.approx(0.8, rel=0.05)


@pytest.mark.parametrize("records, message", [
    (lambda: _records({}, [8192, 16384], cm.NCCL_PARAMS), "at least 3 sizes"),
    (lambda: _records({}, SIZES[:4], cm.NCCL_PARAMS) + _records({}, SIZES[4:8], cm.NCCL_PARAMS,
                                                                  host="other"), "more than one machine"),
    (lambda: _records({}, SIZES[:4], cm.NCCL_PARAMS) + _records({}, SIZES[:4], cm.NCCL_PARAMS,
                                                                  nranks=4), "several world sizes"),
    (lambda: [dict(r, status="failed") for r in _records({}, SIZES, cm.NCCL_PARAMS)], "no usable records"),
    (lambda: [dict(r, backend="sim") for r in _records({}, SIZES, cm.NCCL_PARAMS)], "no usable records"),
    (lambda: [dict(r, topology=None) for r in _records({}, SIZES, cm.NCCL_PARAMS)], "--topology"),
])
def test_fit_refuses_what_cannot_determine_a_model(records, message):
    with pytest.raises(NcclTuneError, match=message):
        calibrate.fit(records())


def test_log_reported_choice_is_used_instead_of_the_models():
    recs = _records({}, SIZES[:6], cm.NCCL_PARAMS)
    for r in recs:
        r["effective"] = {"algo": "RING", "proto": "SIMPLE", "channels": 2}
    cal = calibrate.fit(recs)
    assert {(pt.algo, pt.proto, pt.from_log) for pt in cal.points} == {("Ring", "Simple", True)}


def test_model_file_round_trip_and_bad_files(tmp_path):
    cal = calibrate.fit(_records({}, SIZES, replace(cm.NCCL_PARAMS, launch_us=5.0, lat_scale=1.2)))
    path = tmp_path / "m.json"
    calibrate.save(cal, str(path))
    data = json.loads(path.read_text())
    assert data["calibrated"] and {"bytes", "measured_us", "model_us", "ratio"} <= set(data["points"][0])
    loaded = calibrate.load(str(path))
    assert loaded.topology == "pcie" and loaded.nranks == 8
    assert loaded.params.lat_scale == pytest.approx(cal.params.lat_scale)
    for text, what in (("{", "not JSON"), ('{"schema": "x"}', "schema"),
                       (json.dumps(dict(data, params=dict(data["params"], lat_scale=-1))), "non-positive"),
                       (json.dumps(dict(data, params={})), "malformed")):
        path.write_text(text)
        with pytest.raises(NcclTuneError, match=what) as err:
            calibrate.load(str(path))
        assert str(path) in str(err.value)


def test_fit_on_a_real_default_curve_predicts_that_machines_other_settings(real_fixtures):
    # The shared references hold one machine (2x L40S) measured under four settings: the
    # fit sees only its default curve, then predicts the other three.
    refs = [r for r in references.load(real_fixtures / "reference_latency")
            if r.machine == "farmshare-2xl40s"]
    assert len(refs) == 4
    default = next(r for r in refs if not r.env)
    cal = calibrate.fit(default.records(), default.kind)
    at16 = {}
    for ref in refs:
        for nbytes, measured in ref.points:
            if 8 << 10 <= nbytes <= 64 << 10:
                model = cm.latency_us(nbytes, 2, ref.kind, ref.env, params=cal.params, mode="eager")
                assert 0.67 <= model / measured <= 1.5, (ref.name, nbytes, model, measured)
        at16[ref.name] = (ref.at(16384),
                          cm.latency_us(16384, 2, ref.kind, ref.env, params=cal.params, mode="eager"))
    names = list(at16)
    for a in names:
        for b in names:
            (ma, pa), (mb, pb) = at16[a], at16[b]
            if ma < mb and (mb - ma) / ma > 0.10:
                assert pa < pb, (a, b, at16)
