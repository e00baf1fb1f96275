"""The NCCL variable catalogue: one place for each variable's grammar, scope and default.

Facts come from NCCL's documentation (docs.nvidia.com/deeplearning/nccl, "Environment
Variables") and, where marked (code), from reading NCCL 2.30 source; see
DESIGN.md section 5. Grammar details were checked against NCCL's source (tuning.cc
parseList, paths.cc ncclGetLevel, getNthreads) and the strings of libnccl 2.32.3, whose
table of names every catalogued variable but NCCL_TUNER_CONFIG_FILE (read by the tuner
plugin) appears in (tests/test_settings.py checks this against the installed library). Scope is what a sweep needs to know:

- ``communicator``: re-read at every communicator init (NCCL_PROTO, NCCL_ALGO,
  NCCL_THREAD_THRESHOLDS), so one process may try several values, one process group each;
- ``process``: cached on first read for the life of the process (most integer
  parameters) or process-wide by nature (P2P level, debug output), so a new value needs
  a new process.

`check_value` validates one value and returns findings (severity, message); `parse_*`
helpers expose the structure (which protocols a value allows for allreduce, say) for
grid pruning and for comparing what was asked with what NCCL reports it used.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass, field

ERROR = "error"
WARNING = "warning"

PROTOCOLS = ("LL", "LL128", "Simple")
ALGORITHMS = ("Tree", "Ring", "CollNetDirect", "CollNetChain", "NVLS", "NVLSTree", "PAT")
# Function prefixes of the per-collective form (NCCL >= 2.24), lower-cased. NCCL matches
# them case-insensitively against its ncclFuncStr table, whose first NCCL_NUM_FUNCTIONS (5)
# entries are these (tuning.cc parseList; libnccl 2.32.3's strings list the same five);
# any other prefix makes NCCL reject the whole value ("Unrecognized prefix token").
COLL_FUNCTIONS = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
# NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL path types: NCCL compares them with strcmp (so
# case-sensitively) against topoPathTypeStr up to SYS (graph/paths.cc ncclGetLevel); a
# value that matches nothing and does not start with a digit is silently ignored.
P2P_LEVELS = ("LOC", "NVL", "NVB", "C2C", "PIX", "PXB", "P2C", "PXN", "PHB", "SYS")
# Legacy integers (same function): 0 LOC, 1 PIX, 2 PXB, 3 PHB, 4 and above SYS.
LEGACY_LEVELS = ("LOC", "PIX", "PXB", "PHB", "SYS")
DEBUG_LEVELS = ("VERSION", "WARN", "INFO", "ABORT", "TRACE", "NONE")
# Subsystems NCCL_DEBUG_SUBSYS names (2.32.3's strings add ALLOC_HOST and DESTROY); NCCL
# ignores a name it does not know, so an unknown one is a warning, not an error.
DEBUG_SUBSYS = (
    "INIT",
    "COLL",
    "P2P",
    "SHM",
    "NET",
    "GRAPH",
    "TUNING",
    "ENV",
    "ALLOC",
    "ALLOC_HOST",
    "CALL",
    "PROXY",
    "NVLS",
    "BOOTSTRAP",
    "REG",
    "PROFILE",
    "RAS",
    "DESTROY",
    "ALL",
)
CTA_POLICIES = ("DEFAULT", "EFFICIENCY", "ZERO")

Finding = tuple[str, str]  # (severity, message)


class SettingError(ValueError):
    """A value that NCCL would reject or misread; the message says why."""


@dataclass(frozen=True)
class Setting:
    """One NCCL environment variable: its grammar, scope, default and meaning."""

    name: str
    scope: str  # "process" | "communicator"
    default: str
    meaning: str
    check: Callable[[str, tuple[int, int, int] | None], list[Finding]]
    tunable: bool = False  # a sweep may vary it for latency
    since: str | None = None  # first NCCL version that reads it, when recent
    aliases: tuple[str, ...] = field(default=())


def did_you_mean(word: str, choices, cutoff: float = 0.6) -> str:
    """'; did you mean X?' for the closest of `choices` (case-insensitive), else ''."""
    lookup = {c.lower(): c for c in choices}
    close = difflib.get_close_matches(word.lower(), list(lookup), n=1, cutoff=cutoff)
    return f"; did you mean {lookup[close[0]]}?" if close else ""


# ---------------------------------------------------------------- list grammars


def _parse_name_list(text: str, names: tuple[str, ...], what: str) -> tuple[bool, list[str]]:
    """Parse ``[^]a,b,c`` against `names` (case-insensitive) -> (excluded, canonical names)."""
    body = text.strip()
    exclude = body.startswith("^")
    if exclude:
        body = body[1:]
    items = [item.strip() for item in body.split(",")]
    if not body or any(not item for item in items):
        raise SettingError(f"empty {what} name in '{text}'")
    lookup = {n.lower(): n for n in names}
    out = []
    for item in items:
        canonical = lookup.get(item.lower())
        if canonical is None:
            raise SettingError(f"unknown {what} '{item}' (known: {', '.join(names)})" + did_you_mean(item, names))
        out.append(canonical)
    return exclude, out


def parse_coll_list(value: str, names: tuple[str, ...], what: str) -> dict[str, frozenset[str]]:
    """Parse NCCL's PROTO/ALGO grammar into the set each collective function may use.

    Grammar (NCCL >= 2.24; older versions take only the first form):
    ``[^]a,b`` or ``[^]a,b;func:[^]c,d;...``. The first list may lack a prefix and applies
    to every function; prefixed lists override it for one function. Returns a mapping
    with key ``"*"`` for the unprefixed list (when given) and one key per named function.
    """
    result: dict[str, frozenset[str]] = {}
    parts = value.split(";")
    for index, part in enumerate(parts):
        part = part.strip()
        if not part:
            raise SettingError(f"empty section in '{value}'")
        func = "*"
        if ":" in part:
            func, part = (s.strip() for s in part.split(":", 1))
            func = func.lower()
            if func not in COLL_FUNCTIONS:
                raise SettingError(f"unknown collective '{func}' (known: {', '.join(COLL_FUNCTIONS)})")
        elif index > 0:
            raise SettingError(f"only the first list may lack a 'function:' prefix in '{value}'")
        exclude, items = _parse_name_list(part, names, what)
        allowed = frozenset(names) - set(items) if exclude else frozenset(items)
        result[func] = allowed
    return result


def allowed_for(value: str | None, names: tuple[str, ...], what: str, func: str = "allreduce") -> frozenset[str]:
    """The names `value` lets `func` use (all of them when the variable is unset)."""
    if value is None or value == "":
        return frozenset(names)
    table = parse_coll_list(value, names, what)
    return table.get(func, table.get("*", frozenset(names)))


def allowed_protocols(value: str | None, func: str = "allreduce") -> frozenset[str]:
    """Protocols an NCCL_PROTO value allows for `func` (canonical names)."""
    return allowed_for(value, PROTOCOLS, "protocol", func)


def allowed_algorithms(value: str | None, func: str = "allreduce") -> frozenset[str]:
    """Algorithms an NCCL_ALGO value allows for `func` (canonical names)."""
    return allowed_for(value, ALGORITHMS, "algorithm", func)


def enables_ll128(value: str) -> bool:
    """True when an NCCL_PROTO value names LL128 for any function, or enables it by `^`.

    NCCL (code) treats any explicit NCCL_PROTO that enables LL128 as a user override and
    skips LL128's platform checks, so it runs even on PCIe, where it can corrupt data.
    """
    try:
        table = parse_coll_list(value, PROTOCOLS, "protocol")
    except SettingError:
        return False
    return any("LL128" in allowed for allowed in table.values())


# ---------------------------------------------------------------- value checkers


def _as_int(value: str) -> int:
    try:
        return int(value.strip(), 0)
    except ValueError:
        raise SettingError(f"'{value}' is not an integer") from None


def _refuse_empty(table: dict[str, frozenset[str]], what: str) -> None:
    for func, allowed in table.items():
        if not allowed:
            target = "every collective" if func == "*" else func
            raise SettingError(f"leaves no {what} for {target}, so NCCL cannot run it")


def _check_proto(value: str, version=None) -> list[Finding]:
    _refuse_empty(parse_coll_list(value, PROTOCOLS, "protocol"), "protocol")
    found: list[Finding] = []
    if enables_ll128(value):
        found.append(
            (
                WARNING,
                f"'{value}' enables LL128 explicitly: NCCL then skips its LL128 "
                "safety checks and uses it even on PCIe, where it can corrupt data; "
                "leave LL128 to NCCL (it enables it itself where it is safe)",
            )
        )
    if ";" in value or ":" in value:
        found += _needs_version(version, (2, 24, 0), "per-collective NCCL_PROTO")
    return found


def _check_algo(value: str, version=None) -> list[Finding]:
    _refuse_empty(parse_coll_list(value, ALGORITHMS, "algorithm"), "algorithm")
    if ";" in value or ":" in value:
        return _needs_version(version, (2, 24, 0), "per-collective NCCL_ALGO")
    return []


def _needs_version(version, minimum: tuple[int, int, int], what: str) -> list[Finding]:
    if version is not None and tuple(version) < minimum:
        need = ".".join(map(str, minimum))
        have = ".".join(map(str, version))
        return [(WARNING, f"{what} needs NCCL >= {need}; the NCCL consulted is {have}")]
    return []


def _int_range(low: int, high: int | None, multiple: int = 1) -> Callable:
    def check(value: str, version=None) -> list[Finding]:
        number = _as_int(value)
        if number < low or (high is not None and number > high):
            bound = f"[{low}, {high}]" if high is not None else f">= {low}"
            raise SettingError(f"{number} is out of range {bound}")
        if number % multiple:
            raise SettingError(f"{number} is not a multiple of {multiple}")
        return []

    return check


def _check_channels(value: str, version=None) -> list[Finding]:
    number = _as_int(value)
    if not 1 <= number <= 64:
        raise SettingError(f"{number} is out of range [1, 64] (NCCL's MAXCHANNELS since 2.25)")
    if number > 32 and version is not None and tuple(version) < (2, 25, 0):
        return [(WARNING, f"{number} channels: NCCL before 2.25 caps channels at 32")]
    return []


def _choices(options: tuple[str, ...], *, case_sensitive: bool = False, integers: range | None = None) -> Callable:
    def check(value: str, version=None) -> list[Finding]:
        v = value.strip()
        if integers is not None and re.fullmatch(r"-?\d+", v):
            if int(v) not in integers:
                raise SettingError(f"{v} is out of range [{integers.start}, {integers.stop - 1}]")
            return []
        if v in options or (not case_sensitive and v.upper() in {o.upper() for o in options}):
            return []
        if case_sensitive and v.upper() in options:
            return [
                (
                    WARNING,
                    f"'{v}' is in the wrong case: NCCL matches '{v.upper()}' case-sensitively and ignores this value",
                )
            ]
        raise SettingError(
            f"'{v}' is not one of {', '.join(options)}"
            + (f" or {integers.start}-{integers.stop - 1}" if integers else "")
            + did_you_mean(v, options)
        )

    return check


def _bool01(value: str, version=None) -> list[Finding]:
    if value.strip() not in ("0", "1"):
        raise SettingError(f"'{value}' is not 0 or 1")
    return []


def _check_debug_subsys(value: str, version=None) -> list[Finding]:
    body = value.strip().lstrip("^")
    items = [item.strip() for item in body.split(",")]
    if not body or any(not item for item in items):
        raise SettingError(f"empty debug subsystem name in '{value}'")
    known = set(DEBUG_SUBSYS)
    unknown = [item for item in items if item.upper() not in known]
    if unknown:
        return [
            (
                WARNING,
                f"unknown debug subsystem {', '.join(unknown)} (NCCL ignores it; known: {', '.join(DEBUG_SUBSYS)})",
            )
        ]
    return []


def _check_path_level(value: str, version=None) -> list[Finding]:
    """NCCL_P2P_LEVEL / NCCL_NET_GDR_LEVEL: a path name (case-sensitive) or a legacy integer."""
    v = value.strip()
    if v in P2P_LEVELS:
        return []
    if v[:1].isdigit():
        if not v.isdigit():
            raise SettingError(f"'{v}' is neither a path name nor an integer")
        name = LEGACY_LEVELS[min(int(v), len(LEGACY_LEVELS) - 1)]
        return [
            (
                WARNING,
                f"legacy integer level {v} means {name} to NCCL; NCCL's documentation "
                f"discourages integers since their meaning changed over releases: "
                f"write {name}",
            )
        ]
    if v.upper() in P2P_LEVELS:
        return [
            (
                WARNING,
                f"'{v}' is in the wrong case: NCCL compares it case-sensitively with "
                f"'{v.upper()}', so it ignores this value and picks its own level",
            )
        ]
    raise SettingError(
        f"'{v}' is not one of {', '.join(P2P_LEVELS)} (or a legacy integer 0-4)" + did_you_mean(v, P2P_LEVELS)
    )


def _check_thread_thresholds(value: str, version=None) -> list[Finding]:
    fields = value.split()
    if not fields or len(fields) > 6:
        raise SettingError("expected up to 6 integers (Tree LL LL128 Simple, Ring LL LL128 Simple)")
    for item in fields:
        _as_int(item)
    return []


def _check_no_cache(value: str, version=None) -> list[Finding]:
    items = [s.strip() for s in value.split(",")]
    if not value.strip() or any(not s for s in items):
        raise SettingError("expected ALL or a comma list of parameter names")
    return []  # the version note comes from the entry's `since`


def _check_nonempty(value: str, version=None) -> list[Finding]:
    if not value.strip():
        raise SettingError("empty value")
    return []


def _check_iface_list(value: str, version=None) -> list[Finding]:
    body = value.lstrip("^=")
    if not body or any(not s.strip() for s in body.split(",")):
        raise SettingError("expected [^][=]name[,name...]")
    return []


_CATALOGUE = [
    Setting(
        "NCCL_PROTO",
        "communicator",
        "unset: NCCL picks per size (LL128 only where safe)",
        "Protocols NCCL may use: LL, LL128, Simple; ^ excludes; per collective since 2.24.",
        _check_proto,
        tunable=True,
    ),
    Setting(
        "NCCL_ALGO",
        "communicator",
        "unset: NCCL picks per size and topology",
        "Algorithms NCCL may use: Ring, Tree, NVLS, NVLSTree, CollNet*, PAT; ^ excludes.",
        _check_algo,
        tunable=True,
    ),
    Setting(
        "NCCL_THREAD_THRESHOLDS",
        "communicator",
        "unset: NCCL's built-in thresholds",
        "Per-thread byte thresholds below which NCCL uses fewer threads (space separated).",
        _check_thread_thresholds,
    ),
    Setting(
        "NCCL_MAX_NCHANNELS",
        "process",
        "unset: NCCL's topology search (up to 32 or 64)",
        "Upper bound on channels (CTAs) per collective; 1..32 before 2.25, 1..64 after.",
        _check_channels,
        tunable=True,
        aliases=("NCCL_MAX_NRINGS",),
    ),
    Setting(
        "NCCL_MIN_NCHANNELS",
        "process",
        "unset: NCCL's topology search",
        "Lower bound on channels per collective.",
        _check_channels,
        tunable=True,
        aliases=("NCCL_MIN_NRINGS",),
    ),
    Setting("NCCL_MAX_NRINGS", "process", "unset", "Old name of NCCL_MAX_NCHANNELS.", _check_channels),
    Setting("NCCL_MIN_NRINGS", "process", "unset", "Old name of NCCL_MIN_NCHANNELS.", _check_channels),
    Setting(
        "NCCL_MAX_CTAS",
        "process",
        "unset: NCCL's choice",
        "Upper bound on CTAs per collective (2.17+; config field maxCTAs).",
        _check_channels,
        tunable=True,
        since="2.17",
    ),
    Setting(
        "NCCL_MIN_CTAS",
        "process",
        "unset: NCCL's choice",
        "Lower bound on CTAs per collective (2.17+; config field minCTAs).",
        _check_channels,
        tunable=True,
        since="2.17",
    ),
    Setting(
        "NCCL_BUFFSIZE",
        "process",
        "4194304 (4 MiB)",
        "Bytes of the per-peer, per-channel buffer of the Simple protocol.",
        _int_range(1, None),
        tunable=True,
    ),
    Setting(
        "NCCL_LL_BUFFSIZE",
        "process",
        "unset: derived from NCCL_BUFFSIZE",
        "Bytes of the LL protocol's buffer.",
        _int_range(1, None),
    ),
    Setting(
        "NCCL_LL128_BUFFSIZE",
        "process",
        "unset: derived from NCCL_BUFFSIZE",
        "Bytes of the LL128 protocol's buffer.",
        _int_range(1, None),
    ),
    Setting(
        "NCCL_NTHREADS",
        "process",
        "unset: NCCL picks per algorithm/protocol (256-512)",
        "CUDA threads per CTA for LL and Simple; a multiple of 32 in [64, 512].",
        _int_range(64, 512, 32),
        tunable=True,
    ),
    # NCCL clamps out-of-range thread counts (and replaces a non-multiple of 32 by the
    # maximum) with only an INFO line, so the value written is not the value used: error.
    # Bounds from tuning.cc getNthreads: NTHREADS [2*WARP_SIZE, NCCL_MAX_NTHREADS] = [64, 512],
    # LL128_NTHREADS [NCCL_LL128_MAX_NTHREADS/4, NCCL_LL128_MAX_NTHREADS] = [160, 640].
    Setting(
        "NCCL_LL128_NTHREADS",
        "process",
        "unset: 640",
        "CUDA threads per CTA for LL128; a multiple of 32 in [160, 640].",
        _int_range(160, 640, 32),
    ),
    Setting(
        "NCCL_P2P_LEVEL",
        "process",
        "unset: NCCL decides from the topology",
        "Farthest path over which GPUs talk P2P: LOC NVL NVB C2C PIX PXB P2C PXN PHB SYS.",
        _check_path_level,
        tunable=True,
    ),
    Setting(
        "NCCL_P2P_DISABLE", "process", "0", "1 disables P2P between GPUs (SHM or net instead).", _bool01, tunable=True
    ),
    Setting("NCCL_SHM_DISABLE", "process", "0", "1 disables the shared-memory transport.", _bool01),
    Setting(
        "NCCL_NVLS_ENABLE",
        "process",
        "2 (auto: on with NVSwitch)",
        "NVLink SHARP (NVLS) algorithm: 0 off, 1 on, 2 auto.",
        _choices((), integers=range(0, 3)),
        tunable=True,
    ),
    Setting("NCCL_CUMEM_ENABLE", "process", "1 since 2.19", "Allocate NCCL buffers through the cuMem API.", _bool01),
    Setting(
        "NCCL_GRAPH_REGISTER",
        "process",
        "1",
        "Register user buffers captured in CUDA graphs (zero-copy where possible).",
        _bool01,
    ),
    Setting(
        "NCCL_CTA_POLICY",
        "process",
        "0 (DEFAULT)",
        "CTA scheduling policy (2.27+): DEFAULT/0, EFFICIENCY/1, ZERO/2.",
        _choices(CTA_POLICIES, integers=range(0, 3)),
        since="2.27",
    ),
    Setting(
        "NCCL_NO_CACHE",
        "process",
        "unset",
        "Parameters to re-read at every use instead of caching (ALL or a list; 2.29.7+).",
        _check_no_cache,
        since="2.29.7",
    ),
    Setting(
        "NCCL_TUNER_PLUGIN",
        "process",
        "unset: libnccl-tuner.so if found",
        "Tuner plugin library name or path.",
        _check_nonempty,
    ),
    Setting(
        "NCCL_TUNER_CONFIG_FILE",
        "process",
        "unset: nccl_tuner.conf",
        "CSV rules for NCCL's example tuner plugin.",
        _check_nonempty,
    ),
    Setting(
        "NCCL_DEBUG",
        "process",
        "unset (WARN-level messages only on errors)",
        "Log level: VERSION, WARN, INFO, ABORT, TRACE.",
        _choices(DEBUG_LEVELS),
    ),
    Setting(
        "NCCL_DEBUG_SUBSYS",
        "process",
        "INIT,BOOTSTRAP,ENV",
        "Subsystems logged at INFO: comma list, ^ excludes (INIT, TUNING, ENV, ...).",
        _check_debug_subsys,
    ),
    Setting(
        "NCCL_DEBUG_FILE",
        "process",
        "unset: stdout",
        "File for NCCL's log; %h is the host name and %p the pid.",
        _check_nonempty,
    ),
    Setting(
        "NCCL_NET_GDR_LEVEL",
        "process",
        "unset: NCCL decides (PXB)",
        "Farthest NIC-GPU path for GPUDirect RDMA: LOC PIX PXB PHB SYS (case-sensitive).",
        _check_path_level,
    ),
    Setting(
        "NCCL_SOCKET_IFNAME",
        "process",
        "unset: any but lo and docker*",
        "Network interfaces for sockets: prefixes, ^ excludes, = exact.",
        _check_iface_list,
    ),
    Setting(
        "NCCL_IB_HCA",
        "process",
        "unset: all IB/RoCE devices",
        "InfiniBand HCAs to use: [^][=]mlx5_0[:port],...",
        _check_iface_list,
    ),
]

CATALOGUE: dict[str, Setting] = {s.name: s for s in _CATALOGUE}


def lookup(name: str) -> Setting | None:
    """The catalogue entry for `name`, or None for a variable the catalogue lacks."""
    return CATALOGUE.get(name)


def scope_of(name: str) -> str:
    """'communicator' or 'process'; variables the catalogue lacks count as process-scoped."""
    setting = CATALOGUE.get(name)
    return setting.scope if setting else "process"


def check_value(name: str, value: str, nccl_version: tuple[int, int, int] | None = None) -> list[Finding]:
    """Validate `value` for the known variable `name`: a list of (severity, message).

    An invalid value gives one ERROR finding; warnings cover legal but risky values.
    Quoting and unknown names are the profile linter's business, not this function's.
    """
    setting = CATALOGUE.get(name)
    if setting is None:
        return []
    try:
        found = setting.check(value, nccl_version)
    except SettingError as exc:
        return [(ERROR, f"invalid value for {name}: {exc}")]
    if setting.since and nccl_version is not None:
        minimum = tuple(int(p) for p in setting.since.split("."))
        minimum = minimum + (0,) * (3 - len(minimum))
        found += _needs_version(nccl_version, minimum, name)
    return found


def is_valid(name: str, value: str) -> bool:
    """True when `check_value` finds no error (warnings allowed)."""
    return all(sev != ERROR for sev, _ in check_value(name, value))


def split_by_scope(env: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Split an env mapping into (process-scoped, communicator-scoped) parts, order kept."""
    process = {k: v for k, v in env.items() if scope_of(k) == "process"}
    communicator = {k: v for k, v in env.items() if scope_of(k) == "communicator"}
    return process, communicator


# ---------------------------------------------------------------- NCCL_NO_CACHE (2.29.7+)
#
# Which variables NCCL_NO_CACHE makes re-read per communicator, from NCCL's source
# (tags v2.29.7-1 and v2.30.7-1 of github.com/NVIDIA/nccl; NCCL_NO_CACHE is absent from
# v2.29.3-1 and every earlier tag):
#
# - src/include/param.h: NCCL_PARAM(name, "X", default) defines ncclParamName(), which
#   keeps a static cache and calls ncclLoadParam("NCCL_X", ...) while it is unset.
#   src/misc/param.cc ncclLoadParam reads the variable through ncclGetEnv, logs
#   "NCCL_X set by environment to V." (INFO, ENV) when it is set, and stores the value
#   in the cache unless caching is disabled for it, in which case every later call reads
#   the environment again and logs again. 2.29.7 decides that in misc/param.cc itself
#   (ncclGetEnvNoCacheOnce, logging "Disabling caching for environment variable X.");
#   from 2.30.3 in src/param/param.cc ncclParamIsCacheDisabled ("PARAM: Disabling caching
#   for environment variable X."). The decision is taken once per parameter, and
#   NCCL_NO_CACHE itself is read once per process (std::call_once): it must be in the
#   environment the process starts with. Names are compared exactly with the full
#   "NCCL_X" key (strtok on ',' in 2.29.7, no blanks trimmed): write NCCL_A,NCCL_B.
# - ncclGetEnv (misc/param.cc) calls the env plugin's getEnv (2.28.7+; src/plugin/env.cc),
#   whose built-in default (src/plugin/env/env_v1.cc ncclEnvGetEnv) is std::getenv: the
#   live process environment, so a value set later with setenv (Python's os.environ
#   assignment calls putenv; os.environ.pop calls unsetenv) is what the next read sees.
#   Before 2.28.7 ncclGetEnv called getenv directly. An external env plugin
#   (NCCL_ENV_PLUGIN) may answer from anywhere: NCCL's log decides.
# - Variables read once into statics outside the param system stay process-wide:
#   NCCL_P2P_LEVEL / NCCL_P2P_DISABLE (src/graph/paths.cc ncclTopoUserP2pLevel, logged
#   once), NCCL_NET_GDR_LEVEL (paths.cc ncclTopoUserGdrLevel), NCCL_CTA_POLICY
#   (src/init.cc getEnvCtaPolicyOnce under std::call_once), the NCCL_DEBUG family
#   (src/debug.cc, new-style ncclParam re-read only through ncclResetDebugInit),
#   NCCL_NO_CACHE itself, and the network/plugin selections (read at their one-time init).

NO_CACHE_SINCE = (2, 29, 7)

REREAD_INIT = "init"  # read with ncclGetEnv at every communicator init, any version
REREAD_PARAM = "param"  # NCCL_PARAM: cached; re-read at each use under NCCL_NO_CACHE (2.29.7+)
REREAD_HOT = "param-hot"  # NCCL_PARAM read outside init too: re-reading it mid-process is unsafe
REREAD_STATIC = "static"  # a static or one-time read outside the param system: process-wide


@dataclass(frozen=True)
class Reread:
    """How NCCL reads one variable, and so whether NCCL_NO_CACHE lets it vary per communicator."""

    kind: str  # REREAD_INIT | REREAD_PARAM | REREAD_HOT | REREAD_STATIC
    source: str  # where NCCL reads it (file and function, v2.30.7-1)
    note: str = ""


_PARAM_H = "NCCL_PARAM (src/include/param.h -> src/misc/param.cc ncclLoadParam)"
REREADS: dict[str, Reread] = {
    "NCCL_PROTO": Reread(REREAD_INIT, "src/graph/tuning.cc ncclTopoTuneModel (ncclGetEnv)"),
    "NCCL_ALGO": Reread(REREAD_INIT, "src/graph/tuning.cc ncclTopoTuneModel (ncclGetEnv)"),
    "NCCL_THREAD_THRESHOLDS": Reread(REREAD_INIT, "src/graph/tuning.cc ncclTopoTuneModel (ncclGetEnv)"),
    "NCCL_NTHREADS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/graph/tuning.cc ncclTopoTuneModel"),
    "NCCL_LL128_NTHREADS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/graph/tuning.cc ncclTopoTuneModel"),
    "NCCL_MAX_NCHANNELS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/graph/connect.cc ncclMaxNchannels"),
    "NCCL_MIN_NCHANNELS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/graph/connect.cc ncclMinNchannels"),
    "NCCL_MAX_NRINGS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/graph/connect.cc ncclMaxNchannels"),
    "NCCL_MIN_NRINGS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/graph/connect.cc ncclMinNchannels"),
    "NCCL_BUFFSIZE": Reread(REREAD_PARAM, f"{_PARAM_H}; src/init.cc computeBuffSizes"),
    "NCCL_LL_BUFFSIZE": Reread(REREAD_PARAM, f"{_PARAM_H}; src/init.cc computeBuffSizes"),
    "NCCL_LL128_BUFFSIZE": Reread(REREAD_PARAM, f"{_PARAM_H}; src/init.cc computeBuffSizes"),
    "NCCL_MAX_CTAS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/init.cc envConfigOverride"),
    "NCCL_MIN_CTAS": Reread(REREAD_PARAM, f"{_PARAM_H}; src/init.cc envConfigOverride"),
    "NCCL_NVLS_ENABLE": Reread(REREAD_PARAM, f"{_PARAM_H}; src/transport/nvls.cc ncclNvlsInit"),
    "NCCL_SHM_DISABLE": Reread(REREAD_PARAM, f"{_PARAM_H}; src/transport/shm.cc shmCanConnect"),
    "NCCL_CUMEM_ENABLE": Reread(
        REREAD_HOT,
        f"{_PARAM_H}; src/misc/cudawrap.cc ncclCuMemEnable",
        "read at allocations and frees throughout the process: buffers of "
        "one process must agree, so it stays process-wide",
    ),
    "NCCL_GRAPH_REGISTER": Reread(
        REREAD_HOT,
        f"{_PARAM_H}; src/enqueue.cc (every enqueue)",
        "read at every enqueue: under NCCL_NO_CACHE each collective would re-read and log it inside the timed loop",
    ),
    "NCCL_P2P_LEVEL": Reread(
        REREAD_STATIC, "src/graph/paths.cc ncclGetUserP2pLevel (static ncclTopoUserP2pLevel, read once)"
    ),
    "NCCL_P2P_DISABLE": Reread(
        REREAD_STATIC, "src/graph/paths.cc ncclGetUserP2pLevel (static ncclTopoUserP2pLevel, read once)"
    ),
    "NCCL_NET_GDR_LEVEL": Reread(
        REREAD_STATIC, "src/graph/paths.cc ncclTopoCheckGdr (global ncclTopoUserGdrLevel, read once)"
    ),
    "NCCL_CTA_POLICY": Reread(REREAD_STATIC, "src/init.cc getEnvCtaPolicyOnce (std::call_once)"),
    "NCCL_NO_CACHE": Reread(
        REREAD_STATIC,
        "2.29.7 src/misc/param.cc ncclGetEnvNoCacheOnce; "
        "2.30 src/param/param.cc ncclParamIsCacheDisabled "
        "(std::call_once)",
    ),
    "NCCL_TUNER_PLUGIN": Reread(
        REREAD_STATIC, "src/plugin/tuner.cc ncclTunerPluginLoad (loaded once, kept while any communicator holds it)"
    ),
    "NCCL_TUNER_CONFIG_FILE": Reread(REREAD_STATIC, "the tuner plugin's own init (not an NCCL_PARAM)"),
    "NCCL_DEBUG": Reread(
        REREAD_STATIC, "src/debug.cc ncclDebugInit (new-style ncclParam; re-read only through ncclResetDebugInit)"
    ),
    "NCCL_DEBUG_SUBSYS": Reread(REREAD_STATIC, "src/debug.cc ncclDebugInit"),
    "NCCL_DEBUG_FILE": Reread(REREAD_STATIC, "src/debug.cc ncclDebugInit"),
    "NCCL_SOCKET_IFNAME": Reread(
        REREAD_STATIC, "src/misc/socket.cc ncclFindInterfaces (bootstrap and socket net init, once)"
    ),
    "NCCL_IB_HCA": Reread(REREAD_STATIC, "src/transport/net_ib/init.cc ncclIbInit (once)"),
}


def reread_of(name: str) -> Reread:
    """How NCCL reads `name` (a variable the table lacks counts as process-wide)."""
    return REREADS.get(name, Reread(REREAD_STATIC, "not catalogued: assumed read once"))


def no_cache_supported(nccl_version) -> bool | None:
    """True when this NCCL honours NCCL_NO_CACHE (2.29.7+), None when the version is unknown."""
    if nccl_version is None:
        return None
    return tuple(nccl_version)[:3] >= NO_CACHE_SINCE


def rereads_under_no_cache(name: str) -> bool:
    """True for a cached NCCL_PARAM variable that NCCL_NO_CACHE (2.29.7+) makes NCCL read
    again at every communicator init, so it may vary per communicator in one process."""
    return reread_of(name).kind == REREAD_PARAM


def per_communicator(name: str, nccl_version=None, no_cache: bool = False) -> bool | None:
    """Whether `name` may take a new value per communicator in one process.

    Communicator-scoped variables always may; with `no_cache` (NCCL_NO_CACHE listing it),
    the cached NCCL_PARAM variables may on NCCL >= 2.29.7 (None when the version is
    unknown); the rest are process-wide whatever NCCL_NO_CACHE says.
    """
    kind = reread_of(name).kind
    if kind == REREAD_INIT or scope_of(name) == "communicator":
        return True
    if kind != REREAD_PARAM or not no_cache:
        return False
    return no_cache_supported(nccl_version) if nccl_version is not None else None
