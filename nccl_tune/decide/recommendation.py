"""Which NCCL settings to run: cells ranked by time saved per token, and the pick.

From results records (measured, or simulated by the sweep's `sim` backend) or, with no
results, from the analytical cost model (modelled). Rules (issue "recommend"):

- a cell's saving per token is baseline minus cell collectives time at the decode size,
  with an interval carried from the rounds (nccl_tune.model.per_token.estimate_saving);
- the recommended cell has the largest saving whose interval excludes zero; with none,
  keep NCCL's defaults;
- ties go to the cell that sets fewer variables: a cell is tied with the best when the
  paired per-round difference of their savings has an interval that includes zero (or,
  without shared rounds, when its interval reaches the best's saving); modelled savings
  within TIE_FRACTION of each other are ties;
- cells whose records are wrong, failed or timed out, whose NCCL log contradicts the
  requested settings, that are not final (pruned early in a search), or whose settings
  do not lint clean are never recommended; cells measured without NCCL's log are
  recommended as "declared", not "confirmed";
- the trust word follows the records' provenance (nccl_tune.vocab.Provenance): only where
  NCCL ran is a cell confirmed, contradicted or declared; simulated, modelled and gloo
  cells say what they are.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from nccl_tune import stats
from nccl_tune.decide.report import GLOO_NOTE, latency_records
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar
from nccl_tune.model import costmodel
from nccl_tune.model.per_token import (
    LatencyCurve,
    OutOfRangeError,
    SavingEstimate,
    estimate_saving,
    projected_tok_s,
    projected_tok_s_interval,
)
from nccl_tune.nccl import settings
from nccl_tune.store import BASELINE, cell_label
from nccl_tune.vocab import Provenance, provenance_of

MEASURED, MODELLED, SIMULATED = "measured", "modelled", "simulated"
TIE_FRACTION = 0.02  # modelled savings this close (relative) count as a tie
MIN_MODELLED_FRACTION = 0.01  # a modelled saving below 1% of the baseline's comm time is none
BACKEND_PREFERENCE = ("nccl", "nccl-tests", "gloo", "sim")
STATUS_ORDER = ("ok", "timeout", "failed", "wrong")  # worse to the right

# Settings the embedded (modelled) default compares with NCCL's defaults. LL128 is left
# out: forcing it skips NCCL's safety checks (DESIGN.md section 5).
PUBLIC_REPORT_PROFILE = {
    "NCCL_PROTO": "LL",
    "NCCL_ALGO": "Ring",
    "NCCL_P2P_LEVEL": "SYS",
    "NCCL_MAX_NCHANNELS": "16",
    "NCCL_BUFFSIZE": "16777216",
    "NCCL_NTHREADS": "512",
}
MODELLED_CANDIDATES = (
    {"NCCL_P2P_LEVEL": "SYS"},
    {"NCCL_PROTO": "LL"},
    {"NCCL_PROTO": "Simple"},
    {"NCCL_ALGO": "Ring"},
    {"NCCL_ALGO": "Tree"},
    {"NCCL_PROTO": "LL", "NCCL_ALGO": "Ring"},
    {"NCCL_NTHREADS": "512"},
    {"NCCL_MAX_NCHANNELS": "16"},
    PUBLIC_REPORT_PROFILE,
)


@dataclass
class CellRow:
    """One cell's figures at the decode size and whether it may be recommended."""

    cell: str
    env: dict
    status: str = "ok"
    confirmed: bool | None = None
    final: bool = True
    effective: dict | None = None
    latency_us: float | None = None  # one collective at the decode size
    comm_ms: float | None = None  # collectives per token x latency
    saving: SavingEstimate | None = None
    projected_tok_s: float | None = None
    projected_ci: tuple[float, float] | None = None
    projected_range: tuple[float, float] | None = None  # modelled: over published machines
    # Modelled rows: the range of latency_us (published machines of the kind, or a fit's own
    # error) and whether latency_us comes from a fit of this machine (None: measured row).
    latency_range: tuple[float, float] | None = None
    calibrated: bool | None = None
    verdict: str = ""
    eligible: bool = False
    reason: str | None = None  # why it is not recommended
    errors: list = field(default_factory=list)
    curve: LatencyCurve | None = field(default=None, repr=False)
    records: list | None = field(default=None, repr=False)  # final records (measured cells)
    modelled: bool = False  # figures from the cost model, not from records
    provenance: Provenance | None = None  # of its records (None: modelled, or not yet known)

    @property
    def label(self) -> str:
        """The settings in words."""
        return cell_label(self.env)

    @property
    def n_vars(self) -> int:
        """How many variables the cell sets."""
        return len(self.env)

    @property
    def trust(self) -> str:
        """Where NCCL ran: confirmed (its log showed the settings), contradicted or declared
        (unseen); else the provenance itself: modelled, simulated, measured on gloo. The one
        word the table, --json and the export all print (Provenance.trust)."""
        if self.modelled:
            return Provenance.MODELLED.trust(None)
        return (self.provenance or Provenance.NCCL).trust(self.confirmed)

    def to_dict(self) -> dict:
        """JSON-ready form (the issue's field names)."""
        saving = self.saving
        return {
            "cell": self.cell,
            "env": self.env,
            "label": self.label,
            "status": self.status,
            "trust": self.trust,
            "final": self.final,
            "effective": self.effective,
            "latency_us": self.latency_us,
            "comm_ms_per_token": self.comm_ms,
            "saving_ms_per_token": saving.saving_ms if saving else None,
            "saving_ci_ms": list(saving.ci_ms) if saving and saving.ci_ms else None,
            "ci_basis": saving.basis if saving else None,
            "n_rounds": saving.n_rounds if saving else None,
            "extrapolated": saving.extrapolated if saving else False,
            "projected_tok_s": self.projected_tok_s,
            "projected_tok_s_ci": list(self.projected_ci) if self.projected_ci else None,
            "projected_tok_s_range": list(self.projected_range) if self.projected_range else None,
            "latency_range_us": ([round(v, 2) for v in self.latency_range] if self.latency_range else None),
            "calibrated": self.calibrated,
            "verdict": self.verdict,
            "eligible": self.eligible,
            "reason": self.reason,
            "errors": self.errors,
        }


@dataclass
class Analysis:
    """Everything `recommend` prints, exports and plots."""

    source: str  # measured | modelled | simulated
    message_bytes: int
    collectives: int
    baseline: CellRow
    cells: list[CellRow]  # ranked, baseline excluded
    pruned: list[CellRow] = field(default_factory=list)
    recommended: CellRow | None = None
    world_size: int | None = None
    backend: str | None = None
    topology: str | None = None
    topology_note: str | None = None
    nccl_version: str | None = None
    gpus: str | None = None
    host: str | None = None
    measured_at: str | None = None
    notes: list[str] = field(default_factory=list)
    summaries: list = field(default_factory=list, repr=False)  # report.CellSizeSummary, measured
    # Cells compared with the baseline and the per-cell confidence that keeps the family's
    # error rate at the requested level (Bonferroni): picking the largest of k savings
    # would otherwise find a "winner" among equal cells most of the time.
    family_size: int = 1
    cell_confidence: float | None = None
    confidence: float = 0.95  # the family-wise level asked for
    provenance: Provenance = Provenance.MODELLED  # of the records (vocab.provenance_of)

    def saving_ms_at(self, row: CellRow, nbytes: int, extrapolate: bool = False) -> float:
        """ms per forward `row` saves against the baseline at `nbytes`, by the estimator of
        the table: for measured cells model.estimate_saving on the records (paired by round
        where possible), so the speculative plan's plain decoding under a cell matches the
        table's projection; for modelled ones the curves' difference (as the table).
        OutOfRangeError outside the measured sizes without `extrapolate`."""
        if row.records is not None and self.baseline.records is not None:
            estimate = estimate_saving(
                self.baseline.records, row.records, nbytes, self.collectives, extrapolate, self.cell_confidence or 0.95
            )
            if estimate is not None:
                return estimate.saving_ms
        base = self.baseline.curve.at(nbytes, extrapolate)
        return self.collectives * (base - row.curve.at(nbytes, extrapolate)) / 1000.0

    def to_dict(self) -> dict:
        """JSON-ready form."""
        rec = self.recommended
        return {
            "source": self.source,
            "provenance": self.provenance.value,
            "message_bytes": self.message_bytes,
            "collectives_per_token": self.collectives,
            "world_size": self.world_size,
            "backend": self.backend,
            "topology": self.topology,
            "topology_note": self.topology_note,
            "nccl_version": self.nccl_version,
            "gpus": self.gpus,
            "recommended": rec.to_dict() if rec else None,
            "keep_defaults": rec is None,
            "baseline": self.baseline.to_dict(),
            "cells": [c.to_dict() for c in self.cells],
            "pruned": [c.to_dict() for c in self.pruned],
            "notes": self.notes,
            "family_size": self.family_size,
            "cell_confidence": self.cell_confidence,
        }


# ---------------------------------------------------------------- shared helpers


def source_words(analysis: Analysis) -> str:
    """The source in words for exported headers: the provenance ('measured with NCCL',
    'measured on gloo', 'imported', 'simulated', 'modelled'). gloo says why it matters:
    its figures say nothing about NCCL settings."""
    if analysis.provenance is Provenance.GLOO:
        return f"{Provenance.GLOO.value} (NCCL settings do not affect gloo: differences are noise)"
    return analysis.provenance.value


def trust_words(row: CellRow) -> str:
    """The trust of a recommended cell in words, from its provenance: what NCCL's log said
    where NCCL ran, and why nothing can confirm it where it did not."""
    words = {
        "confirmed": "confirmed by NCCL log",
        "contradicted": "contradicted by NCCL log",
        "declared": "declared, not confirmed by NCCL log",
        Provenance.SIMULATED.value: "simulated: nothing ran, so no NCCL log confirms it",
        Provenance.MODELLED.value: "modelled: nothing ran, so no NCCL log confirms it",
        Provenance.GLOO.value: "measured on gloo: NCCL settings do not apply there",
    }
    return words.get(row.trust, row.trust)


def short_label(label: str) -> str:
    """A cell's label without the NCCL_ prefixes (tables and plots)."""
    return " ".join(part[5:] if part.startswith("NCCL_") else part for part in label.split(" "))


def check_tok_s(analysis: Analysis, baseline_tok_s: float | None) -> str | None:
    """A note when the baseline's collectives alone take longer per token than the whole
    token does at --baseline-tok-s: the latencies (or the layer count, world, message
    size) do not describe that server, so its projections mean nothing."""
    comm = analysis.baseline.comm_ms
    if not baseline_tok_s or comm is None:
        return None
    whole = 1000.0 / baseline_tok_s
    if comm <= whole:
        return None
    note = (
        f"IMPLAUSIBLE: the baseline's collectives take {comm:.1f} ms per token, more than the "
        f"whole {whole:.1f} ms per token at --baseline-tok-s {baseline_tok_s:g}: these "
        "latencies (or --layers, the world size, the message size) do not describe that "
        "server; the projected tok/s mean nothing"
    )
    analysis.notes.append(note)
    return note


def lint_problems(env: dict[str, str]) -> list[str]:
    """Findings (errors and warnings) that keep a profile from linting clean: first what
    the profile grammar refuses (a cell whose recorded env holds LD_PRELOAD, a value
    bash would run), then the catalogue's value checks."""
    refused = grammar.env_problems(env)
    out = [f"{key}: {why}" if key else why for key, why in refused]
    bad = {key for key, _ in refused}
    for key, value in env.items():
        if key not in bad:
            out += [f"{key}: {msg}" for _, msg in settings.check_value(key, str(value))]
    return out


def ci_words(analysis: Analysis, confidence: float = 0.95) -> str:
    """'98.33% CI': the per-cell level the intervals were computed at (Bonferroni-widened
    when several cells were compared with the baseline), else the requested level."""
    level = analysis.cell_confidence if analysis.cell_confidence is not None else confidence
    return f"{100 * level:.4g}% CI"


def family_words(analysis: Analysis, confidence: float = 0.95) -> str:
    """' (family-wise 95%, Bonferroni over k cells)' when k > 1 cells were compared, else ''."""
    if analysis.family_size > 1 and analysis.cell_confidence is not None:
        return f" (family-wise {100 * confidence:.4g}%, Bonferroni over {analysis.family_size} cells)"
    return ""


def export_row(analysis: Analysis, force: bool) -> tuple[CellRow | None, str | None, str | None]:
    """(row to write, why it is forced, why nothing is written)."""
    rec = analysis.recommended
    if rec is not None and analysis.source == MEASURED:
        return rec, None, None
    if rec is not None:
        if not force:
            return (
                None,
                None,
                (
                    f"not written: the recommendation is {analysis.source}, not measured "
                    "(pass --force to write it anyway; its header says so)"
                ),
            )
        return rec, f"{analysis.source} figures, written with --force", None
    if not force:
        return None, None, ("not written: no recommendation (keep NCCL's defaults; --force writes the best cell)")
    savers = [
        r for r in analysis.cells if r.status == "ok" and r.final and r.saving is not None and r.saving.saving_ms > 0
    ]
    candidates = [r for r in savers if r.confirmed is not False and not lint_problems(r.env)]
    if not candidates and savers:
        return (
            None,
            None,
            "not written: every cell that saves time is refused (its settings do not lint clean, "
            "or NCCL's log contradicts them: see 'why not')",
        )
    if not candidates:
        return None, None, "not written: no cell saves time, even without a significant interval"
    best = max(candidates, key=lambda r: r.saving.saving_ms)
    return best, "--force: this cell's saving is NOT significant (its interval includes zero)", None


def _fill_projection(row: CellRow, baseline_tok_s: float | None) -> None:
    if baseline_tok_s is None or row.saving is None:
        return
    try:
        row.projected_tok_s = projected_tok_s(baseline_tok_s, row.saving.saving_ms)
    except ValueError:
        row.projected_tok_s = None
    row.projected_ci = projected_tok_s_interval(baseline_tok_s, row.saving.ci_ms)


def _tied(best: CellRow, other: CellRow, modelled: bool) -> bool:
    a, b = best.saving, other.saving
    if modelled:
        return abs(a.saving_ms - b.saving_ms) <= TIE_FRACTION * abs(a.saving_ms)
    if a.per_round_ms and b.per_round_ms:
        same = stats.tied(a.per_round_ms, b.per_round_ms)  # the one tie rule (stats.tied)
        if same is not None:
            return same
    return b.ci_ms is not None and b.ci_ms[1] >= a.saving_ms


def pick(rows: list[CellRow], modelled: bool = False) -> CellRow | None:
    """The recommended row: the largest eligible saving, ties to fewer variables."""
    eligible = [r for r in rows if r.eligible]
    if not eligible:
        return None
    best = max(eligible, key=lambda r: r.saving.saving_ms)
    tied = [r for r in eligible if r is best or _tied(best, r, modelled)]
    return min(tied, key=lambda r: (r.n_vars, -r.saving.saving_ms))


def _rank(rows: list[CellRow]) -> list[CellRow]:
    def key(r: CellRow):
        saving = r.saving.saving_ms if r.saving else -math.inf
        return (not r.eligible, -saving, r.n_vars)

    return sorted(rows, key=key)


# ---------------------------------------------------------------- measured / simulated

WORLD_ONE = (
    "a world of one rank has no collectives: tensor parallelism over one GPU runs no "
    "allreduce, so NCCL settings save nothing"
)


def check_world(world, what: str) -> None:
    """NcclTuneError for a world of one rank (nothing to model or recommend)."""
    if world is not None and int(world) < 2:
        raise NcclTuneError(f"{what} {world}: {WORLD_ONE}; use the TP size the server runs (2 or more)")


def _choose_subset(records: list[dict], tp: int | None) -> tuple[list[dict], int, str, list[str]]:
    notes = []
    records = latency_records(records, notes.append)
    allreduce = [r for r in records if (r.get("op") or "allreduce") == "allreduce"]
    if not allreduce:
        raise NcclTuneError("the results hold no allreduce records")
    worlds = Counter(r.get("world_size") for r in allreduce)
    if tp is not None:
        if tp not in worlds:
            found = ", ".join(str(w) for w in sorted(worlds, key=lambda w: (w is None, w)))
            raise NcclTuneError(f"no results for world size {tp} (--tp); the results hold world size(s) {found}")
        world = tp
    elif len(worlds) > 1:
        found = ", ".join(str(w) for w in sorted(worlds, key=lambda w: (w is None, w)))
        raise NcclTuneError(f"the results hold several world sizes ({found}): choose one with --tp")
    else:
        world = next(iter(worlds))
    check_world(world, "the results' world size" if tp is None else "--tp")
    subset = [r for r in allreduce if r.get("world_size") == world]
    backends = Counter(r.get("backend") for r in subset)
    backend = next((b for b in BACKEND_PREFERENCE if b in backends), None) or backends.most_common(1)[0][0]
    if len(backends) > 1:
        others = ", ".join(sorted(str(b) for b in backends if b != backend))
        notes.append(f"using backend {backend}; records of {others} left out")
    return [r for r in subset if r.get("backend") == backend], world, backend, notes


def _worst_status(statuses) -> str:
    return max(statuses, key=lambda s: STATUS_ORDER.index(s) if s in STATUS_ORDER else 0)


def _describe_gpus(records: list[dict]) -> str | None:
    values = Counter()
    for r in records:
        gpus = r.get("gpus")
        if isinstance(gpus, list) and gpus:
            names = Counter(str(g.get("name") if isinstance(g, dict) else g) for g in gpus)
            values[", ".join(f"{n}x {name}" for name, n in names.items())] += 1
        elif gpus:
            values[str(gpus)] += 1
    return values.most_common(1)[0][0] if values else None


def _most_common(records: list[dict], getter) -> str | None:
    values = Counter(v for v in (getter(r) for r in records) if v)
    return str(values.most_common(1)[0][0]) if values else None


def analyze_records(
    records: list[dict],
    *,
    nbytes: int,
    collectives: int,
    tp: int | None = None,
    extrapolate: bool = False,
    baseline_tok_s: float | None = None,
    confidence: float = 0.95,
) -> Analysis:
    """Rank the cells of measured (or simulated) records at the decode size `nbytes`."""
    from nccl_tune.decide.report import summarize

    subset, world, backend, notes = _choose_subset(records, tp)
    final = [r for r in subset if r.get("final", True) is not False]
    by_cell: dict[str, list[dict]] = {}
    for r in final:
        by_cell.setdefault(r.get("cell") or BASELINE, []).append(r)
    if BASELINE not in by_cell and any(r.get("final", True) is False for r in subset):
        raise NcclTuneError(unfinished_search_message(subset, nbytes, collectives, extrapolate, confidence))
    if BASELINE not in by_cell:
        raise NcclTuneError(
            "the results hold no baseline (NCCL defaults) records for world size "
            f"{world}: a saving needs the defaults measured alongside the cells"
        )
    summaries = summarize(subset, confidence=confidence)
    rows: dict[str, CellRow] = {}
    pruned: dict[str, CellRow] = {}
    flags: dict[tuple[str, bool], list] = {}
    for s in summaries:
        target = rows if s.final else pruned
        row = target.setdefault(s.cell, CellRow(cell=s.cell, env=dict(s.env), final=s.final, provenance=s.provenance))
        row.status = _worst_status([row.status, s.status])
        row.errors = sorted(set(row.errors) | set(s.errors))
        flags.setdefault((s.cell, s.final), []).append(s.confirmed)
        if s.observed_effective and (s.bytes == nbytes or row.effective is None):
            row.effective = s.observed_effective  # what NCCL reported; never a simulated choice
    for (cell, is_final), seen in flags.items():
        row = (rows if is_final else pruned)[cell]
        row.confirmed = False if any(f is False for f in seen) else True if all(f is True for f in seen) else None
    for cell_rows in (rows, pruned):
        for row in cell_rows.values():
            _fill_curve(row, summaries, nbytes, collectives, extrapolate)
    for cell in [c for c in pruned if c in rows]:
        pruned.pop(cell)  # a cell with final records is judged on those
    base_records = by_cell[BASELINE]
    baseline = rows.pop(BASELINE)
    baseline.records = base_records
    for row in rows.values():
        row.records = by_cell.get(row.cell, [])
    if baseline.status != "ok":
        raise NcclTuneError(f"the baseline cell's records are {baseline.status}: nothing can be compared with it")
    if baseline.latency_us is None:
        raise NcclTuneError(
            f"the baseline was not measured at or around {nbytes} B "
            "(pass --extrapolate to extrapolate from the measured sizes)"
        )
    family = max(1, sum(1 for row in rows.values() if row.status == "ok"))
    cell_confidence = 1 - (1 - confidence) / family
    for row in rows.values():
        _judge_measured(
            row,
            base_records,
            by_cell.get(row.cell, []),
            nbytes,
            collectives,
            extrapolate,
            cell_confidence,
            baseline_tok_s,
        )
    for row in pruned.values():
        row.verdict, row.reason = "pruned", "not final (an early rung of a search)"
    ranked = _rank(list(rows.values()))
    source = SIMULATED if backend == "sim" else MEASURED
    analysis = Analysis(
        source=source,
        message_bytes=nbytes,
        collectives=collectives,
        baseline=baseline,
        cells=ranked,
        pruned=list(pruned.values()),
        world_size=world,
        backend=backend,
        notes=notes,
        summaries=summaries,
        family_size=family,
        cell_confidence=cell_confidence,
        confidence=confidence,
        provenance=provenance_of(subset[0]),
    )
    if backend == "gloo":
        analysis.notes.append(GLOO_NOTE)
    analysis.recommended = pick(ranked)
    analysis.nccl_version = _most_common(subset, lambda r: (r.get("versions") or {}).get("nccl"))
    analysis.gpus = _describe_gpus(subset)
    analysis.host = _most_common(subset, lambda r: r.get("host"))
    analysis.topology = _most_common(
        subset,
        lambda r: r.get("topology") if isinstance(r.get("topology"), str) else (r.get("topology") or {}).get("kind"),
    )
    analysis.measured_at = _most_common(subset, lambda r: r.get("time"))
    if any(row.saving and row.saving.extrapolated for row in ranked) or baseline.verdict == "extrapolated":
        analysis.notes.append(
            f"{nbytes} B lies outside the measured sizes: latencies there are EXTRAPOLATED (--extrapolate)"
        )
    check_tok_s(analysis, baseline_tok_s)
    return analysis


MAX_PRUNED_NAMED = 3


def unfinished_search_message(
    subset: list[dict], nbytes: int, collectives: int, extrapolate: bool, confidence: float
) -> str:
    """One line for results whose search stopped before its final rung (every record
    `final: false`): what happened, what to do, the best pruned cells; nothing is picked."""
    from nccl_tune.decide.report import summarize

    summaries = [s for s in summarize(subset, confidence=confidence) if not s.final]
    rows: dict[str, CellRow] = {}
    for s in summaries:
        rows.setdefault(s.cell, CellRow(cell=s.cell, env=dict(s.env), final=False))
    for row in rows.values():
        _fill_curve(row, summaries, nbytes, collectives, extrapolate)
    base = rows.pop(BASELINE, None)
    measured = sorted((r for r in rows.values() if r.latency_us is not None), key=lambda r: r.latency_us)
    text = (
        "the search never reached its final rung (every record is final: false, from an early "
        "rung): resume it with a larger --budget (the same nccl-tune sweep command and --out); "
        "nothing is recommended"
    )
    if measured:
        best = ", ".join(f"{r.label} ({r.latency_us:.2f} us)" for r in measured[:MAX_PRUNED_NAMED])
        against = (
            f" against the baseline's {base.latency_us:.2f} us"
            if base is not None and base.latency_us is not None
            else ""
        )
        sim = " (simulated)" if any(r.get("backend") == "sim" for r in subset) else ""
        text += f"; best pruned cells at {nbytes} B{sim}: {best}{against}"
    return text


def _fill_curve(row: CellRow, summaries, nbytes: int, collectives: int, extrapolate: bool) -> None:
    points = [
        (s.bytes, s.p50_us)
        for s in summaries
        if s.cell == row.cell and s.final == row.final and s.status == "ok" and s.p50_us is not None
    ]
    if not points:
        return
    row.curve = LatencyCurve.from_points(points, label=row.label)
    try:
        row.latency_us = row.curve.at(nbytes, extrapolate)
    except OutOfRangeError:
        return
    if not row.curve.covers(nbytes):
        row.verdict = "extrapolated"
    row.comm_ms = collectives * row.latency_us / 1000.0


def _judge_measured(
    row: CellRow, base_records, cell_records, nbytes, collectives, extrapolate, confidence, baseline_tok_s
) -> None:
    if row.status != "ok":
        row.verdict, row.reason = row.status, f"records are {row.status}"
        return
    try:
        row.saving = estimate_saving(base_records, cell_records, nbytes, collectives, extrapolate, confidence)
    except OutOfRangeError as exc:
        row.verdict, row.reason = "not measured", str(exc)
        return
    if row.saving is None:
        row.verdict, row.reason = "not measured", "no usable latency at the decode size"
        return
    _fill_projection(row, baseline_tok_s)
    if row.saving.ci_ms is None:
        row.verdict, row.reason = "no interval", "one value per size: no interval can be computed"
    else:
        lo, hi = row.saving.ci_ms
        row.verdict = stats.FASTER if lo > 0 else stats.SLOWER if hi < 0 else stats.NO_DIFFERENCE
        if row.verdict != stats.FASTER:
            row.reason = "interval includes zero" if row.verdict == stats.NO_DIFFERENCE else "slower"
    if row.reason is None and row.confirmed is False:
        row.reason = "NCCL's log contradicts the requested settings"
    if row.reason is None:
        problems = lint_problems(row.env)
        if problems:
            row.reason = "does not lint clean: " + "; ".join(problems)
    row.eligible = row.reason is None


# ---------------------------------------------------------------- modelled (embedded default)


def model_curve(
    env: dict[str, str], topology_name: str, nranks: int, sizes, params: costmodel.ModelParams | None = None
) -> LatencyCurve:
    """A latency curve from the cost model at `sizes` (bytes); `params`: a fitted model."""
    points = [(b, costmodel.latency_us(b, nranks, topology_name, env, params=params)) for b in sorted(set(sizes))]
    return LatencyCurve.from_points(points, label=f"model {topology_name}")


def default_model_sizes(extra=()) -> list[int]:
    """Powers of two from 256 B to 4 MiB plus the sizes a caller needs exactly."""
    return sorted({1 << p for p in range(8, 23)} | {int(b) for b in extra if b > 0})


def analyze_model(
    *,
    topology_name: str,
    nranks: int,
    nbytes: int,
    collectives: int,
    baseline_tok_s: float | None = None,
    candidates=MODELLED_CANDIDATES,
    extra_sizes=(),
    params: costmodel.ModelParams | None = None,
) -> Analysis:
    """The embedded default: NCCL's defaults against a few settings, all modelled
    (`params`: constants fitted by `model fit`; NCCL's own choice is kept)."""
    check_world(nranks, "--tp")
    sizes = default_model_sizes([nbytes, *extra_sizes])

    def row_for(env: dict) -> CellRow:
        from nccl_tune.store import cell_id

        curve = model_curve(env, topology_name, nranks, sizes, params)
        row = CellRow(cell=cell_id(env), env=dict(env), curve=curve, confirmed=None, modelled=True)
        row.latency_us = curve.at(nbytes)
        row.comm_ms = collectives * row.latency_us / 1000.0
        choice = costmodel.predict(
            "allreduce", nbytes, nranks, env, costmodel.topology(topology_name), params or costmodel.NCCL_PARAMS
        )
        row.effective = {
            "algo": choice.algo,
            "proto": choice.proto,
            "channels": choice.channels,
            "confirmed": None,
            "detail": f"modelled, transport {choice.link}",
        }
        row.calibrated = costmodel.is_calibrated(params, choice.algo, choice.proto)
        return row

    def uncalibrated_ms(row: CellRow) -> float:
        return collectives * costmodel.latency_us(nbytes, nranks, topology_name, row.env) / 1000.0

    baseline = row_for({})
    rows = []
    for env in candidates:
        row = row_for(env)
        saving = baseline.comm_ms - row.comm_ms
        if params is not None and not (row.calibrated and baseline.calibrated):
            # A fit says nothing of a pair it did not calibrate: compare like with like, the
            # uncalibrated model's own difference.
            saving = uncalibrated_ms(baseline) - uncalibrated_ms(row)
        row.saving = SavingEstimate(saving, None, None, 0)
        _fill_projection(row, baseline_tok_s)
        if saving > MIN_MODELLED_FRACTION * baseline.comm_ms:
            row.verdict = "faster (modelled)"
        elif saving < -MIN_MODELLED_FRACTION * baseline.comm_ms:
            row.verdict, row.reason = "slower (modelled)", "slower"
        else:
            row.verdict, row.reason = "no difference (modelled)", "no modelled saving"
        if row.reason is None:
            problems = lint_problems(row.env)
            row.reason = ("does not lint clean: " + "; ".join(problems)) if problems else None
        row.eligible = row.reason is None
        rows.append(row)
    ranked = _rank(rows)
    analysis = Analysis(
        source=MODELLED,
        message_bytes=nbytes,
        collectives=collectives,
        baseline=baseline,
        cells=ranked,
        world_size=nranks,
        backend=None,
        topology=topology_name,
    )
    analysis.recommended = pick(ranked, modelled=True)
    check_tok_s(analysis, baseline_tok_s)
    return analysis
