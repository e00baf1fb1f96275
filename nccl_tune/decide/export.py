"""Writing what `recommend` decided: the `.env` profile and the tuner-plugin CSV.

Both are written atomically (fileio.write_atomic) and only for a measured, significant
recommendation unless forced; anything modelled or forced says so in its header. The
profile's provenance header records what was measured, where, when, with which NCCL,
the saving and its interval, the trust (confirmed by NCCL's log or declared where NCCL ran;
else the provenance: simulated, modelled, measured on gloo) and the exact command. The tuner CSV follows NCCL's example tuner plugin (nccl_tune.nccl.tuner).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nccl_tune import fileio, store
from nccl_tune.model import costmodel
from nccl_tune.live import grammar, profile
from nccl_tune.nccl import releases, settings, tuner
from nccl_tune.errors import NcclTuneError
from nccl_tune.decide.recommendation import (MEASURED, MODELLED, Analysis, CellRow,
                                      lint_problems, source_words)
from nccl_tune.store import cell_label


@dataclass(frozen=True)
class Workload:
    """The decode workload a saving refers to."""

    layers: int
    per_layer: int
    extra: int
    tokens: int
    hidden: int
    dtype: str

    def describe(self, analysis: Analysis) -> str:
        """One line: the message size and the allreduces per token."""
        return (f"allreduce latency at {analysis.message_bytes} B ({self.tokens} token(s) x "
                f"{self.hidden} x {self.dtype}); {analysis.collectives} allreduces per token "
                f"({self.layers} layers x {self.per_layer} + {self.extra})")


def installed_nccl() -> str:
    """'not measured (installed: 2.x.y)' for provenance when nothing was measured."""
    try:
        from nccl_tune.nccl import ncclinfo

        lib = ncclinfo.default_library()
    except Exception:  # the version is provenance only; never fail an export over it
        lib = None
    return f"not measured (installed: {lib.version})" if lib else "not measured"


def ci_words(analysis: Analysis, confidence: float = 0.95) -> str:
    """'98.33% CI': the per-cell level the intervals were computed at (Bonferroni-widened
    when several cells were compared with the baseline), else the requested level."""
    level = analysis.cell_confidence if analysis.cell_confidence is not None else confidence
    return f"{100 * level:.4g}% CI"


def family_words(analysis: Analysis, confidence: float = 0.95) -> str:
    """' (family-wise 95%, Bonferroni over k cells)' when k > 1 cells were compared, else ''."""
    if analysis.family_size > 1 and analysis.cell_confidence is not None:
        return (f" (family-wise {100 * confidence:.4g}%, Bonferroni over {analysis.family_size} "
                "cells)")
    return ""


def provenance(analysis: Analysis, row: CellRow, workload: Workload, command: str,
               topology_note: str | None = None, forced: str | None = None,
               baseline_tok_s: float | None = None, confidence: float = 0.95) -> dict:
    """The `# key: value` header of an exported profile."""
    s = row.saving
    where = [f"world size {analysis.world_size}"]
    if analysis.gpus:
        where.insert(0, analysis.gpus)
    if analysis.source == MODELLED:
        how = (topology_note or analysis.topology or "").split(":")[0]
        where.append(f"topology {how}")
    elif analysis.topology:
        where.append(f"topology {analysis.topology}")
    if analysis.host:
        where.append(f"host {analysis.host}")
    if analysis.backend:
        where.append(f"backend {analysis.backend}")
    saving = f"{s.saving_ms:.3f} ms per token"
    if s.ci_ms is not None:
        saving += (f" ({ci_words(analysis, confidence)} {s.ci_ms[0]:.3f} to {s.ci_ms[1]:.3f}"
                   f"{family_words(analysis, confidence)}, basis {s.basis}, {s.n_rounds} rounds)")
    elif analysis.source == MODELLED:
        saving += " (modelled: no interval)"
    prov = {
        "source": source_words(analysis),
        "what": workload.describe(analysis),
        "where": ", ".join(where),
        "nccl": analysis.nccl_version or installed_nccl(),
        "when": f"exported {store.now_iso()}" + (f"; measured {analysis.measured_at}"
                                                  if analysis.measured_at else ""),
        "saving": saving,
        "trust": row.trust,  # the word --json and the table print (CellRow.trust)
    }
    if baseline_tok_s and row.projected_tok_s:
        prov["predicted"] = f"{baseline_tok_s:.1f} -> {row.projected_tok_s:.1f} tok/s"
    if forced:
        prov["forced"] = forced
    prov["command"] = command
    return prov


def export_row(analysis: Analysis, force: bool) -> tuple[CellRow | None, str | None, str | None]:
    """(row to write, why it is forced, why nothing is written)."""
    rec = analysis.recommended
    if rec is not None and analysis.source == MEASURED:
        return rec, None, None
    if rec is not None:
        if not force:
            return None, None, (f"not written: the recommendation is {analysis.source}, not measured "
                                "(pass --force to write it anyway; its header says so)")
        return rec, f"{analysis.source} figures, written with --force", None
    if not force:
        return None, None, ("not written: no recommendation (keep NCCL's defaults; --force writes "
                            "the best cell)")
    candidates = [r for r in analysis.cells if r.status == "ok" and r.final and r.confirmed is not False
                  and r.saving is not None and r.saving.saving_ms > 0 and not lint_problems(r.env)]
    if not candidates:
        return None, None, "not written: no cell saves time, even without a significant interval"
    best = max(candidates, key=lambda r: r.saving.saving_ms)
    return best, "--force: this cell's saving is NOT significant (its interval includes zero)", None


def lint_findings(text: str, path: str) -> list[str]:
    """Lint findings (errors and warnings) for profile text: every value through the
    catalogue (settings.check_value, which warns on LL128) and no value that needs quoting."""
    return lint_problems(profile.parse_profile(text, path=path).env)


APPLY_NOTES = ["Apply: set -a; . THIS.env; set +a   or   docker run --env-file THIS.env",
               "or nccl-tune exec --profile THIS.env -- CMD ARGS.",
               "Check a running server carries it: nccl-tune check --profile THIS.env --pid PID --tree."]


def write_profile(path: str, analysis: Analysis, workload: Workload, command: str, *,
                  force: bool = False, topology_note: str | None = None,
                  baseline_tok_s: float | None = None, confidence: float = 0.95,
                  conf: bool = False, target: releases.Target | None = None,
                  target_notes: tuple[str, ...] = ()) -> dict:
    """Write the recommended profile (or refuse, saying why); returns what happened.

    `conf`: in NCCL's conf-file syntax (nccl_tune.live.conffile) instead of a .env file.
    `target`: the NCCL release the profile was checked against (recorded in the header,
    with `target_notes`, the values whose meaning changes there).
    """
    row, forced, refusal = export_row(analysis, force)
    if row is None:
        return {"path": path, "written": False, "reason": refusal}
    grammar.check_env(row.env, f"results cell {row.cell}")  # whatever the results file says
    prov = provenance(analysis, row, workload, command, topology_note, forced, baseline_tok_s,
                      confidence)
    if target is not None:  # right after the measured release's line
        extra = {"nccl target": target.describe(),
                 **{f"nccl target warning {i}": n for i, n in enumerate(target_notes, start=1)}}
        keys = list(prov)
        at = keys.index("nccl") + 1 if "nccl" in keys else len(keys)
        prov = {k: prov[k] for k in keys[:at]} | extra | {k: prov[k] for k in keys[at:]}
    if conf:
        from nccl_tune.live import conffile

        text = conffile.render_conf(row.env, prov)
    else:
        text = profile.render_profile(row.env, prov, APPLY_NOTES)
    back = profile.parse_profile(text, path=path)
    problems = lint_findings(text, path)
    if back.env != row.env or problems:
        raise NcclTuneError("the profile would not lint clean: " + "; ".join(problems), path=path)
    fileio.write_atomic(path, text)
    return {"path": path, "written": True, "cell": row.cell, "env": row.env, "forced": bool(forced)}


# ---------------------------------------------------------------- tuner-plugin CSV
#
# NCCL's example plugin runs every collective, size and communicator that no rule covers
# on ONE channel (nccl_tune.nccl.tuner), so the CSV tiles every collective the plugin knows
# from 0 to SIZE_MAX with an explicit channel count: the measured winner where measured
# and significant, elsewhere NCCL's own choice under the profile's settings (seen in
# NCCL's log where the cell was measured, else modelled), each row's comment says which.

# Sizes the model is asked about outside the measured ones: 1 B to 4 GiB (the last row
# runs on to SIZE_MAX with the 4 GiB choice).
MODEL_SIZES = tuple(1 << k for k in range(0, 33))
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
    from collections import Counter

    records = list(analysis.baseline.records or []) + list((row.records if row else None) or [])
    counts = Counter(r.get("nnodes") for r in records if isinstance(r.get("nnodes"), int))
    return counts.most_common(1)[0][0] if counts else 1


def _model_point(op: str, nbytes: int, nranks: int, env: dict, topo, topo_name: str,
                 fastest: bool = False) -> tuner.Point:
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


def tuner_points(analysis: Analysis, topology_name: str, row: CellRow | None = None,
                 forced: bool = False) -> tuple[list[tuner.Point], list[str]]:
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
        points = [_model_point("allreduce", b, nranks, env, topo, topology_name,
                               fastest=row is not None and b <= MODELLED_FASTEST_UP_TO)
                  for b in MODEL_SIZES]
        notes.append(f"algorithm, protocol and channels are MODELLED for {topology_name}, not measured")
        return points, notes
    level = _rule_confidence(analysis)
    by_size = {} if row is None else {
        s.bytes: s for s in analysis.summaries
        if s.cell == row.cell and s.final and s.status == "ok" and s.p50_us is not None}
    base_sizes = {s.bytes for s in analysis.summaries if s.cell == store.BASELINE and s.final}
    measured = sorted(set(by_size) & base_sizes)
    origin: dict[str, list[int]] = {"observed": [], "declared": [], "modelled": [],
                                    "modelled_channels": [], "not faster": []}
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
            if algo and proto and channels and not _check_allowed(
                    [tuner.Rule("allreduce", 0, 0, tuner.plugin_algorithm(algo),
                                tuner.plugin_protocol(proto), 1)], env):
                points.append(tuner.Point(nbytes, algo, proto, int(channels),
                                          f"not faster: NCCL's own choice, from {log}", True))
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
        if _check_allowed([tuner.Rule("allreduce", 0, 0, tuner.plugin_algorithm(algo),
                                      tuner.plugin_protocol(proto), 1)], env):
            # NCCL would mark it IGNORE and the plugin skip the rule: the log contradicts
            # the settings, so the model's choice under them stands in.
            notes.append(f"{nbytes} B: the records report {algo}/{proto}, which "
                         f"{cell_label(env)} disables: NCCL's modelled choice instead")
            points.append(_model_point("allreduce", nbytes, nranks, env, topo, topology_name))
            continue
        if not channels:
            channels = _modelled_channels(nbytes, algo, proto, env, topo, nranks)
            origin["modelled_channels"].append(nbytes)
            how += ", channels MODELLED"
        points.append(tuner.Point(nbytes, algo, proto, int(channels), f"{win} ({how})",
                                  True))
    span = (measured[0], measured[-1]) if measured else None
    for nbytes in MODEL_SIZES:
        if span is None or not span[0] <= nbytes <= span[1]:
            try:
                points.append(_model_point("allreduce", nbytes, nranks, env, topo, topology_name))
            except ValueError:
                notes.append(f"allreduce {nbytes} B: {cell_label(env)} allows nothing the model knows")
    if row is not None and forced:
        notes.append(f"--force: rules describe one cell, the exported profile's: {cell_label(row.env)}; "
                     "its choice wherever its saving is above zero, NOT significant")
    elif row is not None:
        notes.append(f"rules describe one cell, the exported profile's: {cell_label(row.env)}; a "
                     f"measured winner only where it is faster than the baseline "
                     f"({ci_words(analysis, level)} above zero"
                     f"{family_words(analysis, analysis.confidence)}, as recommend)")
    words = {"observed": f"algorithm/protocol as {log} reported them at",
             "declared": "algorithm/protocol as the settings force them (declared, not seen in "
                         "NCCL's log) at",
             "modelled": f"algorithm/protocol MODELLED for {topology_name} (NCCL's log was not "
                         "captured and the settings do not force one) at",
             "modelled_channels": "channel counts MODELLED (NCCL's log did not report them) at",
             "not faster": "NCCL's own choice (the cell is not significantly faster) at"}
    for key, sizes in origin.items():
        if sizes:
            notes.append(f"{words[key]} " + ", ".join(f"{b} B" for b in sizes))
    notes.append(f"sizes outside the measured ones: NCCL's own choice under these settings, "
                 f"MODELLED for {topology_name}")
    return points, notes


def _faster_at(analysis: Analysis, row: CellRow, nbytes: int, level: float,
               forced: bool = False) -> bool:
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


def other_collective_points(op: str, analysis: Analysis, topology_name: str,
                            env: dict) -> list[tuner.Point]:
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


def _version_tuple(text: str | None):
    from nccl_tune.nccl.ncclinfo import parse_version

    return parse_version(text)


def tuner_header(analysis: Analysis, path: str, command: str, nnodes: int, nranks: int,
                 notes: list[str], uncovered: list[str],
                 target: releases.Target | None = None) -> list[str]:
    """The CSV's '#' header: minimum plugin version, where to build it, how to load it,
    what runs on one channel, the plugin interfaces the target release loads, version
    warnings, provenance."""
    version = analysis.nccl_version
    where = "the results were measured with"
    if not version:
        installed = installed_nccl()
        version = installed.split("installed: ")[-1].rstrip(")") if "installed: " in installed else None
        where = "this machine has"
    header = [
        "NCCL tuner-plugin rules written by nccl-tune for NCCL's example tuner plugin; needs the "
        "plugin of NCCL >= 2.30.3 (older example plugins crash on NCCL core's flat cost table).",
        "Build: in an NCCL >= 2.30.3 source tree, cd plugins/tuner/example && make (before 2.29.7 "
        "the folder was ext-tuner/example) -> libnccl-tuner-example.so; NCCL core >= 2.28.3 loads it.",
        "Load: export NCCL_TUNER_PLUGIN=/path/to/libnccl-tuner-example.so NCCL_TUNER_CONFIG_FILE="
        f"{os.path.abspath(path)} together with the .env profile these rules were chosen under.",
        "The example plugin runs every collective, size and communicator no rule matches (and "
        "channels -1) on ONE channel: every row has an explicit count and each collective is "
        "tiled from 0 to 18446744073709551615 bytes.",
        f"Rules match nNodes={nnodes} nRanks={nranks} only: a communicator of another shape "
        "matches none and runs every collective on ONE channel.",
        "NCCL_ALGO/NCCL_PROTO win over a rule: NCCL core marks what they disable IGNORE in the "
        "cost table and the plugin skips such a rule (src/enqueue.cc, plugin.c).",
    ]
    if target is not None:
        header.append(f"Target: {target.describe()}. {releases.tuner_header(target)}.")
    header += tuner.version_warnings(_version_tuple(version), where)
    if target is not None and target.version and target.version != version:
        header += tuner.version_warnings(_version_tuple(target.version), "the target release is")
    for item in uncovered:
        header.append(f"NO RULE (runs on ONE channel): {item}")
    header += [
        f"source: {source_words(analysis)}; world size {analysis.world_size}; nodes {nnodes}; "
        + (f"NCCL {analysis.nccl_version}; " if analysis.nccl_version else "")
        + f"written {store.now_iso()}",
        "Process-wide settings (NCCL_P2P_LEVEL, NCCL_BUFFSIZE, NCCL_NTHREADS, ...) cannot be"
        " expressed here: keep them in the .env profile.",
        f"command: {command}",
    ] + [f"note: {n}" for n in notes]
    return header


def write_tuner_csv(path: str, analysis: Analysis, topology_name: str, command: str, *,
                    force: bool = False, target: releases.Target | None = None) -> dict:
    """Write tuner-plugin rules (or refuse, saying why); returns what happened.

    Refuses without `force` when the figures are not measured, when there is no
    recommendation, or when some collective would be left without rules (the refusal
    names what would run on one channel).
    """
    if analysis.source != MEASURED and not force:
        return {"path": path, "written": False,
                "reason": f"not written: {analysis.source} figures (pass --force to write them anyway)"}
    if analysis.recommended is None and not force:
        return {"path": path, "written": False,
                "reason": "not written: no recommendation (keep NCCL's defaults)"}
    row, forced, refusal = export_row(analysis, force)  # the same cell as the .env export
    if row is None and analysis.source != MODELLED:
        return {"path": path, "written": False, "reason": refusal}
    env = row.env if row is not None else {}
    # The rules are chosen under this cell's env: one the profile grammar refuses (a
    # results file whose env holds LD_PRELOAD) is never exported, in any form.
    grammar.check_env(env, f"results cell {row.cell if row else store.BASELINE}")
    nranks, nnodes = analysis.world_size or 8, records_nnodes(analysis, row)
    points, notes = tuner_points(analysis, topology_name, row,
                                 forced=bool(forced) and analysis.recommended is None)
    if nnodes > 1:
        notes.append(f"{nnodes}-node communicator: the cost model knows one node's links only, so "
                     "its choices here are rougher guesses than on one node")
    rules = tuner.tile(points, "allreduce", nnodes, nranks) if points else []
    uncovered = [] if rules else ["allreduce (the settings allow nothing the model knows)"]
    for op in OTHER_OPS:
        coll = tuner.PLUGIN_COLLECTIVE[op]
        more = other_collective_points(op, analysis, topology_name, env)
        if more:
            rules += tuner.tile(more, coll, nnodes, nranks)
        else:
            uncovered.append(f"every {coll} ({cell_label(env)} allows no algorithm/protocol the "
                             f"model knows for {coll})")
    disabled = _check_allowed(rules, env)
    if disabled:  # a rule NCCL's settings disable is skipped: a bug here, never written
        raise NcclTuneError("tuner rules the profile's NCCL_ALGO/NCCL_PROTO disable: "
                            + "; ".join(disabled[:3]), path=path)
    if uncovered and not force:
        return {"path": path, "written": False,
                "reason": "not written: NCCL's example plugin would run " + "; ".join(uncovered)
                          + " on ONE channel (pass --force to write it anyway; its header says so)"}
    header = tuner_header(analysis, path, command, nnodes, nranks, notes, uncovered, target)
    text = tuner.render(rules, header)
    tuner.parse(text)  # the plugin's own reading must accept every line
    fileio.write_atomic(path, text)
    return {"path": path, "written": True, "rules": [r.line() for r in rules],
            "nnodes": nnodes, "nranks": nranks, "one_channel": uncovered, "forced": bool(forced)}
