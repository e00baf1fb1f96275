"""How every modelled output prints its range and whether it is calibrated.

`model predict`, `spec-plan`'s comm(n) and `validate`'s modelled prediction print the rows
of nccl_tune.model.calibrate.predict_rows the same way: a range per row, calibrated yes or
no, and one note per basis (which published machines, or the fit's own error) with the
question that splits a kind's machines.
"""

from __future__ import annotations

from tabulate import tabulate


def range_text(range_us) -> str:
    """'9.7-38.6' (us, one decimal), or '-' without a range."""
    return "-" if not range_us else f"{range_us[0]:.1f}-{range_us[1]:.1f}"


def range_notes(rows: list[dict]) -> list[str]:
    """What the ranges of `predict_rows` rest on: one line per distinct basis, and the
    question that splits a kind's machines where they differ by more than 3x."""
    out, seen = [], set()
    for row in rows:
        found = row.get("range") or {}
        key = (found.get("basis"), tuple(found.get("machines") or ()), found.get("question"))
        if not found or key in seen:
            continue
        seen.add(key)
        if found.get("calibrated"):
            out.append(f"range (calibrated rows): {found['basis']}")
            continue
        out.append(
            f"range (uncalibrated rows): the model's time x where {len(found['machines'])} "
            f"{found['basis']} fall from the model (90% prediction interval for a machine "
            f"not among them): {', '.join(found['machines'])}" + ("; cut to 4x" if found.get("capped") else "")
        )
        if found.get("question"):
            out.append(
                f"these machines differ by {found['machines_differ_by']:.1f}x; the question "
                f"that splits them: {found['question']}"
            )
    if not out:
        out.append("range: no published measurement to range these figures: they are the model's alone")
    return out


def comm_lines(comm_model: dict | None) -> list[str]:
    """comm(n) as `model predict` prints a modelled time: per token count the model's time
    per allreduce, calibrated or not, its range, and comm(n) with its range; then what the
    ranges rest on (nccl_tune.spec.verify.comm_ranges)."""
    if not comm_model:
        return []
    rows = comm_model["rows"]
    how = "calibrated" if comm_model["calibrated"] else "uncalibrated: no fit of your machine"
    table = [
        [
            r["tokens"],
            r["bytes"],
            f"{r['time_us']:.2f}",
            r["algo"],
            r["proto"],
            "yes" if r["calibrated"] else "no",
            range_text(r["range_us"]),
            f"{r['comm_ms']:.3f}",
            "-" if not r["comm_range_ms"] else f"{r['comm_range_ms'][0]:.3f}-{r['comm_range_ms'][1]:.3f}",
        ]
        for r in rows
    ]
    return [
        (
            f"comm(n), MODELLED ({how}): {comm_model['collectives']} allreduces per forward of "
            "n tokens at the model's time per allreduce"
        ),
        tabulate(
            table,
            headers=[
                "tokens",
                "bytes",
                "model us",
                "algo",
                "proto",
                "calibrated",
                "range us",
                "comm ms",
                "comm range ms",
            ],
            tablefmt="simple",
            disable_numparse=True,
        ),
        *range_notes(rows),
    ]
