"""Calibrate the latency model to one machine's measurements (`nccl-tune model fit`).

NCCL's tables (costmodel) describe no real machine exactly: published machines of one
kind differ by 1.5x and more, and eager timers add host launch time. A fit keeps the
model's structure (NCCL's choice of algorithm, protocol and channels; baseLat + hops x
hwLat; bandwidth per channel) and moves only what the records identify:

- per (algorithm, protocol) NCCL ran in the records (read from the record's NCCL log
  when it has one, else the model's own choice): a factor on that pair's latency terms
  (`pair_lat_scale`) and, where the records reach sizes at which its transfer shows, one
  on its bandwidth (`pair_bw_scale`). A default curve that ran Ring/LL calibrates Ring/LL
  and nothing else; a fit on several settings calibrates each pair they ran.
- `launch_us`, host launch time per collective, only when the records hold both graph
  and eager runs: eager runs alone cannot tell launch time from latency (each pair's
  latency factor absorbs it, launch stays at the model's guess); graph replay has none.

The pairs no record ran keep the uncalibrated model: their predictions say
"uncalibrated" and carry the published range of the machine's kind
(nccl_tune.model.ranges), never constants the records could not identify. A calibrated
prediction carries the fit's own error on its pair as its range (at least 10%).

NCCL's *selection* is never fitted: NCCL knows nothing of the calibration. Residuals
are log ratios (a 10% error weighs the same at 10 us and at 100 us), solved with
bounded least squares. Records that cannot determine a model (fewer than three sizes,
several machines or world sizes, nothing ok) are refused with one line saying why.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field, replace

import numpy as np

from nccl_tune import fileio, vocab
from nccl_tune.errors import NcclTuneError
from nccl_tune.model import costmodel
from nccl_tune.nccl import settings

SCHEMA = "nccl-tune-model/2"
OLD_SCHEMAS = ("nccl-tune-model/1",)  # one latency factor for every pair: all calibrated
MODEL_MAX_DEPTH = 6  # the model file: points -> env, constants -> link -> table
MAX_NRANKS = vocab.MAX_RANKS  # the largest world a model file may describe (as --tp, --nranks)
PROTOS = settings.PROTOCOLS
ALGOS = ("Ring", "Tree", "NVLS")
MIN_SIZES = 3
# A parameter whose relative effect on every point is below this is not seen by the records.
MIN_SENSITIVITY = 0.03
MIN_CALIBRATED_ERROR = math.log(1.10)  # a calibrated prediction's range: at least +-10%
MIN_PAIR_SIZES = 2  # sizes a pair needs, where latency is LATENCY_SHARE of its time, to calibrate
LATENCY_SHARE = 0.5


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
        return {
            "bytes": self.nbytes,
            "env": self.env,
            "mode": self.mode,
            "measured_us": round(self.measured_us, 3),
            "model_us": round(self.model_us, 3),
            "ratio": round(self.ratio, 4),
            "algo": self.algo,
            "proto": self.proto,
            "link": self.link,
            "choice_from": "NCCL log" if self.from_log else "model",
        }


def pair_name(algo: str, proto: str) -> str:
    """'Ring/LL': how the calibration names an (algorithm, protocol) pair.

    The transport is not part of it: a pair's factor carries from host memory to P2P
    (NCCL_P2P_LEVEL=SYS), since it mostly measures the host and the protocol's code path
    (published: 4x RTX PRO 6000 fitted on its host-memory default curve predicts its
    NCCL_P2P_LEVEL=SYS table within 4%, bench/model_truth.py)."""
    return f"{algo}/{proto}"


@dataclass
class Calibration:
    """A fitted model: parameters, the pairs it calibrates, what was held, the error per point."""

    topology: str
    nranks: int
    params: costmodel.ModelParams
    fitted: list[str]
    held: dict[str, str]
    points: list[Point]
    source: dict = field(default_factory=dict)
    mode: str = "eager"
    calibrated_pairs: list[str] = field(default_factory=list)

    def pair_error(self) -> dict[str, float]:
        """Per calibrated pair, the fit's worst |log(model / measured)| on its points."""
        out: dict[str, float] = {}
        for pt in self.points:
            key = pair_name(pt.algo, pt.proto)
            if key in self.calibrated_pairs:
                out[key] = max(out.get(key, 0.0), abs(math.log(pt.ratio)))
        return {k: round(v, 4) for k, v in out.items()}

    def constants(self) -> dict:
        """The fitted constants in NCCL's own terms (us, GB/s), per calibrated pair."""
        p = self.params
        out = {"launch_us": round(p.launch_us, 3)}
        links = sorted({pt.link for pt in self.points if pt.link}) or ["pci"]
        for pair in self.calibrated_pairs:
            algo, proto = pair.split("/")
            if algo == "NVLS":
                continue
            lat = p.pair_lat_scale.get(pair, 1.0)
            out[pair] = {
                link: {
                    "base_lat_us": round(p.base_lat[(algo, proto)] * lat, 3),
                    "hop_lat_us": round(p.hw_lat[link][(algo, proto)] * lat, 3),
                    "bw_per_channel_gbps": round(p.bw_per_channel[link] * p.pair_bw_scale.get(pair, 1.0), 3),
                }
                for link in links
            }
        return out

    def is_calibrated(self, point: Point) -> bool:
        """True when the point's (algorithm, protocol) is one this fit calibrated."""
        return pair_name(point.algo, point.proto) in self.calibrated_pairs

    def worst_ratio(self) -> float:
        """The calibrated point furthest from measured, as a ratio >= 1 either way (the
        uncalibrated points are the model's own figures, not the fit's)."""
        points = [pt for pt in self.points if self.is_calibrated(pt)] or self.points
        return max(max(pt.ratio, 1 / pt.ratio) for pt in points)

    def to_dict(self) -> dict:
        """The model file's content (`model fit --out`)."""
        p = self.params
        return {
            "schema": SCHEMA,
            "calibrated": True,
            "topology": self.topology,
            "nranks": self.nranks,
            "mode": self.mode,
            "calibrated_pairs": list(self.calibrated_pairs),
            "pair_error": self.pair_error(),
            "params": {
                "launch_us": p.launch_us,
                "lat_scale": p.lat_scale,
                "bw_scale": dict(p.bw_scale),
                "pair_lat_scale": dict(p.pair_lat_scale),
                "pair_bw_scale": dict(p.pair_bw_scale),
            },
            "fitted": self.fitted,
            "held": self.held,
            "constants": self.constants(),
            "worst_ratio": round(self.worst_ratio(), 4),
            "points": [dict(pt.to_dict(), calibrated=self.is_calibrated(pt)) for pt in self.points],
            "source": self.source,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }


# ---------------------------------------------------------------- records -> points


def _machine_key(rec: dict) -> tuple:
    gpus = rec.get("gpus")
    return (rec.get("host"), tuple(gpus) if isinstance(gpus, list) else gpus)


def points_from_records(records: list[dict]) -> tuple[list[Point], int, dict]:
    """(points, world size, source description) from one machine's ok allreduce records.

    Several rounds of a (setting, size) become one point (their median). NcclTuneError
    when the records are not one machine's, mix world sizes, or none is usable.
    """
    usable = [
        r
        for r in records
        if r.get("status", "ok") == "ok"
        and (r.get("op") or "allreduce") == "allreduce"
        and r.get("backend") != "sim"
        and isinstance(r.get("lat_us"), dict)
        and r["lat_us"].get("p50")
        and isinstance(r.get("bytes"), int)
        and r["bytes"] > 0
    ]
    if not usable:
        raise NcclTuneError(
            "no usable records: a fit needs ok allreduce measurements "
            "(sim records are the model itself and are left out)"
        )
    sizes = {r.get("world_size") for r in usable}
    if len(sizes) > 1:
        raise NcclTuneError(
            "records of several world sizes "
            f"({', '.join(str(s) for s in sorted(sizes, key=str))}): fit one "
            "machine and one world size at a time"
        )
    nranks = usable[0].get("world_size")
    if not isinstance(nranks, int) or nranks < 2:
        raise NcclTuneError(f"world size {nranks!r}: a fit needs two ranks or more")
    machines = {_machine_key(r) for r in usable}
    if len(machines) > 1:
        named = "; ".join(f"host {h} gpus {g}" for h, g in sorted(machines, key=str))
        raise NcclTuneError(
            f"records of more than one machine ({named}): a fit describes one machine; pass one machine's results"
        )
    groups: dict[tuple, list[dict]] = {}
    for rec in usable:
        env = {k: str(v) for k, v in (rec.get("env") or {}).items()}
        mode = rec.get("mode") or "eager"
        groups.setdefault((tuple(sorted(env.items())), rec["bytes"], mode), []).append(rec)
    points = []
    for (env_items, nbytes, mode), recs in sorted(groups.items(), key=lambda kv: (kv[0][0], kv[0][1])):
        point = Point(nbytes, dict(env_items), float(np.median([r["lat_us"]["p50"] for r in recs])), mode)
        eff = recs[0].get("effective") or {}
        if eff.get("algo") and eff.get("proto"):
            point.algo, point.proto, point.from_log = _nccl_name(eff["algo"]), _nccl_name(eff["proto"]), True
        points.append(point)
    host, gpus = next(iter(machines))
    topologies = sorted({r.get("topology") for r in usable if r.get("topology")})
    source = {
        "host": host,
        "gpus": gpus,
        "records": len(usable),
        "topology_in_records": topologies[0] if len(topologies) == 1 else None,
    }
    return points, nranks, source


def _nccl_name(name: str) -> str:
    table = {n.lower(): n for n in (*settings.PROTOCOLS, "Ring", "Tree", "NVLS")}
    return table.get(str(name).lower(), str(name))


# ---------------------------------------------------------------- the model at a point


def _time(point: Point, topo: costmodel.Topology, nranks: int, params: costmodel.ModelParams) -> costmodel.Choice:
    env = point.env
    if (point.from_log or point.pinned) and point.proto in PROTOS and point.algo in ("Ring", "Tree", "NVLS"):
        res = costmodel._resources(topo, env)
        return costmodel._time_choice(
            "allreduce", point.nbytes, nranks, point.algo, point.proto, topo, env, res, params, point.mode
        )
    return costmodel.predict("allreduce", point.nbytes, nranks, env, topo, params, point.mode)


def _with(base: costmodel.ModelParams, names: list[str], values) -> costmodel.ModelParams:
    lat, bw = dict(base.pair_lat_scale), dict(base.pair_bw_scale)
    changes: dict = {}
    for name, value in zip(names, values):
        if name == "launch_us":
            changes["launch_us"] = float(value)
        elif name.startswith("lat:"):
            lat[name[4:]] = float(math.exp(value))
        else:
            bw[name[3:]] = float(math.exp(value))
    return replace(base, pair_lat_scale=lat, pair_bw_scale=bw, **changes)


def _residuals(points, topo, nranks, base, names, values) -> np.ndarray:
    params = _with(base, names, values)
    return np.array([math.log(_time(pt, topo, nranks, params).time_us / pt.measured_us) for pt in points])


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
    """Fit the pairs NCCL ran (latency, and bandwidth where it shows) to one machine's records.

    NcclTuneError (one line) when the records cannot determine a model: fewer than
    three sizes, several machines or world sizes, no topology, or nothing ok.
    """
    points, nranks, source = points_from_records(records)
    name = topology_name or source.get("topology_in_records")
    if not name:
        raise NcclTuneError(
            "the records do not say which topology kind they come from: pass "
            f"--topology ({', '.join(costmodel.TOPOLOGIES)})"
        )
    if name not in costmodel.TOPOLOGIES:
        raise NcclTuneError(f"unknown topology '{name}' (known: {', '.join(costmodel.TOPOLOGIES)})")
    topo = costmodel.topology(name)
    n_sizes = len({pt.nbytes for pt in points})
    if n_sizes < MIN_SIZES:
        raise NcclTuneError(
            f"{n_sizes} message size(s) measured: a fit needs at least "
            f"{MIN_SIZES} sizes to tell latency from bandwidth (sweep or "
            "nccl-tests over 8 KB..1 MB)"
        )
    base = costmodel.NCCL_PARAMS
    for pt in points:  # fix each point's (algo, proto) once: NCCL's selection is not fitted
        choice = _time(pt, topo, nranks, base)
        pt.algo, pt.proto, pt.link = choice.algo, choice.proto, choice.link
        pt.pinned = True
    modes = {pt.mode for pt in points}
    held: dict[str, str] = {}
    names: list[str] = []
    if modes == {"eager", "graph"}:
        names.append("launch_us")
    elif "eager" in modes:
        held["launch_us"] = (
            f"eager records alone cannot tell host launch time from latency: "
            f"kept at the model's {base.launch_us:g} us, each pair's latency "
            "factor takes the rest (add graph-mode runs to fit it)"
        )
    else:
        held["launch_us"] = "graph-mode records: launch time is hidden by graph replay (0)"
        base = replace(base, launch_us=0.0)
    pairs = _latency_pairs(points, topo, nranks, base, held)
    used = [pt for pt in points if pair_name(pt.algo, pt.proto) in pairs]
    if not pairs:
        raise NcclTuneError(
            "no algorithm/protocol was measured at two sizes or more where its "
            "latency is at least half its time: nothing to calibrate (measure "
            "8 KB..1 MB)"
        )
    names += [f"lat:{p}" for p in pairs] + [f"bw:{p}" for p in pairs]
    names, held = _identifiable(used, topo, nranks, base, names, held)
    solved = _solve(used, topo, nranks, base, names)
    params = _with(base, names, solved)
    for pt in points:
        pt.model_us = _time(pt, topo, nranks, params).time_us
    source.update(points=len(points), sizes=n_sizes)
    return Calibration(
        topology=name,
        nranks=nranks,
        params=params,
        fitted=[_label(n) for n in names],
        held={_label(k): v for k, v in held.items()},
        points=points,
        source=source,
        mode="eager" if "eager" in modes else "graph",
        calibrated_pairs=pairs,
    )


def _latency_pairs(points, topo, nranks, base, held) -> list[str]:
    """The pairs whose latency these records identify: seen at MIN_PAIR_SIZES sizes or more
    where latency is at least half the modelled time. The others stay uncalibrated (held)."""
    seen: dict[str, set] = {}
    for pt in points:
        key = pair_name(pt.algo, pt.proto)
        seen.setdefault(key, set())
        share = float(_jacobian([pt], topo, nranks, base, [f"lat:{key}"], [0.0])[0, 0])
        if share >= LATENCY_SHARE:
            seen[key].add(pt.nbytes)
    out = []
    for key, sizes in sorted(seen.items()):
        if len(sizes) >= MIN_PAIR_SIZES:
            out.append(key)
        else:
            held[key] = (
                f"seen at {len(sizes)} size(s) where its latency is at least half the "
                f"time: too few to calibrate; uncalibrated"
            )
    return out


def _solve(points, topo, nranks, base, names) -> list[float]:
    """Bounded least squares on log ratios; launch in [0, 500] us, scales in [e^-5, e^5]."""
    from scipy.optimize import least_squares

    lower = [0.0 if n == "launch_us" else -5.0 for n in names]
    upper = [500.0 if n == "launch_us" else 5.0 for n in names]
    start = [min(max(_start(n, base), lo + 1e-6), hi - 1e-6) for n, lo, hi in zip(names, lower, upper)]
    solved = least_squares(
        lambda v: _residuals(points, topo, nranks, base, names, v), start, bounds=(lower, upper), x_scale="jac"
    )
    return [float(v) for v in solved.x]


def _label(name: str) -> str:
    if name.startswith("lat:"):
        return f"latency {name[4:]}"
    if name.startswith("bw:"):
        return f"bandwidth {name[3:]}"
    return name


def _start(name: str, base) -> float:
    return base.launch_us if name == "launch_us" else 0.0


def _identifiable(points, topo, nranks, base, names, held):
    """Drop the parameters these records cannot determine, saying why (held)."""
    names = list(names)
    values = [_start(n, base) for n in names]
    jac = _jacobian(points, topo, nranks, base, names, values)
    for i, name in reversed(list(enumerate(names))):
        if name.startswith("bw:") and float(np.max(np.abs(jac[:, i]))) < MIN_SENSITIVITY:
            held[name] = (
                f"{name[3:]} bandwidth invisible at these sizes (transfer under "
                f"{MIN_SENSITIVITY:.0%} of every point): its latency factor is "
                "fitted, its bandwidth kept; measure larger sizes to fit it"
            )
            names.pop(i)
            values.pop(i)
    # A pair seen at too few sizes cannot split latency from bandwidth: keep its bandwidth.
    while names:
        jac = _jacobian(points, topo, nranks, base, names, values)
        if np.linalg.matrix_rank(_normalized(jac), tol=1e-3) == len(names):
            break
        bws = [n for n in names if n.startswith("bw:")]
        if not bws:
            raise NcclTuneError(
                "these records cannot determine the model's constants (the "
                f"fitted terms {', '.join(_label(n) for n in names)} are "
                "confounded): measure more sizes (8 KB..1 MB)"
            )
        drop = min(bws, key=lambda n: sum(pair_name(p.algo, p.proto) == n[3:] for p in points))
        held[drop] = (
            f"{drop[3:]} measured at too few sizes to tell its bandwidth from its "
            "latency: bandwidth kept, latency fitted"
        )
        i = names.index(drop)
        names.pop(i)
        values.pop(i)
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
    calibrated_pairs: tuple | None = None  # None: an older file, one factor for every pair
    pair_error: dict = field(default_factory=dict)

    def is_calibrated(self, algo: str, proto: str) -> bool:
        """True when the fit identified this (algorithm, protocol) pair."""
        return self.calibrated_pairs is None or pair_name(algo, proto) in self.calibrated_pairs

    def describe(self) -> str:
        """One line for headers: which calibration this is."""
        pairs = (
            "every pair (an older model file)"
            if self.calibrated_pairs is None
            else ", ".join(self.calibrated_pairs) or "none"
        )
        return (
            f"CALIBRATED model {self.path} (fitted to measurements of one machine: "
            f"topology {self.topology}, {self.nranks} ranks, {self.mode}; calibrated: "
            f"{pairs}; other pairs uncalibrated, with the published range)"
        )


def save(calibration: Calibration, path: str) -> None:
    """Write the model file atomically."""
    fileio.write_atomic(path, json.dumps(calibration.to_dict(), indent=2) + "\n")


def _scales(raw, what: str) -> dict:
    if not isinstance(raw, dict):
        raise TypeError(f"{what} is not an object")
    return {str(k): float(v) for k, v in raw.items()}


def load(path: str) -> LoadedModel:
    """Read a `model fit` file; NcclTuneError naming the file when it is not one."""
    data = fileio.load_json(path, what="model file", max_depth=MODEL_MAX_DEPTH)
    if not isinstance(data, dict) or data.get("schema") not in (SCHEMA, *OLD_SCHEMAS):
        raise NcclTuneError(f"not a `nccl-tune model fit` file (schema is not {SCHEMA})", path=path)
    raw = data.get("params")
    scales = raw.get("bw_scale") if isinstance(raw, dict) else None
    positive = ("a positive number", lambda v: fileio.is_number(v) and v > 0)
    checks = [  # (name, value, expected, check): every value the model reads, typed
        (
            "topology",
            data.get("topology"),
            "one of " + ", ".join(costmodel.TOPOLOGIES),
            lambda v: isinstance(v, str) and v in costmodel.TOPOLOGIES,
        ),
        (
            "nranks",
            data.get("nranks"),
            f"an integer from 2 to {MAX_NRANKS}",
            lambda v: fileio.is_int(v) and 2 <= v <= MAX_NRANKS,
        ),
        ("mode", data.get("mode"), "graph or eager", lambda v: v in (None, "graph", "eager")),
        ("params", raw, "an object", lambda v: isinstance(v, dict)),
        (
            "params.launch_us",
            (raw or {}).get("launch_us") if isinstance(raw, dict) else None,
            "a non-negative number",
            lambda v: fileio.is_number(v) and v >= 0,
        ),
        ("params.lat_scale", raw.get("lat_scale") if isinstance(raw, dict) else None, *positive),
        (
            "params.bw_scale",
            scales,
            "an object with " + ", ".join(PROTOS),
            lambda v: isinstance(v, dict) and all(p in v for p in PROTOS),
        ),
    ] + [(f"params.bw_scale.{p}", scales.get(p) if isinstance(scales, dict) else None, *positive) for p in PROTOS]
    for key in ("pair_lat_scale", "pair_bw_scale"):  # per algorithm/protocol pair (schema 2)
        table = raw.get(key, {}) if isinstance(raw, dict) else {}
        checks.append(
            (
                f"params.{key}",
                table,
                "an object of positive numbers",
                lambda v: isinstance(v, dict) and all(fileio.is_number(x) and x > 0 for x in v.values()),
            )
        )
    errors = data.get("pair_error", {})
    checks.append(
        (
            "pair_error",
            errors,
            "an object of non-negative numbers",
            lambda v: isinstance(v, dict) and all(fileio.is_number(x) and x >= 0 for x in v.values()),
        )
    )
    pairs = data.get("calibrated_pairs") if data["schema"] == SCHEMA else None
    if data["schema"] == SCHEMA:
        checks.append(
            (
                "calibrated_pairs",
                pairs,
                "a list of ALGO/PROTO pairs",
                lambda v: (
                    isinstance(v, list)
                    and all(
                        isinstance(p, str)
                        and len(p.split("/")) == 2
                        and p.split("/")[0] in ALGOS
                        and p.split("/")[1] in PROTOS
                        for p in v
                    )
                ),
            )
        )
    for name, value, expected, check in checks:
        if not check(value):
            raise fileio.wrong_type(path, name, value, expected)
    params = replace(
        costmodel.NCCL_PARAMS,
        launch_us=float(raw["launch_us"]),
        lat_scale=float(raw["lat_scale"]),
        bw_scale={p: float(scales[p]) for p in PROTOS},
        pair_lat_scale=_scales(raw.get("pair_lat_scale", {}), "pair_lat_scale"),
        pair_bw_scale=_scales(raw.get("pair_bw_scale", {}), "pair_bw_scale"),
    )
    return LoadedModel(
        path,
        data["topology"],
        data["nranks"],
        data.get("mode") or "eager",
        params,
        tuple(pairs) if pairs is not None else None,
        _scales(errors, "pair_error"),
    )


# ---------------------------------------------------------------- predictions


def predict_rows(
    topology_name: str, nranks: int, sizes, env: dict, mode: str, model: LoadedModel | None = None, refs=None
) -> list[dict]:
    """Per size: NCCL's algorithm, protocol and channels, the time, whether it is calibrated,
    and its range: the fit's own error on a calibrated pair; else what published machines
    of the kind give the model's time (`refs`; nccl_tune.model.ranges)."""
    from nccl_tune.model import ranges

    topo = costmodel.topology(topology_name)
    rows = []
    for nbytes in sizes:
        try:
            choice = costmodel.predict(
                "allreduce", nbytes, nranks, env, topo, model.params if model else costmodel.NCCL_PARAMS, mode
            )
        except ValueError as exc:
            raise NcclTuneError(f"--env: {exc}") from None
        calibrated = model is not None and model.is_calibrated(choice.algo, choice.proto)
        if model is not None and not calibrated:  # the fit moved nothing of this pair
            choice = costmodel.predict("allreduce", nbytes, nranks, env, topo, mode=mode)
        row = {
            "bytes": nbytes,
            "time_us": round(choice.time_us, 3),
            "algo": choice.algo,
            "proto": choice.proto,
            "channels": choice.channels,
            "transport": choice.link,
            "mode": mode,
            "calibrated": calibrated,
            "range_us": None,
            "range": None,
        }
        if calibrated:
            err = max(model.pair_error.get(pair_name(choice.algo, choice.proto), 0.0), MIN_CALIBRATED_ERROR)
            row["range_us"] = [round(choice.time_us * math.exp(-err), 2), round(choice.time_us * math.exp(err), 2)]
            row["range"] = {
                "basis": f"the fit's error on {choice.algo}/{choice.proto} (at least 10%)",
                "calibrated": True,
            }
        elif refs:
            found = ranges.kind_range(refs, topology_name, nranks, nbytes, env, mode)
            if found is not None:
                row["range_us"] = found.rounded()
                row["range"] = found.to_dict()
        rows.append(row)
    return rows
