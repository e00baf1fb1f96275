"""What rank 0 prints: header lines and an nccl-tests-like table, one row per size.

Rows are printed as each size finishes (like nccl-tests), so the columns have fixed
widths rather than being laid out by tabulate at the end. Pure functions of records.
"""

from __future__ import annotations

import os

from nccl_tune.store import cell_label

COLUMNS = (
    ("size", 12),
    ("count", 11),
    ("type", 10),
    ("time_p50(us)", 13),
    ("p99(us)", 10),
    ("cv%", 7),
    ("algbw", 8),
    ("busbw", 8),
    ("#wrong", 7),
)
# nccl-tune's dtype names -> the names nccl-tests prints in its type column.
NCCL_TYPE = {"bf16": "bfloat16", "fp16": "half", "fp32": "float"}


def header_lines(info: dict) -> list[str]:
    """The run's header: world, hosts, backend, mode, versions, NCCL_* and conf files."""
    versions = info.get("versions") or {}
    hosts = info.get("hosts") or []
    per_host: dict[str, int] = {}
    for host in hosts:
        per_host[host] = per_host.get(host, 0) + 1
    env = info.get("env_process") or {}
    conf = info.get("conf_files") or {}
    lines = [
        f"microbench.allreduce  run {info.get('run_id')}",
        f"world {info.get('world_size')} rank(s) on {info.get('nnodes')} node(s): "
        + ", ".join(f"{h} x{n}" for h, n in per_host.items()),
        f"backend {info.get('backend')}  mode {info.get('mode')}  op {info.get('op')}  "
        f"dtype {info.get('dtype')}  warmup {info.get('warmup')}  iters {info.get('iters')}"
        + (f"  graph-ops {info.get('graph_ops')}" if info.get("mode") == "graph" else "")
        + (
            f"  ops-per-sample {info.get('ops_per_sample')}"
            if info.get("mode") != "graph" and (info.get("ops_per_sample") or 1) > 1
            else ""
        )
        + (f"  gap-us {info.get('gap_us'):g} (timed from the last rank's arrival)" if info.get("gap_us") else ""),
        "versions: " + "  ".join(f"{k} {versions.get(k) or '-'}" for k in ("torch", "cuda", "nccl")),
        "NCCL_* at start: " + (" ".join(f"{k}={v}" for k, v in env.items()) or "(none)"),
    ]
    if conf:
        for path, values in conf.items():
            lines.append(f"NCCL conf file {path}: " + (" ".join(f"{k}={v}" for k, v in values.items()) or "(empty)"))
    gpus = info.get("gpus")
    if gpus:
        names: dict[str, int] = {}
        for name in gpus:
            names[name] = names.get(name, 0) + 1
        lines.append("gpus: " + ", ".join(f"{n} x{c}" for n, c in names.items()))
    lines.append("verify-effective: " + (info.get("verify_note") or "off"))
    for note in info.get("notes") or []:
        lines.append(note)
    return ["# " + line for line in lines]


def cell_lines(cell: str, env: dict, round_: int, plan: bool) -> list[str]:
    """The lines opening one cell's rows: which settings, then the column header."""
    lines = []
    if plan:
        lines.append(f"# cell {cell} round {round_}: {cell_label(env)}")
    head = "".join(name.rjust(width) for name, width in COLUMNS) + "  algo/proto/ch"
    lines.append("#" + head[1:])
    units = ["(B)", "(elements)", "", "", "", "", "(GB/s)", "(GB/s)", ""]
    lines.append("#" + "".join(u.rjust(w) for u, (_, w) in zip(units, COLUMNS))[1:])
    return lines


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def effective_text(effective: dict | None) -> str:
    """'Ring/LL/1' (+ '?' unconfirmed, '!' contradicted), or '-' when unknown."""
    if not effective or not effective.get("algo"):
        return "-"
    text = f"{effective['algo']}/{effective['proto']}/{_num(effective.get('channels'), 'd')}"
    confirmed = effective.get("confirmed")
    return text + ("" if confirmed else ("!" if confirmed is False else "?"))


def row(record: dict) -> str:
    """One table row for a record (a failed one shows its status and error instead)."""
    lat = record.get("lat_us") or {}
    cells = [
        str(record.get("bytes")),
        str(record.get("count", "-")),
        NCCL_TYPE.get(record.get("dtype"), str(record.get("dtype"))),
    ]
    if record.get("status") in ("failed", "timeout"):
        text = "".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))
        return f"{text}  {record['status']}: {record.get('error')}"
    cv = lat.get("cv")
    cells += [
        _num(lat.get("p50"), ".2f"),
        _num(lat.get("p99"), ".2f"),
        _num(cv * 100 if cv is not None else None, ".1f"),
        _num(record.get("algbw_gbps"), ".3f"),
        _num(record.get("busbw_gbps"), ".3f"),
        _num(record.get("wrong"), "d"),
    ]
    text = "".join(c.rjust(w) for c, (_, w) in zip(cells, COLUMNS))
    return f"{text}  {effective_text(record.get('effective'))}"


def read_conf_files(environ) -> dict[str, dict[str, str]]:
    """NCCL's configuration files that exist, in the order NCCL reads them.

    NCCL reads NCCL_CONF_FILE when it is set and not empty, *instead of* $HOME/.nccl.conf,
    then /etc/nccl.conf, and applies each value the environment does not set yet (so
    the first file wins; src/misc/param.cc initEnvFunc). A run records them. Values are
    read as KEY=VALUE lines, '#' comments skipped.
    """
    home = environ.get("HOME")  # NCCL builds the user file's path from $HOME (none: no file)
    user = environ.get("NCCL_CONF_FILE") or (os.path.join(home, ".nccl.conf") if home else None)
    paths = [user, "/etc/nccl.conf"]
    out: dict[str, dict[str, str]] = {}
    for path in paths:
        if not path or path in out or not os.path.isfile(path):
            continue
        values: dict[str, str] = {}
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                for line in handle:
                    text = line.strip()
                    if text and not text.startswith("#") and "=" in text:
                        key, _, value = text.partition("=")
                        values[key.strip()] = value.strip()
        except OSError:
            continue
        out[path] = values
    return out
