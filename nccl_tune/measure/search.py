"""Search strategies over a sweep grid: exhaustive, successive halving, coordinate descent.

A strategy decides *what* to measure next; the sweep engine (nccl_tune.measure.sweep) decides
*how*: launches grouped by process-scoped settings, a fresh communicator per
communicator-scoped setting, timeouts, records written exactly once. They meet in
`Measure`, a callable taking a batch of `sweep.Request`s and returning their records
(`SweepEngine.measure`). Every decision is a pure function of the records seen, and the
engine answers a request already in the results file from the file, so a killed search
run again replays its decisions and resumes in the rung it was in, measuring nothing
twice.

Budget unit (issue 7): one measurement = one cell at one message size for one round at
the full iteration count; a request at fewer iterations costs iters / full_iters.
Baseline measurements count too.

Scores: within one batch and round, a cell's score is the geometric mean over message
sizes of its p50 divided by the baseline's p50 in the same round (< 1 is faster).
Normalising by a baseline measured alongside cancels drift between batches. Failed,
timed-out and wrong cells score infinity and are never kept.

Verdict: finalists are measured at full iterations for `rounds` rounds, baseline in
every round, records marked `final: true` (earlier rungs `final: false`, so `report` and
`recommend` judge only the final ones). The best finalist is the one with the lowest
median score or, among those statistically tied with it, the one that sets the fewest
variables (stats.tied: the rule recommend picks by too). It is a winner only when the
Student-t interval of its per-round log score excludes 0 at confidence 1 - alpha/k,
k = number of finalists (Bonferroni: the best of k equal cells would otherwise "win" by
chance); with fewer than stats.MIN_ROUNDS rounds there is no interval and no winner. Exhaustive compares every cell, so k is the whole grid and
it needs more rounds to declare a winner than strategies that narrow the field first.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from nccl_tune import stats
from nccl_tune.measure.grid import Cell
from nccl_tune.measure.sweep import Request
from nccl_tune.measure.sweepplan import round_order
from nccl_tune.store import BASELINE

STRATEGIES = ("exhaustive", "halving", "descent")
STRATEGY_HELP = {
    "exhaustive": "every cell, every round: small grids (tens of cells) or a final check",
    "halving": "successive halving: all cells briefly, the better half longer, ...; "
    "large grids where most cells are clearly worse",
    "descent": "AutoCCL-style: PROTO/ALGO/P2P_LEVEL subspaces, then one resource variable "
    "at a time; large grids built from axes (needs --set/--grid axes)",
}
IMPLEMENTATION_VARS = ("NCCL_PROTO", "NCCL_ALGO", "NCCL_P2P_LEVEL")

Measure = Callable[[list[Request]], list[dict]]


class BudgetExhausted(Exception):
    """The next batch would exceed the measurement budget."""


@dataclass
class Ledger:
    """Measurements spent so far against an optional cap (budget units, see module doc)."""

    n_sizes: int
    full_iters: int
    limit: float | None = None
    spent: float = 0.0

    def cost(self, requests: Sequence[Request]) -> float:
        """Budget units of a batch: sizes x iters / full_iters per request."""
        return sum(self.n_sizes * min(1.0, (r.iters or self.full_iters) / self.full_iters) for r in requests)

    def charge(self, requests: Sequence[Request]) -> None:
        """Count a batch, or raise BudgetExhausted (spending nothing) when it does not fit."""
        cost = self.cost(requests)
        if self.limit is not None and self.spent + cost > self.limit + 1e-9:
            raise BudgetExhausted(
                f"the next batch needs {cost:.1f} measurements and "
                f"{max(0.0, self.limit - self.spent):.1f} of {self.limit:g} are left"
            )
        self.spent += cost


@dataclass
class RungInfo:
    """One batch of a search: what it measured."""

    rung: int
    cells: int
    iters: int
    rounds: int
    final: bool
    spent: float


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
    unfinished: list[str]  # cells still in the race when the search stopped early
    spent: float
    rungs: list[RungInfo] = field(default_factory=list)
    stopped: str | None = None  # why the search stopped early (budget, failures), else None
    records: list[dict] = field(default_factory=list, repr=False)

    def to_dict(self) -> dict:
        """JSON-ready form (records left out)."""
        return {
            "strategy": self.strategy,
            "best": self.best,
            "best_env": self.best_env,
            "winner": self.winner,
            "best_score": self.best_score,
            "score_ci": list(self.score_ci) if self.score_ci else None,
            "finalists": self.finalists,
            "pruned": self.pruned,
            "unfinished": self.unfinished,
            "spent": round(self.spent, 3),
            "stopped": self.stopped,
            "rungs": [r.__dict__ for r in self.rungs],
        }


# ---------------------------------------------------------------- scoring


def _ok(record: dict) -> bool:
    return (
        (record.get("status") or "ok") == "ok"
        and record.get("correct") is not False
        and (record.get("lat_us") or {}).get("p50") is not None
    )


def batch_scores(records: Sequence[dict]) -> dict[tuple[str, int], float]:
    """Score per (cell, round): geometric mean over sizes of p50 / baseline p50.

    A cell with any failed or wrong size, or with no baseline in its round, scores infinity.
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
        base = p50.get((BASELINE, key[1]))
        mine = p50.get(key)
        if key in bad or not base or not mine or set(mine) - set(base):
            scores[key] = math.inf
            continue
        logs = [math.log(mine[b] / base[b]) for b in mine]
        scores[key] = math.exp(sum(logs) / len(logs))
    return scores


def score_noise(records: Sequence[dict]) -> float:
    """Relative standard error of one score in a batch, from the per-iteration samples.

    The p50 of n samples with coefficient of variation cv has a relative standard error
    of about 1.25 cv / sqrt(n); a score divides two p50s and averages over sizes. The
    median over the batch's records is used (0.0 when no record carries samples).
    """
    errors = []
    for r in records:
        samples = r.get("samples_us") or []
        if _ok(r) and len(samples) >= 2:
            values = np.asarray(samples, dtype=float)
            errors.append(1.2533 * values.std(ddof=1) / values.mean() / math.sqrt(values.size))
    if not errors:
        return 0.0
    sizes = max(1, len({r.get("bytes") for r in records}))
    return float(np.median(errors)) * math.sqrt(2.0 / sizes)


def cell_scores(records: Sequence[dict]) -> dict[str, float]:
    """Median over rounds of each cell's score (infinity if any round failed)."""
    per_cell: dict[str, list[float]] = {}
    for (cell, _), score in batch_scores(records).items():
        per_cell.setdefault(cell, []).append(score)
    return {c: (math.inf if any(math.isinf(s) for s in v) else float(np.median(v))) for c, v in per_cell.items()}


def final_verdict(
    records: Sequence[dict], finalists: Sequence[str], confidence: float = 0.95, n_vars: dict[str, int] | None = None
):
    """(best cell, winner?, median score, interval) over the final rung's records.

    The decision rule recommend applies too (stats.tied): the cell with the lowest median
    score, or, among the cells statistically tied with it (paired by round), the one that
    sets the fewest variables (`n_vars`), so a minimal profile beats a superset that only
    adds noise. A winner needs the Bonferroni interval of its per-round log score to
    exclude 0; with fewer than stats.MIN_ROUNDS rounds there is no interval (None) and no
    winner: a t interval from two rounds spans many orders of magnitude.
    """
    per_round: dict[str, dict[int, float]] = {}
    for (cell, round_), score in batch_scores(records).items():
        if cell in finalists:
            per_round.setdefault(cell, {})[round_] = score
    candidates = {c: v for c, v in per_round.items() if v and not any(math.isinf(s) for s in v.values())}
    if not candidates:
        return None, False, None, None
    median = {c: float(np.median(list(v.values()))) for c, v in candidates.items()}
    best = min(candidates, key=lambda c: (median[c], c))
    if n_vars:
        logs = {c: {r: math.log(s) for r, s in v.items()} for c, v in candidates.items()}
        tied = [c for c in candidates if c == best or stats.tied(logs[best], logs[c])]
        best = min(tied, key=lambda c: (n_vars.get(c, 0), median[c], c))
    logs = [math.log(s) for s in candidates[best].values()]
    if len(logs) < stats.MIN_ROUNDS:  # too few rounds: no interval and no winner
        return best, False, median[best], None
    level = 1 - (1 - confidence) / max(1, len(finalists))
    _, lo, hi = stats.t_ci(logs, level)
    return best, hi < 0, median[best], (math.exp(lo), math.exp(hi))


# ---------------------------------------------------------------- shared machinery


@dataclass
class _Run:
    """State shared by a strategy's batches: rounds handed out, budget, records seen."""

    strategy: str
    measure: Measure
    ledger: Ledger
    baseline: Cell
    seed: int
    isolation: str
    records: list[dict] = field(default_factory=list)
    rungs: list[RungInfo] = field(default_factory=list)
    next_round: int = 1

    def batch(self, cells: Sequence[Cell], iters: int, rung: int, rounds: int = 1, final: bool = False) -> list[dict]:
        """Measure `cells` and the baseline for `rounds` fresh rounds (each in a fresh
        random order, grouped by process scope); returns this batch's records."""
        unique = list({c.id: c for c in [self.baseline, *cells]}.values())
        requests = []
        for round_ in range(self.next_round, self.next_round + rounds):
            extra = {"strategy": self.strategy, "rung": rung, "final": final}
            requests += [
                Request(c, round_, iters=iters, extra=dict(extra))
                for c in round_order(unique, round_, self.seed, self.isolation)
            ]
        before = self.ledger.spent
        self.ledger.charge(requests)
        self.next_round += rounds
        got = self.measure(requests)
        self.records.extend(got)
        self.rungs.append(RungInfo(rung, len(unique) - 1, iters, rounds, final, round(self.ledger.spent - before, 3)))
        return got

    def outcome(
        self,
        finalists: list[str],
        final_records: list[dict],
        pruned: dict[str, int],
        unfinished: list[str],
        envs: dict[str, dict],
        stopped: str | None,
        confidence: float,
    ) -> Outcome:
        n_vars = {c: len(env) for c, env in envs.items()}
        best, winner, score, ci = (
            final_verdict(final_records, finalists, confidence, n_vars) if final_records else (None, False, None, None)
        )
        return Outcome(
            self.strategy,
            best,
            envs.get(best) if best else None,
            winner,
            score,
            ci,
            finalists,
            pruned,
            unfinished,
            self.ledger.spent,
            self.rungs,
            stopped,
            self.records,
        )


def _split(cells: Sequence[Cell]) -> tuple[Cell, dict[str, Cell]]:
    baseline = next((c for c in cells if c.id == BASELINE), Cell({}))
    return baseline, {c.id: c for c in cells if c.id != BASELINE}


# ---------------------------------------------------------------- exhaustive


def run_exhaustive(
    cells: Sequence[Cell],
    measure: Measure,
    ledger: Ledger,
    rounds: int,
    seed: int = 0,
    isolation: str = "group",
    confidence: float = 0.95,
) -> Outcome:
    """Every cell at full iterations for `rounds` rounds, one round per batch."""
    baseline, by_id = _split(cells)
    run = _Run("exhaustive", measure, ledger, baseline, seed, isolation)
    envs = {cid: c.env for cid, c in by_id.items()}
    final: list[dict] = []
    for _ in range(rounds):
        try:
            final += run.batch(list(by_id.values()), ledger.full_iters, 0, 1, final=True)
        except BudgetExhausted as exc:
            # Rounds already complete still compare every cell; none got all its rounds.
            done = run.next_round - 1
            return run.outcome(
                sorted(by_id) if final else [],
                final,
                {},
                sorted(by_id),
                envs,
                f"budget: {exc} (rounds completed: {done} of {rounds})",
                confidence,
            )
    return run.outcome(sorted(by_id), final, {}, [], envs, None, confidence)


# ---------------------------------------------------------------- successive halving


@dataclass(frozen=True)
class Rung:
    """One rung of a halving plan: how many cells, at how many iterations, how many rounds."""

    cells: int
    iters: int
    rounds: int
    final: bool


def plan_halving(
    n_cells: int, full_iters: int, rounds: int, eta: int = 2, min_fraction: float = 1 / 8, keep: int = 4
) -> list[Rung]:
    """All cells at full_iters x min_fraction for one round, then the best 1/eta at eta x
    the iterations (capped at full), ... until at most `keep` remain; those are measured as
    an exhaustive sweep would (full iterations, `rounds` rounds). The last rungs before
    the final one (at most 4 x keep cells, at full iterations) take two rounds, so that
    one round's drift cannot pick the finalists alone."""
    plan, n = [], n_cells
    iters = max(1, int(round(full_iters * min_fraction)))
    while n > keep:
        late = iters >= full_iters and n <= 4 * keep
        plan.append(Rung(n, iters, min(2, rounds) if late else 1, False))
        n = math.ceil(n / eta)
        iters = min(full_iters, iters * eta)
    plan.append(Rung(n, full_iters, rounds, True))
    return plan


def minimal_parts(
    survivors: list[str], ranked: list[str], scores: dict[str, float], envs: dict[str, dict]
) -> list[str]:
    """Cells brought back into the final rung: for each finalist, the best-scoring cell
    (that did not fail, in the last rung it was measured in) whose settings are a proper
    part of the finalist's.

    Without this, halving can prune NCCL_P2P_LEVEL=SYS alone in an early, noisy rung
    while keeping a cell that adds three more variables to it; then the minimal profile
    never reaches the final rung, where ties go to the cell that sets fewer variables
    (final_verdict), and the superset wins by default. At most one part per finalist,
    so the final rung measures at most twice the planned cells.
    """
    kept = set(survivors)
    extra: list[str] = []
    for survivor in survivors:
        mine = set(envs.get(survivor, {}).items())
        for c in ranked:  # best first
            env = set(envs.get(c, {}).items())
            if c in kept or math.isinf(scores.get(c, math.inf)) or not env or not env < mine:
                continue
            extra.append(c)
            kept.add(c)
            break
    return extra


def run_halving(
    cells: Sequence[Cell],
    measure: Measure,
    ledger: Ledger,
    rounds: int,
    seed: int = 0,
    isolation: str = "group",
    eta: int = 2,
    min_fraction: float = 1 / 8,
    keep: int = 4,
    confidence: float = 0.95,
) -> Outcome:
    """Successive halving: every cell briefly, the better 1/eta longer, until `keep` remain
    (plus, in the final rung, each finalist's best-scoring proper part: minimal_parts)."""
    baseline, by_id = _split(cells)
    run = _Run("halving", measure, ledger, baseline, seed, isolation)
    envs = {cid: c.env for cid, c in by_id.items()}
    alive = sorted(by_id)
    pruned: dict[str, int] = {}
    last_score: dict[str, float] = {}  # each cell's score in the last rung it was measured in
    for rung, step in enumerate(plan_halving(len(alive), ledger.full_iters, rounds, eta, min_fraction, keep)):
        if step.final and rung > 0:  # a finalist's minimal part reaches the final too
            ranked_all = sorted(last_score, key=lambda c: (last_score[c], c))
            for c in minimal_parts(alive, ranked_all, last_score, envs):
                alive.append(c)
                pruned.pop(c, None)
        try:
            got = run.batch([by_id[c] for c in alive], step.iters, rung, step.rounds, step.final)
        except BudgetExhausted as exc:
            return run.outcome([], [], pruned, alive, envs, f"budget: {exc}", confidence)
        if step.final:
            return run.outcome(alive, got, pruned, [], envs, None, confidence)
        scores = cell_scores(got)
        ranked = sorted(alive, key=lambda c: (scores.get(c, math.inf), c))
        survivors = [c for c in ranked if not math.isinf(scores.get(c, math.inf))]
        survivors = survivors[: math.ceil(len(alive) / eta)]
        last_score.update({c: scores.get(c, math.inf) for c in alive})
        for c in alive:
            if c not in survivors:
                pruned[c] = rung
        alive = survivors  # best first
        if not alive:
            return run.outcome([], [], pruned, [], envs, "every cell failed", confidence)
    raise AssertionError("a halving plan always ends in a final rung")  # pragma: no cover


# ---------------------------------------------------------------- coordinate descent

Axes = list[tuple[str, list]]  # (name, values; None = leave unset), as grid.GridSpec.axes


def _env_of(axes: Axes, point: dict) -> dict[str, str]:
    return {name: point[name] for name, _ in axes if point.get(name) is not None}


def run_descent(
    axes: Axes,
    cells: Sequence[Cell],
    measure: Measure,
    ledger: Ledger,
    rounds: int,
    seed: int = 0,
    isolation: str = "group",
    top_subspaces: int = 3,
    probe_fraction: float = 0.5,
    min_gain: float = 0.01,
    max_passes: int = 3,
    confidence: float = 0.95,
) -> Outcome:
    """AutoCCL-style search (NSDI 2025): implementation subspaces, then resource descent.

    1. Every combination of the implementation variables in the grid (NCCL_PROTO,
       NCCL_ALGO, NCCL_P2P_LEVEL) is probed with each resource variable at its first value.
    2. In each of the best `top_subspaces` subspaces, one resource variable at a time
       moves to its best value while the score improves by more than the larger of
       `min_gain` and twice the noise of a score difference (`score_noise`); the
       subspaces descend in lockstep, so each step is one batch that the engine groups
       into launches by process scope (never one launch per cell).
    3. A second start (each resource variable at its last value) guards against one bad
       start; the best point of every start and subspace goes to the final rung.
    Cells the grid pruned are never measured.
    """
    baseline, by_id = _split(cells)
    run = _Run("descent", measure, ledger, baseline, seed, isolation)
    valid = {cid: c for cid, c in by_id.items()}
    impl = [(n, v) for n, v in axes if n in IMPLEMENTATION_VARS]
    resources = [(n, v) for n, v in axes if n not in IMPLEMENTATION_VARS]
    probe_iters = max(1, int(round(ledger.full_iters * probe_fraction)))
    scores: dict[str, float] = {BASELINE: 1.0}
    rung = 0
    noise = [0.0]  # largest score noise seen in a probe batch (see score_noise)

    def cid(point: dict) -> str:
        return Cell(_env_of(axes, point)).id

    def probe(points: list[dict]) -> None:
        nonlocal rung
        todo = {cid(p): valid[cid(p)] for p in points if cid(p) in valid and cid(p) not in scores}
        if not todo:
            return
        got = run.batch(list(todo.values()), probe_iters, rung)
        rung += 1
        noise[0] = max(noise[0], score_noise(got))
        found = cell_scores(got)
        for c in todo:
            scores[c] = found.get(c, math.inf)

    def score(point: dict) -> float:
        return scores.get(cid(point), math.inf)

    stopped, finals = None, []
    try:
        first = {n: values[0] for n, values in resources}
        subspaces = [dict(zip([n for n, _ in impl], combo)) for combo in _product([v for _, v in impl])]
        probe([{**s, **first} for s in subspaces])
        ranked = sorted(subspaces, key=lambda s: score({**s, **first}))
        best_subs = [s for s in ranked if not math.isinf(score({**s, **first}))][:top_subspaces]
        starts = [first, {n: values[-1] for n, values in resources}]
        current = [{**s, **st} for st in starts for s in best_subs]
        for _ in range(max_passes):
            moved = False
            for name, values in resources:
                probe([{**p, name: v} for p in current for v in values])
                # a move must beat noise: two scores differ by chance by ~sqrt(2) x noise
                gate = max(min_gain, math.sqrt(2) * noise[0])
                for i, p in enumerate(current):
                    best_v = min(values, key=lambda v: score({**p, name: v}))
                    if score({**p, name: best_v}) < score(p) * (1 - gate):
                        current[i] = {**p, name: best_v}
                        moved = True
            if not moved:
                break
        finals = sorted(
            {cid(p) for p in current if cid(p) != BASELINE and cid(p) in valid and not math.isinf(score(p))}
        )
    except BudgetExhausted as exc:
        stopped = f"budget: {exc}"
    envs = {c: valid[c].env for c in scores if c in valid}
    if stopped:
        return run.outcome([], [], {}, sorted(envs), envs, stopped, confidence)
    pruned = {c: -1 for c in envs if c not in finals}
    if not finals:
        return run.outcome([], [], pruned, [], envs, "no probed cell beat a failure", confidence)
    try:
        got = run.batch([valid[c] for c in finals], ledger.full_iters, rung, rounds, final=True)
    except BudgetExhausted as exc:
        return run.outcome([], [], pruned, finals, envs, f"budget: {exc}", confidence)
    return run.outcome(finals, got, pruned, [], envs, None, confidence)


def _product(lists: list[list]) -> list[tuple]:
    out: list[tuple] = [()]
    for values in lists:
        out = [prefix + (v,) for prefix in out for v in values]
    return out


# ---------------------------------------------------------------- planning


def estimate_cost(
    strategy: str,
    n_cells: int,
    n_sizes: int,
    rounds: int,
    full_iters: int,
    axes: Axes | None = None,
    eta: int = 2,
    min_fraction: float = 1 / 8,
    keep: int = 4,
    top_subspaces: int = 3,
    probe_fraction: float = 0.5,
) -> float:
    """Planned measurements (budget units, baseline included) before running.

    Exact for exhaustive, and for halving when nothing fails and no finalist's proper part
    is brought back into the final rung (minimal_parts: at most as many cells again
    there); for descent an upper estimate
    (two descent passes from each of two starts in each probed subspace).
    """
    if strategy == "exhaustive":
        return (n_cells + 1) * n_sizes * rounds
    if strategy == "halving":
        return sum(
            (r.cells + 1) * n_sizes * r.rounds * min(1.0, r.iters / full_iters)
            for r in plan_halving(n_cells, full_iters, rounds, eta, min_fraction, keep)
        )
    if strategy == "descent":
        axes = axes or []
        impl = [v for n, v in axes if n in IMPLEMENTATION_VARS]
        resources = [v for n, v in axes if n not in IMPLEMENTATION_VARS]
        n_sub = math.prod(len(v) for v in impl) if impl else 1
        subs = min(top_subspaces, n_sub)
        per_pass = sum(len(v) - 1 for v in resources)
        probes = min(n_cells, n_sub + subs * 2 * 2 * per_pass)
        batches = 1 + 2 * len(resources)
        return (probes + batches) * n_sizes * probe_fraction + (2 * subs + 1) * n_sizes * rounds
    raise ValueError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})")


def run_strategy(
    strategy: str,
    cells: Sequence[Cell],
    measure: Measure,
    ledger: Ledger,
    rounds: int,
    seed: int = 0,
    isolation: str = "group",
    axes: Axes | None = None,
    confidence: float = 0.95,
) -> Outcome:
    """Dispatch to a strategy by name (descent needs the grid's axes)."""
    if strategy == "exhaustive":
        return run_exhaustive(cells, measure, ledger, rounds, seed, isolation, confidence=confidence)
    if strategy == "halving":
        return run_halving(cells, measure, ledger, rounds, seed, isolation, confidence=confidence)
    if strategy == "descent":
        if not axes:
            raise ValueError("descent needs grid axes (--set or --grid), not only explicit cells")
        return run_descent(axes, cells, measure, ledger, rounds, seed, isolation, confidence=confidence)
    raise ValueError(f"unknown strategy '{strategy}' (known: {', '.join(STRATEGIES)})")
