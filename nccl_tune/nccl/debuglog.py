"""NCCL's debug log (NCCL_DEBUG=INFO output), line by line: what each line says, a
summary of a run's lines, and whether they confirm the settings a cell requested.

`parse_log_line` / `parse_log` turn lines into `LogLine`s (None for anything that is not
an NCCL line; no input raises), `summarize_log` gathers what a run read and chose
(variables, channels, rings, trees, the per-collective algorithm and protocol, tuner
plugins), and `confirm_effective` / `confirm_reread` compare that with a cell's requested
environment. Grouping by process and communicator, and checking a profile against a
server's log, is nccl_tune.nccl.nccllog. Pure functions (no library is loaded).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from nccl_tune.nccl.ncclinfo import parse_version

# A parser for NCCL_DEBUG=INFO output (DESIGN.md section 5). Lines look like
#
#     host:pid:tid [dev] NCCL INFO <message>
#     host:pid:tid [dev] file.cc:123 NCCL WARN <message>
#     host:pid:tid [dev] file.cc:123 (function) NCCL WARN <message>   (2.30: src/debug.cc)
#     host:pid:tid [dev] 12.345678 function:123 NCCL TRACE <message>
#     NCCL version 2.12.7+cuda11.4                  (VERSION level: no prefix)
#     RCCL version : 2.21.5-HEAD:9a0e6a1           (RCCL's banner; 2.6-era RCCL: "RCCL version 2.6.4+hip3.5")
#
# possibly behind a prefix added by the launcher or the log collector (mpirun
# --tag-output "[1,0]<stdout>:", "[0] ", torchrun "[rank0]:", a timestamp, Ray's
# "(pid=...)"), so the NCCL part is searched for anywhere in the line. Anything that is
# not an NCCL line parses to None; no input raises.

# Numeric ids of the 2.19-2.23 per-collective line ("Algo 1 proto 0"), in NCCL's enum
# order: NCCL_ALGO_TREE 0, RING 1, COLLNET_DIRECT 2, COLLNET_CHAIN 3, NVLS 4,
# NVLS_TREE 5, PAT 6 (src/include/device.h, later src/include/nccl_tuner.h; PAT from
# 2.23, the CollNet split and NVLS from 2.14-2.17); NCCL_PROTO_LL 0, LL128 1, SIMPLE 2.
# Before 2.14 id 2 was the single NCCL_ALGO_COLLNET (src/include/devcomm.h).
ALGO_BY_ID = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
ALGO_BY_ID_BEFORE_2_14 = ("Tree", "Ring", "CollNetDirect")
PROTO_BY_ID = ("LL", "LL128", "Simple")
_ALGO_NAMES = {name.lower(): name for name in ALGO_BY_ID} | {"collnet": "CollNetDirect"}
_PROTO_NAMES = {name.lower(): name for name in PROTO_BY_ID}
# nccl-tune op name -> NCCL's function name in the log (ncclFuncToString).
OP_FUNC = {"allreduce": "AllReduce", "all_gather": "AllGather", "reduce_scatter": "ReduceScatter"}

# The prefix of a log line, found in linear time (a search for the whole prefix tried
# every start position and scanned the host name from each: quadratic, 75 s on one
# 40,000-character line). First the level words, a literal search; then the prefix
# fields, matched only in the PREFIX_SPAN characters before them, anchored at their end.
_LEVEL_RE = re.compile(r"NCCL (?P<level>INFO|WARN|TRACE|CALL)\b ?")
_HEAD_RE = re.compile(
    r"(?:(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) )?\[(?P<dev>\d+)\] "
    r"(?:(?P<ms>\d+\.\d+) )?(?:(?P<src>[\w./+-]+:\d+) )?(?:\((?P<func>\S*?)\) )?\Z"
)
PREFIX_SPAN = 512  # host (at most 255) + pid, tid, device, time, file:line and function
MAX_LEVEL_TRIES = 4  # "NCCL INFO" words in a line before its prefix is given up
MAX_LOG_LINE = 64 * 1024  # longer lines are matched on their first 64 KiB only
_VERSION_RE = re.compile(
    r"(?P<lib>NCCL|RCCL) version\s*(?::\s*)?(?P<v>\d+\.\d+\.\d+)"
    r"(?:[+-](?:cuda(?P<cuda>\d+(?:\.\d+)*)|hip(?P<hip>\d+(?:\.\d+)*)|HEAD(?::(?P<git>\w+))?))?"
)
_ENV_RE = re.compile(r"^(?P<var>NCCL_[A-Z0-9_]+) set by environment to (?P<val>.*)$")
# NCCL_NO_CACHE taking effect for one parameter (2.29.7 src/misc/param.cc; 2.30+ with a
# "PARAM: " prefix, src/param/param.cc ncclParamIsCacheDisabled).
_NO_CACHE_RE = re.compile(r"^(?:PARAM: )?Disabling caching for environment variable (?P<var>NCCL_[A-Z0-9_]+)\.?$")
_PLUGIN_ENV_RE = re.compile(r"Setting (?P<var>NCCL_[A-Z0-9_]+) to \"?(?P<val>[^\"]*)\"?")
_TRANSPORT_RE = re.compile(
    r"^(?P<what>Channel|Ring) (?P<ch>\d+)(?:/(?P<sub>\d+))? : (?P<src>\d+)\[(?P<srcdev>[0-9a-fA-Fx]+)\]"
    r" -> (?P<dst>\d+)\[(?P<dstdev>[0-9a-fA-Fx]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$"
)
_RING_RE = re.compile(r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<n>\d+))? :(?P<ranks>(?:\s+-?\d+)*)\s*$")
_TREES_RE = re.compile(r"^Trees? (?P<body>\[\d+\].*)$")
_CONNECTED_RE = re.compile(r"^Connected all (?P<what>rings|trees)")
_COLL_CHANNELS_RE = re.compile(r"^(?P<n>\d+) coll channels")
# RCCL appends the communicator to transport lines: "via P2P/IPC comm 0x2bc1f840 nRanks 02".
# (?<!\s): a match starts where a whitespace run starts, so no run is scanned twice.
_VIA_COMM_RE = re.compile(r"(?<!\s)\s+comm (?P<comm>0x[0-9a-fA-F]+) nRanks (?P<nranks>\d+)\s*$")
# The API-call line (NCCL_DEBUG_SUBSYS=COLL), src/enqueue.cc ncclEnqueueCheck, 2.x:
# "AllReduce: opCount 3 sendbuff 0x.. recvbuff 0x.. count 7168 datatype 9 op 0 root 0 comm 0x.. [nranks=8] stream 0x.."
_COLL_RE = re.compile(
    r"^(?P<func>[A-Za-z]+): opCount (?P<op>[0-9a-fA-F]+) .*?\bcount (?P<count>\d+) datatype "
    r"(?P<dtype>\d+)(?: op (?P<redop>\d+))?(?: root (?P<root>-?\d+))? comm (?P<comm>0x[0-9a-fA-F]+|\(nil\))"
    r"(?: \[nranks=(?P<nranks>\d+)\])?"
)
# Tuner plugin lines (src/misc/tuner.cc 2.19-2.23, src/plugin/tuner.cc 2.24+).
# The name is the rest of the line less a " (vN)" suffix, cut in code: a lazy name
# before an optional suffix and trailing spaces backtracks over every space (quadratic).
_TUNER_RE = re.compile(
    r"^(?:TUNER/Plugin: Using (?!internal)(?:tuner plugin )?(?P<name>.+)"
    r"|Successfully loaded external tuner plugin (?P<path>\S+)\s*$)"
)
_TUNER_V_RE = re.compile(r" \(v(?P<v>\d+)\)\Z")
_TUNER_NONE_RE = re.compile(r"^TUNER/Plugin: (?:.*using internal tuner|No plugin found|Could not find)", re.I)
# Graph search result (NCCL_DEBUG_SUBSYS=GRAPH): intra/inter path types, NVL = NVLink.
_GRAPH_RE = re.compile(
    r"^Pattern (?P<pattern>\d+), crossNic \d+, nChannels (?P<n>\d+), bw [\d.]+/[\d.]+, "
    r"type (?P<intra>[A-Z0-9]+)/(?P<inter>[A-Z0-9]+)"
)
# "comm 0x5967f7993f30 rank 0 nRanks 1 nNodes 1 localRanks 1 localRank 0 MNNVL 0" (init.cc).
_COMM_RE = re.compile(
    r"^comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) "
    r"nNodes (?P<nnodes>\d+) localRanks (?P<local>\d+)"
)
# "comm 0x.. rank R nranks N ... - Init COMPLETE": the event is looked for in code after
# the first "comm ... nranks N" (".*- " after each of many candidates is quadratic).
_INIT_RE = re.compile(r"comm (?P<comm>0x[0-9a-fA-F]+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)", re.IGNORECASE)
_INIT_EVENT_RE = re.compile(r"- (?P<what>Init START|Init COMPLETE|Destroy COMPLETE)", re.IGNORECASE)
_CHOICE_RE = re.compile(
    r"^(?:(?P<func>[A-Za-z]+): )?(?P<bytes>\d+) Bytes -> Algo (?P<algo>[A-Za-z_]+|\d+) proto "
    r"(?P<proto>[A-Za-z0-9_]+)(?: channel\{Lo\.\.Hi\}=\{(?P<lo>\d+)\.\.(?P<hi>\d+)\})?"
    r"(?: time (?P<time>-?[\d.]+(?:e[-+]?\d+)?))?"
)
# The label takes its trailing blanks (stripped in code): one greedy class, no overlap.
_TABLE_RE = re.compile(r"^\s*(?P<label>[A-Za-z][A-Za-z \t/]*)\|(?P<cells>.*)$")
_CELL_RE = re.compile(r"^\s*(?P<lat>-?[\d.]+)\s*/\s*(?P<bw>-?[\d.]+)\s*$")


@dataclass(frozen=True)
class LogLine:
    """One NCCL log line: where it came from, its kind and what it says.

    kind: version | env | no_cache | env_plugin | transport | ring | trees | connected |
    coll_channels | init | comm | choice | coll | tuner | graph | table | warn | info | trace.
    WARN lines' data: source ("file.cc:123" or None), file, line, function (2.30+).
    """

    kind: str
    level: str  # INFO | WARN | TRACE | CALL | VERSION
    message: str
    host: str | None = None
    pid: int | None = None
    dev: int | None = None
    data: dict | None = None


def canonical_algo(name: str) -> str | None:
    """'RING' / 'ring' / 'NVLS_TREE' -> 'Ring' / 'NVLSTree'; None when unknown."""
    return _ALGO_NAMES.get(name.replace("_", "").lower())


def canonical_proto(name: str) -> str | None:
    """'SIMPLE' / 'll128' -> 'Simple' / 'LL128'; None when unknown."""
    return _PROTO_NAMES.get(name.lower())


def _by_id(table: tuple[str, ...], text: str) -> str | None:
    index = int(text)
    return table[index] if 0 <= index < len(table) else None


def _choice(match: re.Match, version: tuple[int, int, int] | None) -> dict:
    algo, proto = match.group("algo"), match.group("proto")
    numeric = algo.isdigit()
    algos = ALGO_BY_ID_BEFORE_2_14 if version is not None and version < (2, 14, 0) else ALGO_BY_ID
    lo, hi = match.group("lo"), match.group("hi")
    time_us = match.group("time")
    return {
        "func": match.group("func"),
        "bytes": int(match.group("bytes")),
        "algo": _by_id(algos, algo) if numeric else canonical_algo(algo),
        "proto": _by_id(PROTO_BY_ID, proto) if proto.isdigit() else canonical_proto(proto),
        "raw_algo": algo,
        "raw_proto": proto,
        "numeric": numeric,
        "channel_lo": int(lo) if lo is not None else None,
        "channel_hi": int(hi) if hi is not None else None,
        "channels": int(hi) - int(lo) + 1 if lo is not None and hi is not None else None,
        "time_us": float(time_us) if time_us is not None else None,
    }


def _last_event(text: str, start: int) -> str | None:
    """The last '- Init START|Init COMPLETE|Destroy COMPLETE' after `start` (what the
    greedy '.*- ' of a single expression took), in one linear scan."""
    last = None
    for match in _INIT_EVENT_RE.finditer(text, start):
        last = match
    return last["what"] if last else None


def _table_row(message: str) -> dict | None:
    match = _TABLE_RE.match(message)
    if not match:
        return None
    label = match.group("label").strip()
    cells = [c.strip() for c in match.group("cells").split("|")]
    if cells and cells[-1] == "":
        cells.pop()
    if not cells:
        return None
    if label == "Algorithm":
        return {"row": "algorithms", "values": cells}
    if label == "Protocol":
        return {"row": "protocols", "values": cells}
    if label == "Latency/AlgBw":  # 2.8-2.18: one header of "Tree/    LL" pairs
        pairs = []
        for cell in cells:
            algo, _, proto = cell.partition("/")
            pairs.append(
                (canonical_algo(algo.strip()) or algo.strip(), canonical_proto(proto.strip()) or proto.strip())
            )
        return {"row": "pairs", "values": pairs}
    if label == "Max NThreads":
        try:
            return {"row": "nthreads", "values": [int(c) for c in cells]}
        except ValueError:
            return None
    parsed = [_CELL_RE.match(c) for c in cells]
    if not all(parsed) or " " in label:
        return None
    return {"row": "costs", "func": label, "values": [(float(m.group("lat")), float(m.group("bw"))) for m in parsed]}


def _classify(message: str, version: tuple[int, int, int] | None) -> tuple[str, dict | None]:
    text = message.strip()
    match = _VERSION_RE.search(text)
    if match and match.start() == 0:
        return "version", _version_data(match)
    match = _ENV_RE.match(text)
    if match:
        value = match.group("val").strip()
        if value.endswith(".") and value[:-1].lstrip("-").isdigit():
            value = value[:-1]  # integer params end their sentence with "."
        return "env", {"var": match.group("var"), "value": value}
    match = _NO_CACHE_RE.match(text)
    if match:
        return "no_cache", {"var": match.group("var")}
    match = _PLUGIN_ENV_RE.search(text)
    if match:
        return "env_plugin", {"var": match.group("var"), "value": match.group("val")}
    match = _CHOICE_RE.match(text)
    if match:
        return "choice", _choice(match, version)
    match = _TRANSPORT_RE.match(text)
    if match:
        via, comm, comm_ranks = match.group("via").strip(), None, None
        tail = _VIA_COMM_RE.search(via)
        if tail:  # RCCL: "... via P2P/IPC comm 0x2bc1f840 nRanks 02"
            via, comm, comm_ranks = via[: tail.start()].strip(), tail.group("comm"), int(tail.group("nranks"))
        parts = via.split("/")
        transport = "/".join(parts[:2]) if parts[0] in ("P2P", "SHM", "NET") and len(parts) > 1 else parts[0]
        return "transport", {
            "channel": int(match.group("ch")),
            "src": int(match.group("src")),
            "dst": int(match.group("dst")),
            "direction": match.group("dir"),
            "via": via,
            "transport": transport,
            "comm": comm,
            "nranks": comm_ranks,
        }
    match = _RING_RE.match(text)
    if match:
        ranks = [int(r) for r in match.group("ranks").split()]
        total = match.group("n")
        return "ring", {
            "channel": int(match.group("ch")),
            "of": int(total) if total is not None else None,
            "ranks": ranks,
        }
    match = _TREES_RE.match(text)
    if match:
        return "trees", {"trees": re.findall(r"\[(\d+)\] (\S+)", match.group("body"))}
    match = _CONNECTED_RE.match(text)
    if match:
        return "connected", {"what": match.group("what")}
    match = _COLL_CHANNELS_RE.match(text)
    if match:
        return "coll_channels", {"channels": int(match.group("n"))}
    match = _COLL_RE.match(text)
    if match:
        return "coll", {
            "func": match.group("func"),
            "op_count": match.group("op"),
            "count": int(match.group("count")),
            "datatype": int(match.group("dtype")),
            "comm": match.group("comm"),
            "nranks": int(match.group("nranks")) if match.group("nranks") else None,
        }
    match = _TUNER_RE.match(text)
    if match and (match.group("path") or match.group("name").strip()):
        name = (match.group("name") or "").rstrip()
        version = _TUNER_V_RE.search(name) if name else None
        if version:
            name = name[: version.start()]
        return "tuner", {
            "loaded": True,
            "name": name or match.group("path"),
            "interface": int(version["v"]) if version else None,
        }
    if _TUNER_NONE_RE.match(text):
        return "tuner", {"loaded": False, "name": None, "interface": None}
    match = _GRAPH_RE.match(text)
    if match:
        return "graph", {
            "pattern": int(match.group("pattern")),
            "channels": int(match.group("n")),
            "intra": match.group("intra"),
            "inter": match.group("inter"),
        }
    match = _COMM_RE.match(text)
    if match:
        return "comm", {
            "comm": match.group("comm"),
            "rank": int(match.group("rank")),
            "nranks": int(match.group("nranks")),
            "nnodes": int(match.group("nnodes")),
            "local_ranks": int(match.group("local")),
        }
    match = _INIT_RE.search(text)
    event = _last_event(text, match.end()) if match else None
    if event:
        return "init", {
            "comm": match.group("comm"),
            "rank": int(match.group("rank")),
            "nranks": int(match.group("nranks")),
            "event": event,
        }
    row = _table_row(message)
    if row is not None:
        return "table", row
    return "info", None


def _version_data(match: re.Match) -> dict:
    data = {"version": match.group("v"), "cuda": match.group("cuda")}
    if match.group("lib") == "RCCL":  # extra keys only for RCCL: NCCL's stay as they were
        data.update(library="RCCL", hip=match.group("hip"), git=match.group("git"))
    return data


def _warn_data(match: dict) -> dict:
    src = match["src"]
    file, _, line = src.rpartition(":") if src else (None, None, None)
    return {"source": src, "file": file or None, "line": int(line) if line else None, "function": match["func"] or None}


def _prefix(line: str) -> dict | None:
    """The prefix fields (host, pid, tid, dev, ms, src, func), level and message of an
    NCCL log line, or None: linear in the line's length (see _LEVEL_RE)."""
    for tries, level in enumerate(_LEVEL_RE.finditer(line)):
        if tries >= MAX_LEVEL_TRIES:
            return None
        start = max(0, level.start() - PREFIX_SPAN)
        head = _HEAD_RE.search(line, start, level.start())
        if head is not None:
            return {**head.groupdict(), "level": level["level"], "msg": line[level.end() :]}
    return None


def parse_log_line(raw: str, version: tuple[int, int, int] | None = None) -> LogLine | None:
    """Parse one line of NCCL output; None when it is not an NCCL log line.

    `version` (from an earlier version line) decides how numeric algorithm ids read.
    """
    if not isinstance(raw, str):
        return None
    line = raw[:MAX_LOG_LINE].rstrip("\r\n")
    match = _prefix(line)
    if match is None:
        version_match = _VERSION_RE.search(line)
        if version_match is None:
            return None
        return LogLine("version", "VERSION", line[version_match.start() :], data=_version_data(version_match))
    level, message = match["level"], match["msg"]
    common = dict(
        level=level,
        message=message,
        host=match["host"],
        pid=int(match["pid"]) if match["pid"] else None,
        dev=int(match["dev"]),
    )
    if level == "WARN":
        return LogLine("warn", data=_warn_data(match), **common)
    if level in ("TRACE", "CALL"):
        kind, data = _classify(message, version)
        return LogLine(kind if kind == "choice" else "trace", data=data if kind == "choice" else None, **common)
    kind, data = _classify(message, version)
    return LogLine(kind, data=data, **common)


# ncclDataType_t -> bytes per element (nccl.h: int8 uint8 int32 uint32 int64 uint64 half
# float double bfloat16 fp8e4m3 fp8e5m2).
DTYPE_BYTES = (1, 1, 4, 4, 8, 8, 2, 4, 8, 2, 1, 1)


def _coll_bytes(coll: dict) -> set[int]:
    """The nBytes a choice line may show for an API-call line: count x element size, or
    that times nranks (allgather / reducescatter count the whole buffer)."""
    dtype = coll.get("datatype")
    if dtype is None or not 0 <= dtype < len(DTYPE_BYTES):
        return set()
    one = coll["count"] * DTYPE_BYTES[dtype]
    return {one, one * coll["nranks"]} if coll.get("nranks") else {one}


def parse_log(lines) -> list[LogLine]:
    """Parse an iterable of lines (or one text); keeps NCCL lines only, in order.

    A choice line without a function name (the numeric 2.19-2.23 form) takes the
    function of the same process's latest API-call line ("Broadcast: opCount ...",
    NCCL_DEBUG_SUBSYS=COLL) when its size fits that call (data["func_from"] = "opCount");
    otherwise it stays None (it could be any collective).
    """
    if isinstance(lines, str):
        lines = lines.splitlines()
    out: list[LogLine] = []
    version = None
    last_call: dict[tuple, dict] = {}
    for raw in lines:
        entry = parse_log_line(raw, version)
        if entry is None:
            continue
        if entry.kind == "version":
            version = parse_version(entry.data["version"]) or version
        elif entry.kind == "coll":
            last_call[(entry.host, entry.pid)] = entry.data
        elif entry.kind == "choice" and entry.data["func"] is None:
            call = last_call.get((entry.host, entry.pid))
            if call is not None and entry.data["bytes"] in _coll_bytes(call):
                entry = replace(
                    entry, data={**entry.data, "func": call["func"], "func_from": "opCount", "comm": call["comm"]}
                )
        out.append(entry)
    return out


def _tuning_tables(entries: list[LogLine]) -> dict:
    """Fold the TUNING table rows (per process) into {func: {"Algo/Proto": [lat, bw]}}."""
    tables: dict[str, dict] = {}
    state: dict[tuple, dict] = {}
    for entry in entries:
        if entry.kind != "table":
            continue
        key = (entry.host, entry.pid)
        st = state.setdefault(key, {"pairs": []})
        row = entry.data
        if row["row"] == "algorithms":
            algos = [canonical_algo(a) or a for a in row["values"]]
            st["algos"] = algos
            st["pairs"] = [(a, p) for a in algos for p in PROTO_BY_ID]
        elif row["row"] == "protocols":
            # A protocol row may list more groups than there are algorithms (2.29's PAT
            # block does): the columns are algorithms x (LL, LL128, Simple) regardless.
            continue
        elif row["row"] == "pairs":
            st["pairs"] = row["values"]
        elif row["row"] == "costs":
            func = tables.setdefault(row["func"], {})
            for (algo, proto), (lat, bw) in zip(st["pairs"], row["values"]):
                func[f"{algo}/{proto}"] = [lat, bw]
    return tables


def summarize_log(entries: list[LogLine]) -> dict:
    """What a stretch of NCCL log says: version, env, channels, transports, choices, warnings.

    Keys: version, cuda, env (var -> value NCCL reported reading), env_plugin (values a
    network plugin set), channels (the communicator's channel count, from "N coll
    channels" or the "Channel xx/NN" ring lines), transports (sorted names), rings,
    trees, connected (sorted), comms (Init COMPLETE events), tuning (the cost table),
    choices (per-collective algorithm/protocol lines), warnings (WARN messages); when
    present, env_reads (every `set by environment` line in order, as (var, value)) and
    no_cache (variables NCCL said it stopped caching, NCCL_NO_CACHE 2.29.7+).
    """
    out: dict = {
        "version": None,
        "cuda": None,
        "env": {},
        "env_plugin": {},
        "channels": None,
        "transports": [],
        "rings": {},
        "trees": [],
        "connected": [],
        "comms": [],
        "tuning": {},
        "choices": [],
        "warnings": [],
    }
    transports: set[str] = set()
    connected: set[str] = set()
    ring_total = None
    for entry in entries:
        data = entry.data or {}
        if entry.kind == "version":
            out["version"], out["cuda"] = data["version"], data["cuda"]
        elif entry.kind == "env":
            out["env"][data["var"]] = data["value"]
            out.setdefault("env_reads", []).append((data["var"], data["value"]))  # every read
        elif entry.kind == "env_plugin":
            out["env_plugin"][data["var"]] = data["value"]
        elif entry.kind == "no_cache":
            out.setdefault("no_cache", [])
            if data["var"] not in out["no_cache"]:
                out["no_cache"].append(data["var"])
        elif entry.kind == "transport":
            transports.add(data["transport"])
        elif entry.kind == "ring":
            out["rings"][data["channel"]] = data["ranks"]
            if data["of"] is not None:
                ring_total = max(ring_total or 0, data["of"])
        elif entry.kind == "trees":
            out["trees"].extend(t for _, t in data["trees"])
        elif entry.kind == "connected":
            connected.add(data["what"])
        elif entry.kind == "coll_channels":
            out["channels"] = data["channels"]
        elif entry.kind == "init" and data["event"].lower() == "init complete":
            out["comms"].append({k: data[k] for k in ("comm", "rank", "nranks")})
        elif entry.kind == "choice":
            out["choices"].append(data)
        elif entry.kind == "warn":
            out["warnings"].append(entry.message)
    if out["channels"] is None:
        out["channels"] = ring_total
    out["transports"] = sorted(transports)
    out["connected"] = sorted(connected)
    out["tuning"] = _tuning_tables(entries)
    return out


def choices_for(summary: dict, op: str, nbytes: int, world: int = 1) -> list[dict]:
    """The per-collective choices of `summary` that belong to `op` at `nbytes`.

    NCCL logs all_gather / reduce_scatter sizes per rank (2.24+) or in total (older),
    so both count. Lines without a function name (the numeric form) match any op.
    """
    func = OP_FUNC.get(op, op).lower()
    sizes = {nbytes}
    if op in ("all_gather", "reduce_scatter") and world > 0:
        sizes.add(nbytes // world)
    return [
        c
        for c in summary.get("choices", [])
        if c["bytes"] in sizes and (c["func"] is None or c["func"].lower() == func)
    ]


def _requested_bounds(env: dict[str, str]) -> tuple[int | None, int | None]:
    def number(*names):
        for name in names:
            try:
                return int(env[name])
            except (KeyError, ValueError):
                continue
        return None

    return (number("NCCL_MIN_NCHANNELS", "NCCL_MIN_NRINGS"), number("NCCL_MAX_NCHANNELS", "NCCL_MAX_NRINGS"))


def confirm_effective(
    requested_env: dict[str, str],
    observed: dict | None,
    op: str = "allreduce",
    nbytes: int | None = None,
    world: int = 1,
) -> dict | None:
    """Compare what was requested with what NCCL's log says it ran: the `effective` object.

    Returns None when nothing was observed (no log), else {algo, proto, channels,
    confirmed, detail}: confirmed is True when every logged choice for this op and size
    obeys the requested NCCL_PROTO / NCCL_ALGO / NCCL_MAX_NCHANNELS and NCCL read the
    requested values it reports, False on any contradiction, None when the log holds no
    choice for this collective (an old NCCL, or TUNING not logged). `channels` is the
    number of channels the collective used (the communicator's when no choice was seen).
    """
    from nccl_tune.nccl import settings  # local: keeps this module importable on its own

    if not observed or not any(observed.get(k) for k in ("version", "choices", "comms", "env", "channels")):
        return None
    func = OP_FUNC.get(op, op)
    func_key = func.lower()
    version = observed.get("version")
    seen = choices_for(observed, op, nbytes, world) if nbytes is not None else list(observed.get("choices", []))
    problems: list[str] = []
    notes: list[str] = []
    # What NCCL says it read from the environment, against what was requested.
    for var, value in sorted(observed.get("env", {}).items()):
        if var in requested_env and requested_env[var] != value:
            problems.append(f"NCCL read {var}={value}, requested {requested_env[var]}")
    for var, value in sorted(observed.get("env_plugin", {}).items()):
        notes.append(f"a plugin set {var}={value}")
    min_ch, max_ch = _requested_bounds(requested_env)
    comm_channels = observed.get("channels")
    if max_ch is not None and comm_channels is not None and comm_channels > max_ch:
        problems.append(f"communicator has {comm_channels} channels, NCCL_MAX_NCHANNELS={max_ch}")
    if min_ch is not None and comm_channels is not None and comm_channels < min_ch:
        notes.append(f"communicator has {comm_channels} channels, NCCL_MIN_NCHANNELS={min_ch}")
    try:
        allowed_algos = settings.allowed_algorithms(requested_env.get("NCCL_ALGO"), func_key)
        allowed_protos = settings.allowed_protocols(requested_env.get("NCCL_PROTO"), func_key)
    except settings.SettingError as exc:
        allowed_algos = allowed_protos = None
        notes.append(f"requested value unreadable: {exc}")
    where = f"{func} {nbytes} B" if nbytes is not None else func
    head = f"NCCL {version}" if version else "NCCL (version not logged)"
    if not seen:
        detail = (
            f"{head}: no per-collective line for {where} (needs NCCL_DEBUG_SUBSYS=TUNING; "
            "NCCL < 2.24 logs it only in some releases)"
        )
        if problems:
            detail += "; contradicted: " + "; ".join(problems)
        return {
            "algo": None,
            "proto": None,
            "channels": comm_channels,
            "confirmed": False if problems else None,
            "detail": "; ".join([detail] + notes),
        }
    counts: dict[tuple, int] = {}
    for c in seen:
        key = (c["algo"], c["proto"], c["channels"])
        counts[key] = counts.get(key, 0) + 1
        if allowed_algos is not None and c["algo"] is not None and c["algo"] not in allowed_algos:
            problems.append(f"algorithm {c['algo']} used, NCCL_ALGO={requested_env.get('NCCL_ALGO')}")
        if allowed_protos is not None and c["proto"] is not None and c["proto"] not in allowed_protos:
            problems.append(f"protocol {c['proto']} used, NCCL_PROTO={requested_env.get('NCCL_PROTO')}")
        if max_ch is not None and c["channels"] is not None and c["channels"] > max_ch:
            problems.append(f"{c['channels']} channels used, NCCL_MAX_NCHANNELS={max_ch}")
        if c["algo"] is None or c["proto"] is None:
            notes.append(f"unknown algo/proto ids {c['raw_algo']}/{c['raw_proto']}")
    (algo, proto, channels), _ = max(counts.items(), key=lambda kv: kv[1])
    ran = ", ".join(
        f"{a}/{p}" + (f" on {n} ch" if n is not None else "") + f" x{k}"
        for (a, p, n), k in sorted(counts.items(), key=lambda kv: -kv[1])
    )
    asked = " ".join(
        f"{k}={requested_env[k]}"
        for k in ("NCCL_ALGO", "NCCL_PROTO", "NCCL_MIN_NCHANNELS", "NCCL_MAX_NCHANNELS")
        if k in requested_env
    )
    verdict = (
        ("contradicted: " + "; ".join(dict.fromkeys(problems)))
        if problems
        else (f"obeyed {asked}" if asked else "nothing requested")
    )
    return {
        "algo": algo,
        "proto": proto,
        "channels": channels if channels is not None else comm_channels,
        "confirmed": not problems,
        "detail": "; ".join([f"{head}: {where} ran {ran}", verdict] + notes),
    }


def _same_value(a: str, b: str) -> bool:
    """Equal as NCCL would read them: integer params are logged as parsed (0x10 -> 16)."""
    if a == b:
        return True
    try:
        return int(a, 0) == int(b, 0)
    except (TypeError, ValueError):
        return False


def confirm_reread(requested_env: dict[str, str], observed: dict | None, names, disabled=()) -> dict | None:
    """Whether the cached variables `names` (NCCL_NO_CACHE's list) took this cell's values
    in the communicator whose log stretch is `observed` (a summarize_log result).

    A variable the cell sets must appear in a `set by environment` line with that value
    (ncclLoadParam logs each read; a cached value would log nothing). One the cell leaves
    unset must have no such line, and NCCL must have said it stopped caching it
    ("Disabling caching for environment variable X", logged once per process: pass the
    names seen so far in the process as `disabled`), or a value cached from an earlier
    cell could be in force unseen. Returns None without a log, else {confirmed: True |
    False (contradicted) | None (not seen), detail}.
    """
    if not observed or not names:
        return None
    reads: dict[str, list[str]] = {}
    for var, value in observed.get("env_reads") or observed.get("env", {}).items():
        reads.setdefault(var, []).append(value)
    disabled = set(disabled) | set(observed.get("no_cache") or [])
    problems, missing, fine = [], [], []
    for name in names:
        seen = reads.get(name, [])
        wanted = requested_env.get(name)
        if wanted is not None:
            other = [v for v in seen if not _same_value(v, wanted)]
            if other:
                problems.append(f"NCCL read {name}={other[-1]}, the cell sets {wanted}")
            elif seen:
                fine.append(f"{name}={wanted} read")
            else:
                missing.append(f"no 'set by environment' line for {name}={wanted}")
        elif seen:
            problems.append(f"NCCL read {name}={seen[-1]}, the cell leaves it unset")
        elif name in disabled:
            fine.append(f"{name} unset (re-read)")
        else:
            missing.append(f"{name} unset, but NCCL never said it stopped caching it")
    confirmed = False if problems else (None if missing else True)
    detail = "; ".join(problems + missing + fine)
    return {"confirmed": confirmed, "detail": f"NCCL_NO_CACHE: {detail}"}
