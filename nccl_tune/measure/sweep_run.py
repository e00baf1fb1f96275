"""Run a sweep's plan: `run_sweep(plan) -> SweepSummary`.

The run checks --out (required, writable, not another command's file, --no-resume
refusing an existing one), holds the results file's lock (node 0 only: a follower node
writes nothing), builds the sweep engine (nccl_tune.measure.sweep) with the sim
landscape or the launcher, runs the chosen search strategy (nccl_tune.measure.search)
and says what happened. Ctrl-C or SIGTERM during the run kills the running launch and
returns a summary marked interrupted; every finished cell is in the file. Whether the
run failed (nothing comparable was measured) is the summary's `failure`: the command
turns it, and an interruption, into its exit code (nccl_tune.errors).
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure import search
from nccl_tune.measure import sweep as sweeplib
from nccl_tune.measure.sweep_request import SweepPlan


@dataclass(frozen=True)
class RunStart:
    """What a run knows before its first measurement."""

    already_recorded: int  # (cell, round) pairs in --out before: skipped (resume)
    todo: int | None  # cell measurements still planned; None when the data decide (descent)
    warnings: tuple[str, ...]  # the engine's, from reading --out


@dataclass(frozen=True)
class SweepSummary:
    """What a sweep did: `to_dict()` is the `sweep --json` object."""

    plan: SweepPlan
    run_id: str
    already_recorded: int
    interrupted: bool
    stats: sweeplib.SweepStats
    outcome: search.Outcome | None  # None when interrupted before the strategy returned
    measurements_spent: float
    failure: str | None = None  # why nothing could be compared (exit 1), else None

    @property
    def notes(self) -> list[str]:
        """The plan's notes, then the decisions the engine took on its own."""
        return list(self.plan.notes) + list(self.stats.notes)

    @property
    def unfinished_env(self) -> dict[str, dict[str, str]]:
        """cell id -> settings, for the cells still in the race when the search stopped."""
        if self.outcome is None:
            return {}
        envs = {cell.id: cell.env for cell in self.plan.grid.cells}
        return {c: envs[c] for c in self.outcome.unfinished}

    def to_dict(self) -> dict:
        """JSON-ready form (the `sweep --json` object)."""
        plan = self.plan
        return {
            "backend": plan.backend,
            "simulated": plan.simulated,
            "out": plan.request.out,
            "rounds": plan.rounds,
            "isolation": plan.isolation,
            "run_id": self.run_id,
            "cells": len(plan.grid.cells),
            "dropped": len(plan.grid.dropped),
            "already_recorded": self.already_recorded,
            "interrupted": self.interrupted,
            **self.stats.to_dict(),
            "notes": self.notes,
            "search": (
                {**self.outcome.to_dict(), "unfinished_env": self.unfinished_env}
                if self.outcome
                else {"strategy": plan.strategy}
            ),
            "measurements_spent": round(self.measurements_spent, 1),
            "budget": plan.request.budget,
        }


def check_out(plan: SweepPlan) -> str:
    """--out, checked before anything runs: given, a results file the inputs are not, and
    not an existing file when --no-resume says not to continue it."""
    request = plan.request
    out = request.out
    if not out:
        raise NcclTuneError("--out FILE is required (results are appended there, one record per line)")
    grid_file = [request.grid] if request.grid and os.path.exists(request.grid) else []
    fileio.check_output(out, kind=fileio.OutputKind.RESULTS, inputs=[request.model] + grid_file, option="--out")
    if os.path.exists(out) and request.resume is False:
        raise NcclTuneError(f"--out {out} exists: pass --resume to continue it, or choose another file")
    return out


def run_sweep(
    plan: SweepPlan,
    *,
    on_start: Callable[[RunStart], None] | None = None,
    on_cell: Callable[[sweeplib.Request, str], None] | None = None,
    on_warning: Callable[[str], None] | None = None,
) -> SweepSummary:
    """Measure `plan` into its --out file and summarise. `on_start` hears what is already
    recorded and what is left before the first measurement (with the warnings so far);
    `on_cell` each (cell, round) as it finishes, with its status; `on_warning` every
    warning the engine gives after that (a rank's line that is not a record, say)."""
    out = check_out(plan)
    # One writer for the whole run (fileio); a follower node of a multi-node sweep writes
    # nothing (node 0 does) and may share the file's folder with it.
    lock = fileio.ResultsLock(out, option="--out") if plan.writes_records else None
    with lock or contextlib.nullcontext():
        return _run(plan, out, on_start, on_cell, on_warning)


def _engine(plan: SweepPlan, out: str, warn: Callable[[str], None]) -> sweeplib.SweepEngine:
    """The engine for `plan`: the sim landscape or the launcher, and the launch timeout
    (--timeout, else 120 s + 30 s per cell in the launch)."""
    from nccl_tune.measure import simbackend

    request = plan.request
    landscape = (
        simbackend.make_landscape(request.sim_landscape, plan.grid.topology, request.seed, model=plan.sim_model)
        if plan.simulated
        else None
    )
    timeout = request.timeout
    return sweeplib.SweepEngine(
        plan.options,
        plan.launcher,
        out,
        isolation=plan.isolation,
        timeout=timeout if timeout else 120.0,
        timeout_per_cell=0.0 if timeout else 30.0,
        landscape=landscape,
        keep_env=tuple(request.keep_env),
        module=request.module,
        warn=warn,
        strategy=plan.strategy,
        grid=plan.grid.cells,
    )


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _run(plan: SweepPlan, out: str, on_start, on_cell, on_warning) -> SweepSummary:
    warnings: list[str] = []
    started = False

    def warn(message: str) -> None:  # held until on_start, then passed on as they come
        if started and on_warning is not None:
            on_warning(message)
        else:
            warnings.append(message)

    engine = _engine(plan, out, warn)
    done_before = len(engine.recorded_requests())
    planned = plan.planned_requests()
    todo = max(0, planned - done_before) if planned is not None else None
    if on_start is not None:
        on_start(RunStart(done_before, todo, tuple(warnings)))
    started = True
    engine.on_cell = on_cell
    interrupted = False
    # SIGTERM as Ctrl-C: the engine kills the running launch, the summary is still given
    previous = signal.signal(signal.SIGTERM, _raise_interrupt)
    ledger = search.Ledger(len(plan.options.sizes), plan.options.full_iters, plan.request.budget)
    outcome = None
    try:
        outcome = search.run_strategy(
            plan.strategy,
            plan.grid.cells,
            engine.measure,
            ledger,
            plan.rounds,
            plan.request.seed,
            engine.isolation,
            axes=plan.axes,
        )
    except (KeyboardInterrupt, sweeplib.SweepInterrupted):
        interrupted = True
    finally:
        signal.signal(signal.SIGTERM, previous)
    failure = sweeplib.run_failure(outcome.records) if outcome and plan.writes_records else None
    return SweepSummary(
        plan=plan,
        run_id=engine.run_id,
        already_recorded=done_before,
        interrupted=interrupted,
        stats=engine.stats,
        outcome=outcome,
        measurements_spent=ledger.spent,
        failure=failure,
    )
