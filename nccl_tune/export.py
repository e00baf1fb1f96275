"""Writing what `recommend` decided: the `.env` profile and the tuner-plugin CSV.

Both are written atomically (profile.write_atomic) and only for a measured, significant
recommendation unless forced; anything modelled or forced says so in its header. The
profile's provenance header records what was measured, where, when, with which NCCL,
the saving and its interval, the trust (confirmed by NCCL's log or declared) and the
exact command. The tuner CSV follows NCCL's example tuner plugin (nccl_tune.tuner).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nccl_tune import costmodel, profile, settings, store, tuner
from nccl_tune.errors import NcclTuneError
from nccl_tune.recommendation import (MEASURED, MODELLED, Analysis, CellRow, default_model_sizes,
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
        from nccl_tune import ncclinfo

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
                  baseline_tok_s: float | None = None, confidence: float = 0.95) -> dict:
    """Write the recommended profile (or refuse, saying why); returns what happened."""
    row, forced, refusal = export_row(analysis, force)
    if row is None:
        return {"path": path, "written": False, "reason": refusal}
    prov = provenance(analysis, row, workload, command, topology_note, forced, baseline_tok_s,
                      confidence)
    text = profile.render_profile(row.env, prov, APPLY_NOTES)
    back = profile.parse_profile(text, path=path)
    problems = lint_findings(text, path)
    if back.env != row.env or problems:
        raise NcclTuneError("the profile would not lint clean: " + "; ".join(problems), path=path)
    profile.write_atomic(path, text)
    return {"path": path, "written": True, "cell": row.cell, "env": row.env, "forced": bool(forced)}


# ---------------------------------------------------------------- tuner-plugin CSV

def _env_single(env: dict, name: str, known) -> str | None:
    value = env.get(name)
    if not value or "," in value or "^" in value or ":" in value:
        return None
    return next((k for k in known if k.lower() == value.strip().lower()), None)


def _rule_confidence(analysis: Analysis) -> float:
    return analysis.cell_confidence if analysis.cell_confidence is not None else 0.95


def tuner_points(analysis: Analysis, topology_name: str, row: CellRow | None = None,
                 forced: bool = False) -> tuple[list[tuple], list[str]]:
    """(bytes, algo, proto, channels) per size for the tuner CSV, and notes on how.

    The rules describe ONE cell, the one the .env profile exports (`row`; default the
    recommended cell), so the two files never disagree. Measured: at each measured size
    where that cell is faster than the baseline with an interval at recommend's per-cell
    (family-wise) level, the algorithm/protocol/channels NCCL reported running there,
    else the ones its settings force, else the model's choice for its settings (the
    notes say which, per size); at other sizes no rule (NCCL's own choice). Modelled:
    the fastest (algo, proto) the model finds under that cell's settings. `forced`
    (--force without a significant winner): a rule wherever the cell's saving is above
    zero, significant or not (the notes say so).
    """
    topo = costmodel.topology(topology_name)
    nranks = analysis.world_size or 8
    row = row if row is not None else analysis.recommended
    notes: list[str] = []
    points = []
    if analysis.source == MODELLED:
        env = row.env if row is not None else {}
        for nbytes in default_model_sizes():
            if nbytes <= 1 << 20:
                c = costmodel.fastest("allreduce", nbytes, nranks, env, topo)
                points.append((nbytes, c.algo, c.proto, c.channels))
        notes.append(f"algorithm, protocol and channels are MODELLED for {topology_name}, not measured")
        return points, notes
    if row is None:
        return [], notes
    level = _rule_confidence(analysis)
    by_size = {s.bytes: s for s in analysis.summaries
               if s.cell == row.cell and s.final and s.status == "ok"
               and s.p50_us is not None}
    base_sizes = {s.bytes for s in analysis.summaries if s.cell == store.BASELINE and s.final}
    origin: dict[str, list[int]] = {"observed": [], "declared": [], "modelled": [],
                                    "modelled_channels": [], "not faster": []}
    for nbytes in sorted(set(by_size) & base_sizes):
        summary = by_size[nbytes]
        faster = _faster_at(analysis, row, nbytes, level, forced)
        if not faster:
            origin["not faster"].append(nbytes)
            points.append((nbytes, None, None, None))
            continue
        eff = summary.effective or {}
        algo, proto, channels = eff.get("algo"), eff.get("proto"), eff.get("channels")
        if algo and proto:
            origin["observed"].append(nbytes)
        else:
            algo = algo or _env_single(row.env, "NCCL_ALGO", settings.ALGORITHMS)
            proto = proto or _env_single(row.env, "NCCL_PROTO", settings.PROTOCOLS)
            if algo and proto:
                origin["declared"].append(nbytes)
        if not (algo and proto and channels):
            try:
                guess = costmodel.choose("allreduce", nbytes, nranks, row.env, topo)
            except ValueError:
                notes.append(f"{nbytes} B: {cell_label(row.env)} allows nothing the model knows: no rule")
                points.append((nbytes, None, None, None))
                continue
            if not (algo and proto):
                origin["modelled"].append(nbytes)
                algo, proto = algo or guess.algo, proto or guess.proto
            if not channels:
                lo, hi = row.env.get("NCCL_MIN_NCHANNELS"), row.env.get("NCCL_MAX_NCHANNELS")
                if lo and lo == hi:
                    channels = int(lo)
                else:
                    pool = costmodel.channel_pool(topo, row.env)
                    link = costmodel.effective_link(topo, row.env)
                    nt = costmodel.max_threads(algo, proto, link, row.env)
                    channels = costmodel.launch_shape(nbytes, algo, proto, pool, nt, nranks)[0]
                    origin["modelled_channels"].append(nbytes)
        points.append((nbytes, algo, proto, int(channels)))
    if forced:
        notes.append(f"--force: rules describe one cell, the exported profile's: {cell_label(row.env)}; "
                     "a rule at sizes where its saving is above zero, NOT significant")
    else:
        notes.append(f"rules describe one cell, the exported profile's: {cell_label(row.env)}; a rule "
                     f"only at sizes where it is faster than the baseline ({ci_words(analysis, level)} "
                     f"above zero{family_words(analysis, analysis.confidence)}, as recommend)")
    words = {"observed": "algorithm/protocol as NCCL's log reported them at",
             "declared": "algorithm/protocol as the settings force them (declared, not seen in "
                         "NCCL's log) at",
             "modelled": f"algorithm/protocol MODELLED for {topology_name} (NCCL's log was not "
                         "captured and the settings do not force one) at",
             "modelled_channels": "channel counts MODELLED (NCCL's log did not report them) at",
             "not faster": "no rule (NCCL's own choice: the cell is not significantly faster) at"}
    for key, sizes in origin.items():
        if sizes:
            notes.append(f"{words[key]} " + ", ".join(f"{b} B" for b in sizes))
    return points, notes


def _faster_at(analysis: Analysis, row: CellRow, nbytes: int, level: float,
               forced: bool = False) -> bool:
    """The cell's saving at `nbytes` has an interval above zero at `level` (as recommend);
    `forced`: its saving is above zero, significant or not."""
    from nccl_tune.model import OutOfRangeError, estimate_saving

    if row.records is None or analysis.baseline.records is None:
        return False
    try:
        est = estimate_saving(analysis.baseline.records, row.records, nbytes, 1, False, level)
    except OutOfRangeError:
        return False
    if forced:
        return est is not None and est.saving_ms > 0
    return est is not None and est.ci_ms is not None and est.ci_ms[0] > 0


def write_tuner_csv(path: str, analysis: Analysis, topology_name: str, command: str, *,
                    force: bool = False) -> dict:
    """Write tuner-plugin rules (or refuse, saying why); returns what happened."""
    if analysis.source != MEASURED and not force:
        return {"path": path, "written": False,
                "reason": f"not written: {analysis.source} figures (pass --force to write them anyway)"}
    if analysis.recommended is None and not force:
        return {"path": path, "written": False,
                "reason": "not written: no recommendation (keep NCCL's defaults)"}
    row, forced, refusal = export_row(analysis, force)  # the same cell as the .env export
    if row is None and analysis.source != MODELLED:
        return {"path": path, "written": False, "reason": refusal}
    points, notes = tuner_points(analysis, topology_name, row,
                                 forced=bool(forced) and analysis.recommended is None)
    rules = tuner.rules_from_points(points, nnodes=1, nranks=analysis.world_size or 8)
    if not rules:
        return {"path": path, "written": False,
                "reason": "not written: at no measured size is the exported cell significantly "
                          "faster than NCCL's defaults"}
    header = [
        "NCCL tuner-plugin rules written by nccl-tune (format of NVIDIA/nccl ext-tuner/example).",
        f"source: {source_words(analysis)}; world size {analysis.world_size}; "
        + (f"NCCL {analysis.nccl_version}; " if analysis.nccl_version else "")
        + f"written {store.now_iso()}",
        "Load: build NCCL's example plugin (nccl/ext-tuner/example: make ->"
        " libnccl-tuner-example.so), then export NCCL_TUNER_PLUGIN=/path/to/libnccl-tuner-example.so"
        f" and NCCL_TUNER_CONFIG_FILE={os.path.abspath(path)}",
        "First matching line wins; sizes outside every range keep NCCL's own choice. Channels are"
        " always explicit: with -1 the example plugin runs ONE channel.",
        "Process-wide settings (NCCL_P2P_LEVEL, NCCL_BUFFSIZE, NCCL_NTHREADS, ...) cannot be"
        " expressed here: keep them in the .env profile.",
        f"command: {command}",
    ] + [f"note: {n}" for n in notes]
    text = tuner.render(rules, header)
    tuner.parse(text)  # the plugin's own reading must accept every line
    profile.write_atomic(path, text)
    return {"path": path, "written": True, "rules": [r.line() for r in rules],
            "forced": bool(forced)}
