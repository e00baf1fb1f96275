"""Which tuner-plugin rules the exported cell gets: the decision the CSV export renders.

NCCL's example plugin runs every collective, size and communicator that no rule covers
on ONE channel (nccl_tune.nccl.tuner), so the rules tile every collective the plugin knows
from 0 to SIZE_MAX with an explicit channel count: the measured winner where measured
and significant, elsewhere NCCL's own choice under the profile's settings (seen in
NCCL's log where the cell was measured, else modelled); each row's origin says which.
`choose` makes the whole decision (or says why nothing is written);
nccl_tune.decide.export renders it with its header and writes it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from nccl_tune import store
from nccl_tune.decide.recommendation import MEASURED, MODELLED, Analysis, CellRow, ci_words, export_row, family_words
from nccl_tune.live import grammar
from nccl_tune.model import costmodel
from nccl_tune.nccl import settings, tuner
from nccl_tune.store import cell_label

# Sizes the model is asked about outside the measured ones: 1 B to 4 GiB (the last row
# runs on to SIZE_MAX with the 4 GiB choice).
MODEL_SIZES = tuple(1 << k for k in range(33))
MODELLED_FASTEST_UP_TO = 1 << 20  # a MODELLED recommendation is about decode sizes only
OTHER_OPS = ("all_gather", "reduce_scatter", "broadcast", "reduce")


def _env_single(env: dict, name: str, known) -> str | None:
    value = env.get(name)
    if not value or "," in value or "^" in value or ":" in value:
        return None
    return next((k for k in known if k.lower() == value.strip().lower()), None)


def _rule_confidence(analysis: Analysis) -> float:
    return analysis.cell_confidence if analysis.cell_confidence is not None else 0.95


def records_nnodes(analysis: Analysis, row: CellRow | None = None) -> int:
    """The node count of the communicator the records measured (most common; 1 if unknown)."""
    records = list(analysis.baseline.records or []) + list((row.records if row else None) or [])
    counts = Counter(r.get("nnodes") for r in records if isinstance(r.get("nnodes"), int))
    return counts.most_common(1)[0][0] if counts else 1


def _model_point(
    op: str, nbytes: int, nranks: int, env: dict, topo, topo_name: str, fastest: bool = False
) -> tuner.Point:
    """NCCL's own modelled choice (or, with `fastest`, the model's fastest) at `nbytes`."""
    pick = costmodel.fastest if fastest else costmodel.choose
    c = pick(op, nbytes, nranks, env, topo)
    words = "MODELLED fastest" if fastest else "NCCL's own choice, MODELLED"
    return tuner.Point(nbytes, c.algo, c.proto, c.channels, f"{words} for {topo_name}")


def _modelled_channels(nbytes: int, algo: str, proto: str, env: dict, topo, nranks: int) -> int:
    lo, hi = env.get("NCCL_MIN_NCHANNELS"), env.get("NCCL_MAX_NCHANNELS")
    if lo and lo == hi and lo.isdigit():
        return int(lo)
    pool = costmodel.channel_pool(topo, env)
    nt = costmodel.max_threads(algo, proto, costmodel.effective_link(topo, env), env)
    return costmodel.launch_shape(nbytes, algo, proto, pool, nt, nranks)[0]


def tuner_points(
    analysis: Analysis, topology_name: str, row: CellRow | None = None, forced: bool = False
) -> tuple[list[tuner.Point], list[str]]:
    """allreduce Points at every size the CSV needs, and header notes on how.

    The rules describe ONE cell, the one the .env profile exports (`row`; default the
    recommended cell), so the two files never disagree. Measured: at each measured size
    where that cell is faster than the baseline with an interval at recommend's per-cell
    (family-wise) level, the algorithm/protocol/channels NCCL reported running there
    (else the ones its settings force, else the model's), labelled "measured winner"; at
    measured sizes where it is not faster, NCCL's own choice under the cell's settings as
    NCCL's log showed it (else modelled). Outside the measured span, and for a MODELLED
    analysis everywhere, NCCL's modelled choice (a MODELLED recommendation's decode sizes
    up to 1 MiB take the model's fastest instead).
    """
    topo = costmodel.topology(topology_name)
    nranks = analysis.world_size or 8
    row = row if row is not None else analysis.recommended
    env = row.env if row is not None else {}
    notes: list[str] = []
    if analysis.source == MODELLED:
        points = [
            _model_point(
                "allreduce",
                b,
                nranks,
                env,
                topo,
                topology_name,
                fastest=row is not None and b <= MODELLED_FASTEST_UP_TO,
            )
            for b in MODEL_SIZES
        ]
        notes.append(f"algorithm, protocol and channels are MODELLED for {topology_name}, not measured")
        return points, notes
    level = _rule_confidence(analysis)
    by_size = (
        {}
        if row is None
        else {
            s.bytes: s
            for s in analysis.summaries
            if s.cell == row.cell and s.final and s.status == "ok" and s.p50_us is not None
        }
    )
    base_sizes = {s.bytes for s in analysis.summaries if s.cell == store.BASELINE and s.final}
    measured = sorted(set(by_size) & base_sizes)
    origin: dict[str, list[int]] = {
        "observed": [],
        "declared": [],
        "modelled": [],
        "modelled_channels": [],
        "not faster": [],
    }
    points: list[tuner.Point] = []
    # a simulated choice is the cost model's, never one NCCL was seen to make
    log = "NCCL's log" if analysis.source == MEASURED else "the sim backend's cost model (not observed)"
    win = "measured winner" if analysis.source == MEASURED else "SIMULATED winner"
    win += ", NOT significant (--force)" if forced else ""
    for nbytes in measured:
        eff = by_size[nbytes].effective or {}
        algo, proto, channels = eff.get("algo"), eff.get("proto"), eff.get("channels")
        if not _faster_at(analysis, row, nbytes, level, forced):
            origin["not faster"].append(nbytes)
            if (
                algo
                and proto
                and channels
                and not _check_allowed(
                    [tuner.Rule("allreduce", 0, 0, tuner.plugin_algorithm(algo), tuner.plugin_protocol(proto), 1)], env
                )
            ):
                points.append(
                    tuner.Point(nbytes, algo, proto, int(channels), f"not faster: NCCL's own choice, from {log}", True)
                )
            else:
                points.append(_model_point("allreduce", nbytes, nranks, env, topo, topology_name))
            continue
        how = log
        if algo and proto:
            origin["observed"].append(nbytes)
        else:
            algo = algo or _env_single(env, "NCCL_ALGO", settings.ALGORITHMS)
            proto = proto or _env_single(env, "NCCL_PROTO", settings.PROTOCOLS)
            if algo and proto:
                origin["declared"].append(nbytes)
                how = "forced by the settings"
            else:
                try:
                    guess = costmodel.choose("allreduce", nbytes, nranks, env, topo)
                except ValueError:
                    notes.append(f"{nbytes} B: {cell_label(env)} allows nothing the model knows")
                    continue
                origin["modelled"].append(nbytes)
                algo, proto, how = algo or guess.algo, proto or guess.proto, "algo/proto MODELLED"
        if _check_allowed(
            [tuner.Rule("allreduce", 0, 0, tuner.plugin_algorithm(algo), tuner.plugin_protocol(proto), 1)], env
        ):
            # NCCL would mark it IGNORE and the plugin skip the rule: the log contradicts
            # the settings, so the model's choice under them stands in.
            notes.append(
                f"{nbytes} B: the records report {algo}/{proto}, which "
                f"{cell_label(env)} disables: NCCL's modelled choice instead"
            )
            points.append(_model_point("allreduce", nbytes, nranks, env, topo, topology_name))
            continue
        if not channels:
            channels = _modelled_channels(nbytes, algo, proto, env, topo, nranks)
            origin["modelled_channels"].append(nbytes)
            how += ", channels MODELLED"
        points.append(tuner.Point(nbytes, algo, proto, int(channels), f"{win} ({how})", True))
    span = (measured[0], measured[-1]) if measured else None
    for nbytes in MODEL_SIZES:
        if span is None or not span[0] <= nbytes <= span[1]:
            try:
                points.append(_model_point("allreduce", nbytes, nranks, env, topo, topology_name))
            except ValueError:
                notes.append(f"allreduce {nbytes} B: {cell_label(env)} allows nothing the model knows")
    if row is not None and forced:
        notes.append(
            f"--force: rules describe one cell, the exported profile's: {cell_label(row.env)}; "
            "its choice wherever its saving is above zero, NOT significant"
        )
    elif row is not None:
        notes.append(
            f"rules describe one cell, the exported profile's: {cell_label(row.env)}; a "
            f"measured winner only where it is faster than the baseline "
            f"({ci_words(analysis, level)} above zero"
            f"{family_words(analysis, analysis.confidence)}, as recommend)"
        )
    words = {
        "observed": f"algorithm/protocol as {log} reported them at",
        "declared": "algorithm/protocol as the settings force them (declared, not seen in NCCL's log) at",
        "modelled": f"algorithm/protocol MODELLED for {topology_name} (NCCL's log was not "
        "captured and the settings do not force one) at",
        "modelled_channels": "channel counts MODELLED (NCCL's log did not report them) at",
        "not faster": "NCCL's own choice (the cell is not significantly faster) at",
    }
    for key, sizes in origin.items():
        if sizes:
            notes.append(f"{words[key]} " + ", ".join(f"{b} B" for b in sizes))
    notes.append(
        f"sizes outside the measured ones: NCCL's own choice under these settings, MODELLED for {topology_name}"
    )
    return points, notes


def _faster_at(analysis: Analysis, row: CellRow, nbytes: int, level: float, forced: bool = False) -> bool:
    """The cell's saving at `nbytes` has an interval above zero at `level` (as recommend);
    `forced`: its saving is above zero, significant or not."""
    from nccl_tune.model.per_token import OutOfRangeError, estimate_saving

    if row is None or row.records is None or analysis.baseline.records is None:
        return False
    try:
        est = estimate_saving(analysis.baseline.records, row.records, nbytes, 1, False, level)
    except OutOfRangeError:
        return False
    if forced:
        return est is not None and est.saving_ms > 0
    return est is not None and est.ci_ms is not None and est.ci_ms[0] > 0


def other_collective_points(op: str, analysis: Analysis, topology_name: str, env: dict) -> list[tuner.Point]:
    """NCCL's own modelled choice for `op` at MODEL_SIZES ([] when the settings allow
    nothing the model knows for it: then the plugin would run it on one channel)."""
    topo = costmodel.topology(topology_name)
    nranks = analysis.world_size or 8
    try:
        return [_model_point(op, b, nranks, env, topo, topology_name) for b in MODEL_SIZES]
    except ValueError:
        return []


def _check_allowed(rules: list[tuner.Rule], env: dict) -> list[str]:
    """Rules whose algorithm/protocol the profile's NCCL_ALGO/NCCL_PROTO disable (NCCL marks
    them IGNORE and the plugin skips them: those sizes would run on one channel)."""
    bad = []
    plugin_algo = {v: k for k, v in tuner.ALGORITHM_NAMES.items()}
    plugin_proto = {v: k for k, v in tuner.PROTOCOL_NAMES.items()}
    for r in rules:
        try:
            algos = settings.allowed_algorithms(env.get("NCCL_ALGO"), r.collective)
            protos = settings.allowed_protocols(env.get("NCCL_PROTO"), r.collective)
        except settings.SettingError:
            continue
        if plugin_algo[r.algorithm] not in algos or plugin_proto[r.protocol] not in protos:
            bad.append(f"{r.collective} {r.min_bytes}-{r.max_bytes} B ({r.algorithm}/{r.protocol})")
    return bad


@dataclass(frozen=True)
class TunerRows:
    """The rules chosen for the exported cell, or why none are written (`refusal`)."""

    rules: tuple[tuner.Rule, ...] = ()
    notes: tuple[str, ...] = ()  # how the rows were chosen (the CSV header's notes)
    uncovered: tuple[str, ...] = ()  # collectives no rule covers: they run on ONE channel
    nnodes: int = 1
    nranks: int = 8
    forced: bool = False
    refusal: str | None = None
    disabled: tuple[str, ...] = ()  # rules NCCL's settings disable: a bug, never written

    @classmethod
    def refused(cls, reason: str) -> TunerRows:
        """Nothing to write, and why."""
        return cls(refusal=reason)


def choose(analysis: Analysis, topology_name: str, force: bool = False) -> TunerRows:
    """The rules for the cell the .env export writes (recommendation.export_row).

    Refuses without `force` when the figures are not measured, when there is no
    recommendation, or when some collective would be left without rules (the refusal
    names what would run on one channel).
    """
    if analysis.source != MEASURED and not force:
        return TunerRows.refused(f"not written: {analysis.source} figures (pass --force to write them anyway)")
    if analysis.recommended is None and not force:
        return TunerRows.refused("not written: no recommendation (keep NCCL's defaults)")
    row, forced, refusal = export_row(analysis, force)  # the same cell as the .env export
    if row is None and analysis.source != MODELLED:
        return TunerRows.refused(refusal)
    env = row.env if row is not None else {}
    # The rules are chosen under this cell's env: one the profile grammar refuses (a
    # results file whose env holds LD_PRELOAD) is never exported, in any form.
    grammar.check_env(env, f"results cell {row.cell if row else store.BASELINE}")
    nranks, nnodes = analysis.world_size or 8, records_nnodes(analysis, row)
    points, notes = tuner_points(analysis, topology_name, row, forced=bool(forced) and analysis.recommended is None)
    if nnodes > 1:
        notes.append(
            f"{nnodes}-node communicator: the cost model knows one node's links only, so "
            "its choices here are rougher guesses than on one node"
        )
    rules = tuner.tile(points, "allreduce", nnodes, nranks) if points else []
    uncovered = [] if rules else ["allreduce (the settings allow nothing the model knows)"]
    for op in OTHER_OPS:
        coll = tuner.PLUGIN_COLLECTIVE[op]
        more = other_collective_points(op, analysis, topology_name, env)
        if more:
            rules += tuner.tile(more, coll, nnodes, nranks)
        else:
            uncovered.append(
                f"every {coll} ({cell_label(env)} allows no algorithm/protocol the model knows for {coll})"
            )
    refusal = None
    if uncovered and not force:
        refusal = (
            "not written: NCCL's example plugin would run "
            + "; ".join(uncovered)
            + " on ONE channel (pass --force to write it anyway; its header says so)"
        )
    return TunerRows(
        tuple(rules),
        tuple(notes),
        tuple(uncovered),
        nnodes,
        nranks,
        bool(forced),
        refusal,
        tuple(_check_allowed(rules, env)),
    )
