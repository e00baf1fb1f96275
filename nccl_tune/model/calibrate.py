"""Calibrate the latency model to one machine's measurements (`nccl-tune model fit`).

NCCL's tables (costmodel) describe no real machine exactly: published 8-GPU machines of
one kind differ by 1.5x and more, and eager timers add host launch time. A fit keeps the
model's structure (NCCL's choice of algorithm, protocol and channels; baseLat + hops x
hwLat; bandwidth per channel) and fits its constants to the records:

- `launch_us`: host launch time per collective (eager records only; graph replay hides it);
- `lat_scale`: one factor on every latency term, so the fitted base latency per
  (algorithm, protocol) and the per-hop latency keep NCCL's ratios between protocols;
- `bw_scale[proto]`: one factor per protocol on the per-channel bandwidth.

NCCL's *selection* is never fitted: NCCL knows nothing of the calibration, so each
point is timed as the (algorithm, protocol) NCCL picks with its own constants, or the
one the record's NCCL log reported (`effective`). Residuals are log ratios (a 10% error
weighs the same at 10 us and at 100 us), solved with bounded least squares.

What the records cannot determine is said, never guessed silently: a protocol the
records never ran keeps the other protocols' bandwidth factor (or 1.0), and eager
records of a single protocol cannot separate launch time from latency, so `lat_scale`
is then held at NCCL's table (1.0) and listed as held. Records that cannot determine
even one latency and bandwidth (fewer than three sizes, several machines, nothing ok)
are refused with one line saying why.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from nccl_tune import fileio, vocab
from nccl_tune.model import costmodel
from nccl_tune.nccl import settings
from nccl_tune.errors import NcclTuneError

SCHEMA = "nccl-tune-model/1"
MODEL_MAX_DEPTH = 6  # the model file: points -> env, constants -> link -> table
MAX_NRANKS = vocab.MAX_RANKS  # the largest world a model file may describe (as --tp, --nranks)
PROTOS = settings.PROTOCOLS
MIN_SIZES = 3
# A parameter whose relative effect on every point is below this is not seen by the records.
MIN_SENSITIVITY = 0.03


@dataclass
class Point:
    """One measured size of one setting, with the model's time for it."""

    nbytes: int
    env: dict
    measured_us: float
    mode: str
    algo: str = ""
    proto: str = ""
    link: str = ""
    model_us: float = 0.0
    from_log: bool = False  # algo/proto as the record's NCCL log reported them
    pinned: bool = False  # algo/proto fixed for the fit (NCCL's selection is not fitted)

    @property
    def ratio(self) -> float:
        """Model over measured."""
        return self.model_us / self.measured_us

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"bytes": self.nbytes, "env": self.env, "mode": self.mode,
                "measured_us": round(self.measured_us, 3), "model_us": round(self.model_us, 3),
                "ratio": round(self.ratio, 4), "algo": self.algo, "proto": self.proto,
                "link": self.link, "choice_from": "NCCL log" if self.from_log else "model"}


@dataclass
class Calibration:
    """A fitted model: parameters, what was fitted or held, and the error per point."""

    topology: str
    nranks: int
    params: costmodel.ModelParams
    fitted: list[str]
    held: dict[str, str]
    points: list[Point]
    source: dict = field(default_factory=dict)
    mode: str = "eager"

    def constants(self) -> dict:
        """The fitted constants in NCCL's own terms (us, GB/s), per link the points used."""
        p = self.params
        links = sorted({pt.link for pt in self.points if pt.link}) or ["pci"]
        out = {"launch_us": round(p.launch_us, 3), "lat_scale": round(p.lat_scale, 4),
               "bw_scale": {k: round(v, 4) for k, v in p.bw_scale.items()}}
        for link in links:
            out[link] = {
                "base_lat_us": {f"{a}/{pr}": round(p.base_lat[(a, pr)] * p.lat_scale, 3)
                                for a, pr in p.base_lat},
                "hop_lat_us": {f"{a}/{pr}": round(v * p.lat_scale, 3)
                               for (a, pr), v in p.hw_lat[link].items()},
                "bw_per_channel_gbps": {pr: round(p.bw_per_channel[link] * p.bw_scale[pr], 3)
                                        for pr in PROTOS},
            }
        return out

    def worst_ratio(self) -> float:
        """The point furthest from measured, as a ratio >= 1 either way."""
        return max(max(pt.ratio, 1 / pt.ratio) for pt in self.points)

    def to_dict(self) -> dict:
        """The model file's content (`model fit --out`)."""
        return {"schema": SCHEMA, "calibrated": True, "topology": self.topology,
                "nranks": self.nranks, "mode": self.mode,
                "params": {"launch_us": self.params.launch_us, "lat_scale": self.params.lat_scale,
                           "bw_scale": dict(self.params.bw_scale)},
                "fitted": self.fitted, "held": self.held, "constants": self.constants(),
                "worst_ratio": round(self.worst_ratio(), 4),
                "points": [pt.to_dict() for pt in self.points], "source": self.source,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}


# ---------------------------------------------------------------- records -> points

def _machine_key(rec: dict) -> tuple:
    gpus = rec.get("gpus")
    return (rec.get("host"), tuple(gpus) if isinstance(gpus, list) else gpus)


def points_from_records(records: list[dict]) -> tuple[list[Point], int, dict]:
    """(points, world size, source description) from one machine's ok allreduce records.

    Several rounds of a (setting, size) become one point (their median). NcclTuneError
    when the records are not one machine's, mix world sizes, or none is usable.
    """
    usable = [r for r in records if r.get("status", "ok") == "ok"
              and (r.get("op") or "allreduce") == "allreduce" and r.get("backend") != "sim"
              and isinstance(r.get("lat_us"), dict) and r["lat_us"].get("p50")
              and isinstance(r.get("bytes"), int) and r["bytes"] > 0]
    if not usable:
        raise NcclTuneError("no usable records: a fit needs ok allreduce measurements "
                            "(sim records are the model itself and are left out)")
    sizes = {r.get("world_size") for r in usable}
    if len(sizes) > 1:
        raise NcclTuneError("records of several world sizes "
                            f"({', '.join(str(s) for s in sorted(sizes, key=str))}): fit one "
                            "machine and one world size at a time")
    nranks = usable[0].get("world_size")
    if not isinstance(nranks, int) or nranks < 2:
        raise NcclTuneError(f"world size {nranks!r}: a fit needs two ranks or more")
    machines = {_machine_key(r) for r in usable}
    if len(machines) > 1:
        named = "; ".join(f"host {h} gpus {g}" for h, g in sorted(machines, key=str))
        raise NcclTuneError(f"records of more than one machine ({named}): a fit describes one "
                            "machine; pass one machine's results")
    groups: dict[tuple, list[dict]] = {}
    for rec in usable:
        env = {k: str(v) for k, v in (rec.get("env") or {}).items()}
        mode = rec.get("mode") or "eager"
        groups.setdefault((tuple(sorted(env.items())), rec["bytes"], mode), []).append(rec)
    points = []
    for (env_items, nbytes, mode), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        point = Point(nbytes, dict(env_items), float(np.median([r["lat_us"]["p50"] for r in recs])),
                      mode)
        eff = recs[0].get("effective") or {}
        if eff.get("algo") and eff.get("proto"):
            point.algo, point.proto, point.from_log = _nccl_name(eff["algo"]), _nccl_name(eff["proto"]), True
        points.append(point)
    host, gpus = next(iter(machines))
    topologies = sorted({r.get("topology") for r in usable if r.get("topology")})
    source = {"host": host, "gpus": gpus, "records": len(usable),
              "topology_in_records": topologies[0] if len(topologies) == 1 else None}
    return points, nranks, source


def _nccl_name(name: str) -> str:
    table = {n.lower(): n for n in (*settings.PROTOCOLS, "Ring", "Tree", "NVLS")}
    return table.get(str(name).lower(), str(name))


# ---------------------------------------------------------------- the model at a point

def _time(point: Point, topo: costmodel.Topology, nranks: int,
          params: costmodel.ModelParams) -> costmodel.Choice:
    env = point.env
    if (point.from_log or point.pinned) and point.proto in PROTOS and point.algo in ("Ring", "Tree", "NVLS"):
        res = costmodel._resources(topo, env)
        return costmodel._time_choice("allreduce", point.nbytes, nranks, point.algo, point.proto,
                                      topo, env, res, params, point.mode)
    return costmodel.predict("allreduce", point.nbytes, nranks, env, topo, params, point.mode)


def _with(base: costmodel.ModelParams, names: list[str], values) -> costmodel.ModelParams:
    changes: dict = {"bw_scale": dict(base.bw_scale)}
    for name, value in zip(names, values):
        if name == "launch_us":
            changes["launch_us"] = float(value)
        elif name == "lat_scale":
            changes["lat_scale"] = float(math.exp(value))
        else:
            changes["bw_scale"][name.split(":")[1]] = float(math.exp(value))
    return replace(base, **changes)


def _residuals(points, topo, nranks, base, names, values) -> np.ndarray:
    params = _with(base, names, values)
    return np.array([math.log(_time(pt, topo, nranks, params).time_us / pt.measured_us)
                     for pt in points])


def _jacobian(points, topo, nranks, base, names, values, step=1e-3) -> np.ndarray:
    r0 = _residuals(points, topo, nranks, base, names, values)
    cols = []
    for i in range(len(names)):
        bumped = np.array(values, dtype=float)
        bumped[i] += step * (10.0 if names[i] == "launch_us" else 1.0)
        cols.append((_residuals(points, topo, nranks, base, names, bumped) - r0) / step)
    return np.array(cols).T


# ---------------------------------------------------------------- the fit

def fit(records: list[dict], topology_name: str | None = None) -> Calibration:
    """Fit launch time, latency scale and per-protocol bandwidth to one machine's records.

    NcclTuneError (one line) when the records cannot determine a model: fewer than
    three sizes, several machines or world sizes, no topology, or nothing ok.
    """
    points, nranks, source = points_from_records(records)
    name = topology_name or source.get("topology_in_records")
    if not name:
        raise NcclTuneError("the records do not say which topology kind they come from: pass "
                            f"--topology ({', '.join(costmodel.TOPOLOGIES)})")
    if name not in costmodel.TOPOLOGIES:
        raise NcclTuneError(f"unknown topology '{name}' (known: {', '.join(costmodel.TOPOLOGIES)})")
    topo = costmodel.topology(name)
    n_sizes = len({pt.nbytes for pt in points})
    if n_sizes < MIN_SIZES:
        raise NcclTuneError(f"{n_sizes} message size(s) measured: a fit needs at least "
                            f"{MIN_SIZES} sizes to tell latency from bandwidth (sweep or "
                            "nccl-tests over 8 KB..1 MB)")
    base = costmodel.NCCL_PARAMS
    for pt in points:  # fix each point's (algo, proto) once: NCCL's selection is not fitted
        choice = _time(pt, topo, nranks, base)
        pt.algo, pt.proto, pt.link = choice.algo, choice.proto, choice.link
        pt.pinned = True
    eager = any(pt.mode == "eager" for pt in points)
    protos_seen = sorted({pt.proto for pt in points}, key=PROTOS.index)
    names = (["launch_us"] if eager else []) + ["lat_scale"] + [f"bw:{p}" for p in protos_seen]
    held: dict[str, str] = {}
    if not eager:
        held["launch_us"] = "graph-mode records: launch time is hidden by graph replay (0)"
        base = replace(base, launch_us=0.0)
    names, held = _identifiable(points, topo, nranks, base, names, held)
    if not any(n.startswith("bw:") for n in names) and "lat_scale" not in names \
            and "launch_us" not in names:
        raise NcclTuneError("these records determine none of the model's constants")
    solved = _solve(points, topo, nranks, base, names)
    if "launch_us" in names and "lat_scale" in held and solved[names.index("launch_us")] < 1e-3:
        # Launch time would be negative: the latency itself is below NCCL's table. Hold
        # launch at 0 and fit the latency scale instead (the two cannot both be fitted).
        names = [n if n != "launch_us" else "lat_scale" for n in names]
        held.pop("lat_scale")
        held["launch_us"] = ("these eager records cannot separate launch time from latency, "
                             "and the latency is below NCCL's table: launch held at 0, the "
                             "latency scale fitted")
        base = replace(base, launch_us=0.0)
        solved = _solve(points, topo, nranks, base, names)
    params = _with(base, names, solved)
    fitted_bw = [params.bw_scale[n.split(":")[1]] for n in names if n.startswith("bw:")]
    fill = math.exp(float(np.mean(np.log(fitted_bw)))) if fitted_bw else 1.0
    for proto in PROTOS:
        if f"bw:{proto}" not in names:
            params.bw_scale[proto] = fill
            held[f"bw:{proto}"] = (f"{proto} not seen in these records: its bandwidth takes the "
                                   f"fitted protocols' factor ({fill:.3g})" if fitted_bw else
                                   f"{proto} bandwidth not determined: NCCL's table kept")
    for pt in points:
        pt.model_us = _time(pt, topo, nranks, params).time_us
    modes = {pt.mode for pt in points}
    source.update(points=len(points), sizes=n_sizes)
    return Calibration(topology=name, nranks=nranks, params=params,
                       fitted=[_label(n) for n in names], held={_label(k): v for k, v in held.items()},
                       points=points, source=source, mode="eager" if "eager" in modes else "graph")


def _solve(points, topo, nranks, base, names) -> list[float]:
    """Bounded least squares on log ratios; launch in [0, 500] us, scales in [e^-5, e^5]."""
    from scipy.optimize import least_squares

    lower = [0.0 if n == "launch_us" else -5.0 for n in names]
    upper = [500.0 if n == "launch_us" else 5.0 for n in names]
    start = [min(max(_start(n, points, base), lo + 1e-6), hi - 1e-6)
             for n, lo, hi in zip(names, lower, upper)]
    solved = least_squares(lambda v: _residuals(points, topo, nranks, base, names, v), start,
                           bounds=(lower, upper), x_scale="jac")
    return [float(v) for v in solved.x]


def _label(name: str) -> str:
    return f"bw_scale.{name.split(':')[1]}" if name.startswith("bw:") else name


def _start(name: str, points: list[Point], base) -> float:
    if name == "launch_us":
        return max(0.0, min(pt.measured_us for pt in points) * 0.3)
    return 0.0


def _identifiable(points, topo, nranks, base, names, held):
    """Drop the parameters these records cannot determine, saying why (held)."""
    names = list(names)
    values = [_start(n, points, base) for n in names]
    jac = _jacobian(points, topo, nranks, base, names, values)
    for i, name in reversed(list(enumerate(names))):
        if name.startswith("bw:") and float(np.max(np.abs(jac[:, i]))) < MIN_SENSITIVITY:
            held[name] = (f"{name[3:]} bandwidth invisible at these sizes (transfer under "
                          f"{MIN_SENSITIVITY:.0%} of every {name[3:]} point): measure larger "
                          "sizes to fit it")
            names.pop(i)
            values.pop(i)
    jac = _jacobian(points, topo, nranks, base, names, values)
    if names and np.linalg.matrix_rank(_normalized(jac), tol=1e-3) < len(names) \
            and "launch_us" in names and "lat_scale" in names:
        i = names.index("lat_scale")
        names.pop(i)
        values.pop(i)
        held["lat_scale"] = ("these eager records cannot separate launch time from latency "
                             "(one protocol's latency only): NCCL's latency table kept (1.0), "
                             "the rest is launch time; add NCCL_PROTO=Simple or graph-mode runs")
        jac = _jacobian(points, topo, nranks, base, names, values)
    if names and np.linalg.matrix_rank(_normalized(jac), tol=1e-3) < len(names):
        raise NcclTuneError("these records cannot determine the model's constants (the "
                            f"fitted terms {', '.join(_label(n) for n in names)} are confounded): "
                            "measure more sizes (8 KB..1 MB) or more settings (NCCL_PROTO)")
    return names, held


def _normalized(jac: np.ndarray) -> np.ndarray:
    norms = np.linalg.norm(jac, axis=0)
    norms[norms == 0] = 1.0
    return jac / norms


# ---------------------------------------------------------------- model files

@dataclass(frozen=True)
class LoadedModel:
    """A model file read back: what `--model FILE` gives recommend, sweep and validate."""

    path: str
    topology: str
    nranks: int
    mode: str
    params: costmodel.ModelParams

    def describe(self) -> str:
        """One line for headers: which calibration this is."""
        return (f"CALIBRATED model {self.path} (fitted to measurements of one machine: "
                f"topology {self.topology}, {self.nranks} ranks, {self.mode})")


def save(calibration: Calibration, path: str) -> None:
    """Write the model file atomically."""
    fileio.write_atomic(path, json.dumps(calibration.to_dict(), indent=2) + "\n")


def load(path: str) -> LoadedModel:
    """Read a `model fit` file; NcclTuneError naming the file when it is not one."""
    data = fileio.load_json(path, what="model file", max_depth=MODEL_MAX_DEPTH)
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        raise NcclTuneError(f"not a `nccl-tune model fit` file (schema is not {SCHEMA})", path=path)
    raw = data.get("params")
    scales = raw.get("bw_scale") if isinstance(raw, dict) else None
    positive = ("a positive number", lambda v: fileio.is_number(v) and v > 0)
    checks = [  # (name, value, expected, check): every value the model reads, typed
        ("topology", data.get("topology"), "one of " + ", ".join(costmodel.TOPOLOGIES),
         lambda v: isinstance(v, str) and v in costmodel.TOPOLOGIES),
        ("nranks", data.get("nranks"), f"an integer from 2 to {MAX_NRANKS}",
         lambda v: fileio.is_int(v) and 2 <= v <= MAX_NRANKS),
        ("mode", data.get("mode"), "graph or eager", lambda v: v in (None, "graph", "eager")),
        ("params", raw, "an object", lambda v: isinstance(v, dict)),
        ("params.launch_us", (raw or {}).get("launch_us") if isinstance(raw, dict) else None,
         "a non-negative number", lambda v: fileio.is_number(v) and v >= 0),
        ("params.lat_scale", raw.get("lat_scale") if isinstance(raw, dict) else None, *positive),
        ("params.bw_scale", scales, "an object with " + ", ".join(PROTOS),
         lambda v: isinstance(v, dict) and all(p in v for p in PROTOS)),
    ] + [(f"params.bw_scale.{p}", scales.get(p) if isinstance(scales, dict) else None, *positive)
         for p in PROTOS]
    for name, value, expected, check in checks:
        if not check(value):
            raise fileio.wrong_type(path, name, value, expected)
    params = replace(costmodel.NCCL_PARAMS, launch_us=float(raw["launch_us"]),
                     lat_scale=float(raw["lat_scale"]), bw_scale={p: float(scales[p]) for p in PROTOS})
    return LoadedModel(path, data["topology"], data["nranks"], data.get("mode") or "eager", params)


# ---------------------------------------------------------------- predictions

def predict_rows(topology_name: str, nranks: int, sizes, env: dict, mode: str,
                 model: LoadedModel | None = None, refs=None) -> list[dict]:
    """Per size: modelled time, NCCL's algorithm, protocol and channels, and (without a
    calibrated `model`) the range published machines of this kind measured (`refs`)."""
    topo = costmodel.topology(topology_name)
    params = model.params if model else costmodel.NCCL_PARAMS
    rows = []
    for nbytes in sizes:
        try:
            choice = costmodel.predict("allreduce", nbytes, nranks, env, topo, params, mode)
        except ValueError as exc:
            raise NcclTuneError(f"--env: {exc}") from None
        row = {"bytes": nbytes, "time_us": round(choice.time_us, 3), "algo": choice.algo,
               "proto": choice.proto, "channels": choice.channels, "transport": choice.link,
               "mode": mode, "calibrated": model is not None, "range_us": None,
               "range_machines": [], "range_measured_us": None, "range_basis": None}
        if model is None and refs:
            from nccl_tune.model import references

            found = references.kind_range(refs, topology_name, nranks, nbytes, env)
            if found is not None:
                row.update(range_us=[round(found.low, 2), round(found.high, 2)],
                           range_machines=list(found.machines),
                           range_measured_us=[round(v, 2) for v in found.measured],
                           range_basis=found.basis)
        rows.append(row)
    return rows
