"""What a sweep will do, before the engine runs it: measurement options, sizes, the
launch environment, round orders, launch counts and time estimates (pure functions).
"""

from __future__ import annotations

import os
import random
from dataclasses import dataclass

from microbench.options import DEFAULT_ITERS, DEFAULT_WARMUP, conf_conflicts  # torch-free
from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar
from nccl_tune.measure.grid import Cell, group_cells

MODULE = "microbench.allreduce"
BACKENDS = ("nccl", "gloo", "sim")
ISOLATIONS = ("group", "process", "nocache")
ISOLATION_CHOICES = ("auto", *ISOLATIONS)
CONF_FILES = ("~/.nccl.conf", "/etc/nccl.conf")
CONTROLLED_PREFIXES = ("NCCL_", "TORCH_NCCL_")  # inherited ones are removed from launches
GLOO_NOTE = (
    "backend gloo: NCCL settings do not affect gloo; cells differ only in name "
    "(this tests the sweep's mechanics, not NCCL)"
)


# ---------------------------------------------------------------- options


def canonical_dtype(name: str) -> str:
    """'bf16' / 'bfloat16' -> 'bf16'; NcclTuneError for an unknown dtype (the microbench's rules)."""
    from microbench import options as microbench_options  # torch-free

    return microbench_options.canonical_dtype(name)


def resolve_sizes(sizes: str | None, tokens: str | None, hidden: int | None, dtype: str) -> list[int]:
    """Message sizes in bytes, by the microbench's own rules (so both agree on every size):
    explicit `sizes` (K = 1024, as nccl-tests) or tokens x hidden x dtype bytes.
    """
    from microbench import options as microbench_options  # torch-free

    return microbench_options.resolve_sizes(sizes, tokens, hidden, canonical_dtype(dtype))


@dataclass(frozen=True)
class MeasureOptions:
    """What every cell measures, passed through to the microbench."""

    backend: str
    sizes: tuple[int, ...]
    dtype: str = "bf16"
    op: str = "allreduce"
    iters: int | None = None
    warmup: int | None = None
    mode: str | None = None
    graph_ops: int | None = None
    verify_effective: bool | None = None
    op_timeout: float | None = None
    label: str | None = None

    @property
    def full_iters(self) -> int:
        """Timed iterations of a full measurement (--iters, else the microbench's default)."""
        return self.iters if self.iters is not None else DEFAULT_ITERS

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise NcclTuneError(f"--backend: '{self.backend}' is not one of {', '.join(BACKENDS)}")

    def microbench_args(self, plan_path: str, out_path: str) -> list[str]:
        """The microbench's command-line arguments for one launch."""
        args = [
            "--plan",
            plan_path,
            "--out",
            out_path,
            "--backend",
            self.backend,
            "--op",
            self.op,
            "--sizes",
            ",".join(map(str, self.sizes)),
            "--dtype",
            self.dtype,
        ]
        if self.iters is not None:
            args += ["--iters", str(self.iters)]
        if self.warmup is not None:
            args += ["--warmup", str(self.warmup)]
        if self.mode is not None:
            args += ["--mode", self.mode]
        if self.graph_ops is not None:
            args += ["--graph-ops", str(self.graph_ops)]
        if self.verify_effective is not None:
            args.append("--verify-effective" if self.verify_effective else "--no-verify-effective")
        if self.op_timeout is not None:
            args += ["--timeout", str(self.op_timeout)]
        if self.label is not None:
            args += ["--label", self.label]
        return args


# ---------------------------------------------------------------- environment


def launch_environment(
    process_env: dict[str, str], keep: tuple[str, ...] = (), base: dict[str, str] | None = None
) -> tuple[dict[str, str], list[str]]:
    """The environment of a launch: the caller's without NCCL_* and TORCH_NCCL_* (except
    `keep`) + `process_env`. TORCH_NCCL_* change torch's work around every collective
    (timing events, trace buffers, blocking waits, error handling), so a stray one
    inherited from the shell would change the cells as a stray NCCL_* would.

    Returns (env, names of inherited variables removed). NcclTuneError when
    `process_env` holds what the profile grammar refuses (the cells come from checked
    grids; this keeps any other caller to the same rule).
    """
    grammar.check_env(process_env, "sweep cell environment")
    base = dict(os.environ if base is None else base)
    removed = sorted(k for k in base if k.startswith(CONTROLLED_PREFIXES) and k not in keep)
    env = {k: v for k, v in base.items() if k not in removed}
    env.update(process_env)
    env["PYTHONUNBUFFERED"] = "1"
    return env, removed


def conf_files(base: dict[str, str] | None = None, keep: tuple[str, ...] = ()) -> list[tuple[str, list[str]]]:
    """NCCL conf files the ranks would still read: (path, NCCL_* names they set).

    NCCL reads NCCL_CONF_FILE and ~/.nccl.conf / /etc/nccl.conf for any variable the
    environment does not set (DESIGN.md section 5). NCCL_CONF_FILE itself is an
    inherited NCCL_* variable, removed from launches unless kept (`keep`).
    """
    base = os.environ if base is None else base
    # NCCL reads NCCL_CONF_FILE instead of $HOME/.nccl.conf, then /etc/nccl.conf
    # (src/misc/param.cc initEnvFunc).
    if base.get("NCCL_CONF_FILE") and "NCCL_CONF_FILE" in keep:
        paths = [base["NCCL_CONF_FILE"]]
    else:
        home = base.get("HOME")
        paths = [os.path.join(home, ".nccl.conf")] if home else [os.path.expanduser(CONF_FILES[0])]
    paths += list(CONF_FILES[1:])
    out = []
    for path in paths:
        if not os.path.exists(path):
            continue
        try:  # the input policy (a pipe with no writer, a folder: not read), lines as NCCL takes them
            lines = fileio.iter_lines(path, what="NCCL conf file", strict=False, on_long=lambda number, length: None)
            names = [
                line.split("=", 1)[0].strip() for _, line in lines if "=" in line and not line.lstrip().startswith("#")
            ]
        except NcclTuneError:
            continue
        out.append((path, [n for n in names if n.startswith("NCCL_")]))
    return out


def conf_cell_conflicts(conf: list[tuple[str, list[str]]], cells: list[Cell], no_cache=()) -> list[tuple[str, str]]:
    """(path, name) of conf-file values that stop `cells` from sharing a process
    (microbench.options.conf_conflicts: a communicator-scoped name, or one `no_cache`
    lists under isolation nocache, that some cells set and others do not; the
    microbench refuses such a plan)."""
    envs = [{k: v for k, v in c.env.items() if k in c.comm_env or k in no_cache} for c in cells]
    return [(path, name) for path, name, _ in conf_conflicts(dict(conf), envs, no_cache)]


# ---------------------------------------------------------------- rounds


def round_order(cells: list[Cell], round_: int, seed: int, isolation: str) -> list[Cell]:
    """The cells of one round in a fresh random order (reproducible from seed and round).

    Grouped: process groups in random order, cells inside a group in random order after
    the group's cell without communicator-scoped settings (see grid.group_by_process).
    """
    rng = random.Random(f"nccl-tune:{seed}:{round_}")
    if isolation == "process":
        order = list(cells)
        rng.shuffle(order)
        return order
    groups = group_cells(cells, isolation)
    rng.shuffle(groups)
    order = []
    for group in groups:
        plain = [c for c in group.cells if not c.split(isolation)[1]]
        rest = [c for c in group.cells if c.split(isolation)[1]]
        rng.shuffle(rest)
        order += plain + rest
    return order


def count_launches(cells: list[Cell], rounds: int, isolation: str) -> int:
    """Launches an exhaustive sweep needs when nothing fails (re-runs not counted)."""
    per_round = len(cells) if isolation == "process" else len(group_cells(cells, isolation))
    return per_round * rounds


def planned_nccl_version(backend: str, given: str | None = None):
    """(version tuple or None, where it came from) of the NCCL a sweep plans for:
    --nccl-version when given, else on nccl the libnccl torch would load here (the first
    loadable one, nccl_tune.nccl.ncclinfo.default_library); gloo and sim load none."""
    import re

    from nccl_tune.nccl import ncclinfo

    if given is not None:
        version = ncclinfo.parse_version(given)
        if version is None or not re.fullmatch(r"\d+\.\d+\.\d+", given.strip()):
            raise NcclTuneError(f"--nccl-version: '{given}' is not a version X.Y.Z (e.g. 2.30.7)")
        return version, " (--nccl-version)"
    if backend != "nccl":
        return None, ""
    lib = ncclinfo.default_library()
    version = ncclinfo.parse_version(lib.version) if lib else None
    return version, (f" ({lib.source}: {lib.path})" if lib and version else "")


def resolve_isolation(
    requested: str | None, backend: str, nccl_version, verify_effective: bool | None = None, version_source: str = ""
) -> tuple[str, list[str]]:
    """The isolation a sweep uses, and notes saying why.

    auto: nocache when the NCCL planned for is 2.29.7 or newer (NCCL_NO_CACHE), else
    group; process when --no-verify-effective leaves shared NCCL cells unconfirmable.
    On gloo and sim no libnccl is loaded: auto plans nocache only for a given --nccl-version.
    """
    from nccl_tune.nccl import settings

    shown = ".".join(map(str, nccl_version)) if nccl_version else None
    where = f"NCCL {shown}{version_source}" if shown else "no NCCL version known"
    supported = settings.no_cache_supported(nccl_version)
    notes: list[str] = []
    if requested in (None, "auto"):
        if backend == "nccl" and verify_effective is False:
            return "process", ["isolation process: --no-verify-effective leaves grouped cells unconfirmable"]
        isolation = "nocache" if supported else "group"
        if supported is None and backend != "nccl":
            notes.append(
                f"isolation group (auto): backend {backend} loads no NCCL "
                "(--nccl-version X.Y.Z plans for one; 2.29.7+ gives nocache)"
            )
        else:
            why = (
                "honours NCCL_NO_CACHE (2.29.7+)"
                if supported
                else "predates NCCL_NO_CACHE (2.29.7)"
                if supported is False
                else "so NCCL_NO_CACHE cannot be relied on"
            )
            notes.append(f"isolation {isolation} (auto): {where} {why}")
    else:
        isolation = requested
        if isolation == "nocache" and supported is False:
            notes.append(
                f"warning: --isolation nocache with {where}, which ignores NCCL_NO_CACHE: "
                "cells varying a cached variable will be unconfirmed and re-run alone "
                "(--isolation group avoids that)"
            )
    if isolation == "nocache" and backend != "nccl":
        notes.append(
            f"backend {backend}: NCCL_NO_CACHE and the per-cell environment are applied "
            "as on NCCL, but there is no NCCL log, so no cell can be confirmed"
        )
    return isolation, notes


def launches_by_isolation(cells: list[Cell], rounds: int) -> dict[str, int]:
    """Launches an exhaustive sweep of `cells` needs under each isolation (no failures)."""
    return {name: count_launches(cells, rounds, name) for name in ("process", "group", "nocache")}


# Rough costs (s) for the plan's time estimate: torchrun start, import torch and
# rendezvous per launch; communicator creation per cell; per-op sync per iteration.
LAUNCH_COST_S = {"nccl": 15.0, "gloo": 5.0, "sim": 0.0}
CELL_COST_S = {"nccl": 1.5, "gloo": 0.3, "sim": 0.0}
OP_COST_US = {"nccl": 60.0, "gloo": 250.0, "sim": 0.0}


def estimate_seconds(cells: list[Cell], rounds: int, isolation: str, options: MeasureOptions) -> float:
    """A rough wall-time estimate of an exhaustive sweep (no failures, no re-runs)."""
    backend = options.backend
    iters = options.full_iters + (options.warmup if options.warmup is not None else DEFAULT_WARMUP)
    per_cell = CELL_COST_S[backend] + len(options.sizes) * iters * OP_COST_US[backend] * 1e-6
    launches = count_launches(cells, rounds, isolation)
    return launches * LAUNCH_COST_S[backend] + len(cells) * rounds * per_cell


# ---------------------------------------------------------------- identity


def grid_digest(cells) -> dict:
    """What names a grid in a sweep's identity: its cell count and a hash of its cell ids."""
    import hashlib

    ids = sorted(c.id for c in cells)
    return {"cells": len(ids), "hash": hashlib.sha1("\n".join(ids).encode()).hexdigest()[:10]}


def sweep_identity(
    options: MeasureOptions,
    *,
    world_size: int | None,
    nnodes: int | None,
    cells=None,
    landscape=None,
    common_env: dict | None = None,
) -> dict:
    """What defines the records of one sweep: every option that changes what a record
    means (what was measured, how, on what, in which world, or for sim what the model
    draws). Stored in every record the sweep writes (`sweep`), so a resume into a file
    of another sweep is refused instead of reusing records that measured something else.
    Rounds, seed (on real backends), budget, strategy, label and isolation are not in it:
    they say how many or in what order, not what a record is."""
    identity = {
        "backend": options.backend,
        "op": options.op,
        "dtype": options.dtype,
        "sizes": list(options.sizes),
        "world_size": world_size,
        "nnodes": nnodes,
        "mode": options.mode,
        "iters": options.iters,
        "warmup": options.warmup,
        "graph_ops": options.graph_ops,
    }
    if cells is not None:
        identity["grid"] = grid_digest(cells)
    if landscape is not None:  # sim: what the model draws from (its draws are seeded too)
        identity.update(
            topology=landscape.topology, landscape=landscape.kind, sim_seed=landscape.seed, model=landscape.calibrated
        )
    if common_env:
        identity["common_env"] = dict(sorted(common_env.items()))
    return identity


def _shown(key: str, value) -> str:
    if value is None:
        return "default" if key in ("mode", "iters", "warmup", "graph_ops") else "none"
    if key == "grid" and isinstance(value, dict):
        return f"{value.get('cells')} cells (#{value.get('hash')})"
    if key == "sizes" and isinstance(value, list):
        return ",".join(map(str, value))
    if isinstance(value, dict):
        return " ".join(f"{k}={v}" for k, v in value.items()) or "none"
    return str(value)


def identity_differences(there: dict, here: dict) -> list[str]:
    """'topology pcie-shm there, pcie-amd-2s here' for each key both identities hold
    with different values (a key one of them lacks is not compared)."""
    out = []
    for key in here:
        if key in there and there[key] != here[key]:
            out.append(f"{key.replace('_', ' ')} {_shown(key, there[key])} there, {_shown(key, here[key])} here")
    return out
