"""The latency model and its ranges against published measurements of real machines.

For every published table (nccl_tune.model.references: shipped with the package, each with
its machine, settings, timer and source), at 8-64 KB:

- uncalibrated: model / measured, the model run with the table's own settings, timer
  (graph or eager, GPUs per process) and transport;
- in range: each point against its kind's range (nccl_tune.model.ranges) built from every
  published machine, and, the headline, built without the point's own machine
  (leave one machine out, LOMO: the range a user of an unseen machine gets);
- calibrated transfer: on each machine with a default curve, `model fit` on that curve,
  then every other setting of the machine predicted: calibrated (its algorithm/protocol/
  transport was fitted: model / measured) or uncalibrated (then its range, built without
  the machine, must hold the measurement);
- rankings at 16 KB on machines measured under several settings, for every pair measured
  more than 10% apart: calibrated times where both are calibrated, else the uncalibrated
  model's own order (a fit says nothing of a pair it did not calibrate);
- per kind: the machines, how far apart they are, and the question that splits them.

Targets (issue 23): LOMO >= 90% of the 8-64 KB points; no range at NCCL's defaults wider
than 4x; every transferred point calibrated within [0.67, 1.5] or uncalibrated inside
its range; every ranking pair in the measured order. Tables whose source does not state
the settings are listed but not scored.

Honesty: constants of the model were fitted to some of these tables (costmodel's doc says
which: the host-memory per-hop and bandwidth guesses, Simple over PCIe), so the
uncalibrated ratios and the LOMO figure are not fully out of sample for those tables.

    python bench/model_truth.py [--json] [--references PATH]
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from nccl_tune.errors import NcclTuneError
from nccl_tune.model import calibrate, ranges, references

WINDOW = ranges.CHECK_WINDOW
TARGET = (0.67, 1.5)
LOMO_TARGET = 0.90
RANK_SIZE = 16 << 10
RANK_MIN_DIFF = 0.10


def _window(ref) -> list[tuple[int, float]]:
    return [(b, t) for b, t in ref.points if WINDOW[0] <= b <= WINDOW[1]]


def _range(refs, ref, nbytes, exclude=None):
    return ranges.kind_range(
        refs, ref.kind, ref.n_gpus, nbytes, ref.env, ref.mode or "eager", ref.gpus_per_process, exclude_machine=exclude
    )


def _fits(refs) -> dict:
    """Per (machine, GPUs): the model fitted to its default curve (or why not)."""
    out = {}
    for ref in refs:
        if ref.settings_stated and not ref.env and (ref.machine, ref.n_gpus) not in out:
            try:
                cal = calibrate.fit(ref.records(), ref.kind)
                out[(ref.machine, ref.n_gpus)] = calibrate.LoadedModel(
                    f"fit on {ref.name}",
                    cal.topology,
                    cal.nranks,
                    cal.mode,
                    cal.params,
                    tuple(cal.calibrated_pairs),
                    cal.pair_error(),
                )
            except NcclTuneError as exc:
                out[(ref.machine, ref.n_gpus)] = str(exc)
    return out


def _transfer(refs, ref, fit) -> list[dict]:
    """Each 8-64 KB point predicted by the machine's default-curve fit."""
    out = []
    for nbytes, measured in _window(ref):
        row = calibrate.predict_rows(ref.kind, ref.n_gpus, [nbytes], ref.env, ref.mode or "eager", fit)[0]
        if row["calibrated"]:
            ratio = row["time_us"] / measured
            out.append(
                {"bytes": nbytes, "calibrated": True, "ratio": round(ratio, 3), "ok": TARGET[0] <= ratio <= TARGET[1]}
            )
        else:
            found = _range(refs, ref, nbytes, exclude=ref.machine)
            out.append(
                {
                    "bytes": nbytes,
                    "calibrated": False,
                    "range_us": [round(found.low, 2), round(found.high, 2)] if found else None,
                    "ok": bool(found and found.covers(measured)),
                }
            )
    return out


def evaluate(refs) -> dict:
    """Every figure of the report, as a dict."""
    fits = _fits(refs)
    rows = []
    for ref in refs:
        fit = fits.get((ref.machine, ref.n_gpus))
        points = []
        for nbytes, measured in _window(ref):
            model = ranges.reference_model_us(ref, nbytes)
            every = _range(refs, ref, nbytes)
            lomo = _range(refs, ref, nbytes, exclude=ref.machine)
            points.append(
                {
                    "bytes": nbytes,
                    "measured_us": measured,
                    "model_us": round(model, 2),
                    "uncalibrated": round(model / measured, 3),
                    "range_us": [round(every.low, 2), round(every.high, 2)] if every else None,
                    "in_range": every.covers(measured) if every else None,
                    "lomo_range_us": [round(lomo.low, 2), round(lomo.high, 2)] if lomo else None,
                    "in_lomo_range": lomo.covers(measured) if lomo else None,
                    "lomo_width": lomo.width if lomo else None,
                    "width": every.width if every else None,
                }
            )
        transfer = (
            _transfer(refs, ref, fit)
            if isinstance(fit, calibrate.LoadedModel) and ref.env and ref.settings_stated
            else None
        )
        rows.append(
            {
                "name": ref.name,
                "machine": ref.machine,
                "kind": ref.kind,
                "n_gpus": ref.n_gpus,
                "env": ref.env,
                "mode": ref.mode,
                "gpus_per_process": ref.gpus_per_process,
                "scored": ref.settings_stated,
                "source": ref.source,
                "points": points,
                "transfer": transfer,
                "fit": fit if isinstance(fit, str) else (fit.describe() if fit else None),
            }
        )
    return {"references": rows, "rankings": _rankings(refs, fits), "kinds": _kinds(refs), "targets": None}


def _rankings(refs, fits) -> list[dict]:
    machines: dict[tuple, list] = {}
    for ref in refs:
        if ref.settings_stated and ref.at(RANK_SIZE) is not None:
            machines.setdefault((ref.machine, ref.n_gpus), []).append(ref)
    out = []
    for key, group in machines.items():
        fit = fits.get(key)
        if len(group) < 2 or not isinstance(fit, calibrate.LoadedModel):
            continue
        figures = []
        for ref in group:
            mode = ref.mode or "eager"
            cal = calibrate.predict_rows(ref.kind, ref.n_gpus, [RANK_SIZE], ref.env, mode, fit)[0]
            unc = calibrate.predict_rows(ref.kind, ref.n_gpus, [RANK_SIZE], ref.env, mode)[0]
            figures.append((ref.name, ref.at(RANK_SIZE), cal, unc))
        for (a, ma, ca, ua), (b, mb, cb, ub) in itertools.combinations(figures, 2):
            if abs(ma - mb) / min(ma, mb) <= RANK_MIN_DIFF:
                continue
            both = ca["calibrated"] and cb["calibrated"]
            pa, pb = (ca["time_us"], cb["time_us"]) if both else (ua["time_us"], ub["time_us"])
            first, second = ((a, ma, pa), (b, mb, pb)) if ma < mb else ((b, mb, pb), (a, ma, pa))
            out.append(
                {
                    "machine": key[0],
                    "faster_measured": first[0],
                    "slower_measured": second[0],
                    "measured_us": [round(first[1], 2), round(second[1], 2)],
                    "model_us": [round(first[2], 2), round(second[2], 2)],
                    "basis": "calibrated" if both else "uncalibrated model",
                    "agrees": first[2] < second[2],
                }
            )
    return out


def _kinds(refs) -> dict:
    """Per kind, at 16 KB and NCCL's defaults on 8 GPUs in graph mode: the range, the
    machines it rests on, how far apart they are and the question that splits them."""
    from nccl_tune.model import costmodel

    out = {}
    for kind in costmodel.TOPOLOGIES:
        found = ranges.kind_range(refs, kind, 8, RANK_SIZE, {}, None)
        out[kind] = found.to_dict() if found else None
    return out


def targets(result: dict) -> dict:
    """Whether the figures meet the issue's targets."""
    scored = [r for r in result["references"] if r["scored"]]
    lomo = [p["in_lomo_range"] for r in scored for p in r["points"] if p["in_lomo_range"] is not None]
    defaults = [p for r in scored if not r["env"] for p in r["points"]]
    widths = [w for p in defaults for w in (p["lomo_width"], p["width"]) if w]
    transfer = [t for r in scored for t in (r["transfer"] or [])]
    ranks = result["rankings"]
    return {
        "lomo_coverage": {
            "target": LOMO_TARGET,
            "covered": sum(lomo),
            "points": len(lomo),
            "fraction": round(sum(lomo) / len(lomo), 3) if lomo else None,
            "met": bool(lomo) and sum(lomo) / len(lomo) >= LOMO_TARGET,
        },
        "lomo_coverage_defaults": {
            "covered": sum(p["in_lomo_range"] for p in defaults if p["in_lomo_range"] is not None),
            "points": sum(p["in_lomo_range"] is not None for p in defaults),
        },
        "max_width_defaults": {
            "target": ranges.MAX_WIDTH,
            "widest": round(max(widths), 3) if widths else None,
            "met": bool(widths) and max(widths) <= ranges.MAX_WIDTH * (1 + 1e-9),
        },
        "calibrated_transfer": {
            "target": list(TARGET),
            "points": len(transfer),
            "calibrated": sum(t["calibrated"] for t in transfer),
            "ok": sum(t["ok"] for t in transfer),
            "met": bool(transfer) and all(t["ok"] for t in transfer),
        },
        "rankings": {
            "pairs": len(ranks),
            "agree": sum(p["agrees"] for p in ranks),
            "met": all(p["agrees"] for p in ranks),
        },
    }


def _span(values) -> str:
    return "-" if not values else f"{min(values):.2f}-{max(values):.2f}"


def _count(flags) -> str:
    flags = [f for f in flags if f is not None]
    return f"{sum(flags)}/{len(flags)}" if flags else "-"


def render(result: dict) -> str:
    """The text report."""
    t = result["targets"]
    lc, w, tr, rk = t["lomo_coverage"], t["max_width_defaults"], t["calibrated_transfer"], t["rankings"]
    yes = {True: "met", False: "NOT met"}
    lines = [
        f"LOMO coverage (8-64 KB points inside the range built without their machine): "
        f"{lc['covered']}/{lc['points']} = {lc['fraction']:.1%} (target {lc['target']:.0%}: "
        f"{yes[lc['met']]}); at NCCL's defaults {t['lomo_coverage_defaults']['covered']}/"
        f"{t['lomo_coverage_defaults']['points']}",
        f"widest range at NCCL's defaults: {w['widest']}x (target <= {w['target']:g}x: {yes[w['met']]})",
        f"calibrated on the default curve, other settings: {tr['ok']}/{tr['points']} ok "
        f"({tr['calibrated']} calibrated within {tr['target']}, the rest uncalibrated inside "
        f"their range): {yes[tr['met']]}",
        f"rankings at 16 KB: {rk['agree']}/{rk['pairs']} pairs in the measured order: {yes[rk['met']]}",
        "",
        f"{'reference':42s} {'kind':14s} {'n':>2s} {'model/meas':>11s} {'in all':>6s} "
        f"{'LOMO':>5s}  transfer (default-curve fit: cal ratio | uncal in range)",
    ]
    for r in result["references"]:
        pts = r["points"]
        tr_text = "-"
        if r["transfer"]:
            tr_text = " ".join(
                f"{p['bytes'] >> 10}K:" + (f"{p['ratio']:.2f}" if p["calibrated"] else ("in" if p["ok"] else "OUT"))
                for p in r["transfer"]
            )
        lines.append(
            f"{r['name']:42s} {r['kind']:14s} {r['n_gpus']:>2d} "
            f"{_span([p['uncalibrated'] for p in pts]):>11s} "
            f"{_count([p['in_range'] for p in pts]):>6s} "
            f"{_count([p['in_lomo_range'] for p in pts]):>5s}  {tr_text}"
            + ("" if r["scored"] else "   (settings not stated: not scored)")
        )
    misses = [
        (r["name"], p) for r in result["references"] if r["scored"] for p in r["points"] if p["in_lomo_range"] is False
    ]
    if misses:
        lines += ["", "outside the leave-one-machine-out range:"]
        lines += [
            f"  {name} {p['bytes'] >> 10}K: measured {p['measured_us']:.1f}, range "
            f"{p['lomo_range_us'][0]:.1f}-{p['lomo_range_us'][1]:.1f}"
            for name, p in misses
        ]
    lines += ["", f"rankings at 16 KB (pairs measured more than {RANK_MIN_DIFF:.0%} apart):"]
    for p in result["rankings"]:
        lines.append(
            f"  {p['faster_measured']} < {p['slower_measured']}: measured "
            f"{p['measured_us'][0]:.2f} < {p['measured_us'][1]:.2f}, {p['basis']} "
            f"{p['model_us'][0]:.2f} vs {p['model_us'][1]:.2f}: "
            f"{'agrees' if p['agrees'] else 'DISAGREES'}"
        )
    lines += [
        "",
        "per kind, NCCL's defaults, 8 GPUs, 16 KB, graph mode: range (machines; how far "
        "apart they are; the question that splits them where more than 3x)",
    ]
    for kind, found in result["kinds"].items():
        if found:
            lines.append(
                f"  {kind:14s} {found['low']:.1f}-{found['high']:.1f} us"
                + (" (cut to 4x)" if found["capped"] else "")
                + f"; {len(found['machines'])} machines; {found['machines_differ_by']:.2f}x"
                + (f"; {found['question']}" if found["question"] else "")
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print the figures as JSON")
    parser.add_argument("--references", help="a references.json (default: the shipped tables)")
    args = parser.parse_args()
    try:
        refs = references.load(args.references)
    except NcclTuneError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    result = evaluate(refs)
    result["targets"] = targets(result)
    print(json.dumps(result, indent=2) if args.json else render(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
