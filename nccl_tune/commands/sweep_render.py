"""What `nccl-tune sweep` prints: the plan (--dry-run), the short plan and progress of a
run, and its summary. Text only; `--json` prints the plan's or summary's `to_dict()`."""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune import stats
from nccl_tune.measure.sweep_request import SweepPlan
from nccl_tune.measure.sweep_run import SweepSummary

MAX_DROPPED_LISTED = 20
MAX_UNFINISHED_LISTED = 8


def scope(plan: SweepPlan) -> str:
    """What will run, in words: cells, rounds or rungs, process groups, launches."""
    cells, rounds, groups = len(plan.grid.cells), plan.rounds, len(plan.groups)
    if plan.strategy == "halving":
        rungs = plan.halving_rungs
        return (
            f"{cells} cells, search halving in {len(rungs)} rungs (final: {rungs[-1].cells} "
            f"cells x {rounds} rounds), {groups} process groups, at most {plan.launches} launches"
        )
    if plan.strategy == "descent":
        return (
            f"{cells} cells, search descent ({rounds} final rounds), {groups} process groups, "
            "launches depend on the data (each batch grouped by process scope)"
        )
    return f"{cells} cells x {rounds} rounds, {groups} process groups, {plan.launches} launches"


def _simulated(plan: SweepPlan) -> str:
    return " (simulated)" if plan.simulated else ""


def _print_launches(plan: SweepPlan) -> None:
    """Launches under each isolation, and what each launch of the chosen one sets itself."""
    click.echo(f"\nLaunches for {plan.rounds} round(s) under each isolation (exhaustive, no failures or re-runs):")
    for name, count in plan.launches_by_isolation.items():
        mark = "  <- --isolation" if name == plan.isolation else ""
        click.echo(f"  {name:<8} {count:6d}{mark}")
    if plan.isolation == "nocache":
        for index, grp in enumerate(plan.groups, start=1):
            shown = " ".join(f"{k}={v}" for k, v in grp.launch_env.items()) or "(nothing)"
            click.echo(f"  g{index}: {len(grp.cells)} cells, launch sets {shown}")


def _print_dropped(plan: SweepPlan) -> None:
    dropped = plan.grid.dropped
    if dropped and len(dropped) <= MAX_DROPPED_LISTED:
        click.echo(f"\nDropped before running ({len(dropped)}):")
        click.echo(tabulate([[d.label, d.kind, d.reason] for d in dropped], headers=["settings", "why", "reason"]))
    elif dropped:
        by_reason: dict[str, list] = {}
        for d in dropped:
            by_reason.setdefault(d.reason, []).append(d)
        click.echo(f"\nDropped before running ({len(dropped)}, by reason; --json lists every cell):")
        for reason, cells in sorted(by_reason.items(), key=lambda item: -len(item[1])):
            click.echo(f"  {len(cells):4d} x {reason}")


def _print_costs(plan: SweepPlan) -> None:
    """What each strategy would spend, and the time estimate."""
    click.echo(
        "\nMeasurements each strategy would spend (one = a cell at one size for one round "
        "at full iterations; descent is an upper estimate):"
    )
    full = plan.measurements.get("exhaustive") or 1
    for name, spend in plan.measurements.items():
        mark = "  <- --search" if name == plan.strategy else ""
        click.echo(f"  {name:<10} {spend:8.1f}  ({100 * spend / full:.0f}% of exhaustive){mark}")
    if plan.halving_rungs:
        click.echo(
            "  halving rungs: "
            + ", ".join(
                f"{r.cells} cells x {r.iters} iters x {r.rounds} round(s)" + (" (final)" if r.final else "")
                for r in plan.halving_rungs
            )
        )
    budget = plan.request.budget
    if budget is not None:
        click.echo(f"  --budget {budget:g}: the search stops before a batch that would exceed it")
    minutes = plan.estimate_s / 60
    share = plan.measurements.get(plan.strategy, full) / full
    scaled = "" if plan.strategy == "exhaustive" else (f"; {plan.strategy} measures about {100 * share:.0f}% of that")
    click.echo(
        f"\nEstimated time: about {minutes:.1f} min exhaustive{scaled} (rough: launch "
        "start-up, communicator creation and iterations; failures and re-runs extra)"
    )


def print_plan(plan: SweepPlan) -> None:
    """The --dry-run text: scope, notes, cells by launch, launches, drops, costs, time."""
    click.echo(
        f"Plan: {scope(plan)} "
        f"(isolation {plan.isolation}), sizes {', '.join(map(str, plan.options.sizes))} B, "
        f"{plan.options.op}, backend {plan.backend}" + _simulated(plan)
    )
    for note in plan.notes:
        click.echo(f"  note: {note}")
    group_of = {cell.id: f"g{index}" for index, grp in enumerate(plan.groups, start=1) for cell in grp.cells}
    rows = [[group_of.get(c.id, "-"), c.id, c.label, "; ".join(c.notes)] for c in plan.grid.cells]
    click.echo(tabulate(rows, headers=["launch", "cell", "settings", "notes"]))
    _print_launches(plan)
    _print_dropped(plan)
    _print_costs(plan)


def print_plan_short(plan: SweepPlan, done_before: int) -> None:
    """The lines a run starts with: scope, notes, drops, what a resume skips."""
    dropped = plan.grid.dropped
    click.echo(
        f"Sweep: {scope(plan)}, {len(dropped)} dropped "
        f"(isolation {plan.isolation}), backend {plan.backend}" + _simulated(plan) + f" -> {plan.request.out}"
    )
    for note in plan.notes:
        click.echo(f"  note: {note}")
    for d in dropped[:MAX_DROPPED_LISTED]:
        click.echo(f"  dropped: {d.label}: {d.reason}")
    if len(dropped) > MAX_DROPPED_LISTED:
        click.echo(f"  dropped: {len(dropped) - MAX_DROPPED_LISTED} more (--dry-run lists them by reason)")
    if done_before:
        click.echo(f"  resuming: {done_before} (cell, round) pairs already recorded are skipped")


def _print_search(s: SweepSummary) -> None:
    found, plan = s.outcome, s.plan
    budget = plan.request.budget
    spent = f"{round(s.measurements_spent, 1):g} measurements" + (
        f" of a {budget:g} budget" if budget is not None else ""
    )
    click.echo(f"search {found.strategy if found else plan.strategy}: {spent}")
    if found is None:
        return
    if found.strategy != "exhaustive" and len(found.rungs) > 1:
        click.echo(
            "  rungs: "
            + "; ".join(
                f"{r.rung}: {r.cells} cells x {r.iters} iters x {r.rounds} round(s)" + (" final" if r.final else "")
                for r in found.rungs
            )
        )
    if found.stopped:
        click.echo(f"  stopped early: {found.stopped}")
    if found.unfinished:
        envs = s.unfinished_env
        labels = [
            " ".join(f"{k[5:]}={v}" for k, v in envs[c].items()) for c in found.unfinished[:MAX_UNFINISHED_LISTED]
        ]
        more = len(found.unfinished) - len(labels)
        click.echo(
            f"  never finished ({len(found.unfinished)} cells; --json lists all): "
            + "; ".join(labels)
            + (f"; ... and {more} more" if more > 0 else "")
        )
    if found.pruned:
        click.echo(
            f"  pruned before the final rung: {len(found.pruned)} cells "
            "(kept in the results as final: false; report lists them apart)"
        )
    if found.best:
        label = " ".join(f"{k}={v}" for k, v in (found.best_env or {}).items())
        if found.score_ci:
            lo, hi = found.score_ci
            interval = f"interval {lo:.3f}-{hi:.3f}, Bonferroni over the finalists"
            verdict = "faster than the baseline" if found.winner else "not significantly faster than the baseline"
        else:
            interval = f"too few rounds ({plan.rounds}) for an interval: --rounds {stats.MIN_ROUNDS} or more"
            verdict = "no verdict"
        click.echo(
            f"  best of {len(found.finalists)} finalists: {found.best} {label}: "
            f"{found.best_score:.3f} x baseline latency ({interval}): {verdict}" + _simulated(plan)
        )


def print_summary(s: SweepSummary) -> None:
    """The text after a run: counts, the engine's notes on confirmation, the search's
    finding, and where the results are."""
    st, out = s.stats, s.plan.request.out
    failed = ", ".join(f"{n} {status}" for status, n in sorted(st.failures.items())) or "none"
    rows = [
        ["cells measured", st.cells_measured],
        ["cells already recorded", s.already_recorded],
        ["launches", st.launches],
        ["relaunches after a failure", st.relaunches],
        ["re-runs alone (unconfirmed)", st.reruns],
        ["failed cells measured again (resume)", st.retried],
        ["records written", st.records_written],
        ["failed cells", failed],
        ["wall time", f"{st.wall_s:.1f} s"],
    ]
    click.echo(tabulate(rows, tablefmt="plain"))
    for note in s.notes:
        if note.startswith(("NCCL's log confirmed no cell", "NCCL's log showed no cached")):
            click.echo(f"note: {note}")
    _print_search(s)
    if s.interrupted:
        click.echo(
            f"interrupted: the running launch was killed; every finished cell is in {out}; "
            "run the same command again to resume"
        )
    else:
        click.echo(f"results: {out}" + _simulated(s.plan) + f"; next: nccl-tune report {out}")
