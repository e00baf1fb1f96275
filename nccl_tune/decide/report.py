"""From results records to per-(cell, size) summaries with intervals and verdicts.

One summary per cell, collective, message size, world, backend, mode, dtype and machine:
the median over rounds of each round's p50, a 95% interval, and the difference to the
baseline cell measured under the same conditions with its own interval and a verdict.

The machine (`machine_identity`): the hosts a record was measured on, the GPU models and
the topology as recorded; records of nccl-tests output whose file names no host (a
pasted table) are told apart by the file they were imported from. So results of
different machines (an A40 box with P2P disabled and a DGX H100, say) are never merged
into one baseline, while a sweep's own records (one host, several rounds, resumed or
not) stay together.

Interval basis: with at least `MIN_ROUNDS_FOR_ROUND_CI` rounds, rounds are the unit:
Student-t intervals over per-round p50s (a cell's own latency on the log scale, so it
never reaches below zero: stats.positive_ci), differences paired by round when both cells
share rounds (which cancels drift that hits a whole round), Welch's otherwise. A
percentile bootstrap over 3-5 rounds is far too narrow (stats.t_ci says why). With
fewer rounds, the per-iteration samples are pooled and bootstrapped, and the point
estimate is the pooled median (the statistic that interval is about); that interval
ignores drift between rounds and says so (`ci_basis: "iterations"`).

Records with `final: false` (early rungs of a search) never enter a verdict; they are
summarised apart as pruned, by rung (`shown_rungs`: a finalist only by its final
records, a pruned cell by the rung that dropped it, the baseline by rung beside them). Records marked `superseded` (a sweep re-ran the cell alone
because NCCL's log did not confirm it in a shared process) are left out entirely.

Many cells compared with one baseline: at 95% per comparison, a flat landscape of 20
cells would show about one false "faster" per size. Verdicts therefore use p-values
adjusted across the cells of each (op, size, world, backend) family with
Benjamini-Hochberg (`adjust="bh"`, the default; under a flat landscape this bounds the
chance of any false verdict at 5%), or Bonferroni, or none. The intervals shown stay
at the nominal confidence; a verdict needs both its interval to exclude zero and its
adjusted p-value below 1 - confidence.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field

import numpy as np

from nccl_tune import stats, store
from nccl_tune.store import BASELINE, cell_label
from nccl_tune.vocab import Provenance, provenance_of

MIN_ROUNDS_FOR_ROUND_CI = stats.MIN_ROUNDS
# What every reader of gloo results says (report, recommend, their exports).
GLOO_NOTE = "gloo results: NCCL settings do not affect gloo; differences between cells are noise"
SIMULATED_BANNER = "SIMULATED: these results come from the cost model (backend sim), not from a measurement"
MAX_POOLED_SAMPLES = 4000  # bootstrap cost bound; a deterministic subsample beyond it


@dataclass
class CellSizeSummary:
    """What a cell achieved at one message size, against the baseline."""

    cell: str
    env: dict
    op: str
    bytes: int
    world_size: int | None
    backend: str | None
    status: str  # ok | wrong | failed | timeout
    n_rounds: int
    round_p50s: list[float]
    p50_us: float | None
    ci_us: tuple[float, float] | None
    ci_basis: str | None  # "rounds" | "iterations" | None
    delta_us: float | None = None  # cell - baseline (negative = faster)
    delta_ci_us: tuple[float, float] | None = None
    verdict: str | None = None  # faster | slower | no significant difference | None
    confirmed: bool | None = None  # NCCL's log showed the requested settings
    effective: dict | None = None
    errors: list[str] = field(default_factory=list)
    final: bool = True
    samples_us: list[float] = field(default_factory=list, repr=False)
    p_value: float | None = None  # the difference to the baseline, unadjusted
    p_adjusted: float | None = None  # adjusted across the family (see module doc)
    mode: str | None = None  # graph | eager | None (nccl-tests without the graph line)
    dtype: str | None = None
    machine: str | None = None  # where it was measured, in words (see machine_identity)
    redop: str | None = None  # nccl-tests' reduction op (sum, prod, max, min, avg), if said
    rung: int | None = None  # the search rung of non-final records (None: final)
    provenance: Provenance | None = None  # of its records (vocab.provenance_of)

    @property
    def label(self) -> str:
        """The cell's settings in words."""
        return cell_label(self.env)

    @property
    def row_label(self) -> str:
        """The label a table shows: the settings, and the rung of a pruned row (a search
        measures the baseline in every rung, so its rows differ only by rung)."""
        return self.label + ("" if self.final or self.rung is None else f" [rung {self.rung}]")

    @property
    def observed_effective(self) -> dict | None:
        """What NCCL reported it ran, where NCCL ran (its provenance observes NCCL); None
        for simulated, modelled and gloo records, whose `effective` no NCCL chose."""
        if self.provenance is not None and not self.provenance.observes_nccl:
            return None
        return self.effective

    def to_dict(self, with_samples: bool = False) -> dict:
        """JSON-ready form (per-iteration samples left out unless asked for); `effective`
        only as NCCL reported it (`observed_effective`), with the `provenance`."""
        out = asdict(self)
        if not with_samples:
            out.pop("samples_us")
        out["label"] = self.label
        out["effective"] = self.observed_effective
        out["provenance"] = self.provenance.value if self.provenance else None
        return out


def _hosts(record: dict) -> tuple[str, ...]:
    hosts = record.get("hosts")
    if isinstance(hosts, list) and hosts:
        return tuple(sorted({str(h) for h in hosts}))
    return (record["host"],) if record.get("host") else ()


def _gpu_models(record: dict) -> tuple[str, ...]:
    gpus = record.get("gpus")
    return tuple(sorted({str(g) for g in gpus if g})) if isinstance(gpus, list) else ()


def _topology(record: dict) -> str | None:
    topo = record.get("topology")
    if isinstance(topo, dict):
        topo = topo.get("kind")
    return str(topo) if topo else None


def machine_identity(record: dict, known_gpus: dict | None = None) -> tuple:
    """What tells the machine of a record apart: (hosts, GPU models, topology), or the
    source file for nccl-tests output that names no host.

    `known_gpus` maps (hosts, topology) to the GPU models seen with them: a record that
    lacks GPU names (a failed cell's filler record, say) joins the one set of models
    recorded for its host, so a failure is listed beside the cells that ran.
    """
    hosts, topo = _hosts(record), _topology(record)
    if not hosts and record.get("backend") == "nccl-tests" and record.get("source_file"):
        return ("file", record["source_file"])
    gpus = _gpu_models(record)
    if not gpus and known_gpus is not None:
        seen = known_gpus.get((hosts, topo), set())
        if len(seen) == 1:
            gpus = next(iter(seen))
    return ("machine", hosts, gpus, topo)


def describe_machine(identity: tuple) -> str:
    """A machine identity in words: 'file X' or 'host h1 (NVIDIA H100), topology nvlink'."""
    if identity[0] == "file":
        return f"file {identity[1]}"
    _, hosts, gpus, topo = identity
    if not hosts:
        text = "host unknown"
    elif len(hosts) > 3:
        text = f"hosts {', '.join(hosts[:3])} and {len(hosts) - 3} more"
    else:
        text = ("host " if len(hosts) == 1 else "hosts ") + ", ".join(hosts)
    if gpus:
        text += f" ({', '.join(gpus)})"
    if topo:
        text += f", topology {topo}"
    return text


def _known_gpus(records: list[dict]) -> dict:
    known: dict[tuple, set] = {}
    for r in records:
        gpus = _gpu_models(r)
        if gpus:
            known.setdefault((_hosts(r), _topology(r)), set()).add(gpus)
    return known


def _key(record: dict, known_gpus: dict | None = None) -> tuple:
    return (
        record.get("op") or "allreduce",
        int(record.get("bytes") or 0),
        record.get("world_size"),
        record.get("nnodes"),
        record.get("backend"),
        record.get("mode"),
        record.get("dtype"),
        machine_identity(record, known_gpus),
        record.get("redop"),
    )  # max and min at one size are not one cell


def _status(records: list[dict]) -> str:
    statuses = Counter(r.get("status") or "ok" for r in records)
    if statuses.get("wrong") or any(r.get("correct") is False for r in records):
        return "wrong"
    for bad in ("failed", "timeout"):
        if statuses.get(bad):
            return bad
    return "ok"


def _confirmed(records: list[dict]) -> tuple[bool | None, dict | None]:
    observed = [r.get("effective") for r in records if isinstance(r.get("effective"), dict)]
    if not observed:
        return None, None
    flags = [e.get("confirmed") for e in observed]
    if any(f is False for f in flags):
        verdict = False
    elif flags and all(f is True for f in flags):
        verdict = True
    else:
        verdict = None
    common = Counter((e.get("algo"), e.get("proto"), e.get("channels")) for e in observed)
    algo, proto, channels = common.most_common(1)[0][0]
    return verdict, {"algo": algo, "proto": proto, "channels": channels}


def _round_p50s(records: list[dict]) -> list[tuple[int, float]]:
    by_round: dict[int, list[float]] = {}
    for r in records:
        lat = r.get("lat_us") or {}
        if lat.get("p50") is None:
            continue
        by_round.setdefault(int(r.get("round") or 0), []).append(float(lat["p50"]))
    return sorted((rnd, float(np.median(v))) for rnd, v in by_round.items())


def _pooled(records: list[dict]) -> list[float]:
    samples: list[float] = []
    for r in records:
        samples.extend(float(x) for x in (r.get("samples_us") or []))
        if not r.get("samples_us") and (r.get("lat_us") or {}).get("p50") is not None:
            samples.append(float(r["lat_us"]["p50"]))
    if len(samples) > MAX_POOLED_SAMPLES:
        idx = np.linspace(0, len(samples) - 1, MAX_POOLED_SAMPLES).astype(int)
        samples = [samples[i] for i in idx]
    return samples


def summarize_group(records: list[dict], confidence: float = 0.95, seed: int = 0) -> CellSizeSummary:
    """Summary of the records of one (cell, op, bytes, world, backend), baseline not applied."""
    first = records[0]
    ok = [r for r in records if (r.get("status") or "ok") == "ok"]
    rounds = _round_p50s(ok)
    p50s = [p for _, p in rounds]
    samples = _pooled(ok)
    p50 = ci = basis = None
    if len(p50s) >= MIN_ROUNDS_FOR_ROUND_CI and min(p50s) > 0:
        # on the log scale: a latency interval never reaches below zero (stats.positive_ci)
        _, lo, hi = stats.positive_ci(p50s, confidence)
        p50, ci, basis = float(np.median(p50s)), (lo, hi), "rounds"
    elif samples:
        # The pooled median: the statistic the bootstrap interval (and the difference to
        # the baseline) is about. A median of one or two round p50s can lie outside it.
        p50 = float(np.median(samples))
        if len(samples) > 1:  # one value (an imported average, say) has no interval
            ci = stats.bootstrap_ci(samples, confidence=confidence, n_boot=1000, seed=seed)
            basis = "iterations"
    confirmed, effective = _confirmed(ok)
    errors = sorted({str(r["error"]) for r in records if r.get("error")})
    return CellSizeSummary(
        cell=first.get("cell") or BASELINE,
        env=dict(first.get("env") or {}),
        op=first.get("op") or "allreduce",
        bytes=int(first.get("bytes") or 0),
        world_size=first.get("world_size"),
        backend=first.get("backend"),
        status=_status(records),
        n_rounds=len(rounds),
        round_p50s=p50s,
        p50_us=p50,
        ci_us=ci,
        ci_basis=basis,
        confirmed=confirmed,
        effective=effective,
        errors=errors,
        final=all(r.get("final", True) is not False for r in records),
        samples_us=samples,
        mode=first.get("mode"),
        dtype=first.get("dtype"),
        redop=first.get("redop"),
        machine=describe_machine(machine_identity(first, _known_gpus(records))),
        provenance=provenance_of(first),
    )


def _delta(
    cell: CellSizeSummary,
    base: CellSizeSummary,
    cell_records: list[dict],
    base_records: list[dict],
    confidence: float,
    seed: int,
):
    cell_rounds = dict(_round_p50s([r for r in cell_records if (r.get("status") or "ok") == "ok"]))
    base_rounds = dict(_round_p50s([r for r in base_records if (r.get("status") or "ok") == "ok"]))
    shared = sorted(set(cell_rounds) & set(base_rounds))
    if len(shared) >= MIN_ROUNDS_FOR_ROUND_CI:
        a, b = [cell_rounds[r] for r in shared], [base_rounds[r] for r in shared]
        return (*stats.paired_t_ci(a, b, confidence), _paired_t_p(a, b))
    if len(cell_rounds) >= MIN_ROUNDS_FOR_ROUND_CI and len(base_rounds) >= MIN_ROUNDS_FOR_ROUND_CI:
        a, b = list(cell_rounds.values()), list(base_rounds.values())
        return (*stats.welch_t_ci(a, b, confidence), _welch_p(a, b))
    if cell.samples_us and base.samples_us and min(len(cell.samples_us), len(base.samples_us)) < 2:
        # One value a side (imported averages, say): a difference, but no interval.
        return float(np.median(cell.samples_us) - np.median(base.samples_us)), None, None, None
    if cell.samples_us and base.samples_us:
        return (
            *stats.bootstrap_diff_ci(cell.samples_us, base.samples_us, confidence=confidence, n_boot=1000, seed=seed),
            stats.mann_whitney_p(cell.samples_us, base.samples_us),
        )
    return None


def _paired_t_p(a: list[float], b: list[float]) -> float:
    from scipy.stats import ttest_1samp

    diffs = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    if np.allclose(diffs, diffs[0]):  # no spread: a sure difference, or none
        return 1.0 if diffs[0] == 0 else 0.0
    return float(ttest_1samp(diffs, 0.0).pvalue)


def _welch_p(a: list[float], b: list[float]) -> float:
    from scipy.stats import ttest_ind

    if np.std(a) == 0 and np.std(b) == 0:
        return 1.0 if np.mean(a) == np.mean(b) else 0.0
    return float(ttest_ind(a, b, equal_var=False).pvalue)


ADJUSTMENTS = ("bh", "bonferroni", "none")


def adjust_p(pvalues: list[float], method: str = "bh") -> list[float]:
    """p-values adjusted for a family of comparisons: Benjamini-Hochberg, Bonferroni or none."""
    if method not in ADJUSTMENTS:
        raise ValueError(f"unknown adjustment '{method}' (known: {', '.join(ADJUSTMENTS)})")
    count = len(pvalues)
    if method == "none" or count <= 1:
        return list(pvalues)
    if method == "bonferroni":
        return [min(1.0, p * count) for p in pvalues]
    order = sorted(range(count), key=lambda i: pvalues[i])
    adjusted = [0.0] * count
    running = 1.0
    for rank in range(count, 0, -1):  # step-up: from the largest p-value down
        index = order[rank - 1]
        running = min(running, pvalues[index] * count / rank)
        adjusted[index] = running
    return adjusted


def observation_flag(summary) -> str | None:
    """Why a cell's requested settings cannot be trusted to have run, or None.

    NCCL records (and imports) whose log did not confirm the requested settings are
    flagged; the baseline requests nothing; gloo and sim observe nothing by nature (their
    provenance says so) and say so elsewhere.
    """
    if not summary.env or (summary.provenance is not None and not summary.provenance.observes_nccl):
        return None
    if summary.confirmed is False:
        return "contradicted: NCCL's log shows other settings than requested"
    if summary.confirmed is None:
        return "unverified: the requested settings were not seen in NCCL's log"
    return None


def report_notes(summaries: list[CellSizeSummary]) -> list[str]:
    """The lines a report starts with: simulated results, gloo's noise, a missing baseline."""
    backends = {s.backend for s in summaries}
    notes = []
    if "sim" in backends:
        notes.append(SIMULATED_BANNER)
    if "gloo" in backends:
        notes.append(GLOO_NOTE)
    if not any(s.cell == BASELINE for s in summaries):
        notes.append("no baseline records: no differences or verdicts can be given")
    return notes


VALIDATE_OP = "spec_decode"  # integration.validate's records: decode tok/s, not latencies
VALIDATE_HINT = (
    "validate records (op spec_decode: decode tok/s per configuration, not collective "
    "latencies); nccl-tune validate prints their comparison when it runs (--json for "
    "all of it); report and recommend --results read latency records from nccl-tune "
    "bench, sweep or import-nccl-tests"
)


def latency_records(records: list[dict], warn=None) -> list[dict]:
    """The collective-latency records among `records`; validate's (op spec_decode) are set
    aside with one warning naming what they are, and a file of nothing else is refused
    (NcclTuneError) instead of summarised as an empty table."""
    from nccl_tune.errors import NcclTuneError

    kept = [r for r in records if r.get("op") != VALIDATE_OP]
    dropped = len(records) - len(kept)
    if dropped and not kept:
        raise NcclTuneError(f"these are {VALIDATE_HINT}")
    if dropped and warn:
        warn(f"{dropped} {VALIDATE_HINT.split(';')[0]} left out")
    return kept


def shown_rungs(cells: dict[tuple, list[dict]]) -> dict[tuple, list[dict]]:
    """Which (cell, rung) groups of one family a report shows; rung None = final records.

    A search measures a cell in several rungs: a finalist is shown by its final records
    only (not again as pruned), a pruned cell by the rung where it was dropped (its last),
    and the baseline, measured in every rung, in its final rung and in each rung where a
    shown pruned cell was dropped, labelled by rung, so no two rows look alike.
    """
    final = {cell for cell, rung in cells if rung is None}
    last: dict[str, int] = {}
    for cell, rung in cells:
        if rung is not None and cell not in final:
            last[cell] = max(last.get(cell, rung), rung)
    pruned_rungs = {rung for cell, rung in last.items() if cell != BASELINE}
    if BASELINE in last and not pruned_rungs:  # only the baseline stopped early: show it
        pruned_rungs = {last[BASELINE]}
    out = {}
    for (cell, rung), recs in cells.items():
        if rung is None or (cell == BASELINE and rung in pruned_rungs) or (cell != BASELINE and last.get(cell) == rung):
            out[(cell, rung)] = recs
    return out


def summarize(
    records: list[dict], confidence: float = 0.95, seed: int = 0, adjust: str = "bh"
) -> list[CellSizeSummary]:
    """Summaries of every (cell, size) group, each compared with its baseline.

    Only final records are compared (see module doc); groups made only of non-final
    records come back with `final=False` and no verdict. Verdicts are adjusted for the
    number of cells compared at each size (`adjust`: "bh", "bonferroni" or "none").
    Records are compared only within one (op, size, world, nodes, backend, mode, dtype,
    machine, redop) family (see module doc). Order: by op, world, backend, machine, mode,
    dtype, bytes, then baseline first and cells by p50.
    """
    # The reader's field rules (store.field_problem) also guard records handed over in
    # memory, so nothing downstream needs its own checks of sizes and latencies.
    kept = [r for r in records if not r.get("superseded") and store.field_problem(r) is None]
    known = _known_gpus(kept)
    groups: dict[tuple, dict[tuple, list[dict]]] = {}
    for r in kept:
        final = r.get("final", True) is not False
        cell = (r.get("cell") or BASELINE, None if final else int(r.get("rung") or 0))
        groups.setdefault(_key(r, known), {}).setdefault(cell, []).append(r)
    out: list[CellSizeSummary] = []

    def order(k):  # collective, size, then the family's fields, machine by its description
        return (k[0], k[2] or 0, str(k[4]), describe_machine(k[7]), str(k[5]), str(k[6]), k[1], str(k[8]))

    for key in sorted(groups, key=order):
        cells = shown_rungs(groups[key])
        machine = describe_machine(key[7])
        base_records = cells.get((BASELINE, None))
        base = summarize_group(base_records, confidence, seed) if base_records else None
        if base is not None:
            base.machine = machine
        rows, compared = [], []
        for cell_key, recs in cells.items():
            summary = base if cell_key == (BASELINE, None) else summarize_group(recs, confidence, seed)
            summary.machine = machine
            summary.rung = cell_key[1]
            if (
                cell_key[0] != BASELINE
                and summary.final
                and base is not None
                and summary.status == "ok"
                and base.status == "ok"
                and summary.p50_us is not None
            ):
                delta = _delta(summary, base, recs, base_records, confidence, seed)
                if delta is not None:
                    summary.delta_us, lo, hi, summary.p_value = delta
                    if lo is not None:
                        summary.delta_ci_us = (lo, hi)
                        compared.append(summary)
            rows.append(summary)
        alpha = 1 - confidence
        for summary, p_adj in zip(compared, adjust_p([s.p_value for s in compared], adjust)):
            summary.p_adjusted = p_adj
            lo, hi = summary.delta_ci_us
            raw = stats.verdict(lo, hi)
            summary.verdict = raw if (raw == stats.NO_DIFFERENCE or p_adj < alpha) else stats.NO_DIFFERENCE
        rows.sort(
            key=lambda s: (
                not s.final,
                s.rung or 0,
                s.cell != BASELINE,
                s.status != "ok",
                s.p50_us if s.p50_us is not None else float("inf"),
            )
        )
        out.extend(rows)
    return out
