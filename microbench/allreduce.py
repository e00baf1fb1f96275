"""`torchrun --nproc-per-node N -m microbench.allreduce`: small-message collective latency.

Per size: warm up, time `iters` iterations on every rank (ranks aligned before each),
keep the slowest rank's time per iteration, then check the result exactly (never
timed). Rank 0 prints a header and an nccl-tests-like table and appends one record
per size to --out (DESIGN.md section 3; each record flushed as it is written).

Process groups: the default group is gloo and carries only bookkeeping (barriers,
gathering samples and error reports), so NCCL's log holds nothing but the measured
collectives. Each cell measures on a fresh group (`new_group`) whose communicator
NCCL builds at its first collective, after the cell's NCCL_PROTO / NCCL_ALGO /
NCCL_THREAD_THRESHOLDS are in os.environ; the group is destroyed after the cell.

Failures: an exception on any rank during a size is reported to every rank through the
default group; the size and the cell's remaining sizes are recorded as failed naming
the rank and cause, and a plan goes on with its next cell. Without a plan a failed or
wrong cell makes every rank exit 1. A rank that cannot reach the others, or that makes
no progress for its watchdog's time, prints one line naming itself, the operation and
the cause and exits non-zero (124 for a timeout, after rank 0 recorded it); torchrun then
stops the rest. With NCCL the watchdog fires at --timeout and the measured group's own
timeout is --timeout plus a grace: torch's watchdog ends the process with SIGABRT and no
record, after aborting the communicators under TORCH_NCCL_ASYNC_ERROR_HANDLING=1 (what
torchrun sets in its workers unless it is set: torch/distributed/elastic/agent/server/
local_elastic_agent.py) or without aborting them under torch's own default 3. So a hang
is recorded as a timeout naming the rank and the operation. A stuck NCCL collective
blocks in a device sync, not in the call (NCCL returns once it is queued), which only
the watchdog sees.
The private NCCL log folder is removed on every exit path (microbench.teardown), or
moved into --keep-nccl-log DIR.

Test hook: MICROBENCH_FAULT="RANK:raise" (an exception while measuring on that rank),
"RANK:exit" (the process dies), "RANK:wrong" (one result element corrupted); a third
field ("1:raise:CELL") limits it to one cell.
"""

from __future__ import annotations

import datetime
import json
import os
import socket
import sys
import warnings

from microbench import check, nccllib, nccllog, options, output, teardown, timing
from nccl_tune import fileio, stats, store
from nccl_tune.errors import NcclTuneError
from nccl_tune.model import costmodel
from nccl_tune.nccl import debuglog, settings

PROG = options.PROG
FAULT_VAR = "MICROBENCH_FAULT"
GRACE_S = 30.0  # between the watchdog and the process-group timeout (see timeouts())


def timeouts(backend: str, timeout: float) -> tuple[float, float]:
    """(measured group's timeout, watchdog's) in seconds for --timeout `timeout`.

    NCCL: the watchdog fires first, at `timeout`; torch's own NCCL watchdog (its
    process-group timeout, then SIGABRT: TORCH_NCCL_ASYNC_ERROR_HANDLING is 1 under
    torchrun, 3 by torch's default, and both end the process) only GRACE_S later, so
    the microbench, not SIGABRT, ends a hang and records it. gloo: a collective that
    times out raises in the caller, which is recorded as a timeout through the error
    exchange, so the group's timeout comes first and the watchdog only bounds what no
    group timeout sees.
    """
    if backend == "nccl":
        return timeout + GRACE_S, timeout
    return timeout, timeout + GRACE_S


class Fatal(Exception):
    """A failure that ends the run on this rank (the message names the cause)."""


def _say(text: str) -> None:
    # One write per line: ranks share torchrun's stderr pipe, and print's separate write of
    # the newline would let two ranks' lines interleave into one.
    sys.stderr.write(f"{PROG}: {text}\n")
    sys.stderr.flush()


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    line = f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return line if len(line) <= 300 else line[:297] + "..."


def _fault(rank: int, kind: str, cell: str | None = None) -> bool:
    """True when MICROBENCH_FAULT asks for `kind` on this rank (and cell, when it names one)."""
    parts = os.environ.get(FAULT_VAR, "").split(":", 2)
    if len(parts) < 2 or parts[0] != str(rank) or parts[1] != kind:
        return False
    return len(parts) == 2 or parts[2] == cell


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


# Task counts that schedulers and MPI launchers give each process they start. Without
# torchrun's RANK/WORLD_SIZE, every such task would measure a world of one on its own.
SCHEDULER_WORLD_VARS = (
    ("SLURM_STEP_NUM_TASKS", "SLURM_PROCID"),
    ("SLURM_NTASKS", "SLURM_PROCID"),
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("PMI_SIZE", "PMI_RANK"),
)


def scheduler_without_torchrun(environ) -> tuple[str, int, str | None] | None:
    """(variable, task count, this task's index) when a scheduler or MPI launcher started
    this process as one of several tasks but torchrun's RANK/WORLD_SIZE are unset; else None.

    Mapping those variables onto torch.distributed is not done: it needs the address of
    task 0's host (MASTER_ADDR), which SLURM gives only as a compressed node list and
    Open MPI / PMI not at all. torchrun under the scheduler does this right.
    """
    if "RANK" in environ and "WORLD_SIZE" in environ:
        return None
    for size_var, rank_var in SCHEDULER_WORLD_VARS:
        value = environ.get(size_var, "").strip()
        if value.isdigit() and int(value) > 1:
            return size_var, int(value), environ.get(rank_var)
    return None


def _standalone_env() -> None:
    """Outside torchrun: a world of one process on this host."""
    if "RANK" not in os.environ:
        os.environ.update(
            RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port())
        )


class Bench:
    """One rank's run: resolved options, process groups, log capture and output."""

    def __init__(
        self, args, plan: options.Plan | None, env_process: dict[str, str], torch_env: dict[str, str] | None = None
    ):
        import torch

        self.args, self.plan, self.env_process = args, plan, env_process
        self.torch_env = dict(torch_env or {})
        self.rank = int(os.environ["RANK"])
        self.world = int(os.environ["WORLD_SIZE"])
        self.local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        self.backend, self.mode = resolve_backend_mode(args.backend, args.mode, args.verify)
        self.verify = self.backend == "nccl" if args.verify is None else args.verify
        if args.gap_us and self.backend != "gloo":
            raise NcclTuneError(
                "--gap-us times collectives by host stamps, which only gloo on "
                "CPU completes on the host; on GPUs use --mode graph"
            )
        self.torch_dtype = getattr(torch, options.DTYPES[args.dtype][0])
        self.elem, self.max_exact = options.DTYPES[args.dtype][1:]
        self.device = torch.device("cuda", self.local_rank) if self.backend == "nccl" else torch.device("cpu")
        self.run_id = args.run_id or (plan.run_id if plan and plan.run_id else None) or store.new_run_id()
        self.capture = nccllog.NcclLogCapture(keep_in=args.keep_nccl_log) if self.verify else None
        if self.capture:
            teardown.add(self.capture.cleanup)
        self.nccl_build = nccllib.build_version(torch) if self.backend == "nccl" else None
        self.nccl_loaded: dict | None = None
        self.log_version: str | None = None  # NCCL's "NCCL version" line, once seen
        self.sleep_rate: float | None = None  # highest GPU cycles per us of torch.cuda._sleep seen
        self.last_timing: dict = {}
        self.quiet_ok: bool | None = None
        self.failed_or_wrong = False
        self.current: dict = {}
        self.conf_files: dict | None = None  # set in start(), from every rank
        self.no_cache_seen: set[str] = set()  # NCCL said it stopped caching these (nocache plans)
        self.env_at_init: dict | None = None
        # The bookkeeping group waits longer than a measured collective may take, so a rank
        # stuck in a collective times out there first and still joins the error exchange.
        # The watchdog bounds what no process-group timeout sees (a hung graph replay or
        # device sync): no heartbeat for --timeout plus a grace ends the rank.
        self.group_timeout, watchdog_s = timeouts(self.backend, args.timeout)
        self.control_timeout = 2 * self.group_timeout + 10
        self.watchdog = timing.Watchdog(watchdog_s, self._expired)

    # ---------------------------------------------------------------- set-up

    def start(self) -> None:
        """Log capture (before any NCCL init), device, default gloo group, host facts."""
        import torch
        import torch.distributed as dist

        if self.backend == "nccl":
            self.nccl_loaded = nccllib.loaded_library()
        if self.capture:
            # Looking ncclResetDebugInit up initialises nothing. Without it, eager timing
            # could not switch NCCL's per-collective lines off: leave them off throughout.
            self.capture.install(per_collective=self.mode != "eager" or self.capture.probe())
        if self.world == 1 and self.rank == 0:
            _say(f"note: {options.WORLD_ONE_NOTE}")
        if self.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            # Clocks up first: a rate measured on an idle GPU is several times too low.
            timing.warm_up(timing.START_WARMUP_S)
            self.sleep_rate = timing.measure_sleep_rate()
        self.watchdog.start()
        self.watchdog.beat("joining the process group")
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=self.control_timeout))
        gpu = torch.cuda.get_device_name(self.local_rank) if self.backend == "nccl" else None
        facts = [None] * self.world
        dist.all_gather_object(facts, (socket.gethostname(), gpu, nccl_conf_files(os.environ)))
        self.hosts = [f[0] for f in facts]
        self.gpus = [f[1] for f in facts] if self.backend == "nccl" else None
        self.nnodes = len(set(self.hosts))
        if self.args.gap_us and self.nnodes > 1:
            raise NcclTuneError(
                "--gap-us compares every rank's host clock, so every rank must "
                f"run on one host (these run on {self.nnodes})"
            )
        self.conf_files = merge_conf_files([(f[0], f[2]) for f in facts])
        # Only NCCL reads the conf files: gloo cells cannot lose what NCCL never set.
        clash = (
            options.conf_file_conflicts(self.conf_files, self.cells(), self.plan.no_cache if self.plan else ())
            if self.backend == "nccl"
            else None
        )
        if clash:
            raise NcclTuneError(clash)
        self.versions = {"torch": torch.__version__, "cuda": torch.version.cuda, "nccl": None}
        if self.backend == "nccl":
            self.versions.update(nccllib.version_record(self.nccl_build, self.nccl_loaded, None))

    def header_info(self) -> dict:
        """What header_lines prints."""
        a = self.args
        if not self.verify:
            note = "off" + (" (gloo has no NCCL log)" if self.backend == "gloo" else "")
        else:
            subsys = nccllog.LOUD_SUBSYS if self.capture.per_collective else nccllog.QUIET_SUBSYS
            note = f"on: NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS={subsys} into {self.capture.directory}"
            if self.capture.probe():
                note += "; timed iterations run with per-collective lines off (ncclResetDebugInit)"
            elif self.mode == "eager":
                note += (
                    "; this NCCL lacks ncclResetDebugInit, so per-collective lines stay off "
                    "to keep timed eager runs free of NCCL's logging: algorithm/protocol "
                    "cannot be confirmed"
                )
        notes = []
        for name, value in self.capture.previous.items() if self.capture else ():
            if value is not None:
                notes.append(f"note: your {name}={value} is replaced while verifying")
        if self.backend == "nccl":
            v = self.versions
            notes.append(
                f"libnccl: {v.get('nccl_library') or '(not found)'} ncclGetVersion "
                f"{v.get('nccl_library_version') or '-'}; torch built with {v.get('nccl_build') or '-'}"
            )
        if self.versions.get("nccl_note"):
            notes.append(f"note: NCCL versions differ: {self.versions['nccl_note']}")
        if self.backend == "nccl":
            notes.append(
                "timing: "
                + timing.TIMING_METHODS[timing.timing_method("cuda")]
                + (
                    ""
                    if self.sleep_rate
                    else " (no torch.cuda._sleep here: without the head start, host launch latency can be inside)"
                )
            )
        notes += options.torch_env_notes(self.torch_env, self.mode)
        return {
            "run_id": self.run_id,
            "world_size": self.world,
            "nnodes": self.nnodes,
            "hosts": self.hosts,
            "backend": self.backend,
            "mode": self.mode,
            "op": a.op,
            "dtype": a.dtype,
            "warmup": a.warmup,
            "iters": a.iters,
            "graph_ops": a.graph_ops,
            "ops_per_sample": a.ops_per_sample,
            "gap_us": a.gap_us,
            "versions": self.versions,
            "env_process": self.env_process,
            "torch_env": self.torch_env,
            "conf_files": output.read_conf_files(os.environ),
            "gpus": self.gpus,
            "verify_note": note,
            "notes": notes,
        }

    # ---------------------------------------------------------------- bookkeeping

    def _expired(self, what: str, seconds: float) -> None:
        message = expiry_message(self.rank, self.args.op, what, seconds, self.backend, self.nccl_warnings())
        if self.rank == 0 and self.current.get("cell") is not None and self.args.out:
            try:
                store.append_record(
                    self.args.out,
                    self._record(self.current["cell"], self.current["bytes"], status="timeout", error=message),
                )
            except Exception:
                pass
        _say(message)
        teardown.exit_now(124)

    def nccl_warnings(self, snapshot: dict | None = None) -> list[str]:
        """NCCL WARN messages this process's NCCL wrote to a file (ours since `snapshot`,
        or the user's NCCL_DEBUG_FILE): NCCL sends them there instead of stderr."""
        if self.capture:
            if snapshot is not None:
                return nccllog.warn_messages(self.capture.read_since(snapshot))
            return self.capture.warnings()
        return nccllog.user_debug_file_warnings() if self.backend == "nccl" else []

    def barrier(self) -> None:
        """Meet every rank on the default (gloo) group."""
        import torch.distributed as dist

        dist.barrier()

    def exchange_errors(self, error: str | None) -> list[tuple[int, str]]:
        """Every rank's error of this step (rank, message), same list on all ranks."""
        import torch.distributed as dist

        self.watchdog.beat("exchanging status with the other ranks")
        found = [None] * self.world
        try:
            dist.all_gather_object(found, error)
        except Exception as exc:
            cause = _first_line(exc)
            if "closed by peer" in cause or "Connection reset" in cause:
                cause = "a peer closed its connection: another rank probably died"
            raise Fatal(f"lost contact with the other ranks ({cause})") from None
        errors = [(r, e) for r, e in enumerate(found) if e]
        # Root causes first: a rank that timed out waiting for a failed one is a consequence.
        return sorted(errors, key=lambda item: ("timed out" in item[1].lower(), item[0]))

    def gather_samples(self, samples: list[float], wrong: int) -> tuple[list[float], int]:
        """Slowest rank per iteration (with --gap-us: from the last rank's arrival, out of
        every rank's host stamps), and #wrong summed over ranks."""
        import torch
        import torch.distributed as dist

        local = torch.tensor([float(wrong)] + list(samples), dtype=torch.float64)
        table = [torch.empty_like(local) for _ in range(self.world)]
        dist.all_gather(table, local)
        rows = [t.tolist() for t in table]
        wrong_total = int(sum(r[0] for r in rows))
        if self.args.gap_us:
            return timing.last_arrival_us([r[1:] for r in rows], self.args.ops_per_sample), wrong_total
        return stats.slowest_rank([r[1:] for r in rows]), wrong_total

    # ---------------------------------------------------------------- records

    def _record(self, cell: options.Cell, nbytes: int, **fields) -> dict:
        a = self.args
        extra = dict(cell.extra)
        return store.make_record(
            run_id=self.run_id,
            cell=cell.cell,
            env=cell.env,
            backend=self.backend,
            op=a.op,
            mode=self.mode,
            world_size=self.world,
            nnodes=self.nnodes,
            bytes=nbytes,
            count=nbytes // self.elem,
            dtype=a.dtype,
            iters=cell.iters or a.iters,
            warmup=cell.warmup if cell.warmup is not None else a.warmup,
            graph_ops=a.graph_ops if self.mode == "graph" else None,
            ops_per_sample=a.ops_per_sample if self.mode != "graph" else a.graph_ops,
            gap_us=a.gap_us or None,
            versions=self._versions(),
            gpus=self.gpus,
            round=cell.round,
            label=a.label,
            env_process=self.env_process,
            hosts=sorted(set(self.hosts)),
            conf_files=self.conf_files,
            torch_nccl_env=self.torch_env,
            timing_method=timing.timing_method(self.device.type, a.gap_us),
            **extra,
            **fields,
        )

    def _versions(self) -> dict:
        if self.backend != "nccl" or not self.log_version:
            return dict(self.versions)
        return {**self.versions, **nccllib.version_record(self.nccl_build, self.nccl_loaded, self.log_version)}

    def emit(self, record: dict) -> None:
        """Rank 0: append to --out (flushed), print the row or the JSON line."""
        if self.rank != 0:
            return
        if self.args.out:
            store.append_record(self.args.out, record)
        if self.args.json:
            print(json.dumps(record, default=str), flush=True)
        else:
            print(output.row(record), flush=True)

    # ---------------------------------------------------------------- measuring

    def cells(self) -> list[options.Cell]:
        """The plan's cells, or the one cell of the process environment."""
        return self.plan.cells if self.plan else [options.single_cell(self.env_process)]

    def run(self) -> int:
        """Measure every cell; returns the exit code."""
        import torch.distributed as dist

        if self.rank == 0:
            stream = sys.stderr if self.args.json else sys.stdout
            print("\n".join(output.header_lines(self.header_info())), file=stream, flush=True)
        for cell in self.cells():
            self.run_cell(cell)
        self.watchdog.beat("finishing")
        self.barrier()
        dist.destroy_process_group()
        self.watchdog.stop()
        if self.capture:
            self.capture.cleanup()
        return 1 if self.failed_or_wrong and not self.plan else 0

    def run_cell(self, cell: options.Cell) -> None:
        """Fresh group under the cell's settings, every size measured and recorded."""
        import torch.distributed as dist

        no_cache = self.plan.no_cache if self.plan else ()
        if self.plan:
            options.apply_comm_env(cell.comm_env, no_cache=no_cache)
        if self.rank == 0 and not self.args.json:
            print("\n".join(output.cell_lines(cell.cell, cell.env, cell.round, bool(self.plan))), flush=True)
        mismatch = options.process_env_mismatch(cell.env, self.env_process, no_cache)
        snapshot = self.capture.snapshot() if self.capture else None
        # What this process's environment holds for the per-cell variables as the cell's
        # communicator is made (recorded under nocache plans: the mechanics, also on gloo).
        watched = {*no_cache, *cell.comm_env, *(n for n, s in settings.CATALOGUE.items() if s.scope == "communicator")}
        self.env_at_init = {n: os.environ.get(n) for n in sorted(watched)} if no_cache else None
        self.watchdog.beat(f"creating the process group of cell {cell.cell}")
        group = dist.new_group(backend=self.backend, timeout=datetime.timedelta(seconds=self.group_timeout))
        sizes = self.args.sizes_bytes
        for index, requested in enumerate(sizes):
            self.current = {"cell": cell, "bytes": requested}
            error, result = mismatch, None
            if error is None:
                try:
                    result = self.measure(group, requested, cell)
                except Fatal:
                    raise
                except Exception as exc:
                    error = with_warnings(_first_line(exc), self.nccl_warnings(snapshot))
            errors = self.exchange_errors(error)
            if errors:
                text = "; ".join(f"rank {r}: {e}" for r, e in errors[:4])
                if len(errors) > 4:
                    text += f"; and {len(errors) - 4} more rank(s)"
                self.failed_or_wrong = True
                status = "timeout" if all("timed out" in e.lower() for _, e in errors) else "failed"
                for nbytes in sizes[index:]:
                    self.emit(self._record(cell, nbytes, status=status, error=text, effective=None, correct=None))
                if self.rank == 0 and not self.plan:
                    _say(f"cell {cell.cell} failed at {requested} bytes: {text}")
                break
            samples, nbytes, wrong = result
            samples, wrong = self.gather_samples(samples, wrong if wrong is not None else 0)
            if self.rank == 0:
                self.emit(self.size_record(cell, nbytes, samples, wrong, snapshot))
        self.current = {}
        self.watchdog.beat(f"destroying the process group of cell {cell.cell}")
        self.barrier()
        dist.destroy_process_group(group)
        if self.rank == 0 and self.capture and self.args.show_nccl_log:
            for name, line in self.capture.read_since(snapshot, with_files=True):
                print(f"# nccl-log {cell.cell} {name}: {line}", file=sys.stderr)

    def size_record(self, cell, nbytes: int, samples: list[float], wrong: int, snapshot) -> dict:
        """The record of one measured size (rank 0)."""
        lat = stats.summarize(samples)
        p50 = lat["p50"]
        algbw = nbytes / (p50 * 1e-6) / 1e9 if p50 else None
        busbw = algbw * costmodel.bus_factor(self.args.op, self.world) if algbw is not None else None
        checked = self.args.check
        effective = None
        if self.capture:
            observed = debuglog.summarize_log(debuglog.parse_log(self.capture.read_since(snapshot)))
            self.log_version = observed.get("version") or self.log_version
            effective = debuglog.confirm_effective(cell.env, observed, self.args.op, nbytes, self.world)
            effective = self._confirm_no_cache(cell, observed, effective)
            if effective is not None and not self.capture.per_collective:
                effective["detail"] += (
                    "; per-collective lines were off for the whole run (this "
                    "NCCL lacks ncclResetDebugInit, and they would have been "
                    "written inside the timed eager runs)"
                )
            if effective is not None and self.world == 1:
                effective["detail"] += (
                    "; world size 1: NCCL runs no algorithm (ncclLaunchOneRank "
                    "copies or does nothing), so nothing can be confirmed"
                )
        status = "ok"
        if checked and wrong:
            status = "wrong"
            self.failed_or_wrong = True
            if not self.plan:
                _say(f"cell {cell.cell}: {wrong} wrong element(s) at {nbytes} bytes")
        nocache_fields = (
            {"env_at_init": self.env_at_init, "no_cache": list(self.plan.no_cache)}
            if self.env_at_init is not None
            else {}
        )
        return self._record(
            cell,
            nbytes,
            **nocache_fields,
            lat_us=lat,
            samples_us=samples,
            algbw_gbps=algbw,
            busbw_gbps=busbw,
            correct=(wrong == 0) if checked else None,
            wrong=wrong if checked else None,
            effective=effective,
            status=status,
            timing=dict(self.last_timing) or None,
            nccl_log=self._log_state(),
        )

    def _log_state(self) -> dict | None:
        """Which of NCCL's log controls applied (None when the log is not captured)."""
        if not self.capture:
            return None
        available = self.capture.probe()
        return {
            "reset_debug_init": available,
            "note": nccllib.reset_debug_init_note(available, self.versions.get("nccl")),
            "per_collective_lines": (
                "off during timed iterations"
                if available
                else "on throughout (graph replays log nothing)"
                if self.capture.per_collective
                else "off throughout"
            ),
        }

    def _confirm_no_cache(self, cell, observed: dict, effective: dict | None) -> dict | None:
        """Under isolation nocache: add whether NCCL re-read the plan's cached variables
        with this cell's values (`effective.reread`), and fold it into `confirmed`."""
        names = self.plan.no_cache if self.plan else ()
        if not names:
            return effective
        self.no_cache_seen.update(observed.get("no_cache") or [])
        if not set(names) <= self.no_cache_seen:  # logged once per process: look back
            whole = debuglog.summarize_log(debuglog.parse_log(self.capture.read_since({})))
            self.no_cache_seen.update(whole.get("no_cache") or [])
        reread = debuglog.confirm_reread(cell.env, observed, names, self.no_cache_seen)
        listed = [n for n in os.environ.get("NCCL_NO_CACHE", "").split(",") if n]
        if reread is not None and not set(names) <= set(listed) and "ALL" not in listed:
            reread = {
                "confirmed": False,
                "detail": f"NCCL_NO_CACHE={','.join(listed) or '(unset)'} "
                f"in this process lacks {', '.join(names)}; " + reread["detail"],
            }
        if effective is None or reread is None:
            return effective
        flags = (effective.get("confirmed"), reread["confirmed"])
        effective["confirmed"] = False if False in flags else (True if flags == (True, True) else None)
        effective["detail"] += "; " + reread["detail"]
        effective["reread"] = reread
        return effective

    def _buffers(self, count: int, copies: int):
        import torch

        n_in = check.input_length(self.args.op, count, self.world)
        n_out = check.output_length(self.args.op, count, self.world)
        pairs = []
        for _ in range(copies):
            inp = torch.zeros(n_in, dtype=self.torch_dtype, device=self.device)
            out = inp if self.args.op == "allreduce" else torch.zeros(n_out, dtype=self.torch_dtype, device=self.device)
            pairs.append((inp, out))
        return pairs

    def _op(self, group, inp, out):
        import torch.distributed as dist

        op = self.args.op
        if op == "allreduce":
            return lambda: dist.all_reduce(out, group=group)
        if op == "reduce_scatter":
            fn = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
        else:
            fn = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
        return lambda: fn(out, inp, group=group)

    def _device_align(self, group, call):
        """On CUDA: the DeviceAlign of this size (an untimed one-element allreduce of
        `group`, then a head start sized from the host time of one `call`); else None.
        Sets `last_timing`, what the size's record says about the alignment."""
        import torch
        import torch.distributed as dist

        self.last_timing = {}
        if self.device.type != "cuda":
            return None
        tiny = torch.zeros(1, dtype=torch.float32, device=self.device)
        pre = lambda: dist.all_reduce(tiny, group=group)  # noqa: E731
        pre()
        torch.cuda.synchronize()
        host_us = timing.host_time_us(call)  # enqueue only: nothing waits on the host
        torch.cuda.synchronize()
        # One head start for every rank (the slowest host's): ranks whose waits differed
        # would leave them apart again, which is what the alignment is for.
        slowest = torch.tensor([host_us], dtype=torch.float64)
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # the default (gloo) group, on the host
        # The rate again, right before the loop and under load; the wait is sized with the
        # highest rate seen, so clocks rising up to it cannot shorten the wait, and the
        # record says what the samples really got (describe() after the loop).
        timing.warm_up(timing.LOOP_WARMUP_S)
        now = timing.measure_sleep_rate()
        if now and (self.sleep_rate is None or now > self.sleep_rate):
            self.sleep_rate = now
        device_align = timing.DeviceAlign(
            pre, timing.head_start_us(slowest.item()), self.sleep_rate, rate_before_loop=now
        )
        self.last_timing.update(
            host_enqueue_us=round(host_us, 2),
            host_enqueue_slowest_us=round(slowest.item(), 2),
            **device_align.describe(),
        )
        return device_align

    def _align(self):
        import torch

        if self.device.type == "cuda":

            def align():
                torch.cuda.synchronize()
                self.barrier()

            return align
        return self.barrier

    def measure(self, group, requested: int, cell) -> tuple[list[float], int, int | None]:
        """Time one size on this rank and check it: (samples_us, bytes, wrong or None)."""
        a = self.args
        iters = cell.iters or a.iters
        warmup = cell.warmup if cell.warmup is not None else a.warmup
        count = requested // self.elem
        if a.op != "allreduce":
            count = count // self.world * self.world  # whole elements per rank, as nccl-tests
            if count == 0:
                raise NcclTuneError(f"{requested} bytes is less than one {a.dtype} element per rank")
        nbytes = count * self.elem
        copies = a.graph_ops if self.mode == "graph" else 1
        pairs = self._buffers(count, copies)
        ops = [self._op(group, i, o) for i, o in pairs]
        beat = self.watchdog.beat
        beat(f"measuring {nbytes} bytes in cell {cell.cell}")
        if _fault(self.rank, "raise", cell.cell):
            raise RuntimeError("injected fault (MICROBENCH_FAULT)")
        if _fault(self.rank, "exit", cell.cell):
            os._exit(3)
        align = self._align()
        graph = None
        if self.mode == "graph":
            graph = timing.capture_graph(ops)  # runs each op once first: the log's burst
            for _ in range(warmup):
                graph.replay()
        else:
            # At least one untimed call: the communicator is built there, and its log lines
            # (the short burst that --verify-effective reads) are written outside timing.
            for _ in range(max(warmup, 1)):
                ops[0]()
        quiet = self.capture.quiet() if self.capture else False
        if self.capture:
            self.quiet_ok = quiet
        try:
            device_align = self._device_align(group, graph.replay if graph else ops[0])
            if graph is not None:
                samples = timing.cuda_graph(graph, copies, align, iters, beat, device_align)
            elif a.gap_us:  # stamps, turned into latencies across ranks in gather_samples
                samples = timing.cpu_gapped(ops[0], align, iters, beat, a.ops_per_sample, a.gap_us * 1e-6)
            elif self.device.type == "cuda":
                samples = timing.cuda_eager(ops[0], align, iters, beat, a.ops_per_sample, device_align)
            else:
                samples = timing.cpu_eager(ops[0], align, iters, beat, a.ops_per_sample)
            if device_align is not None:  # what the samples really got, not what was asked
                self.last_timing.update(device_align.describe())
        finally:
            if quiet:
                self.capture.loud()
        wrong = self.check(pairs, count, graph, ops, cell.cell) if a.check else None
        return samples, nbytes, wrong

    def check(self, pairs, count: int, graph, ops, cell: str) -> int:
        """Fill per-rank inputs, run once (replay in graph mode), count wrong elements."""
        import torch

        a = self.args
        values = check.input_values(a.op, self.rank, self.world, count, self.max_exact)
        source = torch.from_numpy(values).to(self.torch_dtype).to(self.device)
        for inp, out in pairs:
            if out is not inp:
                out.zero_()
            inp.copy_(source)
        if graph is not None:
            graph.replay()
        else:
            for op in ops:
                op()
        if self.device.type == "cuda":
            torch.cuda.synchronize()
        if _fault(self.rank, "wrong", cell):
            pairs[0][1].view(-1)[0] += 1
        expected = check.expected_values(a.op, self.rank, self.world, count, self.max_exact)
        return sum(check.count_wrong(out.float().cpu().numpy(), expected) for _, out in pairs)


def nccl_conf_files(environ) -> dict[str, dict[str, str]]:
    """The NCCL conf files this process's NCCL could read, path -> the NCCL_* they set.

    NCCL takes any variable the environment does not set from them (DESIGN.md 5), so
    every record says which exist: a setting may come from there, not from the cell.
    """
    return {
        path: {k: v for k, v in values.items() if k.startswith("NCCL_")}
        for path, values in output.read_conf_files(environ).items()
    }


def merge_conf_files(per_rank: list[tuple[str, dict]]) -> dict[str, dict[str, str]]:
    """One mapping for the record: the ranks' conf files when all ranks see the same,
    else every host's, keyed 'host:path' (another node's file is not this node's)."""
    distinct = {json.dumps(conf, sort_keys=True) for _, conf in per_rank}
    if len(distinct) <= 1:
        return dict(per_rank[0][1]) if per_rank else {}
    merged: dict[str, dict[str, str]] = {}
    for host, conf in per_rank:
        for path, values in conf.items():
            merged[f"{host}:{path}"] = dict(values)
    return merged


def resolve_backend_mode(backend: str, mode: str, verify: bool | None = None) -> tuple[str, str]:
    """auto -> nccl with CUDA (else gloo); auto mode -> graph on CUDA, eager on CPU
    (options.check_backend_mode is the rule; this asks torch what the machine has)."""
    import torch
    import torch.distributed as dist

    return options.check_backend_mode(
        backend, mode, verify, cuda=torch.cuda.is_available(), nccl=dist.is_nccl_available()
    )


def main(argv: list[str] | None = None) -> int:
    """Entry point of every rank; returns the process exit code."""
    rank = int(os.environ.get("RANK", "0"))
    launched = "RANK" in os.environ  # under torchrun (a standalone run gets RANK below)
    scheduled = scheduler_without_torchrun(os.environ)
    if scheduled:
        variable, tasks, task = scheduled
        if task in (None, "0"):  # one line, not one per task
            _say(
                f"error: started as one of {tasks} tasks ({variable}={tasks}) without torchrun's "
                "RANK/WORLD_SIZE, so each task would measure a world of 1 alone; start torchrun "
                "under the scheduler, one per node: srun --ntasks-per-node 1 python -m "
                "torch.distributed.run --nnodes N --nproc-per-node G --rdzv-backend c10d "
                f"--rdzv-endpoint HOST:PORT -m {PROG} ..."
            )
        return 2
    try:
        args = options.parse_args(argv)
        plan = options.load_plan(args.plan) if args.plan else None
        options.check_out(args.out if rank == 0 else None, inputs=[args.plan])  # rank 0 writes --out
        env_process = options.settings_env(os.environ)  # before any instrumentation
        torch_env = options.torch_nccl_env(os.environ)
        warnings.filterwarnings("ignore", category=FutureWarning, module="torch.distributed")
        _standalone_env()
        bench = Bench(args, plan, env_process, torch_env)
    except NcclTuneError as exc:
        # Under torchrun every rank says it, naming itself: torchrun may stop the others as
        # soon as one exits, so no single rank can be relied on to be the one that speaks.
        _say((f"rank {rank}: " if launched else "") + f"error: {exc}")
        return 2
    teardown.install()  # the log folder goes on every exit path, signals included
    lock = None
    try:
        if rank == 0 and args.out:  # the one writer of --out for the whole run (nccl_tune.fileio)
            lock = fileio.ResultsLock(args.out, option="--out").acquire()
        bench.start()
        code = bench.run()
        if lock is not None:
            lock.release()
        return code
    except NcclTuneError as exc:
        _say(f"rank {bench.rank}: error: {exc}")
        code = 2
    except Fatal as exc:
        _say(f"rank {bench.rank}: {exc}")
        code = 1
    except KeyboardInterrupt:
        _say(f"rank {bench.rank}: interrupted")
        code = 130
    except Exception as exc:
        # NCCL's WARN lines went to its debug file, not to this output: the launcher sees
        # them only here, in the line that names the rank.
        _say(f"rank {bench.rank}: failed: " + with_warnings(_first_line(exc), bench.nccl_warnings()))
        code = 1
    if lock is not None:
        lock.release()  # before the hard exit: a file it created and never wrote goes
    teardown.exit_now(code)  # clean up, then skip teardown that could hang on a broken group
    return code


def with_warnings(error: str, warns: list[str], keep: int = 2) -> str:
    """`error` followed by the last `keep` distinct NCCL WARN messages, if any."""
    recent = list(dict.fromkeys(reversed(warns)))[:keep][::-1]
    if not recent:
        return error
    text = "; ".join(w if len(w) <= 200 else w[:197] + "..." for w in recent)
    return f"{error} [NCCL WARN: {text}]"


def expiry_message(rank: int, op: str, what: str, seconds: float, backend: str, warns: list[str] | None = None) -> str:
    """The watchdog's line: rank, operation, what it was doing, and why it is a timeout."""
    where = (
        (" (an NCCL collective that never completes blocks in a device sync: NCCL returns once the call is queued)")
        if backend == "nccl"
        else ""
    )
    return with_warnings(
        f"rank {rank}: timeout: {op} made no progress for {seconds:.0f} s while {what}{where}", warns or []
    )


if __name__ == "__main__":
    sys.exit(main())
