"""Published allreduce latencies of real machines, and the range a kind of machine measured.

The figures ship with the package (nccl_tune/data/references.json, written by the
project): per table the bytes and microseconds as published, the machine, GPUs, kind,
host, NCCL version, timer (graph or eager, GPUs per process), settings, what is known of
the transport (P2P, switches, sockets, NVLS) and the source address. They are facts with
their sources; nobody's text or tables are copied. $NCCL_TUNE_REFERENCES (a
references.json, or the folder holding one) adds tables: the project's schema, or the
older list form, whose kinds `kind_of` reads from the entry's words.

The range a kind of machine gives a modelled time is built in nccl_tune.model.ranges;
`attach_published_range` puts it on a modelled recommendation.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.model import costmodel

ENV_VAR = "NCCL_TUNE_REFERENCES"
FILE_NAME = "references.json"
SCHEMA = "nccl-tune-references/1"
SHIPPED = "shipped with nccl-tune (nccl_tune/data/references.json)"


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
    machine_id: str = ""  # tables of one machine share it
    gpus_per_process: int | None = None  # nccl-tests -g N: N; None: not stated
    p2p: bool | None = None  # P2P between the farthest pairs (False: host memory)
    pcie_switch: bool | None = None
    sockets: int | None = None
    nvls: bool | None = None
    settings_stated: bool = True  # False: the source does not say which settings ran
    derived: str | None = None  # "busbw": times computed from published bus bandwidth
    tool: str = ""
    origin: str = field(default=SHIPPED, compare=False)

    @property
    def machine(self) -> str:
        """The machine this table belongs to (tables of one machine share it)."""
        return self.machine_id or machine_of(self.name)

    def at(self, nbytes: int) -> float | None:
        """Measured us at `nbytes`: log-log interpolated inside the table; flat below its
        smallest size (small allreduces cost their fixed latency); None above its largest."""
        pts = self.points
        if nbytes <= pts[0][0]:
            return pts[0][1]
        exact = dict(pts).get(nbytes)
        if exact is not None:
            return exact
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

        return [
            store.make_record(
                run_id=f"reference:{self.name}",
                cell=store.cell_id(self.env),
                env=dict(self.env),
                backend="nccl-tests",
                op="allreduce",
                mode=self.mode or "eager",
                world_size=self.n_gpus,
                nnodes=1,
                bytes=int(b),
                lat_us={"p50": float(t)},
                host=self.machine,
                gpus=[self.gpus] * self.n_gpus,
                topology=self.kind,
                status="ok",
                label=f"published: {self.source}",
            )
            for b, t in self.points
        ]


def machine_of(name: str) -> str:
    """Machine id of an older-form reference name: tables of one machine share it."""
    cut = re.split(r"-(default|proto-|algo-|p2pmark|graphxml|sglang|p2p-level)", name, maxsplit=1)
    return cut[0]


def kind_of(entry: dict) -> str:
    """The cost model's topology kind for an older-form entry, from what its words say."""
    inter = str(entry.get("interconnect", "")).lower()
    gpus = str(entry.get("gpus", "")).upper()
    cpu = str(entry.get("cpu", ""))
    n = int(entry.get("n_gpus") or 0)
    if "nvlink" in inter or "nvswitch" in inter:
        if re.search(r"V100|P100", gpus):
            return "nvlink-mesh"
        if re.search(r"H100|H200|H800|H20\b|B200|B100|GB200|B300", gpus):
            return "nvswitch-nvls"
        if "A100" in gpus or "A800" in gpus:
            return "nvswitch"
        return "nvlink"
    two_sockets = bool(re.search(r"\b2x\b|dual", cpu, re.IGNORECASE)) and not re.search(
        r"on NUMA 0|single|one socket", cpu, re.IGNORECASE
    )
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


def _comparable_env(env: dict) -> dict:
    # NCCL_GRAPH_FILE values name local files: compare whether one is set, not the name.
    return {k: ("set" if k == "NCCL_GRAPH_FILE" else v) for k, v in env.items()}


def _points(entry: dict) -> tuple:
    return tuple(sorted((int(b), float(t)) for b, t in entry["points"] if float(t) > 0))


def _from_schema(entry: dict, origin: str) -> Reference:
    mode = entry.get("mode")
    if mode not in ("graph", "eager", None):
        raise ValueError(f"mode {mode!r}")
    return Reference(
        name=str(entry["name"]),
        kind=str(entry["kind"]),
        n_gpus=int(entry["n_gpus"]),
        env=_comparable_env({str(k): str(v) for k, v in (entry.get("settings") or {}).items()}),
        mode=mode,
        points=_points(entry),
        gpus=str(entry.get("gpus", "")),
        cpu=str(entry.get("host") or ""),
        source=str(entry.get("source", "")),
        nccl_version=str(entry.get("nccl") or ""),
        machine_id=str(entry["machine"]),
        gpus_per_process=entry.get("gpus_per_process"),
        p2p=entry.get("p2p"),
        pcie_switch=entry.get("pcie_switch"),
        sockets=entry.get("sockets"),
        nvls=entry.get("nvls"),
        settings_stated=bool(entry.get("settings_stated", True)),
        derived=entry.get("derived"),
        tool=str(entry.get("tool") or ""),
        origin=origin,
    )


def _from_list_form(entries: list, origin: str) -> list[Reference]:
    machine_kind: dict[str, str] = {}  # a machine's kind is its default table's
    for entry in entries:
        if isinstance(entry, dict) and not entry.get("env") and "name" in entry:
            machine_kind.setdefault(machine_of(str(entry["name"])), kind_of(entry))
    out = []
    for entry in entries:
        graph = entry.get("graph_mode")
        name = str(entry["name"])
        out.append(
            Reference(
                name=name,
                kind=machine_kind.get(machine_of(name), kind_of(entry)),
                n_gpus=int(entry["n_gpus"]),
                env=_comparable_env({str(k): str(v) for k, v in (entry.get("env") or {}).items()}),
                mode=None if graph is None else ("graph" if graph else "eager"),
                points=_points(entry),
                gpus=str(entry.get("gpus", "")),
                cpu=str(entry.get("cpu", "")),
                source=str(entry.get("source", "")),
                nccl_version=str(entry.get("nccl_version", "")),
                origin=origin,
            )
        )
    return out


def parse(data, origin: str) -> list[Reference]:
    """References from a parsed references.json (either form); NcclTuneError naming `origin`."""
    try:
        if isinstance(data, dict) and data.get("schema") == SCHEMA:
            out = [_from_schema(e, origin) for e in data["references"]]
        elif isinstance(data, list):
            out = _from_list_form(data, origin)
        else:
            raise NcclTuneError(f"not a reference table (neither {SCHEMA} nor a JSON list)", path=origin)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise NcclTuneError(f"malformed reference table ({type(exc).__name__}: {exc})", path=origin) from None
    for ref in out:
        if not ref.points:
            raise NcclTuneError(f"{ref.name}: no points", path=origin)
        if ref.kind not in costmodel.TOPOLOGIES:
            raise NcclTuneError(f"{ref.name}: unknown kind '{ref.kind}'", path=origin)
    return out


REFERENCES_MAX_BYTES = 16 * 1024 * 1024
REFERENCES_MAX_DEPTH = 6  # list -> entry -> points -> [bytes, us]


def _read(path: Path) -> list[Reference]:
    if path.is_dir():
        path = path / FILE_NAME
    data = fileio.load_json(
        path, what="reference table", max_bytes=REFERENCES_MAX_BYTES, max_depth=REFERENCES_MAX_DEPTH
    )
    return parse(data, str(path))


def shipped() -> list[Reference]:
    """The tables shipped with the package."""
    text = (resources.files("nccl_tune") / "data" / FILE_NAME).read_text(encoding="utf-8")
    return parse(json.loads(text), SHIPPED)


def load(path: str | Path | None = None) -> list[Reference]:
    """The published references: `path` alone when given; else the shipped tables plus
    $NCCL_TUNE_REFERENCES's (a name already shipped keeps the shipped table)."""
    if path:
        return _read(Path(path))
    out = shipped()
    extra = os.environ.get(ENV_VAR)
    if extra:
        names = {r.name for r in out}
        out += [r for r in _read(Path(extra)) if r.name not in names]
    return out


def saving_range_ms(
    collectives: int, base_model_us: float, cell_model_us: float, low_us: float, high_us: float
) -> tuple[float, float] | None:
    """ms a cell saves over `collectives` allreduces, low-high, when NCCL's defaults take
    anywhere in [low_us, high_us]: the model's relative saving (1 - cell/default) applied
    to the range of the default latency (the machines differ; the ratio is what the model
    says). None when the model's default time is not positive."""
    if base_model_us <= 0:
        return None
    keep = cell_model_us / base_model_us
    saved = [collectives * lat * (1 - keep) / 1000.0 for lat in (low_us, high_us)]
    return (min(saved), max(saved))


def project_tok_s(
    baseline_tok_s: float, collectives: int, base_model_us: float, cell_model_us: float, found
) -> tuple[float, float] | None:
    """tok/s under a cell, low-high, when NCCL's defaults take anywhere in `found`
    (the saving's range, `saving_range_ms`, applied to the baseline's tok/s)."""
    from nccl_tune.model.per_token import projected_tok_s

    saved = saving_range_ms(collectives, base_model_us, cell_model_us, found.low, found.high)
    if saved is None:
        return None
    out = []
    for ms in saved:
        try:
            out.append(projected_tok_s(baseline_tok_s, ms))
        except ValueError:
            return None
    return (min(out), max(out))


def attach_published_range(analysis, kind: str, baseline_tok_s: float | None, model=None):
    """Ranges for a modelled recommendation: each row's `latency_range` (the fit's own error
    where `model`, a calibrate.LoadedModel, calibrated the row's pair; else what published
    machines of `kind` give the model's time) and, over the range of NCCL's defaults, each
    cell's `projected_range` (tok/s). Returns the defaults' published range; None, with a
    note on `analysis`, when no published machine can give one."""
    from nccl_tune.model import calibrate, ranges

    refs = load()
    nbytes, nranks = analysis.message_bytes, analysis.world_size
    found = ranges.kind_range(refs, kind, nranks, nbytes, {}, mode=None)
    for row in (analysis.baseline, *analysis.cells):
        eff = row.effective or {}
        if model is not None and row.calibrated and row.latency_us:
            err = max(
                model.pair_error.get(calibrate.pair_name(eff.get("algo"), eff.get("proto")), 0.0),
                calibrate.MIN_CALIBRATED_ERROR,
            )
            row.latency_range = (row.latency_us * math.exp(-err), row.latency_us * math.exp(err))
        else:
            cell = ranges.kind_range(refs, kind, nranks, nbytes, row.env, mode=None)
            row.latency_range = (cell.low, cell.high) if cell else None
    if found is None:
        analysis.notes.append("no published measurement to range the model's figures: they are the model's alone")
        return None
    if baseline_tok_s and not analysis.baseline.calibrated:
        for row in analysis.cells:
            if row.latency_us is not None:
                row.projected_range = project_tok_s(
                    baseline_tok_s, analysis.collectives, analysis.baseline.latency_us, row.latency_us, found
                )
    return found
