"""Rules for NCCL's example tuner plugin, as CSV (NCCL_TUNER_CONFIG_FILE).

The plugin is NVIDIA/nccl plugins/tuner/example (ext-tuner/example up to 2.29.3; its
plugin.c and README.md read for this module). Format:

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps,regBuff]

- collective names broadcast, reduce, allgather, reducescatter, allreduce; algorithms
  tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat; protocols ll, ll128,
  simple; all compared case-sensitively (strcmp), unknown names silently become
  allreduce / ring / simple, so this writer emits only names from those lists;
- min_bytes <= size <= max_bytes (both inclusive, strtoull); nNodes/nRanks -1 = any; the
  first matching line wins; a matching line sets that (algorithm, protocol)'s cost to 0,
  unless NCCL core marked it IGNORE (-1: disabled by NCCL_ALGO / NCCL_PROTO or not
  possible here), in which case the plugin goes on to the next rule;
- channels: the plugin sets *nChannels = 1 before matching and only overrides it when a
  rule matches with channels != -1; NCCL core then uses that number (src/enqueue.cc
  ncclGetAlgoInfo: nMaxChannels != 0 replaces its own). So every size, collective and
  communicator no rule covers, and every rule with -1, runs on ONE channel: the writer
  tiles every collective from 0 to SIZE_MAX with an explicit count in every row;
- lines are read with fgets into 256 bytes: a longer line is split and its tail parsed
  as another rule; lines starting with '#' and empty lines are skipped (there are no
  trailing comments: a 9th field would be read as numPipeOps).

Releases: the CSV-reading example exists from 2.27.5; up to 2.29.7 it indexes the cost
table as float** rows and crashes on the flat float[7][3] NCCL core passes (fixed in
2.30.3, commit 14bf4df7). The 2.30.x plugin exports tuner interfaces v6 and v5; NCCL
core looks for v5 from 2.28.3 and v6 from 2.30.3 (src/plugin/tuner.cc).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
# nccl-tune op names -> the plugin's collective names.
PLUGIN_COLLECTIVE = {
    "allreduce": "allreduce",
    "all_gather": "allgather",
    "reduce_scatter": "reducescatter",
    "broadcast": "broadcast",
    "reduce": "reduce",
}
ALGORITHM_NAMES = {
    "Tree": "tree",
    "Ring": "ring",
    "CollNetDirect": "collnet_direct",
    "CollNetChain": "collnet_chain",
    "NVLS": "nvls",
    "NVLSTree": "nvls_tree",
    "PAT": "pat",
}
PROTOCOL_NAMES = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}
MAX_LINE_CHARS = 200  # the plugin's buffer is 256 bytes with the newline and NUL; keep margin
# The last row of every collective ends at SIZE_MAX (64-bit size_t): strtoull reads it
# exactly, so no size, however large, falls through to one channel.
MAX_BYTES = 2**64 - 1
MIN_PLUGIN_VERSION = (2, 30, 3)  # first example plugin that reads NCCL core's flat cost table
V5_CORE_SINCE = (2, 28, 3)  # first NCCL core that loads ncclTunerPlugin_v5


@dataclass(frozen=True)
class Rule:
    """One CSV line: which algorithm, protocol and channels for a size range.

    `note` is written as a '#' comment line just above the rule (the plugin has no
    trailing comments); it takes no part in comparisons.
    """

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str  # lower-case plugin name
    protocol: str  # lower-case plugin name
    channels: int
    nnodes: int = -1
    nranks: int = -1
    note: str = field(default="", compare=False)

    def line(self) -> str:
        """The CSV line (8 fields)."""
        return ",".join(
            str(v)
            for v in (
                self.collective,
                self.min_bytes,
                self.max_bytes,
                self.algorithm,
                self.protocol,
                self.channels,
                self.nnodes,
                self.nranks,
            )
        )

    def matches(self, collective: str, nbytes: int, nnodes: int, nranks: int) -> bool:
        """The plugin's match test (numPipeOps and regBuff not used by these rules)."""
        return (
            self.collective == collective
            and self.min_bytes <= nbytes <= self.max_bytes
            and self.nnodes in (-1, nnodes)
            and self.nranks in (-1, nranks)
        )


@dataclass(frozen=True)
class Point:
    """What one collective should run at one size, and where that choice comes from.

    `origin` is a short phrase for the row's comment ("measured winner, NCCL's log",
    "NCCL's own choice, MODELLED for pcie"); rows merge only with equal origins.
    `measured` marks sizes that were measured (listed in the comment).
    """

    bytes: int
    algorithm: str | None  # NCCL's name (Ring, LL...) or the plugin's; None: no choice
    protocol: str | None
    channels: int | None
    origin: str
    measured: bool = False


def plugin_algorithm(name: str) -> str:
    """NCCL's algorithm name (Ring, NVLSTree, ...; any case) -> the plugin's (ring, nvls_tree)."""
    lookup = {k.lower(): v for k, v in ALGORITHM_NAMES.items()}
    lookup.update({v: v for v in ALGORITHM_NAMES.values()})
    try:
        return lookup[name.lower()]
    except KeyError:
        raise ValueError(f"unknown algorithm '{name}' for the tuner plugin") from None


def plugin_protocol(name: str) -> str:
    """NCCL's protocol name (LL, LL128, Simple; any case) -> the plugin's (ll, ll128, simple)."""
    lookup = {k.lower(): v for k, v in PROTOCOL_NAMES.items()}
    try:
        return lookup[name.lower()]
    except KeyError:
        raise ValueError(f"unknown protocol '{name}' for the tuner plugin") from None


def _sizes_note(origin: str, sizes: list[int]) -> str:
    if not sizes:
        return origin
    shown = ", ".join(str(b) for b in sizes[:6]) + (", ..." if len(sizes) > 6 else "")
    return f"{origin} (measured at {shown} B)"


def tile(points: Iterable[Point], collective: str, nnodes: int, nranks: int) -> list[Rule]:
    """Rules that cover every size from 0 to MAX_BYTES for one collective.

    Each point's range reaches half-way (geometric mean) to its neighbours; the first
    starts at 0 and the last ends at MAX_BYTES. Neighbours with the same (algorithm,
    protocol, channels) and origin merge. Every point needs an explicit channel count
    >= 1 and a known algorithm and protocol (ValueError otherwise): a gap or a -1 would
    run on one channel.
    """
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective '{collective}'")
    pts = sorted({p.bytes: p for p in points}.values(), key=lambda p: p.bytes)
    if not pts:
        return []
    # Half-way (geometric mean, floored exactly: a float sqrt rounds up past 2**26 bytes) to
    # the next point, never past it nor below this one.
    uppers = [max(a.bytes, min(math.isqrt(int(max(a.bytes, 1) * b.bytes)), b.bytes - 1)) for a, b in zip(pts, pts[1:])]
    uppers.append(MAX_BYTES)
    rules: list[Rule] = []
    sizes: list[list[int]] = []
    lo = 0
    for point, hi in zip(pts, uppers):
        if point.algorithm is None or point.protocol is None:
            raise ValueError(f"{collective} {point.bytes} B: no algorithm/protocol for a rule")
        if point.channels is None or int(point.channels) < 1:
            raise ValueError(f"{collective} {point.bytes} B: a rule needs an explicit channel count >= 1")
        key = (plugin_algorithm(point.algorithm), plugin_protocol(point.protocol), int(point.channels))
        last = rules[-1] if rules else None
        if last and (last.algorithm, last.protocol, last.channels) == key and last.note == point.origin:
            rules[-1] = Rule(collective, last.min_bytes, hi, *key, nnodes, nranks, point.origin)
        else:
            rules.append(Rule(collective, lo, hi, *key, nnodes, nranks, point.origin))
            sizes.append([])
        if point.measured:
            sizes[-1].append(point.bytes)
        lo = hi + 1
    return [
        Rule(
            r.collective,
            r.min_bytes,
            r.max_bytes,
            r.algorithm,
            r.protocol,
            r.channels,
            r.nnodes,
            r.nranks,
            _sizes_note(r.note, s),
        )
        for r, s in zip(rules, sizes)
    ]


def rules_from_points(
    points: Iterable[tuple[int, str, str, int]],
    nnodes: int,
    nranks: int,
    collective: str = "allreduce",
    origin: str = "",
) -> list[Rule]:
    """`tile` for plain (bytes, algorithm, protocol, channels) tuples of one origin."""
    return tile([Point(b, a, p, c, origin) for b, a, p, c in points], collective, nnodes, nranks)


def gaps(rules: list[Rule], collective: str, nnodes: int, nranks: int) -> list[tuple[int, int]]:
    """Size ranges [lo, hi] of `collective` that no rule matches (they run on one channel)."""
    spans = sorted(
        (r.min_bytes, r.max_bytes)
        for r in rules
        if r.collective == collective
        and r.nnodes in (-1, nnodes)
        and r.nranks in (-1, nranks)
        and r.min_bytes <= r.max_bytes
    )
    out, nxt = [], 0
    for lo, hi in spans:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = max(nxt, hi + 1)
    if nxt <= MAX_BYTES:
        out.append((nxt, MAX_BYTES))
    return out


def render(rules: list[Rule], header: list[str]) -> str:
    """The CSV text: '#' comment header, then each rule below its '#' note line.

    Every line fits the plugin's 256-byte line buffer with margin (<= MAX_LINE_CHARS).
    """
    out = []
    for text in header:
        out.extend(_wrap_comment(text))
    out.append("# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks")
    for rule in rules:
        line = rule.line()
        if len(line.encode()) > MAX_LINE_CHARS:
            raise ValueError(f"rule line too long for the plugin: {line}")
        if rule.note:
            out.extend(_wrap_comment(f"{rule.collective} {rule.min_bytes}-{rule.max_bytes} B: {rule.note}"))
        out.append(line)
    return "\n".join(out) + "\n"


def _wrap_comment(text: str) -> list[str]:
    """'#' lines of at most MAX_LINE_CHARS bytes; words longer than a line are cut."""
    limit = MAX_LINE_CHARS - 2
    words: list[str] = []
    for word in text.encode("ascii", "replace").decode().split():
        while len(word) > limit - 6:
            words.append(word[: limit - 6])
            word = word[limit - 6 :]
        words.append(word)
    lines, current = [], "#"
    for word in words:
        if len(current) + 1 + len(word) > limit:
            lines.append(current)
            current = "#   "
        current += " " + word
    lines.append(current)
    return lines


def parse(text: str) -> list[Rule]:
    """Read rules the way the example plugin does; ValueError naming the line otherwise."""
    rules = []
    for number, raw in enumerate(text.splitlines(), start=1):
        if not raw or raw.startswith("#"):
            continue
        if len(raw.encode()) >= 256:  # fgets(line, 256) reads 255 bytes; the newline may stay behind
            raise ValueError(f"line {number}: longer than the plugin's 256-byte line buffer")
        fields = [f.strip() for f in raw.split(",")]
        if not 8 <= len(fields) <= 10 or any(not f for f in fields):
            raise ValueError(f"line {number}: expected 8-10 non-empty comma-separated fields")
        coll, lo, hi, algo, proto, channels, nnodes, nranks = fields[:8]
        if coll not in COLLECTIVES:
            raise ValueError(f"line {number}: unknown collective '{coll}'")
        if algo not in ALGORITHM_NAMES.values():
            raise ValueError(f"line {number}: unknown algorithm '{algo}'")
        if proto not in PROTOCOL_NAMES.values():
            raise ValueError(f"line {number}: unknown protocol '{proto}'")
        try:
            rule = Rule(coll, int(lo), int(hi), algo, proto, int(channels), int(nnodes), int(nranks))
        except ValueError:
            raise ValueError(f"line {number}: sizes, channels, nNodes and nRanks must be integers") from None
        rules.append(rule)
    return rules


def first_match(rules: list[Rule], collective: str, nbytes: int, nnodes: int, nranks: int) -> Rule | None:
    """The rule the plugin applies (first match), or None (then it runs ONE channel)."""
    return next((r for r in rules if r.matches(collective, nbytes, nnodes, nranks)), None)


def version_warnings(version: tuple[int, int, int] | None, where: str) -> list[str]:
    """What goes wrong with the example plugin under a known NCCL version (else [])."""
    if version is None:
        return []
    text = ".".join(map(str, version))
    out = []
    if version < MIN_PLUGIN_VERSION:
        out.append(
            f"WARNING: {where} NCCL {text}: the example plugin of NCCL {text} CRASHES "
            "on the flat cost table NCCL core passes (fixed in 2.30.3); build the plugin "
            "from NCCL >= 2.30.3."
        )
    if version < V5_CORE_SINCE:
        out.append(
            f"WARNING: NCCL {text} loads tuner interfaces v2-v4 only, and the 2.30.3+ "
            "example plugin exports v5/v6: it will not be loaded; upgrade NCCL to >= 2.28.3."
        )
    return out
