"""Rules for NCCL's example tuner plugin (NVIDIA/nccl ext-tuner/example), as CSV.

Format (ext-tuner/example/README.md and plugin.c, read for this module):

    collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks[,numPipeOps,regBuff]

- collective names broadcast, reduce, allgather, reducescatter, allreduce; algorithms
  tree, ring, collnet_direct, collnet_chain, nvls, nvls_tree, pat; protocols ll, ll128,
  simple; all compared case-sensitively (strcmp), unknown names silently become
  ring/simple, so this writer emits only names from those lists;
- min_bytes <= size <= max_bytes (both inclusive); nNodes/nRanks -1 = any; the first
  matching line wins; a matching line sets that (algorithm, protocol)'s cost to 0;
- channels: the plugin sets nChannels = 1 before matching and only overrides it when
  the rule's channels is not -1, so -1 runs ONE channel, not NCCL's default: always
  write an explicit count;
- lines are read with fgets into 256 bytes: a longer line is split and its tail parsed
  as another rule; lines starting with '#' and empty lines are skipped.

Loading: build the example plugin (`make` in ext-tuner/example gives
libnccl-tuner-example.so), then set NCCL_TUNER_PLUGIN to its path and
NCCL_TUNER_CONFIG_FILE to the CSV (default file name: nccl_tuner.conf in the working
directory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

COLLECTIVES = ("broadcast", "reduce", "allgather", "reducescatter", "allreduce")
ALGORITHM_NAMES = {"Tree": "tree", "Ring": "ring", "CollNetDirect": "collnet_direct",
                   "CollNetChain": "collnet_chain", "NVLS": "nvls", "NVLSTree": "nvls_tree",
                   "PAT": "pat"}
PROTOCOL_NAMES = {"LL": "ll", "LL128": "ll128", "Simple": "simple"}
MAX_LINE_CHARS = 200  # the plugin's buffer is 256 bytes with the newline and NUL; keep margin
MAX_BYTES = 4294967295  # the plugin's "any size" upper bound in its examples


@dataclass(frozen=True)
class Rule:
    """One CSV line: which algorithm, protocol and channels for a size range."""

    collective: str
    min_bytes: int
    max_bytes: int
    algorithm: str  # lower-case plugin name
    protocol: str  # lower-case plugin name
    channels: int
    nnodes: int = -1
    nranks: int = -1

    def line(self) -> str:
        """The CSV line (8 fields)."""
        return ",".join(str(v) for v in (self.collective, self.min_bytes, self.max_bytes,
                                         self.algorithm, self.protocol, self.channels,
                                         self.nnodes, self.nranks))

    def matches(self, collective: str, nbytes: int, nnodes: int, nranks: int) -> bool:
        """The plugin's match test (numPipeOps and regBuff not used by these rules)."""
        return (self.collective == collective and self.min_bytes <= nbytes <= self.max_bytes
                and self.nnodes in (-1, nnodes) and self.nranks in (-1, nranks))


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


def rules_from_points(points: Iterable[tuple[int, str, str, int]], nnodes: int, nranks: int,
                      collective: str = "allreduce") -> list[Rule]:
    """One rule per run of sizes with the same (algorithm, protocol, channels).

    `points` are (bytes, algorithm, protocol, channels) at measured sizes. Boundaries
    between neighbouring sizes with different winners lie at their geometric mean; the
    rules cover the smallest to the largest size given (other sizes keep NCCL's choice).
    A point with algorithm None leaves its size to NCCL (no rule there).
    """
    pts = sorted(points)
    if collective not in COLLECTIVES:
        raise ValueError(f"unknown collective '{collective}'")
    rules: list[Rule] = []
    bounds = [pts[0][0]] if pts else []
    for (b0, *_), (b1, *_) in zip(pts, pts[1:]):
        bounds.append(int(math.sqrt(b0 * b1)))
    for i, (nbytes, algo, proto, channels) in enumerate(pts):
        lo = bounds[i] if i == 0 else bounds[i] + 1
        hi = bounds[i + 1] if i + 1 < len(pts) else nbytes
        if algo is None:
            continue
        if channels is None or int(channels) < 1:
            raise ValueError(f"{nbytes} B: a rule needs an explicit channel count >= 1")
        key = (plugin_algorithm(algo), plugin_protocol(proto), int(channels))
        last = rules[-1] if rules else None
        if last and (last.algorithm, last.protocol, last.channels) == key and last.max_bytes + 1 == lo:
            rules[-1] = Rule(collective, last.min_bytes, hi, *key, nnodes, nranks)
        else:
            rules.append(Rule(collective, lo, hi, *key, nnodes, nranks))
    return rules


def render(rules: list[Rule], header: list[str]) -> str:
    """The CSV text: '#' comment header (wrapped to fit the plugin's line buffer), then rules."""
    out = []
    for text in header:
        out.extend(_wrap_comment(text))
    out.append("# collective_type,min_bytes,max_bytes,algorithm,protocol,channels,nNodes,nRanks")
    for rule in rules:
        line = rule.line()
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"rule line too long for the plugin: {line}")
        out.append(line)
    return "\n".join(out) + "\n"


def _wrap_comment(text: str) -> list[str]:
    words, lines, current = text.split(), [], "#"
    for word in words:
        if len(current) + 1 + len(word) > MAX_LINE_CHARS - 2:
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
        if len(raw) >= 255:
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


def first_match(rules: list[Rule], collective: str, nbytes: int, nnodes: int,
                nranks: int) -> Rule | None:
    """The rule the plugin applies (first match), or None (NCCL's own choice)."""
    return next((r for r in rules if r.matches(collective, nbytes, nnodes, nranks)), None)
