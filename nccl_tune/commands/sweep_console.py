"""`nccl-tune sweep`'s progress while it runs: the short plan and warnings, then cells
done, failures and ETA on stderr (a bar on a terminal, one line per cell otherwise)."""

from __future__ import annotations

import sys
import time

import click

from nccl_tune.commands.sweep_render import print_plan_short
from nccl_tune.measure.sweep_request import SweepPlan
from nccl_tune.measure.sweep_run import RunStart


class Console:
    """A run as it goes: the short plan and warnings (text mode), then cells done,
    failures and ETA on stderr: a bar on a terminal, one line per cell otherwise."""

    def __init__(self, plan: SweepPlan, as_json: bool):
        self.plan, self.as_json = plan, as_json
        self.total, self.done, self.failed = None, 0, 0
        self.start_time = time.monotonic()
        self.bar = None

    def start(self, begin: RunStart) -> None:
        """Before the first measurement: what runs, and what was already recorded."""
        if not self.as_json:
            print_plan_short(self.plan, begin.already_recorded)
        for message in begin.warnings:
            click.echo(f"warning: {message}", err=True)
        # total None: a strategy whose measurements depend on the data (descent)
        self.total, self.start_time = begin.todo, time.monotonic()
        if sys.stderr.isatty() and not self.as_json and self.total:
            self.bar = click.progressbar(
                length=self.total,
                label="measuring",
                show_eta=True,
                file=sys.stderr,
                item_show_func=lambda _: f"{self.failed} failed",
            )
            self.bar.__enter__()

    def warning(self, message: str) -> None:
        """A warning during the run (one line on stderr, above the bar)."""
        click.echo(f"warning: {message}", err=True)

    def cell(self, request, status: str) -> None:
        """One cell (for one round) finished with `status`."""
        self.done += 1
        self.failed += status != "ok"
        if self.bar is not None:
            self.bar.update(1)
            return
        elapsed = time.monotonic() - self.start_time
        if self.total is None:
            click.echo(
                f"[{self.done}] round {request.round} {request.cell.label}: {status} "
                f"({self.failed} failed, {elapsed:.0f} s)",
                err=True,
            )
            return
        eta = elapsed / self.done * max(0, self.total - self.done)
        click.echo(
            f"[{self.done}/{self.total}] round {request.round} {request.cell.label}: {status} "
            f"({self.failed} failed, ETA {eta:.0f} s)",
            err=True,
        )

    def close(self) -> None:
        """End the bar (a no-op for line output)."""
        if self.bar is not None:
            self.bar.__exit__(None, None, None)
