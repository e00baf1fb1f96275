"""Search strategies over a sweep grid: exhaustive, successive halving, coordinate descent.

A strategy decides *what* to measure next; the sweep engine decides *how* (launches
grouped by process-scoped settings, fresh process groups per communicator-scoped
setting, timeouts, records). The two meet in `Measure`: a callable that takes a batch
of `Request`s and returns their records (one per request and message size). Because
a strategy's every decision is a pure function of the records it has seen, a killed
search resumes by replaying: requests whose records already exist are answered from
the file, nothing is measured twice (`replaying_measure`).

Budget unit (issue 7): one measurement = one cell at one message size for one round at
the full iteration count; a request at fewer iterations costs iters / full_iters.

Scores: within one batch and round, a cell's score is the geometric mean over message
sizes of its p50 divided by the baseline's p50 measured in the same batch and round
(< 1 is faster). Normalising by a baseline measured alongside cancels drift between
batches. Failed, timed-out and wrong cells score infinity and are never kept.

Verdict: the finalists are measured at full iterations for `rounds` rounds with the
baseline in every round; the best by median score is declared a winner only when the
Student-t interval of its per-round log score excludes 0 at confidence 1 - alpha/k,
k = number of finalists (Bonferroni: picking the best of k equal cells would otherwise
"win" by chance). Exhaustive search compares every cell, so k is the whole grid and it
needs more rounds to declare a winner than the strategies that narrow the field first.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable, Iterable, Sequence

import numpy as np

from nccl_tune import stats
from nccl_tune.store import BASELINE, cell_id

STRATEGIES = ("exhaustive", "halving", "descent")
IMPLEMENTATION_VARS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL")
DEFAULT = "default"  # an axis value meaning: leave the variable unset


@dataclass(frozen=True)
class Request:
    """Measure one cell for one round at `iters` iterations, as part of rung `rung`."""

    env: tuple[tuple[str, str], ...]  # sorted (name, value) pairs; () is the baseline
    round: int
    iters: int
    rung: int
    final: bool
    strategy: str

    @property
    def cell(self) -> str:
        """The cell id (store.cell_id of the env)."""
        return cell_id(dict(self.env))

    @property
    def env_dict(self) -> dict[str, str]:
        """The env as a mapping."""
        return dict(self.env)


Measure = Callable[[list[Request]], list[dict]]


def freeze(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """A hashable, order-free form of an env mapping."""
    return tuple(sorted(env.items()))


class BudgetExhausted(Exception):
    """The next batch would exceed the measurement budget."""


@dataclass
class Ledger:
    """Measurements spent so far against an optional cap."""

    n_sizes: int
    full_iters: int
    limit: float | None = None
    spent: float = 0.0

    def cost(self, requests: Iterable[Request]) -> float:
        """Budget units of a batch: sizes x iters / full_iters per request."""
        return sum(self.n_sizes * min(1.0, r.iters / self.full_iters) for r in requests)

    def charge(self, requests: list[Request]) -> None:
        """Count a batch, or raise BudgetExhausted (spending nothing) when it does not fit."""
        cost = self.cost(requests)
        if self.limit is not None and self.spent + cost > self.limit + 1e-9:
            raise BudgetExhausted(f"next batch needs {cost:.1f} measurements, "
                                  f"{self.limit - self.spent:.1f} left of {self.limit:g}")
        self.spent += cost


@dataclass
class Outcome:
    """What a strategy found and what it spent."""

    strategy: str
    best: str | None  # cell id of the best finalist (None: nothing finished)
    best_env: dict | None
    winner: bool  # best is significantly faster than the baseline
    best_score: float | None  # median per-round p50 ratio to baseline (< 1 faster)
    score_ci: tuple[float, float] | None  # interval of that ratio (Bonferroni-adjusted)
    finalists: list[str]
    pruned: dict[str, int]  # cell -> rung where it was dropped
    unfinished: list[str]  # cells planned but never measured at the final rung
    spent: float
    stopped: str | None = None  # why the search stopped early (budget), else None
    records: list[dict] = field(default_factory=list, repr=False)


# ---------------------------------------------------------------- scoring

def _ok(record: dict) -> bool:
    return (record.get("status") or "ok") == "ok" and record.get("correct") is not False \
        and (record.get("lat_us") or {}).get("p50") is not None


def batch_scores(records: Sequence[dict]) -> dict[tuple[str, int], float]:
    """Score per (cell, round): geometric mean over sizes of p50 / baseline p50.

    Records are those of one batch. A cell with any failed or wrong size, or with no
    baseline in its round, scores infinity.
    """
    p50: dict[tuple[str, int], dict[int, float]] = {}
    bad: set[tuple[str, int]] = set()
    for r in records:
        key = (r.get("cell") or BASELINE, int(r.get("round") or 0))
        if _ok(r):
            p50.setdefault(key, {})[int(r["bytes"])] = float(r["lat_us"]["p50"])
        else:
            bad.add(key)
    scores: dict[tuple[str, int], float] = {}
    for key in set(p50) | bad:
        cell, rnd = key
        base = p50.get((BASELINE, rnd))
        mine = p50.get(key)
        if key in bad or not base or not mine or set(mine) - set(base):
            scores[key] = math.inf
            continue
        logs = [math.log(mine[b] / base[b]) for b in mine]
        scores[key] = math.exp(sum(logs) / len(logs))
    return scores


def cell_scores(records: Sequence[dict]) -> dict[str, float]:
    """Median over rounds of each cell's batch score (infinity if any round failed)."""
    per_cell: dict[str, list[float]] = {}
    for (cell, _), score in batch_scores(records).items():
        per_cell.setdefault(cell, []).append(score)
    return {c: (math.inf if any(math.isinf(s) for s in v) else float(np.median(v)))
            for c, v in per_cell.items()}


def final_verdict(records: Sequence[dict], finalists: Sequence[str], confidence: float = 0.95):
    """(best cell, winner?, median score, interval) over the final rung's records."""
    per_round: dict[str, list[float]] = {}
    for (cell, _), score in batch_scores(records).items():
        if cell in finalists:
            per_round.setdefault(cell, []).append(score)
    candidates = {c: v for c, v in per_round.items() if v and not any(math.isinf(s) for s in v)}
    if not candidates:
        return None, False, None, None
    best = min(candidates, key=lambda c: (float(np.median(candidates[c])), c))
    logs = [math.log(s) for s in candidates[best]]
    k = max(1, len(finalists))
    level = 1 - (1 - confidence) / k
    _, lo, hi = stats.t_ci(logs, level)
    winner = len(logs) >= 2 and hi < 0
    return best, winner, float(np.median(candidates[best])), (math.exp(lo), math.exp(hi))


# ---------------------------------------------------------------- replay / resume

def replaying_measure(measure: Measure, existing: Iterable[dict]) -> Measure:
    """Wrap `measure` so requests already answered by `existing` records are not re-measured.

    A request is answered when records with its strategy, rung, round and cell exist
    (whatever their status: a failure is an answer too).
    """
    done: dict[tuple, list[dict]] = {}
    for r in existing:
        key = (r.get("strategy"), r.get("rung"), r.get("round"), r.get("cell"))
        done.setdefault(key, []).append(r)

    def wrapped(requests: list[Request]) -> list[dict]:
        out, todo = [], []
        for req in requests:
            hit = done.get((req.strategy, req.rung, req.round, req.cell))
            if hit:
                out.extend(hit)
            else:
                todo.append(req)
        if todo:
            out.extend(measure(todo))
        return out

    return wrapped


# ---------------------------------------------------------------- shared machinery

@dataclass
class _Run:
    strategy: str
    measure: Measure
    ledger: Ledger
    rounds: int
    full_iters: int
    records: list[dict] = field(default_factory=list)
    round_counter: int = 0

    def batch(self, envs: Sequence[dict], iters: int, rung: int, rounds: int = 1,
              final: bool = False) -> list[dict]:
        """Measure `envs` plus the baseline for `rounds` fresh rounds; returns the batch's records."""
        unique = list(dict.fromkeys([freeze({})] + [freeze(e) for e in envs]))
        requests = [Request(env, self.round_counter + r, iters, rung, final, self.strategy)
                    for r in range(rounds) for env in unique]
        self.ledger.charge(requests)
        self.round_counter += rounds
        got = self.measure(requests)
        self.records.extend(got)
        return got


def _outcome(run: _Run, finalists: list[str], final_records: list[dict], pruned: dict[str, int],
             unfinished: list[str], envs: dict[str, dict], stopped: str | None,
             confidence: float) -> Outcome:
    best, winner, score, ci = final_verdict(final_records, finalists, confidence) \
        if final_records else (None, False, None, None)
    return Outcome(run.strategy, best, envs.get(best) if best else None, winner, score, ci,
                   finalists, pruned, unfinished, run.ledger.spent, stopped, run.records)


# ---------------------------------------------------------------- exhaustive

def run_exhaustive(cells: Sequence[dict], measure: Measure, ledger: Ledger, rounds: int,
                   full_iters: int, confidence: float = 0.95) -> Outcome:
    """Every cell at full iterations for `rounds` rounds (the reference the others are judged by)."""
    run = _Run("exhaustive", measure, ledger, rounds, full_iters)
    envs = {cell_id(e): e for e in cells if e}
    try:
        final = run.batch(list(envs.values()), full_iters, rung=0, rounds=rounds, final=True)
    except BudgetExhausted as exc:
        return _outcome(run, [], [], {}, sorted(envs), envs, str(exc), confidence)
    return _outcome(run, sorted(envs), final, {}, [], envs, None, confidence)


# ---------------------------------------------------------------- successive halving

@dataclass(frozen=True)
class Rung:
    """One rung of a halving plan: how many cells, at how many iterations, for how many rounds."""

    cells: int
    iters: int
    rounds: int
    final: bool


def plan_halving(n_cells: int, full_iters: int, rounds: int, eta: int = 2,
                 min_fraction: float = 1 / 8, keep: int = 4) -> list[Rung]:
    """Rungs: all cells at full_iters x min_fraction, then 1/eta of them at eta x the
    iterations (capped at full), ... until at most `keep` remain, measured like an
    exhaustive sweep (full iterations, `rounds` rounds)."""
    plan, n = [], n_cells
    iters = max(1, int(round(full_iters * min_fraction)))
    while n > keep:
        plan.append(Rung(n, iters, 1, False))
        n = math.ceil(n / eta)
        iters = min(full_iters, iters * eta)
    plan.append(Rung(n, full_iters, rounds, True))
    return plan


def run_halving(cells: Sequence[dict], measure: Measure, ledger: Ledger, rounds: int,
                full_iters: int, eta: int = 2, min_fraction: float = 1 / 8, keep: int = 4,
                confidence: float = 0.95) -> Outcome:
    """Successive halving: measure all briefly, keep the better 1/eta, measure longer, ..."""
    run = _Run("halving", measure, ledger, rounds, full_iters)
    envs = {cell_id(e): e for e in cells if e}
    alive = sorted(envs)
    pruned: dict[str, int] = {}
    for rung, step in enumerate(plan_halving(len(alive), full_iters, rounds, eta, min_fraction, keep)):
        try:
            got = run.batch([envs[c] for c in alive], step.iters, rung, step.rounds, step.final)
        except BudgetExhausted as exc:
            return _outcome(run, [], [], pruned, alive, envs, str(exc), confidence)
        if step.final:
            return _outcome(run, alive, got, pruned, [], envs, None, confidence)
        scores = cell_scores(got)
        ranked = sorted(alive, key=lambda c: (scores.get(c, math.inf), c))
        survivors = [c for c in ranked if not math.isinf(scores.get(c, math.inf))]
        survivors = survivors[:max(1, math.ceil(len(alive) / eta))]
        for c in alive:
            if c not in survivors:
                pruned[c] = rung
        alive = sorted(survivors)
        if not alive:
            return _outcome(run, [], [], pruned, [], envs, "every cell failed", confidence)
    raise AssertionError("a halving plan always ends in a final rung")


# ---------------------------------------------------------------- coordinate descent

def _point_env(axes: dict[str, list[str]], point: dict[str, str]) -> dict[str, str]:
    return {k: point[k] for k in axes if point.get(k, DEFAULT) != DEFAULT}


def run_descent(axes: dict[str, list[str]], valid: Sequence[dict], measure: Measure,
                ledger: Ledger, rounds: int, full_iters: int, top_subspaces: int = 3,
                probe_fraction: float = 0.5, min_gain: float = 0.01, max_passes: int = 3,
                confidence: float = 0.95) -> Outcome:
    """AutoCCL-style search (NSDI 2025): implementation subspaces, then resource descent.

    1. Every combination of the implementation variables (PROTO, ALGO, P2P_LEVEL; those
       in the grid) is measured at the first value of each resource variable.
    2. In each of the best `top_subspaces` subspaces, resource variables move one at a
       time to their best value while the score improves by more than `min_gain`;
       the subspaces descend in lockstep so each step is one grouped batch.
    3. A second start (each resource variable at its last value) guards against one bad
       start; the best point of each start and subspace goes to a final rung.
    """
    run = _Run("descent", measure, ledger, rounds, full_iters)
    valid_ids = {cell_id(e) for e in valid}
    impl = [k for k in axes if k in IMPLEMENTATION_VARS]
    resources = [k for k in axes if k not in IMPLEMENTATION_VARS]
    probe_iters = max(1, int(round(full_iters * probe_fraction)))
    envs: dict[str, dict] = {}
    scores: dict[str, float] = {}
    rung = 0

    def measure_points(points: list[dict[str, str]]) -> None:
        nonlocal rung
        todo = []
        for p in points:
            env = _point_env(axes, p)
            cid = cell_id(env)
            if env and cid in valid_ids and cid not in scores and cid not in {cell_id(t) for t in todo}:
                todo.append(env)
        if not todo:
            return
        got = run.batch(todo, probe_iters, rung)
        rung += 1
        batch = cell_scores(got)
        for env in todo:
            cid = cell_id(env)
            envs[cid] = env
            scores[cid] = batch.get(cid, math.inf)

    def score(point: dict[str, str]) -> float:
        env = _point_env(axes, point)
        return 1.0 if not env else scores.get(cell_id(env), math.inf)

    stopped = None
    try:
        # 1. implementation subspaces at the first resource values
        start = {k: axes[k][0] for k in resources}
        subspaces = [dict(zip(impl, combo)) for combo in _product([axes[k] for k in impl])]
        measure_points([{**s, **start} for s in subspaces])
        ranked = sorted(subspaces, key=lambda s: score({**s, **start}))
        best_subs = [s for s in ranked if not math.isinf(score({**s, **start}))][:top_subspaces]
        # 2-3. lockstep descent in each subspace from two starts
        starts = [start, {k: axes[k][-1] for k in resources}]
        current = [{**s, **st} for st in starts for s in best_subs]
        for _ in range(max_passes):
            moved = False
            for var in resources:
                measure_points([{**p, var: v} for p in current for v in axes[var]])
                for i, p in enumerate(current):
                    here = score(p)
                    best_v = min(axes[var], key=lambda v: score({**p, var: v}))
                    if score({**p, var: best_v}) < here * (1 - min_gain):
                        current[i] = {**p, var: best_v}
                        moved = True
            if not moved:
                break
        finals = sorted({cell_id(_point_env(axes, p)) for p in current
                         if _point_env(axes, p) and not math.isinf(score(p))})
    except BudgetExhausted as exc:
        stopped, finals = str(exc), []
    if stopped:
        return _outcome(run, [], [], {}, sorted(envs), envs, stopped, confidence)
    pruned = {c: -1 for c in envs if c not in finals}
    try:
        got = run.batch([envs[c] for c in finals], full_iters, rung, rounds, final=True)
    except BudgetExhausted as exc:
        return _outcome(run, [], [], pruned, finals, envs, str(exc), confidence)
    return _outcome(run, finals, got, pruned, [], envs, None, confidence)


def _product(lists: list[list[str]]) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = [()]
    for values in lists:
        out = [prefix + (v,) for prefix in out for v in values]
    return out


def estimate_cost(strategy: str, n_cells: int, n_sizes: int, rounds: int, full_iters: int,
                  axes: dict[str, list[str]] | None = None, eta: int = 2,
                  min_fraction: float = 1 / 8, keep: int = 4) -> float:
    """Planned measurements (budget units, baseline included) of a strategy, before running.

    Exact for exhaustive and halving; for descent an estimate (two passes per start).
    """
    if strategy == "exhaustive":
        return (n_cells + 1) * n_sizes * rounds
    if strategy == "halving":
        return sum((r.cells + 1) * n_sizes * r.rounds * min(1.0, r.iters / full_iters)
                   for r in plan_halving(n_cells, full_iters, rounds, eta, min_fraction, keep))
    if strategy == "descent":
        axes = axes or {}
        impl = [k for k in axes if k in IMPLEMENTATION_VARS]
        resources = [k for k in axes if k not in IMPLEMENTATION_VARS]
        n_sub = math.prod(len(axes[k]) for k in impl) if impl else 1
        per_pass = sum(len(axes[k]) - 1 for k in resources)
        probes = n_sub + min(3, n_sub) * 2 * 2 * per_pass
        batches = 1 + 2 * len(resources) * 2
        return (probes + batches) * n_sizes * 0.5 + (2 * min(3, n_sub) + 1) * n_sizes * rounds
    raise ValueError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})")
