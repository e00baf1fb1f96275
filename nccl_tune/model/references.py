"""Published allreduce latencies of real machines, and the range a kind of machine measured.

The data are not part of the package: they are public measurements (nccl-tests tables,
p2pmark, benchmark pages) collected with their sources in a `references.json` file
(machine, GPUs, interconnect, CPU, NCCL version, graph or eager, settings, points in
bytes and us, source). It is found at $NCCL_TUNE_REFERENCES (a file or the folder
holding it), else at `shared/fixtures/real/reference_latency/` beside the checkout.
Without it, ranges are simply not available, and the commands say so.

Each reference is assigned one of the cost model's topology kinds (`kind_of`) from what
the reference says about its machine (interconnect, GPUs, CPU sockets and vendor). A
kind's range at a size is the span its machines measured there, widened to the spread
that machines of one kind show (at most RANGE_MAX_RATIO wide in all).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError

ENV_VAR = "NCCL_TUNE_REFERENCES"
FILE_NAME = "references.json"
RANGE_MAX_RATIO = 3.5  # the widest range_us may be (high / low)
_REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Reference:
    """One published table: a machine under one setting."""

    name: str
    kind: str
    n_gpus: int
    env: dict
    mode: str | None  # graph | eager | None (not stated)
    points: tuple  # ((bytes, us), ...) sorted by size
    gpus: str = ""
    cpu: str = ""
    source: str = ""
    nccl_version: str = ""

    @property
    def machine(self) -> str:
        """The machine this table belongs to (tables of one machine share it)."""
        return machine_of(self.name)

    def at(self, nbytes: int) -> float | None:
        """Measured us at `nbytes`: log-log interpolated inside the table; flat below its
        smallest size (small allreduces cost their fixed latency); None above its largest."""
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1]
        for (b0, t0), (b1, t1) in zip(pts, pts[1:]):
            if b0 <= nbytes <= b1:
                if b0 == b1:
                    return t0
                frac = math.log(nbytes / b0) / math.log(b1 / b0)
                return math.exp(math.log(t0) + frac * (math.log(t1) - math.log(t0)))
        return None

    def records(self) -> list[dict]:
        """The table as results records (backend nccl-tests; mode eager where not stated)."""
        from nccl_tune import store

        return [store.make_record(
            run_id=f"reference:{self.name}", cell=store.cell_id(self.env), env=dict(self.env),
            backend="nccl-tests", op="allreduce", mode=self.mode or "eager",
            world_size=self.n_gpus, nnodes=1, bytes=int(b), lat_us={"p50": float(t)},
            host=self.machine, gpus=[self.gpus] * self.n_gpus, topology=self.kind, status="ok",
            label=f"published: {self.source}") for b, t in self.points]


def machine_of(name: str) -> str:
    """Machine id of a reference name: tables of one machine and setting family share it."""
    cut = re.split(r"-(default|proto-|algo-|p2pmark|graphxml|sglang|p2p-level)", name, maxsplit=1)
    return cut[0]


def kind_of(entry: dict) -> str:
    """The cost model's topology kind for a published machine, from what its entry says."""
    inter = str(entry.get("interconnect", "")).lower()
    gpus = str(entry.get("gpus", "")).upper()
    cpu = str(entry.get("cpu", ""))
    n = int(entry.get("n_gpus") or 0)
    if "nvlink" in inter or "nvswitch" in inter:
        if re.search(r"V100|P100", gpus):
            return "nvlink-mesh"
        if re.search(r"H100|H200|H800|B200|B100|GB200|B300", gpus):
            return "nvswitch-nvls"
        if "A100" in gpus or "A800" in gpus:
            return "nvswitch"
        return "nvlink"
    two_sockets = bool(re.search(r"\b2x\b|dual", cpu, re.I)) and not re.search(
        r"on NUMA 0|single|one socket", cpu, re.I)
    amd = bool(re.search(r"AMD|EPYC", cpu))
    if two_sockets and amd and n > 2:
        return "pcie-amd-2s"
    if two_sockets:
        return "pcie-shm"
    if "mixed" in inter or re.search(r"\bNODE\b|\bPHB\b", cpu):
        return "pcie-direct"
    if "switch" in inter:
        return "pcie-switch"
    if "shm" in inter:
        return "pcie-shm"
    if "p2p" in inter:
        return "pcie-switch"
    return "pcie-direct" if re.search(r"NUMA 0", cpu) else "pcie"


def default_path() -> Path | None:
    """Where references.json is: $NCCL_TUNE_REFERENCES, else beside the checkout; or None."""
    env = os.environ.get(ENV_VAR)
    candidates = [Path(env)] if env else []
    candidates.append(_REPO_ROOT.parent / "shared" / "fixtures" / "real" / "reference_latency")
    for cand in candidates:
        path = cand / FILE_NAME if cand.is_dir() else cand
        if path.is_file():
            return path
    return None


REFERENCES_MAX_BYTES = 16 * 1024 * 1024
REFERENCES_MAX_DEPTH = 6  # list -> entry -> points -> [bytes, us]


def load(path: str | Path | None = None) -> list[Reference]:
    """The published references ([] when no file is found and no path was given)."""
    where = Path(path) if path else default_path()
    if where is None:
        return []
    if where.is_dir():
        where = where / FILE_NAME
    data = fileio.load_json(where, what="reference table", max_bytes=REFERENCES_MAX_BYTES,
                            max_depth=REFERENCES_MAX_DEPTH)
    if not isinstance(data, list):
        raise NcclTuneError("the reference table is not a JSON list", path=str(where))
    out = []
    machine_kind: dict[str, str] = {}  # a machine's kind is its default table's
    for entry in data:
        if isinstance(entry, dict) and not entry.get("env") and "name" in entry:
            machine_kind.setdefault(machine_of(str(entry["name"])), kind_of(entry))
    for i, entry in enumerate(data):
        try:
            pts = tuple(sorted((int(b), float(t)) for b, t in entry["points"] if float(t) > 0))
            graph = entry.get("graph_mode")
            out.append(Reference(
                name=str(entry["name"]),
                kind=machine_kind.get(machine_of(str(entry["name"])), kind_of(entry)), n_gpus=int(entry["n_gpus"]),
                env={str(k): str(v) for k, v in (entry.get("env") or {}).items()},
                mode=None if graph is None else ("graph" if graph else "eager"), points=pts,
                gpus=str(entry.get("gpus", "")), cpu=str(entry.get("cpu", "")),
                source=str(entry.get("source", "")), nccl_version=str(entry.get("nccl_version", ""))))
        except (KeyError, TypeError, ValueError) as exc:
            raise NcclTuneError(f"entry {i}: malformed ({type(exc).__name__}: {exc})",
                                path=str(where)) from None
        if not out[-1].points:
            raise NcclTuneError(f"entry {i} ({out[-1].name}): no points", path=str(where))
    return out


# Original kind names cover the finer kinds' references (`nvlink` is any NVLink machine).
RELATED_KINDS = {"nvlink": ("nvlink", "nvswitch", "nvswitch-nvls", "nvlink-mesh"),
                 "pcie": ("pcie", "pcie-switch")}


def _comparable_env(env: dict) -> dict:
    # NCCL_GRAPH_FILE values name local files: compare whether one is set, not the name.
    return {k: ("set" if k == "NCCL_GRAPH_FILE" else v) for k, v in env.items()}


@dataclass(frozen=True)
class Range:
    """What published machines of a kind measured at one size, and the range it gives."""

    low: float
    high: float
    measured: tuple  # (min, max) the machines measured
    machines: tuple  # reference names used
    basis: str  # how the references were chosen

    def covers(self, value: float) -> bool:
        """True when `value` (us) lies in [low, high]."""
        return self.low <= value <= self.high

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"low": round(self.low, 2), "high": round(self.high, 2),
                "measured": [round(v, 2) for v in self.measured],
                "machines": list(self.machines), "basis": self.basis}


def kind_range(refs: list[Reference], kind: str, nranks: int, nbytes: int,
               env: dict | None = None, exclude_machine: str | None = None) -> Range | None:
    """The range machines of `kind` with `nranks` GPUs measured at `nbytes` (None: none did).

    References with the same settings as `env` where there are any, else those with
    NCCL's defaults. The measured span is widened geometrically to RANGE_MAX_RATIO (the
    spread seen between machines of one kind: switches, sockets, drivers, timers).
    `exclude_machine` leaves one machine out (to check a range against it).
    """
    want = _comparable_env(env or {})
    kinds = RELATED_KINDS.get(kind, (kind,))
    pool = [r for r in refs if r.kind in kinds and r.n_gpus == nranks
            and r.machine != exclude_machine]
    same = [r for r in pool if _comparable_env(r.env) == want]
    basis = "same settings" if want else "NCCL's defaults"
    if not same:
        same = [r for r in pool if not r.env]
        basis = "NCCL's defaults (no reference with these settings)" if want else "NCCL's defaults"
    values = [(r.name, r.at(nbytes)) for r in same]
    values = [(name, v) for name, v in values if v is not None]
    if not values:
        return None
    lo, hi = min(v for _, v in values), max(v for _, v in values)
    mid, half = math.sqrt(lo * hi), math.sqrt(RANGE_MAX_RATIO)
    low, high = mid / half, mid * half
    if hi / lo >= RANGE_MAX_RATIO:  # cannot widen: the machines themselves span more
        low, high = lo, lo * RANGE_MAX_RATIO
    # Rounded inwards, so the printed range is never wider than RANGE_MAX_RATIO.
    low, high = math.ceil(low * 100) / 100, math.floor(high * 100) / 100
    return Range(low, high, (lo, hi), tuple(name for name, _ in values), basis)


def project_tok_s(baseline_tok_s: float, collectives: int, base_model_us: float,
                  cell_model_us: float, found: Range) -> tuple[float, float] | None:
    """tok/s under a cell, low-high, when NCCL's defaults take anywhere in `found`.

    The model's relative saving (1 - cell/default) is applied to the published
    range of the default latency: the machines differ, the ratio is what the model says.
    """
    from nccl_tune.model.per_token import projected_tok_s

    if base_model_us <= 0:
        return None
    keep = cell_model_us / base_model_us
    out = []
    for lat in (found.low, found.high):
        try:
            out.append(projected_tok_s(baseline_tok_s, collectives * lat * (1 - keep) / 1000.0))
        except ValueError:
            return None
    return (min(out), max(out))


def attach_published_range(analysis, kind: str, baseline_tok_s: float | None) -> Range | None:
    """The range reference machines of `kind` measured at a modelled recommendation's
    decode size; sets each cell's `projected_range` (tok/s low-high) over it. None, with a
    note on `analysis`, without a reference table or a published machine of this kind."""
    refs = load()
    found = kind_range(refs, kind, analysis.world_size, analysis.message_bytes)
    if found is None:
        analysis.notes.append(
            f"no published measurement of a {kind} machine with {analysis.world_size} GPUs"
            + ("" if refs else f" (no reference table: set {ENV_VAR})")
            + ": the figures are the model's alone")
        return None
    if baseline_tok_s:
        for row in analysis.cells:
            if row.latency_us is not None:
                row.projected_range = project_tok_s(baseline_tok_s, analysis.collectives,
                                                    analysis.baseline.latency_us, row.latency_us,
                                                    found)
    return found
