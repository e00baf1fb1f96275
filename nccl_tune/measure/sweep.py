"""The sweep engine: measure cells through a launcher, grouped by process scope.

`SweepEngine.measure(requests)` is the one entry point strategies use (exhaustive
rounds here; successive halving or coordinate descent on top): "measure these cells at
these iterations for this round" -> their records, each (cell, round, size, rung)
recorded exactly once in the results file, already-recorded ones reused on resume.

How a batch runs (DESIGN.md sections 4-5):

- Requests are grouped by their process-scoped settings; one launch measures a whole
  group, each cell with a fresh communicator (process group) created after its
  communicator-scoped settings are set (the microbench's --plan). `isolation="process"`
  gives every cell a launch of its own. `isolation="nocache"` (NCCL 2.29.7+) groups only
  by what stays process-wide under NCCL_NO_CACHE (grid.split_env): the launch sets
  NCCL_NO_CACHE to the cached variables its cells set, and each cell sets those per
  communicator like the communicator-scoped ones; NCCL's log must then show each cell's
  values read (effective.reread). When no launch ever shows one re-read, the engine
  falls back to group.
- On NCCL, a cell that shared its process must be confirmed by NCCL's own log (the
  record's `effective.confirmed`); one that is not (older NCCL, or a contradiction) is
  re-run alone, and its shared-process records are kept as `superseded` (final: false).
  When the log confirms no cell at all (an NCCL without per-collective lines), the
  engine switches to one launch per cell. Records say which isolation produced them. On gloo nothing can be confirmed, and
  NCCL settings do not affect gloo at all: grouping there only tests the mechanics.
- Each launch has a timeout; a timed-out or crashed launch is killed with everything it
  started, the cell it was measuring is recorded as timeout/failed with the last lines
  of output, and the cells it had not reached are launched again.
- Ctrl-C kills the running launch; every cell already complete is in the file.
- Resume: a (cell, round, rung) already recorded is not measured again, unless its
  records say failed or timeout (a crash, a hang, a machine that went away): those are
  measured again, and their old records are kept, marked `superseded: true, final:
  false` (`retried_by`: the run id) by a marker line appended to the file
  (store.supersede: the file is never rewritten). `wrong` is a result, never retried.
- Identity: every record carries its sweep's identity (`sweep`: backend, op, dtype,
  sizes, world, mode, iterations, the grid's hash, and for sim the topology, landscape,
  seed and model; sweepplan.sweep_identity). Resuming into a file that holds another
  sweep's records is refused, naming what differs, before anything is measured.
- One writer: run_sweep (nccl_tune.measure.sweep_run) holds the results file's exclusive lock for the whole
  run (nccl_tune.fileio.ResultsLock), so a second sweep to the same file is refused.
- The `sim` backend draws records from nccl_tune.measure.simbackend instead of launching.

Options, sizes, the launch environment, round orders and estimates live in
nccl_tune.measure.sweepplan (re-exported here); launchers and process trees in nccl_tune.measure.launch.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from nccl_tune import fileio, store
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import launch as launching
from nccl_tune.measure.grid import Cell, no_cache_names
from nccl_tune.measure.sweepplan import (  # noqa: F401 - re-exported: the sweep's public names
    BACKENDS,
    CONTROLLED_PREFIXES,
    GLOO_NOTE,
    ISOLATION_CHOICES,
    ISOLATIONS,
    MODULE,
    MeasureOptions,
    canonical_dtype,
    conf_cell_conflicts,
    conf_files,
    count_launches,
    estimate_seconds,
    identity_differences,
    launch_environment,
    launches_by_isolation,
    planned_nccl_version,
    resolve_isolation,
    resolve_sizes,
    round_order,
    sweep_identity,
)


@dataclass(frozen=True)
class Request:
    """One cell to measure for one round (and, for search strategies, one rung)."""

    cell: Cell
    round: int
    iters: int | None = None
    warmup: int | None = None
    extra: dict = field(default_factory=dict)  # merged into records: strategy, rung, final


@dataclass
class SweepStats:
    """What a sweep did."""

    launches: int = 0
    relaunches: int = 0  # launches of the cells a failed launch had not reached
    reruns: int = 0  # process-isolated re-runs of unconfirmed cells
    cells_measured: int = 0
    cells_reused: int = 0  # already in the results file (resume)
    retried: int = 0  # recorded as failed/timeout before, measured again (resume)
    failures: dict = field(default_factory=dict)  # status -> count of cells
    records_written: int = 0
    wall_s: float = 0.0
    notes: list = field(default_factory=list)  # decisions the engine took on its own

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return dict(self.__dict__)


def run_failure(records: list[dict]) -> str | None:
    """Why a finished sweep compared nothing, in words, or None when it did.

    Every cell failed (no record ok and correct), or the baseline did in every round:
    then no cell can be compared with NCCL's defaults, so the command exits 1
    (nccl_tune.errors.RunFailed) after printing its summary. Superseded records (a cell
    re-run alone, or measured again on resume) do not count.
    """
    live = [r for r in records if not r.get("superseded")]
    if not live:
        return None

    def ok(record: dict) -> bool:
        return (record.get("status") or "ok") == "ok" and record.get("correct") is not False

    if not any(ok(r) for r in live):
        statuses = sorted({str(r.get("status") or "ok") for r in live})
        return f"every cell failed ({', '.join(statuses)}): nothing was measured"
    baseline = [r for r in live if (r.get("cell") or store.BASELINE) == store.BASELINE]
    if baseline and not any(ok(r) for r in baseline):
        statuses = sorted({str(r.get("status") or "ok") for r in baseline})
        return (
            f"the baseline (NCCL defaults) failed in every round ({', '.join(statuses)}): "
            "no cell can be compared with it"
        )
    return None


def _shown_sizes(sizes) -> str:
    return ",".join(map(str, sizes))


class SweepInterrupted(Exception):
    """Ctrl-C during a sweep: the running launch was killed, finished records kept."""


# ---------------------------------------------------------------- the engine


def _key(cell: str, round_, rung, nbytes) -> tuple:
    return (cell, round_, rung, nbytes)


RETRIED_STATUSES = ("failed", "timeout")  # measured again on resume; `wrong` is a result


class SweepEngine:
    """Measures batches of requests and appends their records to one results file."""

    def __init__(
        self,
        options: MeasureOptions,
        launcher: launching.Launcher | None,
        out: str,
        *,
        run_id: str | None = None,
        isolation: str = "group",
        timeout: float | None = None,
        timeout_per_cell: float = 0.0,
        landscape=None,
        module: str = MODULE,
        keep_env: tuple[str, ...] = (),
        base_env: dict[str, str] | None = None,
        strategy: str = "exhaustive",
        on_cell: Callable[[Request, str], None] | None = None,
        warn: Callable[[str], None] | None = None,
        grid: list[Cell] | None = None,
    ):
        if isolation not in ISOLATIONS:
            raise NcclTuneError(f"--isolation: '{isolation}' is not one of {', '.join(ISOLATIONS)}")
        if options.backend == "sim" and landscape is None:
            raise NcclTuneError("the sim backend needs a landscape")
        if options.backend != "sim" and launcher is None:
            raise NcclTuneError(f"the {options.backend} backend needs a launcher")
        self.options, self.launcher, self.out = options, launcher, out
        self.run_id = run_id or store.new_run_id()
        self.isolation, self.timeout, self.landscape = isolation, timeout, landscape
        self.timeout_per_cell = timeout_per_cell
        self.module, self.keep_env, self.base_env = module, tuple(keep_env), base_env
        self.strategy = strategy  # records of another strategy in the same file are not reused
        self.on_cell, self.warn = on_cell, warn or (lambda message: None)
        self.stats = SweepStats()
        self.work_dir = out + ".work"
        self._launch_no = 0
        self._recorded: dict[tuple, dict] = {}
        self._lines: dict[tuple, list[tuple]] = {}  # (cell, round, rung) -> its records' store.record_key
        self._retry: set[tuple] = set()  # recorded as failed/timeout: measure again
        # Where this sweep's ranks ran (rank 0's records say): stamped on the records the
        # engine writes itself for cells a launch did not finish, so the report lists a
        # failure beside the cells measured on the same machine.
        self._machine: dict = {}
        common = {k: v for k, v in (base_env or os.environ).items() if k in self.keep_env}
        self.identity = sweep_identity(
            options,
            world_size=self._world(),
            nnodes=launcher.nnodes if launcher else 1,
            cells=grid,
            landscape=landscape,
            common_env=common,
        )
        self._load_existing()

    # -- the results file

    def _world(self) -> int | None:
        """The world size this sweep's ranks form, when known before they run."""
        if self.launcher is None:
            return 2 if self.options.backend == "sim" else None
        return None if self.launcher.template else self.launcher.world_size

    def _matches(self, record: dict) -> bool:
        """A record this sweep would have written: same backend, op, strategy and (when
        known) world. Records without a strategy come from exhaustive sweeps."""
        world = self._world()
        return (
            record.get("backend") == self.options.backend
            and (record.get("strategy") or "exhaustive") == self.strategy
            and (record.get("op") or "allreduce") == self.options.op
            and (world is None or record.get("world_size") in (None, world))
            and not record.get("superseded")
        )

    def _identity_problem(self, record: dict) -> list[str]:
        """How the sweep that wrote `record` differs from this one (empty: the same).

        Records carry the identity of their sweep (`sweep`); records written before that
        (or by another command) are compared on what they carry, when of this backend."""
        there = record.get("sweep")
        if isinstance(there, dict):
            return identity_differences(there, self.identity)
        if record.get("backend") != self.options.backend or record.get("round") is None:
            return []  # another backend or not a sweep's record: not this sweep's, ignored
        here = self.identity
        legacy = {
            k: record.get(k)
            for k in ("op", "dtype", "world_size", "nnodes")
            if record.get(k) is not None and here.get(k) is not None
        }
        if "topology" in here and isinstance(record.get("topology"), str):
            legacy["topology"] = record["topology"]
        problems = identity_differences(legacy, here)
        if record.get("bytes") is not None and record["bytes"] not in self.options.sizes:
            problems.append(f"size {record['bytes']} there, sizes {_shown_sizes(self.options.sizes)} here")
        return problems

    def _load_existing(self) -> None:
        if not os.path.exists(self.out):
            return
        for number, record in store.iter_numbered_records(self.out, self.warn):
            problems = self._identity_problem(record)
            if problems:
                raise NcclTuneError(
                    f"holds the records of another sweep ({'; '.join(problems)}, line {number}): "
                    "resume only the same sweep (same grid, sizes and options), or choose another "
                    "--out",
                    path=self.out,
                )
            if self._matches(record):
                key = _key(record.get("cell"), record.get("round"), record.get("rung"), record.get("bytes"))
                self._recorded.setdefault(key, record)
                self._lines.setdefault(key[:3], []).append(store.record_key(record))
                if record.get("status") in RETRIED_STATUSES:
                    self._retry.add(key[:3])
        if self._retry:
            self.warn(
                f"{self.out}: {len(self._retry)} recorded (cell, round) pair(s) failed or timed "
                "out: measured again when the sweep reaches them (the old records are kept, "
                "marked superseded)"
            )

    def recorded_requests(self) -> set[tuple]:
        """(cell, round, rung) of every request with a record in the file (resume), less
        those recorded as failed or timeout (they are measured again)."""
        return {key[:3] for key in self._recorded} - self._retry

    def existing(self, request: Request) -> list[dict] | None:
        """The request's records already in the file (every size), or None (measure it).

        None too when they say failed or timeout: those are measured again on resume.
        """
        rung = request.extra.get("rung")
        if (request.cell.id, request.round, rung) in self._retry:
            return None
        found = [self._recorded.get(_key(request.cell.id, request.round, rung, b)) for b in self.options.sizes]
        return found if all(found) else None

    def _supersede(self, requests: list[Request]) -> None:
        """Mark the failed/timeout records of `requests` superseded before measuring them again."""
        pairs = [self._req_key(r) for r in requests if self._req_key(r) in self._retry]
        if not pairs or (
            self.launcher is not None and not self.launcher.writes_records and self.options.backend != "sim"
        ):
            return
        keys = [k for pair in pairs for k in self._lines.get(pair, [])]
        store.supersede(self.out, keys, retried_by=self.run_id)
        for pair in pairs:
            self._retry.discard(pair)
            self._lines.pop(pair, None)
            for key in [k for k in self._recorded if k[:3] == pair]:
                del self._recorded[key]
        self.stats.retried += len(pairs)

    def _write(self, records: list[dict]) -> list[dict]:
        if self.launcher is not None and not self.launcher.writes_records and self.options.backend != "sim":
            return []  # a follower node of a multi-node sweep: node 0 keeps the records
        written = []
        for record in records:
            key = _key(record.get("cell"), record.get("round"), record.get("rung"), record.get("bytes"))
            if not record.get("superseded"):
                if key in self._recorded:
                    continue  # exactly once: a size recorded before an interruption
                self._recorded[key] = record
            record["sweep"] = self.identity
            store.append_record(self.out, record)
            self.stats.records_written += 1
            written.append(record)
        return written

    # -- the public entry point

    def measure(self, requests: list[Request]) -> list[dict]:
        """Measure `requests` (grouped by process scope) and return their final records.

        Requests already recorded (resume) are not measured again; their records are
        returned as found. Raises SweepInterrupted on Ctrl-C after keeping every
        finished cell.
        """
        start = time.monotonic()
        results: dict[tuple, list[dict]] = {}
        todo: list[Request] = []
        for request in requests:
            found = self.existing(request)
            if found is not None:
                results[(request.cell.id, request.round, request.extra.get("rung"))] = found
                self.stats.cells_reused += 1
            else:
                todo.append(request)
        self._supersede(todo)
        try:
            while todo:  # batched again after each batch: the isolation may have changed
                batch, *rest = self._batches(todo)
                todo = [r for later in rest for r in later]
                for req_key, records in self._run_batch(batch).items():
                    results[req_key] = records
        finally:
            self.stats.wall_s += time.monotonic() - start
        out = []
        for request in requests:
            out.extend(results.get((request.cell.id, request.round, request.extra.get("rung")), []))
        return out

    def _batches(self, requests: list[Request]) -> list[list[Request]]:
        if self.isolation == "process":
            return [[r] for r in requests]
        groups: dict[tuple, list[Request]] = {}
        for request in requests:
            resident = request.cell.split(self.isolation)[0]
            groups.setdefault(tuple(sorted(resident.items())), []).append(request)
        batches = []
        for batch in groups.values():
            batch.sort(key=lambda r: bool(self._per_comm(r)))  # see grid.group_cells
            batches.append(batch)
        return batches

    def _per_comm(self, request: Request) -> dict[str, str]:
        """The request's settings applied per communicator under the current isolation."""
        return request.cell.split(self.isolation)[1]

    def _launch_isolation(self, launch_size: int) -> str:
        """What a record of a launch of `launch_size` cells says measured it."""
        return "process" if launch_size == 1 else self.isolation

    # -- one batch: launches until every request is accounted for

    def _run_batch(self, batch: list[Request]) -> dict[tuple, list[dict]]:
        results: dict[tuple, list[dict]] = {}
        pending, idle_failures, reruns = list(batch), 0, []
        while pending:
            if len(self._batches(pending)) > 1:  # the isolation changed under this batch
                for sub in self._batches(pending):
                    results.update(self._run_batch(sub))
                break
            by_key = {self._req_key(r): r for r in pending}
            launch_size, finished, confirmations, rereads = len(pending), set(), [], []
            shared_isolation = self._launch_isolation(launch_size)

            def on_complete(key: tuple, records: list[dict]) -> None:
                request = by_key.get(key)
                if request is None or key in finished:
                    return  # records of a cell this launch was not asked for
                finished.add(key)
                self._note_machine(records)
                if self._shared_comm_cell(request, launch_size):
                    confirmations.extend(
                        (r.get("effective") or {}).get("confirmed") for r in records if r.get("status") == "ok"
                    )
                    rereads.extend(
                        ((r.get("effective") or {}).get("reread") or {}).get("confirmed")
                        for r in records
                        if r.get("status") == "ok" and (r.get("effective") or {}).get("reread") is not None
                    )
                if self._needs_rerun(request, records, launch_size):
                    why = _unconfirmed_reason(records)
                    for record in records:
                        record.update(
                            superseded=True,
                            final=False,
                            note=f"not confirmed by NCCL's log in a shared process "
                            f"(isolation {self._launch_isolation(launch_size)}): "
                            f"{why}; re-run alone",
                        )
                    self._write(records)
                    reruns.append((request, why))
                else:
                    results[key] = self._finish(request, records)

            outcome, partial = self._launch(pending, on_complete)
            self._adapt_isolation(confirmations, rereads, shared_isolation)
            remaining = [r for r in pending if self._req_key(r) not in finished]
            if outcome.status == "interrupted":
                raise SweepInterrupted(f"interrupted; every finished cell is in {self.out}")
            if not remaining:
                break
            if outcome.status == "ok":  # ended cleanly without some cells: record why
                for request in remaining:
                    results[self._req_key(request)] = self._fail(
                        request,
                        partial.get(self._req_key(request), []),
                        "failed",
                        "the launch ended without records for this cell; " + outcome.error_text(),
                        launch_size,
                    )
                break
            # The microbench measures cells in plan order: the first unfinished one was
            # running when the launch died; the ones after it were never reached.
            culprit, pending = remaining[0], remaining[1:]
            results[self._req_key(culprit)] = self._fail(
                culprit, partial.get(self._req_key(culprit), []), outcome.status, outcome.error_text(), launch_size
            )
            idle_failures = 0 if finished else idle_failures + 1
            if idle_failures >= 2 and pending:
                for request in pending:
                    results[self._req_key(request)] = self._fail(
                        request,
                        [],
                        "failed",
                        "not measured: two launches in a row failed before measuring anything; " + outcome.error_text(),
                        launch_size,
                    )
                break
            if pending:
                self.stats.relaunches += 1
        for request, why in reruns:
            self.stats.reruns += 1
            alone = Request(
                request.cell,
                request.round,
                request.iters,
                request.warmup,
                {**request.extra, "rerun": f"unconfirmed in a shared process (isolation {shared_isolation}): {why}"},
            )
            results.update(self._run_batch([alone]))
        return results

    @staticmethod
    def _req_key(request: Request) -> tuple:
        return (request.cell.id, request.round, request.extra.get("rung"))

    def _shared_comm_cell(self, request: Request, launch_size: int) -> bool:
        """An NCCL cell with per-communicator settings that shared its process (under
        nocache its confirmation covers the listed cached variables it leaves unset too)."""
        if self.options.backend != "nccl" or launch_size <= 1:
            return False
        # The one cell with nothing set per communicator runs first in its launch (see
        # grid.group_cells): nothing was set before it, so it is clean by construction.
        return bool(self._per_comm(request))

    def _needs_rerun(self, request: Request, records: list[dict], launch_size: int) -> bool:
        """True for an NCCL cell that shared its process and NCCL's log did not confirm."""
        if not self._shared_comm_cell(request, launch_size):
            return False
        ok = [r for r in records if r.get("status") == "ok"]
        return any((r.get("effective") or {}).get("confirmed") is not True for r in ok)

    def _adapt_isolation(self, confirmations: list, rereads: list | None = None, shared: str | None = None) -> None:
        """When NCCL's log can confirm nothing (an NCCL without per-collective lines, or
        no log), every shared cell would be re-run alone: launch one per cell from now on.
        Under nocache, when no cell's cached values were seen re-read (an NCCL that
        ignores NCCL_NO_CACHE), fall back to group for the rest of the sweep."""
        if (
            self.isolation == "nocache"
            and shared == "nocache"
            and rereads
            and not any(flag is True for flag in rereads)
        ):
            self.isolation = "group"
            self.stats.notes.append(
                "NCCL's log showed no cached variable re-read under NCCL_NO_CACHE (an NCCL "
                "before 2.29.7, or an env plugin that caches): isolation switched to group for "
                "the rest of the sweep"
            )
            return
        if self.isolation in ("group", "nocache") and confirmations and all(flag is None for flag in confirmations):
            self.isolation = "process"
            self.stats.notes.append(
                "NCCL's log confirmed no cell of a shared launch (no per-collective lines in this "
                "NCCL, or no log): isolation switched to process for the rest of the sweep"
            )

    def _finish(self, request: Request, records: list[dict]) -> list[dict]:
        written = self._write(records)
        status = next((s for s in ("wrong", "timeout", "failed") if any(r.get("status") == s for r in records)), "ok")
        if status != "ok":
            self.stats.failures[status] = self.stats.failures.get(status, 0) + 1
        self.stats.cells_measured += 1
        if self.on_cell:
            self.on_cell(request, status)
        return written or records

    def _fail(self, request: Request, partial: list[dict], status: str, error: str, launch_size: int = 1) -> list[dict]:
        """Records for a cell a launch did not finish: what it measured + `status` for the rest."""
        have = {r.get("bytes") for r in partial}
        filler = [
            self._record(request, nbytes, launch_size, status=status, error=error, correct=None)
            for nbytes in self.options.sizes
            if nbytes not in have
        ]
        return self._finish(request, partial + filler)

    def _note_machine(self, records: list[dict]) -> None:
        for record in records:
            if record.get("status") == "ok" and record.get("host"):
                self._machine = {
                    k: record.get(k) for k in ("host", "hosts", "gpus", "mode") if record.get(k) is not None
                }

    def _record(self, request: Request, nbytes: int, launch_size: int = 1, **fields) -> dict:
        world = self.launcher.world_size if self.launcher else None
        machine = dict(self._machine)
        machine.setdefault("mode", self.options.mode)  # the mode the ranks resolved, once known
        return store.make_record(
            run_id=self.run_id,
            cell=request.cell.id,
            env=dict(request.cell.env),
            backend=self.options.backend,
            op=self.options.op,
            **machine,
            world_size=world,
            nnodes=self.launcher.nnodes if self.launcher else None,
            bytes=nbytes,
            dtype=self.options.dtype,
            iters=request.iters or self.options.iters,
            round=request.round,
            **self._extra(request, launch_size),
            **fields,
        )

    def _extra(self, request: Request, launch_size: int) -> dict:
        extra = {"isolation": self._launch_isolation(launch_size)}
        if self.options.label is not None:
            extra["label"] = self.options.label
        if self.keep_env:
            extra["common_env"] = {k: v for k, v in (self.base_env or os.environ).items() if k in self.keep_env}
        extra.update(request.extra)
        return extra

    # -- one launch

    def _launch(self, requests: list[Request], on_complete: Callable[[tuple, list[dict]], None]):
        """Run one launch for `requests`, reporting each cell as it completes.

        Returns (outcome, partial records of the cells that did not complete).
        """
        self._launch_no += 1
        self.stats.launches += 1
        if self.options.backend == "sim":
            return self._launch_sim(requests, on_complete)
        try:
            os.makedirs(self.work_dir, exist_ok=True)
        except OSError as exc:
            raise NcclTuneError(f"cannot create the work folder: {exc.strerror}", path=self.work_dir) from None
        stem = os.path.join(self.work_dir, f"{self.run_id}-n{self.launcher.node_rank}-launch{self._launch_no:04d}")
        plan_path, records_path, log_path = stem + ".plan.json", stem + ".records.jsonl", stem + ".log"
        # A launch of one cell gets every process-scoped value from the launcher, as under
        # process isolation: nothing there needs to change inside the process.
        split = self.isolation if len(requests) > 1 else "group"
        no_cache = no_cache_names([r.cell for r in requests]) if split == "nocache" else ()
        plan = {
            "run_id": self.run_id,
            "cells": [
                {
                    "cell": r.cell.id,
                    "env": dict(r.cell.env),
                    "comm_env": r.cell.split(split)[1],
                    "round": r.round,
                    "iters": r.iters,
                    "warmup": r.warmup,
                    "extra": self._extra(r, len(requests)),
                }
                for r in requests
            ],
        }
        if no_cache:
            plan["no_cache"] = list(no_cache)
        fileio.write_atomic(plan_path, json.dumps(plan, indent=1))  # all of it or none (a full disk)
        process_env = dict(requests[0].cell.split(split)[0])
        if no_cache:  # read once per process by NCCL: it must be there from the start
            process_env["NCCL_NO_CACHE"] = ",".join(no_cache)
        env, _ = launch_environment(process_env, self.keep_env, self.base_env)
        argv = self.launcher.argv(self.module, self.options.microbench_args(plan_path, records_path), process_env)
        reader = _RecordReader(records_path, self.warn)
        completed: set[tuple] = set()

        def poll() -> None:
            for record in map(self._check_world, reader.read_new()):
                key = (record.get("cell"), record.get("round"), record.get("rung"))
                reader.by_cell.setdefault(key, []).append(record)
                if key not in completed and self._complete(reader.by_cell[key]):
                    completed.add(key)
                    on_complete(key, self._expand(reader.by_cell[key]))

        limit = self.timeout + self.timeout_per_cell * len(requests) if self.timeout else None
        outcome = launching.run_launch(argv, env, log_path, limit, poll)
        if not self.launcher.writes_records and outcome.status == "ok":
            for request in requests:  # a follower node: rank 0 writes on node 0
                on_complete(self._req_key(request), [])
        partial = {k: v for k, v in reader.by_cell.items() if k not in completed}
        keep_log = outcome.status != "ok" or len(completed) < len(requests)
        for path in (records_path,) if keep_log else (plan_path, records_path, log_path):
            _remove(path)
        _remove_dir(self.work_dir)
        return outcome, partial

    def _check_world(self, record: dict) -> dict:
        """A record measured in another world than the launcher starts becomes failed (a
        launcher that started ranks without torchrun measures worlds of one, say)."""
        expected = self.launcher.expected_world if self.launcher else None
        world = record.get("world_size")
        if expected is None or world is None or world == expected or record.get("status") in ("failed", "timeout"):
            return record
        return {
            **record,
            "status": "failed",
            "correct": None,
            "error": (
                f"world size mismatch: the ranks formed a world of {world}, but the launcher starts "
                f"{expected} ({self.launcher.nproc} per node x {self.launcher.nnodes} node(s)); the "
                "measurement does not describe the intended world"
            ),
        }

    def _complete(self, records: list[dict]) -> bool:
        sizes = {r.get("bytes") for r in records}
        return set(self.options.sizes) <= sizes or None in sizes

    def _expand(self, records: list[dict]) -> list[dict]:
        """A cell-level failure record (bytes null) becomes one record per missing size."""
        whole = [r for r in records if r.get("bytes") is None]
        sized = [r for r in records if r.get("bytes") is not None]
        if not whole:
            return sized
        have = {r["bytes"] for r in sized}
        return sized + [{**whole[0], "bytes": b} for b in self.options.sizes if b not in have]

    def _launch_sim(self, requests: list[Request], on_complete):
        from nccl_tune.measure import simbackend

        world = self.launcher.world_size if self.launcher else 2
        for request in requests:
            on_complete(
                self._req_key(request),
                simbackend.measure_cell(
                    self.landscape,
                    run_id=self.run_id,
                    env=dict(request.cell.env),
                    op=self.options.op,
                    sizes=list(self.options.sizes),
                    nranks=world,
                    nnodes=self.launcher.nnodes if self.launcher else 1,
                    iters=request.iters or self.options.full_iters,
                    dtype=self.options.dtype,
                    mode=self.options.mode or "graph",
                    round_=request.round,
                    launch=str(self._launch_no),
                    extra=self._extra(request, len(requests)),
                ),
            )
        return launching.LaunchOutcome("ok", 0, 0.0, [], ""), {}


def _unconfirmed_reason(records: list[dict]) -> str:
    """Why NCCL's log did not confirm a cell, from its records' `effective`, in one short phrase."""
    for record in records:
        effective = record.get("effective")
        if record.get("status") != "ok" or (effective or {}).get("confirmed") is True:
            continue
        if not effective:
            return "no NCCL log"
        reread = effective.get("reread") or {}
        detail = (
            (reread.get("detail") if reread.get("confirmed") is not True else None)
            or effective.get("detail")
            or "no detail"
        )
        kind = "contradicted" if effective.get("confirmed") is False else "not seen"
        return f"{kind}: {detail[:240]}"
    return "not confirmed"


class _RecordReader:
    """Reads the records a running launch appends, complete lines only."""

    def __init__(self, path: str, warn: Callable[[str], None]):
        self.path, self.warn, self.offset, self.line = path, warn, 0, 0
        self.by_cell: dict[tuple, list[dict]] = {}

    def read_new(self) -> list[dict]:
        """Records appended since the last call."""
        try:
            with open(self.path, "rb") as handle:
                handle.seek(self.offset)
                data = handle.read()
        except OSError:
            return []
        end = data.rfind(b"\n")
        if end < 0:
            return []
        self.offset += end + 1
        out = []
        for raw in data[:end].decode(errors="replace").splitlines():
            self.line += 1
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError:
                self.warn(f"{self.path}:{self.line}: skipped: not JSON")
                continue
            if isinstance(record, dict):
                out.append(record)
        return out


def _remove(path: str) -> None:
    try:
        os.remove(path)
    except OSError:
        pass


def _remove_dir(path: str) -> None:
    try:
        os.rmdir(path)  # only when empty: failed launches keep their logs
    except OSError:
        pass


# ---------------------------------------------------------------- rounds


def run_rounds(engine: SweepEngine, cells: list[Cell], rounds: int, seed: int, extra: dict | None = None) -> list[dict]:
    """Every cell in every round (1..rounds), baseline included, each round in a fresh
    random order. (The CLI runs strategies through nccl_tune.measure.search, whose exhaustive
    strategy does the same and tags its records with strategy and rung.)"""
    records = []
    for round_ in range(1, rounds + 1):
        order = round_order(cells, round_, seed, engine.isolation)
        records += engine.measure([Request(c, round_, extra=dict(extra or {})) for c in order])
    return records
