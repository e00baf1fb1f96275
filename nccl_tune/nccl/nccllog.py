"""NCCL's own log as the proof: per rank and communicator, what NCCL read and what it did.

Input: NCCL_DEBUG=INFO output, one file per process (NCCL_DEBUG_FILE=path.%h.%p) or one
server log with many processes interleaved. Lines are parsed by nccl_tune.nccl.debuglog
(parse_log); this module groups them by process (host:pid) and communicator, and checks
a profile against what each process logged.

What NCCL logs, and so what can be checked (src/misc/param.cc, src/debug.cc):
- "<NAME> set by environment to <value>" when NCCL reads a variable, whether it came
  from the environment or from a conf file (NCCL puts conf values into the environment).
  Cached parameters are logged once per process; NCCL_DEBUG* and NCCL_CONF_FILE are read
  before/without that line, and a plugin's own variables (NCCL_TUNER_CONFIG_FILE) by the
  plugin: those are "not logged", never "missing". NCCL does not log which conf files it
  read.
- channels, rings, trees and transports per communicator (INIT), the per-collective
  choice (TUNING, 2.24+ "AllReduce: N Bytes -> Algo RING proto LL channel{Lo..Hi}=...";
  2.19-2.23 numeric "N Bytes -> Algo 1 proto 0 time T"), tuner-plugin loading.

Which wins when a tuner plugin is loaded and NCCL_ALGO / NCCL_PROTO are set: the
environment. NCCL core zeroes the bandwidth of what they disable (src/graph/tuning.cc),
so those cost-table entries are -1 (IGNORE) before the plugin sees the table
(src/enqueue.cc ncclGetAlgoInfo); the plugin can only pick among what they allow, and
NCCL's example plugin skips a rule whose pair is IGNORE (then the next rule; with none,
it leaves nChannels = 1).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.nccl import debuglog, settings

# Read by NCCL without a "set by environment" line (debug.cc, param.cc) or by a plugin.
NOT_LOGGED = frozenset(
    {
        "NCCL_DEBUG",
        "NCCL_DEBUG_SUBSYS",
        "NCCL_DEBUG_FILE",
        "NCCL_DEBUG_TIMESTAMP_FORMAT",
        "NCCL_DEBUG_TIMESTAMP_LEVELS",
        "NCCL_CONF_FILE",
        "NCCL_TUNER_CONFIG_FILE",
    }
)
NVLINK_TYPES = ("NVL", "NVB", "C2C", "LOC")  # graph path types that are not PCIe/host
CONF_NOTE = (
    "NCCL does not log which conf files it read; their values show as 'set by "
    "environment' (nccl-tune check --pid PID lists the files a process would read)"
)


@dataclass
class Comm:
    """One communicator as one process logged it."""

    comm: str | None
    rank: int | None = None
    nranks: int | None = None
    nnodes: int | None = None
    channels: int | None = None
    ring_total: int | None = None
    rings: dict = field(default_factory=dict)
    trees: list = field(default_factory=list)
    transports: dict = field(default_factory=dict)  # (peer, transport) -> channels
    graph_types: set = field(default_factory=set)  # intra-node path types (GRAPH lines)
    choices: dict = field(default_factory=dict)  # (func, bytes, algo, proto, channels) -> n
    comm_known: bool = True  # False when choices were attributed without a comm id


@dataclass
class Process:
    """One process (host:pid) of the log: what it read, its communicators, its warnings."""

    key: str
    file: str
    host: str | None = None
    pid: int | None = None
    dev: int | None = None
    version: str | None = None
    library: str = "NCCL"
    env: dict = field(default_factory=dict)
    env_plugin: dict = field(default_factory=dict)
    tuner: dict | None = None
    comms: dict = field(default_factory=dict)  # comm id (or None) -> Comm
    current: str | None = None  # the communicator being initialised
    last: str | None = None  # the communicator named last (choices without a comm go there)
    warnings: list = field(default_factory=list)

    def comm(self, comm_id: str | None) -> Comm:
        """The Comm for `comm_id`, created on first sight."""
        if comm_id not in self.comms:
            self.comms[comm_id] = Comm(comm_id)
        return self.comms[comm_id]


def _process_key(entry: debuglog.LogLine, name: str) -> str:
    if entry.pid is not None:
        return f"{entry.host or '?'}:{entry.pid}"
    return f"{name}[{entry.dev}]" if entry.dev is not None else name


def _fold(proc: Process, entry: debuglog.LogLine) -> None:
    """Add one parsed line to its process."""
    data = entry.data or {}
    kind = entry.kind
    if kind == "version":
        proc.version, proc.library = data["version"], data.get("library", "NCCL")
    elif kind == "env":
        proc.env[data["var"]] = data["value"]
    elif kind == "env_plugin":
        proc.env_plugin[data["var"]] = data["value"]
    elif kind == "tuner":
        if data["loaded"] or proc.tuner is None:
            proc.tuner = dict(data)
    elif kind == "warn":
        proc.warnings.append({"message": entry.message, "source": data.get("source"), "function": data.get("function")})
    elif kind in ("init", "comm"):
        comm_id = data["comm"]
        if comm_id not in proc.comms and None in proc.comms:
            # Lines logged before a communicator named itself (NCCL < 2.19 logs no Init
            # START) belong to the one that names itself next.
            proc.comms[comm_id] = proc.comms.pop(None)
            proc.comms[comm_id].comm = comm_id
        comm = proc.comm(comm_id)
        comm.rank, comm.nranks = data["rank"], data["nranks"]
        comm.nnodes = data.get("nnodes", comm.nnodes)
        done = kind == "init" and data["event"].lower() != "init start"
        proc.current = None if done else comm_id
        proc.last = comm_id
    elif kind in ("ring", "trees", "transport", "coll_channels", "graph"):
        comm = proc.comm(data.get("comm") or proc.current)
        if kind == "ring":
            comm.rings[data["channel"]] = data["ranks"]
            if data["of"] is not None:
                comm.ring_total = max(comm.ring_total or 0, data["of"])
        elif kind == "trees":
            comm.trees.extend(t for _, t in data["trees"])
        elif kind == "transport":
            # "[receive]" lines name the peer first: "peer[dev] -> me[dev] [receive] via ..."
            peer = data["src"] if data["direction"] == "receive" else data["dst"]
            comm.transports.setdefault((peer, data["transport"]), set()).add(data["channel"])
        elif kind == "coll_channels":
            comm.channels = data["channels"]
        else:
            comm.graph_types.add(data["intra"])
    elif kind == "choice":
        comm_id = data.get("comm")
        known = comm_id is not None or len([c for c in proc.comms if c is not None]) <= 1
        comm = proc.comm(comm_id or proc.current or proc.last)
        comm.comm_known = comm.comm_known and known
        key = (data["func"], data["bytes"], data["algo"], data["proto"], data["channels"])
        comm.choices[key] = comm.choices.get(key, 0) + 1


def _used(comm: Comm) -> bool:
    return bool(comm.rings or comm.trees or comm.transports or comm.choices or comm.channels)


def read_processes(paths: list[str]) -> list[Process]:
    """Parse every file and group its lines by process; NcclTuneError for an unreadable
    file or one without a single NCCL line."""
    procs: dict[str, Process] = {}
    for path in paths:
        # By the input policy (nccl_tune.fileio): strict UTF-8, streamed, each line cut at
        # debuglog.MAX_LOG_LINE before any expression sees it.
        entries = debuglog.parse_log(
            text
            for _, text in fileio.iter_lines(
                path, what="NCCL log", max_line=debuglog.MAX_LOG_LINE, on_long=lambda number, length: None
            )
        )
        if not entries:
            raise NcclTuneError("no NCCL log line found (was NCCL_DEBUG=INFO set?)", path=path)
        name = os.path.basename(path)
        bare_version: dict | None = None  # old NCCL/RCCL print the banner without a prefix
        mine: list[Process] = []
        for entry in entries:
            if entry.kind == "version" and entry.pid is None and entry.dev is None:
                bare_version = entry.data
                continue
            key = _process_key(entry, name)
            if key not in procs:
                procs[key] = Process(key, path, entry.host, entry.pid, entry.dev)
                mine.append(procs[key])
            _fold(procs[key], entry)
        # NCCL prints its version once per job or per rank 0: processes of the same file
        # that logged none take the file's only version.
        versions = {(p.version, p.library) for p in mine if p.version}
        if bare_version:
            versions.add((bare_version["version"], bare_version.get("library", "NCCL")))
        for proc in mine:
            if proc.version is None and len(versions) == 1:
                proc.version, proc.library = next(iter(versions))
        if bare_version and not mine:
            procs[name] = Process(
                name, path, version=bare_version["version"], library=bare_version.get("library", "NCCL")
            )
    return list(procs.values())


def _rank_entry(proc: Process, comm: Comm | None) -> dict:
    transports = []
    choices = []
    if comm is not None:
        for (peer, name), chans in sorted(comm.transports.items()):
            transports.append({"peer": peer, "transport": name, "channels": sorted(chans)})
        for (func, nbytes, algo, proto, ch), n in sorted(
            comm.choices.items(), key=lambda kv: (str(kv[0][0]), kv[0][1])
        ):
            choices.append({"func": func, "bytes": nbytes, "algo": algo, "proto": proto, "channels": ch, "count": n})
    return {
        "rank": comm.rank if comm else None,
        "nranks": comm.nranks if comm else None,
        "nnodes": comm.nnodes if comm else None,
        "comm": comm.comm if comm else None,
        "process": proc.key,
        "host": proc.host,
        "pid": proc.pid,
        "dev": proc.dev,
        "file": proc.file,
        "version": proc.version,
        "library": proc.library,
        "env": dict(proc.env),
        "env_plugin": dict(proc.env_plugin),
        "conf_files": CONF_NOTE,
        "channels": (comm.channels or comm.ring_total) if comm else None,
        "rings": {str(k): v for k, v in sorted(comm.rings.items())} if comm else {},
        "trees": list(comm.trees) if comm else [],
        "transports": transports,
        "graph_types": sorted(comm.graph_types) if comm else [],
        "tuner_plugin": proc.tuner,
        "choices": choices,
        "choices_comm_known": comm.comm_known if comm else True,
        "warnings": list(proc.warnings),
    }


def rank_entries(procs: list[Process]) -> list[dict]:
    """One entry per (process, communicator); a process without a communicator line
    gives one entry with rank None. Sorted by communicator size, rank, process."""
    out = []
    for proc in procs:
        comms = [c for c in proc.comms.values() if c.comm is not None or _used(c)]
        if not comms:
            out.append(_rank_entry(proc, None))
        for comm in comms:
            out.append(_rank_entry(proc, comm))
    return sorted(
        out,
        key=lambda r: (
            r["nranks"] is None,
            r["nranks"] or 0,
            r["comm"] or "",
            r["rank"] if r["rank"] is not None else -1,
            r["process"],
        ),
    )


def _same_value(logged: str, expected: str) -> bool:
    """NCCL logs integer parameters as strtoll(value, 0) prints them (0x10 -> 16)."""
    if logged == expected:
        return True
    try:
        return int(logged, 0) == int(expected, 0)
    except ValueError:
        return False


def check_profile(procs: list[Process], profile_env: dict[str, str]) -> dict:
    """Every profile variable in every process: confirmed, different, missing or not_logged.

    `ok` is True when every variable NCCL logs was logged with the profile's value by
    every process. A variable NCCL never logs (NOT_LOGGED) cannot be confirmed here.
    """
    variables = []
    ok = bool(procs)
    for name, expected in profile_env.items():
        item = {"name": name, "expected": expected, "confirmed": [], "different": {}, "missing": []}
        for proc in procs:
            logged = proc.env.get(name)
            if logged is None:
                item["missing"].append(proc.key)
            elif _same_value(logged, expected):
                item["confirmed"].append(proc.key)
            else:
                item["different"][proc.key] = logged
        if name in NOT_LOGGED:
            item["status"] = "not_logged"
            item["note"] = "NCCL reads this variable without logging it"
        elif item["different"]:
            item["status"], ok = "different", False
        elif item["missing"]:
            item["status"], ok = "missing", False
            item["note"] = (
                "not in the log of these processes: the variable did not reach them "
                "(a restarted server, a launcher that drops variables) or NCCL "
                "never read it; NCCL logs a variable when it reads it (NCCL_DEBUG=INFO, "
                "subsystem ENV)"
            )
        else:
            item["status"] = "confirmed"
        variables.append(item)
    return {"ok": ok, "processes": len(procs), "variables": variables}


def _path_types(procs: list[Process]) -> set[str]:
    return {t for p in procs for c in p.comms.values() for t in c.graph_types}


def find_warnings(procs: list[Process], profile_env: dict[str, str] | None = None) -> list[dict]:
    """Known traps, per process: LL128 forced on PCIe, P2P requested but SHM used, a tuner
    plugin loaded while NCCL_ALGO / NCCL_PROTO are set; plus NCCL's own WARN lines."""
    out = []
    requested = profile_env or {}
    for proc in procs:
        env = {**requested, **proc.env}
        proto = proc.env.get("NCCL_PROTO") or requested.get("NCCL_PROTO")
        types = {t for c in proc.comms.values() for t in c.graph_types}
        ll128_used = any(k[3] == "LL128" for c in proc.comms.values() for k in c.choices)
        forced = bool(proto) and settings.enables_ll128(proto)
        if forced or (ll128_used and types and not types & set(NVLINK_TYPES)):
            if types and not types & set(NVLINK_TYPES):
                out.append(
                    {
                        "process": proc.key,
                        "kind": "ll128_pcie",
                        "message": f"LL128 forced (NCCL_PROTO={proto}) on a PCIe machine (path "
                        f"type {'/'.join(sorted(types))}): NCCL skips its LL128 "
                        "safety checks when NCCL_PROTO enables it; it can corrupt data",
                    }
                )
            elif forced and not types:
                out.append(
                    {
                        "process": proc.key,
                        "kind": "ll128_forced",
                        "message": f"LL128 forced (NCCL_PROTO={proto}): NCCL skips its LL128 "
                        "safety checks; the log shows no path type to tell NVLink "
                        "from PCIe (NCCL_DEBUG_SUBSYS=GRAPH prints it)",
                    }
                )
        p2p_asked = env.get("NCCL_P2P_LEVEL") or (env.get("NCCL_P2P_DISABLE") == "0")
        shm = sorted(
            {(peer, c.rank) for c in proc.comms.values() for (peer, name) in c.transports if name.startswith("SHM")}
        )
        if p2p_asked and shm:
            pairs = ", ".join(f"{r}->{peer}" for peer, r in shm[:6])
            ask = f"NCCL_P2P_LEVEL={env['NCCL_P2P_LEVEL']}" if env.get("NCCL_P2P_LEVEL") else "NCCL_P2P_DISABLE=0"
            out.append(
                {
                    "process": proc.key,
                    "kind": "p2p_not_used",
                    "message": f"P2P requested ({ask}) but SHM used between ranks {pairs}: "
                    "NCCL found P2P impossible there (IOMMU/ACS, a VM, a container "
                    "without the peer GPU) or P2P is disabled",
                }
            )
        if proc.tuner and proc.tuner.get("loaded"):
            set_vars = [f"{k}={env[k]}" for k in ("NCCL_ALGO", "NCCL_PROTO") if env.get(k)]
            if set_vars:
                out.append(
                    {
                        "process": proc.key,
                        "kind": "tuner_and_env",
                        "message": f"tuner plugin {proc.tuner.get('name')} loaded while "
                        f"{' '.join(set_vars)} is set: the environment wins (NCCL "
                        "marks what it disables IGNORE in the cost table the plugin "
                        "gets); a plugin rule for a disabled pair is skipped",
                    }
                )
        for warn in proc.warnings:
            out.append({"process": proc.key, "kind": "nccl_warn", "message": warn["message"], "source": warn["source"]})
    return out


def analyze(paths: list[str], profile_env: dict[str, str] | None = None) -> dict:
    """The report of `nccl-tune logs nccl`: keys ranks, processes, profile_check, warnings."""
    procs = read_processes(paths)
    return {
        "files": list(paths),
        "processes": len(procs),
        "ranks": rank_entries(procs),
        "profile_check": check_profile(procs, profile_env) if profile_env is not None else None,
        "warnings": find_warnings(procs, profile_env),
    }


def rank_check(log_path: str | list[str], profile_env: dict[str, str]) -> dict:
    """For `validate`: a server's NCCL log (one path, or the per-process files) against the
    profile it should carry (the baseline: {}).

    Returns {ok, ranks (process count), versions, variables (profile_check's), warnings,
    summary (one line)}; ok is None when there is no NCCL log (nothing to check).
    """
    paths = [log_path] if isinstance(log_path, str) else list(log_path)
    try:
        if not paths:
            raise NcclTuneError("NCCL wrote no log file")
        procs = read_processes(paths)
    except NcclTuneError as exc:
        return {
            "ok": None,
            "ranks": 0,
            "versions": [],
            "variables": [],
            "warnings": [],
            "summary": f"no NCCL log to check: {exc}",
        }
    check = check_profile(procs, profile_env)
    bad = [v for v in check["variables"] if v["status"] in ("missing", "different")]
    summary = f"{len(procs)} process(es) logged NCCL; " + (
        "every profile variable confirmed"
        if check["ok"]
        else "; ".join(f"{v['name']} {v['status']} in {len(v['missing']) + len(v['different'])}" for v in bad)
    )
    return {
        "ok": check["ok"],
        "ranks": len(procs),
        "versions": sorted({p.version for p in procs if p.version}),
        "variables": check["variables"],
        "warnings": [w["message"] for w in find_warnings(procs, profile_env) if w["kind"] != "nccl_warn"],
        "summary": summary,
    }


DEBUG_SUBSYS = "INIT,ENV,TUNING"  # what the check reads: variables, channels, transports, choices


def debug_env(prefix: str) -> dict[str, str]:
    """NCCL_DEBUG=INFO into private per-process files `prefix.<host>.<pid>` (NCCL_DEBUG_FILE's
    %h and %p), for a launch whose NCCL log is checked afterwards with rank_check."""
    return {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": DEBUG_SUBSYS, "NCCL_DEBUG_FILE": f"{prefix}.%h.%p"}


def debug_files(prefix: str) -> list[str]:
    """The files NCCL wrote for debug_env(prefix)."""
    import glob

    return sorted(glob.glob(glob.escape(prefix) + ".*"))
