"""Writing what `recommend` decided: the `.env` profile and the tuner-plugin CSV.

Both are written atomically (fileio.write_atomic) and only for a measured, significant
recommendation unless forced; anything modelled or forced says so in its header. The
profile's provenance header records what was measured, where, when, with which NCCL,
the saving and its interval, the trust (confirmed by NCCL's log or declared where NCCL ran;
else the provenance: simulated, modelled, measured on gloo) and the exact command. The
tuner CSV renders the rules nccl_tune.decide.tuner_rows chose, in NCCL's example tuner
plugin's format (nccl_tune.nccl.tuner). Which cell is exported is the recommendation's
(recommendation.export_row); nothing here decides.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from nccl_tune import fileio, store
from nccl_tune.decide import tuner_rows
from nccl_tune.decide.recommendation import (
    MODELLED,
    Analysis,
    CellRow,
    ci_words,
    export_row,
    family_words,
    lint_problems,
    source_words,
)
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar, profile
from nccl_tune.nccl import releases, tuner


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
        return (
            f"allreduce latency at {analysis.message_bytes} B ({self.tokens} token(s) x "
            f"{self.hidden} x {self.dtype}); {analysis.collectives} allreduces per token "
            f"({self.layers} layers x {self.per_layer} + {self.extra})"
        )


def installed_nccl() -> str:
    """'not measured (installed: 2.x.y)' for provenance when nothing was measured."""
    try:
        from nccl_tune.nccl import ncclinfo

        lib = ncclinfo.default_library()
    except Exception:  # the version is provenance only; never fail an export over it
        lib = None
    return f"not measured (installed: {lib.version})" if lib else "not measured"


def provenance(
    analysis: Analysis,
    row: CellRow,
    workload: Workload,
    command: str,
    topology_note: str | None = None,
    forced: str | None = None,
    baseline_tok_s: float | None = None,
    confidence: float = 0.95,
    speculative: str | None = None,
) -> dict:
    """The `# key: value` header of an exported profile (`speculative`: the step planner's
    decision, recommend --spec-steps)."""
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
        saving += (
            f" ({ci_words(analysis, confidence)} {s.ci_ms[0]:.3f} to {s.ci_ms[1]:.3f}"
            f"{family_words(analysis, confidence)}, basis {s.basis}, {s.n_rounds} rounds)"
        )
    elif analysis.source == MODELLED:
        saving += " (modelled: no interval)"
    prov = {
        "source": source_words(analysis),
        "what": workload.describe(analysis),
        "where": ", ".join(where),
        "nccl": analysis.nccl_version or installed_nccl(),
        "when": f"exported {store.now_iso()}" + (f"; measured {analysis.measured_at}" if analysis.measured_at else ""),
        "saving": saving,
        "trust": row.trust,  # the word --json and the table print (CellRow.trust)
    }
    if baseline_tok_s and row.projected_tok_s:
        prov["predicted"] = f"{baseline_tok_s:.1f} -> {row.projected_tok_s:.1f} tok/s"
    if forced:
        prov["forced"] = forced
    if speculative:
        prov["speculative"] = speculative
    prov["command"] = command
    return prov


def lint_findings(text: str, path: str) -> list[str]:
    """Lint findings (errors and warnings) for profile text: every value through the
    catalogue (settings.check_value, which warns on LL128) and no value that needs quoting."""
    return lint_problems(profile.parse_profile(text, path=path).env)


APPLY_NOTES = [
    "Apply: set -a; . THIS.env; set +a   or   docker run --env-file THIS.env",
    "or nccl-tune exec --profile THIS.env -- CMD ARGS.",
    "Check a running server carries it: nccl-tune check --profile THIS.env --pid PID --tree.",
]


def write_profile(
    path: str,
    analysis: Analysis,
    workload: Workload,
    command: str,
    *,
    force: bool = False,
    topology_note: str | None = None,
    baseline_tok_s: float | None = None,
    confidence: float = 0.95,
    conf: bool = False,
    target: releases.Target | None = None,
    target_notes: tuple[str, ...] = (),
    speculative: str | None = None,
) -> dict:
    """Write the recommended profile (or refuse, saying why); returns what happened.

    `conf`: in NCCL's conf-file syntax (nccl_tune.live.conffile) instead of a .env file.
    `target`: the NCCL release the profile was checked against (recorded in the header,
    with `target_notes`, the values whose meaning changes there). `speculative`: the step
    planner's decision (recommend --spec-steps), a `# speculative:` line.
    """
    row, forced, refusal = export_row(analysis, force)
    if row is None:
        return {"path": path, "written": False, "reason": refusal}
    grammar.check_env(row.env, f"results cell {row.cell}")  # whatever the results file says
    prov = provenance(analysis, row, workload, command, topology_note, forced, baseline_tok_s, confidence, speculative)
    if target is not None:  # right after the measured release's line
        extra = {
            "nccl target": target.describe(),
            **{f"nccl target warning {i}": n for i, n in enumerate(target_notes, start=1)},
        }
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


def _version_tuple(text: str | None):
    from nccl_tune.nccl.ncclinfo import parse_version

    return parse_version(text)


def tuner_header(
    analysis: Analysis,
    path: str,
    command: str,
    nnodes: int,
    nranks: int,
    notes: list[str],
    uncovered: list[str],
    target: releases.Target | None = None,
) -> list[str]:
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


def write_tuner_csv(
    path: str,
    analysis: Analysis,
    topology_name: str,
    command: str,
    *,
    force: bool = False,
    target: releases.Target | None = None,
) -> dict:
    """Write the tuner-plugin rules nccl_tune.decide.tuner_rows chose for the exported cell
    (or refuse, saying why: its refusal); returns what happened."""
    chosen = tuner_rows.choose(analysis, topology_name, force)
    if chosen.disabled:  # a rule NCCL's settings disable is skipped: a bug there, never written
        raise NcclTuneError(
            "tuner rules the profile's NCCL_ALGO/NCCL_PROTO disable: " + "; ".join(chosen.disabled[:3]), path=path
        )
    if chosen.refusal:
        return {"path": path, "written": False, "reason": chosen.refusal}
    header = tuner_header(
        analysis, path, command, chosen.nnodes, chosen.nranks, list(chosen.notes), list(chosen.uncovered), target
    )
    text = tuner.render(list(chosen.rules), header)
    tuner.parse(text)  # the plugin's own reading must accept every line
    fileio.write_atomic(path, text)
    return {
        "path": path,
        "written": True,
        "rules": [r.line() for r in chosen.rules],
        "nnodes": chosen.nnodes,
        "nranks": chosen.nranks,
        "one_channel": list(chosen.uncovered),
        "forced": chosen.forced,
    }
