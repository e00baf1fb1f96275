"""Options of `microbench.allreduce`: parsing and validation, torch-free.

Kept apart from the measuring code so that `nccl-tune bench` can check a command
line (and show the same help) without importing torch, and so that the parsing is
testable as pure functions. Bad input raises `NcclTuneError`; the entry point turns
it into one line on stderr and exit code 2.

A plan (`--plan PLAN.json`, written by `nccl-tune sweep`) lists cells to measure one
after another in this process, each with a fresh communicator:

    {"run_id": "...", "cells": [{"cell": "c-1a2b...", "env": {...}, "comm_env": {...},
      "round": 0, "iters": null, "warmup": null, "extra": {"isolation": "group"}}]}
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass, field

from nccl_tune import fileio, vocab
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar
from nccl_tune.nccl import settings

PROG = "microbench.allreduce"

# name -> (torch dtype attribute, bytes per element, largest integer n such that every
# integer in [-n, n] is exact in the type: 2**(mantissa bits + 1)).
DTYPES: dict[str, tuple[str, int, int]] = {
    "bf16": ("bfloat16", 2, 256),
    "fp16": ("float16", 2, 2048),
    "fp32": ("float32", 4, 1 << 24),
}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "half": "fp16", "float32": "fp32", "float": "fp32"}
OPS = ("allreduce", "reduce_scatter", "all_gather")
BACKENDS = ("auto", "nccl", "gloo")
MODES = ("auto", "graph", "eager")
DEFAULT_TOKENS = "1,2,3,4,6,8"
DEFAULT_HIDDEN = 7168
DEFAULT_DTYPE = "bf16"
WORLD_ONE_NOTE = (
    "a world of 1 rank measures no communication (an allreduce over one rank "
    "moves no data: busbw is 0); use 2 ranks or more (nccl-tune bench --nproc 2)"
)
DEFAULT_ITERS = 200  # timed iterations per size (the sweep counts budgets in these)
DEFAULT_WARMUP = 20
# The NCCL_DEBUG family is instrumentation, not a setting under test: it never enters
# a cell's env (so NCCL_DEBUG=INFO does not turn a baseline run into another cell).
DEBUG_VARS = (
    "NCCL_DEBUG",
    "NCCL_DEBUG_SUBSYS",
    "NCCL_DEBUG_FILE",
    "NCCL_DEBUG_TIMESTAMP_LEVELS",
    "NCCL_DEBUG_TIMESTAMP_FORMAT",
)


def canonical_dtype(name: str) -> str:
    """'bf16' / 'bfloat16' -> 'bf16'; raises NcclTuneError for an unknown name."""
    key = name.strip().lower()
    key = DTYPE_ALIASES.get(key, key)
    if key not in DTYPES:
        raise NcclTuneError(f"--dtype: unknown dtype '{name}' (known: {', '.join(DTYPES)})")
    return key


def dtype_size(name: str) -> int:
    """Bytes per element of a dtype name."""
    return DTYPES[canonical_dtype(name)][1]


def parse_size(text: str) -> int:
    """'14336' -> 14336, '64K' -> 65536, '1M' -> 1048576 (K = 1024, as nccl-tests); at
    most nccl_tune.vocab.MAX_BYTES (the vocabulary's one size rule)."""
    return vocab.parse_size(text)


def _int_list(text: str, option: str) -> list[int]:
    return vocab.parse_counts(text, option, vocab.MAX_TOKENS)


def resolve_sizes(sizes: str | None, tokens: str | None, hidden: int | None, dtype: str) -> list[int]:
    """Message sizes in bytes, in the order given, duplicates dropped.

    Either explicit `sizes` ("1K,14336,64K") or decode sizes tokens x hidden x dtype
    size (default tokens 1,2,3,4,6,8 at hidden 7168). Every size must hold whole
    elements of `dtype`.
    """
    elem = dtype_size(dtype)
    if sizes is not None and (tokens is not None or hidden is not None):
        raise NcclTuneError("--sizes cannot be combined with --tokens/--hidden")
    if sizes is not None:
        items = [s for s in sizes.split(",")]
        if not sizes.strip() or any(not s.strip() for s in items):
            raise NcclTuneError(f"--sizes: expected a comma list of sizes, got '{sizes}'")
        values = [parse_size(s) for s in items]
    else:
        if hidden is not None and not 0 < hidden <= vocab.MAX_HIDDEN:
            raise NcclTuneError(f"--hidden: {hidden} must be an integer in [1, {vocab.MAX_HIDDEN}]")
        counts = _int_list(tokens or DEFAULT_TOKENS, "--tokens")
        values = [vocab.check_bytes(t * (hidden or DEFAULT_HIDDEN) * elem, "--tokens x --hidden") for t in counts]
    for value in values:
        if value % elem:
            raise NcclTuneError(
                f"--sizes: {value} bytes is not a multiple of the {elem}-byte {canonical_dtype(dtype)} element"
            )
    return list(dict.fromkeys(values))


# ---------------------------------------------------------------- plans


@dataclass
class Cell:
    """One plan cell: the settings to measure under, and what to add to its records."""

    cell: str
    env: dict[str, str]
    comm_env: dict[str, str]
    round: int = 0
    iters: int | None = None
    warmup: int | None = None
    extra: dict = field(default_factory=dict)


@dataclass
class Plan:
    """Cells measured one after another in one process, each with a fresh communicator.

    `no_cache`: cached NCCL variables this launch lists in NCCL_NO_CACHE (isolation
    nocache); they are set per cell like the communicator-scoped ones.
    """

    run_id: str | None
    cells: list[Cell]
    no_cache: tuple[str, ...] = ()


def _str_map(value, where: str, path: str) -> dict[str, str]:
    if not isinstance(value, dict):
        raise NcclTuneError(f"{where} must be an object of NAME: value strings", path=path)
    for key, val in value.items():
        if not isinstance(key, str) or not key.startswith("NCCL_"):
            raise NcclTuneError(f"{where}: '{key}' is not an NCCL_* variable", path=path)
        if not isinstance(val, str):
            raise NcclTuneError(f"{where}.{key} must be a string, got {type(val).__name__}", path=path)
    return dict(value)


def _opt_count(value, where: str, path: str) -> int | None:
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise NcclTuneError(f"{where} must be a non-negative integer or null", path=path)
    return value


PLAN_MAX_DEPTH = 8  # plan -> cells -> cell -> extra -> an extra's object


def parse_plan(data, path: str = "<plan>") -> Plan:
    """Validate a decoded plan object and return it as a `Plan`.

    `comm_env` must be exactly the communicator-scoped part of `env` (the catalogue in
    nccl_tune.nccl.settings decides scope): the measurement sets those variables itself,
    and the launcher must have set the rest.
    """
    if not isinstance(data, dict):
        raise NcclTuneError("a plan must be a JSON object with 'cells'", path=path)
    run_id = data.get("run_id")
    if run_id is not None and not isinstance(run_id, str):
        raise NcclTuneError("run_id must be a string", path=path)
    cells_data = data.get("cells")
    if not isinstance(cells_data, list) or not cells_data:
        raise NcclTuneError("'cells' must be a non-empty list", path=path)
    no_cache = data.get("no_cache") or []
    if not isinstance(no_cache, list) or not all(
        isinstance(n, str) and settings.rereads_under_no_cache(n) for n in no_cache
    ):
        raise NcclTuneError(
            f"no_cache must list cached NCCL_PARAM variables that NCCL_NO_CACHE re-reads, got {no_cache!r}", path=path
        )
    per_comm = lambda key: settings.scope_of(key) == "communicator" or key in no_cache  # noqa: E731
    cells = []
    for index, item in enumerate(cells_data):
        where = f"cells[{index}]"
        if not isinstance(item, dict):
            raise NcclTuneError(f"{where} must be an object", path=path)
        env = _str_map(item.get("env", {}), f"{where}.env", path)
        problems = grammar.env_problems(env)  # cells are profiles: the same grammar
        if problems:
            name, why = problems[0]
            raise NcclTuneError(f"{where}.env: {name}: {why}", path=path)
        comm_env = _str_map(item.get("comm_env", {}), f"{where}.comm_env", path)
        for key in comm_env:
            if not per_comm(key):
                raise NcclTuneError(
                    f"{where}.comm_env: {key} is process-scoped; only "
                    "communicator-scoped variables (and those the plan's no_cache "
                    "lists) can change inside a process",
                    path=path,
                )
        expected = {k: v for k, v in env.items() if per_comm(k)}
        if comm_env != expected:
            raise NcclTuneError(
                f"{where}.comm_env {comm_env} is not the communicator-scoped part of env {expected}", path=path
            )
        cell_name = item.get("cell")
        if not isinstance(cell_name, str) or not cell_name:
            raise NcclTuneError(f"{where}.cell must be a non-empty string", path=path)
        round_ = item.get("round", 0)
        if not isinstance(round_, int) or isinstance(round_, bool):
            raise NcclTuneError(f"{where}.round must be an integer", path=path)
        extra = item.get("extra")
        extra = {} if extra is None else extra
        if not isinstance(extra, dict):
            raise NcclTuneError(f"{where}.extra must be an object", path=path)
        cells.append(
            Cell(
                cell=cell_name,
                env=env,
                comm_env=comm_env,
                round=round_,
                iters=_opt_count(item.get("iters"), f"{where}.iters", path),
                warmup=_opt_count(item.get("warmup"), f"{where}.warmup", path),
                extra=dict(extra),
            )
        )
    return Plan(run_id=run_id, cells=cells, no_cache=tuple(no_cache))


def load_plan(path: str) -> Plan:
    """Read (by the input policy, nccl_tune.fileio.load_json) and validate a plan file."""
    return parse_plan(fileio.load_json(path, what="plan", max_depth=PLAN_MAX_DEPTH), path)


def settings_env(environ) -> dict[str, str]:
    """The NCCL_* settings of an environment, less the NCCL_DEBUG family, sorted."""
    return {k: environ[k] for k in sorted(environ) if k.startswith("NCCL_") and k not in DEBUG_VARS}


def torch_nccl_env(environ) -> dict[str, str]:
    """The TORCH_NCCL_* variables of an environment, sorted: they change what torch's
    ProcessGroupNCCL does around every collective (timing events, trace buffers, a
    blocking wait, error handling), so a record states them as it states NCCL_*."""
    return {k: environ[k] for k in sorted(environ) if k.startswith("TORCH_NCCL_")}


_TRUE = ("1", "true", "yes", "on", "y")


def torch_env_notes(torch_env: dict[str, str], mode: str) -> list[str]:
    """Header notes on TORCH_NCCL_* values that change the measurement."""
    notes = []
    if torch_env:
        notes.append("TORCH_NCCL_* at start: " + " ".join(f"{k}={v}" for k, v in torch_env.items()))
    if torch_env.get("TORCH_NCCL_BLOCKING_WAIT", "").strip().lower() in _TRUE:
        notes.append(
            "note: TORCH_NCCL_BLOCKING_WAIT makes every wait poll on the host (eager "
            "host overhead rises)" + ("; it has been reported to hang CUDA graph capture" if mode == "graph" else "")
        )
    for name in ("TORCH_NCCL_ENABLE_TIMING", "TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_NCCL_DESYNC_DEBUG"):
        value = torch_env.get(name, "").strip().lower()
        if value and value not in ("0", "false", "no", "off", "n"):
            notes.append(f"note: {name}={torch_env[name]} adds host work to every eager collective")
    return notes


def conf_conflicts(conf_files, comm_envs: list[dict[str, str]], no_cache=()) -> list[tuple[str, str, int]]:
    """(path, name, index of the first cell setting it) for each communicator-scoped name
    a conf file sets that some of the cells (their comm_env) set and others do not.

    NCCL copies conf-file values into the C environment with setenv(name, value, 0) at
    its first call (src/misc/param.cc); Python's os.environ never sees them. A cell that
    sets such a variable replaces it, and the next cell's os.environ.pop (apply_comm_env)
    unsets it for good: a later cell without it then runs on NCCL's default, not on the
    file's value it would see in a process of its own. A name no cell sets, or every
    cell sets, is safe. `conf_files` maps path -> the names (or name: value) it sets;
    `no_cache` names (isolation nocache) are set per cell too, so they count as well.
    """
    found, seen = [], set()
    for path, names in dict(conf_files).items():
        for name in names:
            if name in seen or (settings.scope_of(name) != "communicator" and name not in no_cache):
                continue
            seen.add(name)  # the first file wins, as in NCCL
            setting = [i for i, env in enumerate(comm_envs) if name in env]
            if setting and len(setting) < len(comm_envs):
                found.append((path, name, setting[0]))
    return found


def conf_file_conflicts(conf_files: dict[str, dict[str, str]], cells: list[Cell], no_cache=()) -> str | None:
    """Why a plan's cells cannot share this process given NCCL's conf files (see
    conf_conflicts), as one line; None when they can."""
    clashes = conf_conflicts(conf_files, [c.comm_env for c in cells], no_cache)
    if not clashes:
        return None
    path, name, index = clashes[0]
    return (
        f"NCCL conf file {path} sets {name}, which cell {cells[index].cell} also sets: once "
        "that cell has run, the file's value is gone from this process for the cells that "
        "do not set it; measure these cells one per process (nccl-tune sweep --isolation "
        "process) or remove the setting from the file"
    )


def single_cell(environ) -> Cell:
    """Without a plan: one cell whose env is the process's NCCL_* settings."""
    from nccl_tune.store import cell_id

    env = settings_env(environ)
    comm = {k: v for k, v in env.items() if settings.scope_of(k) == "communicator"}
    return Cell(cell=cell_id(env), env=env, comm_env=comm)


def apply_comm_env(comm_env: dict[str, str], environ=None, no_cache=()) -> None:
    """Make os.environ hold exactly `comm_env` among the communicator-scoped variables
    (and the cached ones `no_cache` lists). os.environ assignment and pop call putenv and
    unsetenv, so NCCL's getenv sees the change at the next communicator's init."""
    environ = os.environ if environ is None else environ
    for name, setting in settings.CATALOGUE.items():
        if (setting.scope == "communicator" or name in no_cache) and name not in comm_env:
            environ.pop(name, None)
    environ.update(comm_env)


def process_env_mismatch(cell_env: dict[str, str], process_env: dict[str, str], no_cache=()) -> str | None:
    """A process-scoped variable of the cell that the process does not carry, described
    (those `no_cache` lists are set per cell, not by the launcher)."""
    for name, value in cell_env.items():
        if name in no_cache:
            continue
        if settings.scope_of(name) == "process" and process_env.get(name) != value:
            return (
                f"cell needs {name}={value} but the process has "
                f"{name}={process_env.get(name, '(unset)')}: the launcher must set it"
            )
    return None


# ---------------------------------------------------------------- what can run here


def check_backend_mode(
    backend: str, mode: str | None, verify: bool | None, *, cuda: bool, nccl: bool = True
) -> tuple[str, str]:
    """(backend, mode) resolved for a machine with (`cuda`) or without CUDA GPUs, or
    NcclTuneError for a combination no rank could run. The one rule for `nccl-tune bench`,
    `nccl-tune sweep` (before launching) and every microbench rank, so all refuse alike.

    auto backend: nccl with CUDA and a torch built with NCCL, else gloo; auto mode: graph
    on NCCL, eager otherwise. graph needs CUDA and NCCL (gloo collectives cannot be
    captured); --verify-effective needs NCCL (it reads NCCL's own log).
    """
    if backend == "auto":
        backend = "nccl" if cuda and nccl else "gloo"
    if backend == "nccl" and not (cuda and nccl):
        raise NcclTuneError(
            f"--backend nccl needs CUDA GPUs and a torch built with NCCL (torch.cuda.is_available() is {cuda})"
        )
    if mode in (None, "auto"):
        mode = "graph" if backend == "nccl" else "eager"
    if mode == "graph" and not cuda:
        raise NcclTuneError("--mode graph needs CUDA (torch.cuda.is_available() is False); use --mode eager")
    if mode == "graph" and backend != "nccl":
        raise NcclTuneError("--mode graph needs the NCCL backend (gloo collectives cannot be captured in a CUDA graph)")
    if verify and backend != "nccl":
        raise NcclTuneError(
            f"--verify-effective needs the NCCL backend (backend {backend} has "
            "no NCCL log): drop it, or use --backend nccl"
        )
    return backend, mode


def check_out(path: str | None, inputs=()) -> None:
    """NcclTuneError when `path` cannot take results (nccl_tune.fileio.check_output: the
    same file as an input such as --plan, under /proc or /sys, a folder, a missing or
    unwritable folder, a file that is not a results file, one another process is writing),
    so that nothing is measured for a file that cannot be written. Creates nothing."""
    if path:
        fileio.check_output(path, kind=fileio.OutputKind.RESULTS, inputs=inputs, option="--out")
        fileio.check_not_busy(path, option="--out")


def preflight(args: argparse.Namespace, *, cuda: bool, nccl: bool = True, writes_out: bool = True):
    """Everything about a parsed command line that can be refused before any rank starts:
    backend and mode, --verify-effective, --out (where this node writes it: node 0),
    --plan. Returns (backend, mode, plan or None); raises NcclTuneError (one line, exit 2)."""
    backend, mode = check_backend_mode(args.backend, args.mode, args.verify, cuda=cuda, nccl=nccl)
    check_out(args.out if writes_out else None, inputs=[args.plan])
    plan = load_plan(args.plan) if args.plan else None
    return backend, mode, plan


# ---------------------------------------------------------------- the command line


class _Parser(argparse.ArgumentParser):
    """argparse that raises NcclTuneError (one line, exit 2) instead of printing usage."""

    def error(self, message: str):
        raise NcclTuneError(message)


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of `python -m microbench.allreduce` (and of `nccl-tune bench`)."""
    # allow_abbrev=False: `--iter 10` is refused, as nccl-tune's (click's) options are.
    p = _Parser(
        prog=PROG,
        allow_abbrev=False,
        description="Small-message collective latency, per rank and slowest-rank, with "
        "a correctness check; run it under torchrun (`nccl-tune bench` wraps it).",
    )
    p.add_argument("--sizes", help="message sizes in bytes: 1K,14336,64K,1M (K=1024)")
    p.add_argument("--tokens", help=f"decode sizes: tokens x hidden x dtype (default {DEFAULT_TOKENS})")
    p.add_argument("--hidden", type=int, help=f"hidden size for --tokens (default {DEFAULT_HIDDEN})")
    p.add_argument("--dtype", default=DEFAULT_DTYPE, help="bf16 (default), fp16 or fp32")
    p.add_argument("--op", default="allreduce", choices=OPS, help="collective (default allreduce)")
    p.add_argument("--backend", default="auto", choices=BACKENDS, help="auto: nccl with CUDA, else gloo")
    p.add_argument(
        "--mode", default="auto", choices=MODES, help="graph (CUDA graphs; default on CUDA) or eager (default on CPU)"
    )
    p.add_argument(
        "--warmup", type=int, default=DEFAULT_WARMUP, help=f"untimed iterations first (default {DEFAULT_WARMUP})"
    )
    p.add_argument("--iters", type=int, default=DEFAULT_ITERS, help=f"timed iterations (default {DEFAULT_ITERS})")
    p.add_argument("--graph-ops", type=int, default=10, help="collectives captured per CUDA graph replay (default 10)")
    p.add_argument(
        "--ops-per-sample",
        type=int,
        default=1,
        help="eager mode: collectives run back to back per timed sample, which "
        "is then divided by them, as graph mode does per replay (default 1: "
        "one aligned collective per sample)",
    )
    p.add_argument(
        "--gap-us",
        type=float,
        default=0.0,
        help="eager mode on CPU (gloo): busy compute of this many microseconds "
        "before each collective, as a decode step has between its "
        "allreduces; each collective is then timed from the last rank's "
        "arrival until all are done, from every rank's host clock (default "
        "0: collectives back to back, slowest rank's time)",
    )
    p.add_argument(
        "--check", dest="check", action="store_true", default=True, help="check results after timing (default)"
    )
    p.add_argument("--no-check", dest="check", action="store_false")
    p.add_argument("--out", help="append one JSON record per size to this .jsonl file")
    p.add_argument("--json", action="store_true", help="print records as JSON lines on stdout instead of the table")
    p.add_argument("--label", help="free text stored in every record")
    p.add_argument(
        "--verify-effective",
        dest="verify",
        action="store_true",
        default=None,
        help="capture NCCL's own log and record what it ran (default with NCCL)",
    )
    p.add_argument("--no-verify-effective", dest="verify", action="store_false")
    p.add_argument(
        "--show-nccl-log", action="store_true", help="print the NCCL log lines captured for each cell (rank 0, stderr)"
    )
    p.add_argument(
        "--keep-nccl-log",
        metavar="DIR",
        help="move each rank's captured NCCL log folder into the existing folder "
        "DIR when the rank ends, on every exit path (default: removed)",
    )
    p.add_argument(
        "--timeout", type=float, default=300.0, help="seconds a collective may take before the run fails (default 300)"
    )
    p.add_argument("--plan", help="JSON plan of cells to measure in turn (written by nccl-tune sweep)")
    p.add_argument("--run-id", help="run id for the records (default: new, or the plan's)")
    return p


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """Parse and validate a command line; raises NcclTuneError on bad input.

    Adds `sizes_bytes` (list of int) and canonical `dtype` to the namespace.
    """
    args = build_parser().parse_args(argv)
    args.dtype = canonical_dtype(args.dtype)
    args.sizes_bytes = resolve_sizes(args.sizes, args.tokens, args.hidden, args.dtype)
    for name in ("warmup", "iters", "graph_ops", "ops_per_sample"):
        value = getattr(args, name)
        low = 0 if name == "warmup" else 1
        if not low <= value <= vocab.MAX_ITERS:
            raise NcclTuneError(f"--{name.replace('_', '-')}: {value} is not in [{low}, {vocab.MAX_ITERS}]")
    if not (math.isfinite(args.gap_us) and 0 <= args.gap_us <= vocab.MAX_SECONDS * 1e6):
        raise NcclTuneError(f"--gap-us: {args.gap_us} must be a number in [0, {vocab.MAX_SECONDS * 1e6:g}]")
    if not (math.isfinite(args.timeout) and 0 < args.timeout <= vocab.MAX_SECONDS):
        raise NcclTuneError(f"--timeout: {args.timeout} must be a number in (0, {vocab.MAX_SECONDS:g}] seconds")
    if args.verify and args.backend == "gloo":
        raise NcclTuneError("--verify-effective needs the NCCL backend (gloo has no NCCL log)")
    if args.keep_nccl_log is not None and not os.path.isdir(args.keep_nccl_log):
        raise NcclTuneError(f"--keep-nccl-log {args.keep_nccl_log}: not an existing folder")
    return args
