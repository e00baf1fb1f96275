"""`nccl-tune import-nccl-tests`: nccl-tests output (text or -J JSON) -> results records."""

from __future__ import annotations

from collections import Counter

import click
from tabulate import tabulate

from nccl_tune import fileio, store, vocab
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import envcheck
from nccl_tune.measure import importers


def _lint_env_option(env: dict[str, str]) -> None:
    """--env goes into every record as the settings the runs used: lint it like a profile.
    Errors refuse (exit 2); warnings are printed."""
    from nccl_tune.live import lint

    findings = lint.lint_env(env, source="--env")
    errors = [f for f in findings if f.severity == lint.ERROR]
    if errors:
        raise NcclTuneError("; ".join(f"--env: {f.variable}: {f.message}" for f in errors))
    for finding in findings:
        click.echo(f"warning: --env: {finding.variable}: {finding.message}", err=True)


@click.command("import-nccl-tests")
@click.argument("files", nargs=-1, required=True, type=vocab.InputFile())
@click.option(
    "--env",
    "env_text",
    metavar='"NCCL_A=x NCCL_B=y"',
    type=envcheck.Assignments(),
    help="The settings the runs used (replaces what the files' headers say; '' = baseline).",
)
@click.option("--label", help="A label stored in every record.")
@click.option(
    "--host",
    metavar="NAME",
    help="The machine the runs ran on (replaces the hosts the files name). The report "
    "compares results of one machine only; files that name no host are compared "
    "only within themselves unless given the same --host.",
)
@click.option(
    "--op",
    type=click.Choice(["allreduce", "all_gather", "reduce_scatter"]),
    help="The collective, when the file does not say (else read or inferred).",
)
@click.option(
    "--out",
    required=True,
    type=vocab.OutputFile(vocab.OutputKind.RESULTS),
    help="Results file to append to (JSON Lines).",
)
@click.option("--json", "as_json", is_flag=True, help="Print the summary as JSON.")
def import_nccl_tests(files, env_text, label, host, op, out, as_json):
    """Convert all_reduce_perf (all_gather, reduce_scatter) output into results records.

    One record per run and size (backend nccl-tests); the out-of-place time is the
    latency, the in-place one is kept; rows with #wrong > 0 are imported as wrong and
    cut-off or failed rows as failed. Every file is read before anything is written.
    """
    fileio.check_output(out, kind=fileio.OutputKind.RESULTS, inputs=files, option="--out")
    env = importers.parse_env_option(env_text) if env_text is not None else None
    if env:
        _lint_env_option(env)
    run_id = store.new_run_id()
    parsed = []
    for path in files:  # read all first: a bad file aborts before anything is appended
        records, runs = importers.import_file(path, env=env, label=label, op=op, run_id=run_id, host=host)
        parsed.append((path, records, runs))
    summary = []
    # One write for every file: all imported, or nothing (a full disk, another writer).
    store.append_records(out, [r for _, records, _ in parsed for r in records])
    for path, records, runs in parsed:
        statuses = Counter(r["status"] for r in records)
        first = records[0]
        summary.append(
            {
                "file": path,
                "runs": len(runs),
                "records": len(records),
                "op": first["op"],
                "world_size": first["world_size"],
                "world_size_inferred": first["world_size_inferred"],
                "nccl": (first["versions"] or {}).get("nccl"),
                "env": store.cell_label(first["env"]),
                "statuses": dict(statuses),
                "run_failures": sorted({r.failure for r in runs if r.failure}),
                "zero_byte_rows": sum(r.zero_byte_rows for r in runs),
                "notes": list(dict.fromkeys(n.split(" (this is part")[0] for r in runs for n in r.notes)),
            }
        )
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json({"out": out, "run_id": run_id, "files": summary})
        return
    rows = [
        [
            s["file"],
            s["runs"],
            s["records"],
            s["op"],
            f"{s['world_size']}{' (inferred)' if s['world_size_inferred'] else ''}" if s["world_size"] else "?",
            s["nccl"] or "?",
            s["env"],
            ", ".join(f"{n} {k}" for k, n in sorted(s["statuses"].items())),
        ]
        for s in summary
    ]
    click.echo(tabulate(rows, headers=["file", "runs", "records", "op", "ranks", "NCCL", "settings", "status"]))
    for s in summary:
        for note in s["notes"]:
            click.echo(f"note: {s['file']}: {note}")
        for failure in s["run_failures"]:
            click.echo(f"note: {s['file']}: the run reported a failure: {failure}")
        if s["zero_byte_rows"]:
            click.echo(
                f"note: {s['file']}: {s['zero_byte_rows']} row(s) of 0 bytes left out "
                "(NCCL does nothing for 0 elements: no message latency to compare)"
            )
    total = sum(s["records"] for s in summary)
    if not total:
        raise NcclTuneError("nothing imported")
    click.echo(f"appended {total} records to {out}; next: nccl-tune report {out}")
