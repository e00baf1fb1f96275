"""nccl-tests output -> results records (`nccl-tune import-nccl-tests`).

The formats are read by nccl_tune.nccl.nccltests (text tables in their old and new layouts,
as people paste them, and `-J` JSON). Here each row becomes a record (DESIGN.md section
3, via store.make_record), one per run and size, `backend: nccl-tests`.

nccl-tests reports the mean time per iteration: it becomes ``lat_us.mean`` and, lacking
a median, ``lat_us.p50`` (``latency_stat: "mean"``), unless per-iteration data gives
the real median (``latency_stat: "p50"``). The out-of-place time is the latency; the
in-place one is kept under ``inplace``. Fields nccl-tests lacks are left null.
"""

from __future__ import annotations

import os

from nccl_tune import fileio, store, vocab
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import envcheck
from nccl_tune.nccl.nccltests import Run, infer_op, infer_world_size, parse_json, parse_text

BACKEND = "nccl-tests"


# ---------------------------------------------------------------- records


def _latency(out: dict, iters: int | None) -> tuple[dict, str]:
    per = out.get("per_iter") or {}
    mean = out["time_us"]
    if per.get("p50_us") is not None:
        cv = per.get("cv_pct")
        return (
            {
                "min": per.get("min_us"),
                "p10": None,
                "p50": per["p50_us"],
                "p90": None,
                "p99": per.get("p99_us"),
                "max": per.get("max_us"),
                "mean": mean,
                "cv": cv / 100 if cv is not None else None,
                "n": iters,
            },
            "p50",
        )
    cv = per.get("cv_pct")
    return (
        {
            "min": per.get("min_us"),
            "p10": None,
            "p50": mean,
            "p90": None,
            "p99": per.get("p99_us"),
            "max": per.get("max_us"),
            "mean": mean,
            "cv": cv / 100 if cv is not None else None,
            "n": iters,
        },
        "mean",
    )


def run_records(
    run: Run,
    versions: dict,
    *,
    path: str,
    env: dict[str, str] | None,
    label: str | None,
    op: str | None,
    run_id: str,
    host: str | None = None,
) -> list[dict]:
    """One record per row of a run (DESIGN.md section 3 via store.make_record).

    `host` names the machine when the file does not (a pasted table): the report
    compares results of one machine only, and tells files without a host apart by
    `source_file`.
    """
    for row in run.rows:  # an absurd size (a typo, a corrupt file) is refused, not inferred from
        if row["size"] > vocab.MAX_BYTES:
            digits = str(row["size"])
            raise NcclTuneError(
                f"a size of {digits[:30]}{'...' if len(digits) > 30 else ''} bytes "
                f"is more than one GPU holds (at most {vocab.MAX_BYTES})",
                path=path,
                line=row.get("line"),
            )
    cell_env = dict(run.env if env is None else env)
    nranks = len(run.gpus) or None
    the_op = op or run.op or infer_op(run.rows)
    if the_op == "rooted":
        raise NcclTuneError(
            "broadcast/reduce results (a root other than -1) are not supported: "
            "pass --op if this is an allreduce, all_gather or reduce_scatter",
            path=path,
        )
    inferred = nranks is None
    if inferred:
        nranks = infer_world_size(run.rows, the_op)
    oob_failed = bool(run.out_of_bounds) and not any(
        (row["out"] or {}).get("wrong") or (row["in"] or {}).get("wrong") for row in run.rows
    )
    records = []
    for row in run.rows:
        # NCCL does nothing for 0 elements (enqueue.cc taskAppend returns at once when
        # count == 0): such a row times an empty call, not a message.
        if row["size"] <= 0:
            run.zero_byte_rows += 1
            continue
        out, inplace = row["out"], row["in"]
        status, error, correct, wrong = "ok", None, None, None
        if out is None:
            status = "failed"
            error = row["failure"] or "the row ends before its numbers (output cut off)"
        else:
            wrongs = [b.get("wrong") for b in (out, inplace) if b and b.get("wrong") is not None]
            checked = bool(wrongs)
            wrong = sum(wrongs) if checked else None
            correct = (wrong == 0) if checked else None
            if wrong:
                status, error = "wrong", f"nccl-tests reported {wrong} wrong elements"
            elif oob_failed:
                status, correct = "wrong", False
                error = (
                    f"the run reported {run.out_of_bounds} out-of-bounds values (FAILED); its rows cannot be told apart"
                )
        lat, stat = _latency(out, row.get("iters") or run.iters) if out else (None, None)
        record = store.make_record(
            run_id=run_id,
            env=cell_env,
            backend=BACKEND,
            op=the_op,
            mode=None if run.graph is None else ("graph" if run.graph else "eager"),
            world_size=nranks,
            nnodes=len(set(run.hosts)) or None,
            bytes=row["size"],
            dtype=row["type"],
            iters=row.get("iters") or run.iters,
            lat_us=lat,
            samples_us=(out or {}).get("samples_us"),
            algbw_gbps=(out or {}).get("algbw_gbps"),
            busbw_gbps=(out or {}).get("busbw_gbps"),
            correct=correct,
            wrong=wrong,
            effective=None,
            versions={
                "nccl": versions.get("nccl"),
                "torch": None,
                "cuda": None,
                "nccl_tests": versions.get("nccl_tests"),
            },
            host=host or (run.hosts[0] if run.hosts else None),
            hosts=[host] if host else (sorted(set(run.hosts)) or None),
            gpus=run.gpus or None,
            topology=None,
            status=status,
            error=error,
            round=run.number,
            label=label,
            latency_stat=stat,
            redop=row.get("redop"),
            root=row.get("root"),
            inplace=None
            if inplace is None
            else {k: inplace.get(k) for k in ("time_us", "algbw_gbps", "busbw_gbps", "wrong")},
            run_failure=run.failure,
            env_plugin=run.env_plugin or None,
            source_file=os.path.basename(path),
            source_line=row["line"],
            source_entry=row.get("entry"),
            world_size_inferred=inferred and nranks is not None,
        )
        records.append(record)
    return records


def parse_env_option(text: str) -> dict[str, str]:
    """``--env "NCCL_PROTO=LL NCCL_ALGO=Ring"`` -> mapping; NcclTuneError on a bad item, an
    unknown name or a bad value (the vocabulary's rule, nccl_tune.live.envcheck)."""
    env = envcheck.parse_assignments(text, "--env")
    envcheck.check_settings(env.items(), "--env")
    return env


MAX_IMPORT_BYTES = 32 * 1024 * 1024  # an nccl-tests output, NCCL's INFO lines of many ranks included


def import_file(
    path: str,
    *,
    env: dict[str, str] | None = None,
    label: str | None = None,
    op: str | None = None,
    run_id: str | None = None,
    host: str | None = None,
) -> tuple[list[dict], list[Run]]:
    """Records of one nccl-tests output file (text or -J JSON) and the runs found in it."""
    text = fileio.read_text(path, what="nccl-tests output", max_bytes=MAX_IMPORT_BYTES)
    is_json = text.lstrip().startswith("{")
    runs, versions = parse_json(text, path) if is_json else parse_text(text, path)
    run_id = run_id or store.new_run_id()
    records = []
    for run in runs:
        records += run_records(run, versions, path=path, env=env, label=label, op=op, run_id=run_id, host=host)
    if not records:
        raise NcclTuneError("only rows of 0 bytes: nothing to import", path=path)
    for record in records:  # never write what a reader would skip
        problem = store.field_problem(record)
        if problem:
            where = f"results entry {record['source_entry']}: " if record.get("source_entry") else ""
            raise NcclTuneError(f"{where}cannot import this row: {problem}", path=path, line=record.get("source_line"))
    return records, runs
