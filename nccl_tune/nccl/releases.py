"""NCCL releases: which variables each one reads, and what changed meaning between them.

The data (nccl_tune/data/nccl_releases.json) is built by tools/nccl_catalogue.py from
every `nvidia-nccl-cu12` wheel on PyPI: per NCCL_* name the first and last release whose
libnccl.so.2 holds it, per release the tuner plugin interfaces it loads
(`ncclTunerPlugin_vN`), and the semantic changes confirmed in NCCL's source and release
notes, each with its source. A test checks the installed libnccl against it.

Every decision names the release it targets (DESIGN.md section 8): `resolve_target`
takes `--nccl-version` or else the libnccl a pip-installed torch loads
(`ncclinfo.default_library`, as `doctor` lists it), and `check` turns a profile's
assignments into findings: an error for a variable the target does not read, a warning
for a value whose meaning changed between the release it was measured on and the target.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from enum import Enum
from importlib import resources

from nccl_tune.errors import NcclTuneError
from nccl_tune.nccl import ncclinfo

Version = tuple[int, int, int]
_INT_RE = re.compile(r"^\s*(0[xX][0-9a-fA-F]+|\d+)\s*$")


class Severity(str, Enum):
    """How bad a release finding is (the words lint uses)."""

    ERROR = "error"
    WARNING = "warning"


@dataclass(frozen=True)
class Change:
    """One change of meaning: names, the first release with the new meaning, which values."""

    id: str
    names: tuple[str, ...]
    since: str
    when: str
    change: str
    cite: str  # the sources in a few words, for one-line findings
    sources: tuple[str, ...]

    @property
    def since_tuple(self) -> Version:
        """`since` as a version tuple."""
        return ncclinfo.parse_version(self.since)


@dataclass(frozen=True)
class Catalogue:
    """The shipped per-release data (see the module docstring)."""

    releases: tuple[str, ...]
    names: dict[str, tuple[str, str]]
    tuner: dict[str, tuple[int, ...]]
    changes: tuple[Change, ...]
    gaps: dict[str, frozenset[str]] = field(default_factory=dict)  # name -> the releases reading it

    @property
    def oldest(self) -> str:
        """The oldest release covered."""
        return self.releases[0]

    @property
    def newest(self) -> str:
        """The newest release covered."""
        return self.releases[-1]

    def covers(self, version: str) -> bool:
        """True when `version` (X.Y.Z) is one of the releases the data was read from."""
        return _short(version) in self.releases

    def reads(self, name: str, version: str) -> bool | None:
        """Whether NCCL `version` reads `name`: None when no catalogued release reads it
        (not an NCCL variable as far as the libraries say) or `version` is older than the
        catalogue. A release newer than the catalogue is judged as the newest one."""
        span = self.names.get(name)
        target = ncclinfo.parse_version(version)
        if span is None or target is None or target < ncclinfo.parse_version(self.oldest):
            return None
        if name in self.gaps and self.covers(version):  # not every release in its span reads it
            return _short(version) in self.gaps[name]
        first, last = (ncclinfo.parse_version(v) for v in span)
        if last == ncclinfo.parse_version(self.newest):
            return first <= target
        return first <= target <= last

    def names_read_by(self, version: str) -> frozenset[str]:
        """Every catalogued name NCCL `version` reads (empty below the catalogue)."""
        return frozenset(name for name in self.names if self.reads(name, version))

    def tuner_versions(self, version: str) -> tuple[int, ...] | None:
        """The tuner plugin interface versions NCCL `version` loads, or None when unknown."""
        return self.tuner.get(_short(version))


def _short(version: str) -> str:
    parsed = ncclinfo.parse_version(version)
    return ".".join(map(str, parsed)) if parsed else version


def parse_catalogue(data: dict) -> Catalogue:
    """A Catalogue from the JSON object tools/nccl_catalogue.py writes."""
    changes = tuple(
        Change(c["id"], tuple(c["names"]), c["since"], c["when"], c["change"], c["cite"], tuple(c["sources"]))
        for c in data["changes"]
    )
    return Catalogue(
        releases=tuple(data["releases"]),
        names={k: (v["first"], v["last"]) for k, v in data["names"].items()},
        tuner={k: tuple(v) for k, v in data["tuner_plugin"].items()},
        changes=changes,
        gaps={k: frozenset(v["in"]) for k, v in data["names"].items() if "in" in v},
    )


@functools.lru_cache(maxsize=1)
def load_catalogue() -> Catalogue:
    """The catalogue shipped with the package (read once per process)."""
    text = resources.files("nccl_tune").joinpath("data", "nccl_releases.json").read_text("utf-8")
    return parse_catalogue(json.loads(text))


@dataclass(frozen=True)
class Target:
    """The NCCL release a decision is checked against, and where that choice came from."""

    version: str | None
    source: str  # "--nccl-version" | "libnccl <path>" | "none found"

    def describe(self) -> str:
        """'NCCL 2.30.7 (--nccl-version)' or a sentence saying none was found."""
        if self.version is None:
            return "no NCCL release (none given, no libnccl found): release checks skipped"
        return f"NCCL {self.version} ({self.source})"

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"version": self.version, "source": self.source}


def resolve_target(
    explicit: str | None, find: Callable[[], ncclinfo.NcclLibrary | None] = ncclinfo.default_library
) -> Target:
    """`--nccl-version` when given, else the libnccl a pip-installed torch loads.

    `explicit` must already be X.Y.Z (the shared click option checks it). `find` is the
    library finder (a parameter so tests need no libnccl).
    """
    if explicit:
        return Target(_short(explicit), "--nccl-version")
    lib = find()
    if lib is None or not lib.version:
        return Target(None, "none found")
    return Target(lib.version, f"libnccl {lib.path}")


@dataclass(frozen=True)
class ReleaseFinding:
    """One release problem of one assignment (line None when the source has no lines)."""

    line: int | None
    variable: str
    severity: Severity
    message: str

    def to_dict(self) -> dict:
        """JSON-ready form."""
        return {"line": self.line, "variable": self.variable, "severity": self.severity.value, "message": self.message}


# ------------------------------------------------------------ which values a change affects


def _as_int(value: str) -> int | None:
    match = _INT_RE.match(value)
    return int(match.group(1), 0) if match else None


def _entries(value: str) -> list[str]:
    return [e.strip() for e in value.split(";") if e.strip()]


def _per_collective(value: str, env: dict[str, str]) -> bool:
    """The value names collectives (`func:list`)."""
    return any(":" in e for e in _entries(value))


def _per_collective_only(value: str, env: dict[str, str]) -> bool:
    """The value names collectives and has no leading list for every collective."""
    entries = _entries(value)
    return bool(entries) and ":" in entries[0]


def _above(limit: int) -> Callable[[str, dict[str, str]], bool]:
    def test(value: str, env: dict[str, str]) -> bool:
        number = _as_int(value)
        return number is not None and number > limit

    return test


def _above_16_without_max_ctas(value: str, env: dict[str, str]) -> bool:
    return _above(16)(value, env) and "NCCL_MAX_CTAS" not in env


WHEN: dict[str, Callable[[str, dict[str, str]], bool]] = {
    "any": lambda value, env: True,
    "per_collective": _per_collective,
    "per_collective_only": _per_collective_only,
    "above_32": _above(32),
    "above_16_without_max_ctas": _above_16_without_max_ctas,
}


def changes_between(
    measured: str, target: str, name: str, value: str, env: dict[str, str], catalogue: Catalogue | None = None
) -> list[Change]:
    """The changes of meaning for `name=value` between two releases (either order)."""
    catalogue = catalogue or load_catalogue()
    low, high = sorted((ncclinfo.parse_version(measured), ncclinfo.parse_version(target)))
    return [
        c for c in catalogue.changes if name in c.names and low < c.since_tuple <= high and WHEN[c.when](value, env)
    ]


def check(
    assignments: Iterable[tuple[int | None, str, str]],
    target: Target,
    measured: str | None = None,
    catalogue: Catalogue | None = None,
) -> list[ReleaseFinding]:
    """Release findings for (line, name, value) assignments of one profile.

    Error: an NCCL_* name some catalogued release reads but the target does not ("it
    would have no effect"). Warning: a value whose meaning changed between `measured`
    (the profile header's nccl line) and the target, saying what changes and why.
    Names no release reads are lint's unknown-name business, not this function's.
    """
    if target.version is None or ncclinfo.parse_version(target.version) is None:
        return []
    catalogue = catalogue or load_catalogue()
    items = list(assignments)
    env = {name: value for _, name, value in items}
    out: list[ReleaseFinding] = []
    for line, name, value in items:
        if not name.startswith("NCCL_"):
            continue
        if catalogue.reads(name, target.version) is False:
            first, last = catalogue.names[name]
            span = f"it reads it from {first} on" if last == catalogue.newest else f"it reads it from {first} to {last}"
            out.append(
                ReleaseFinding(
                    line,
                    name,
                    Severity.ERROR,
                    f"NCCL {target.version} does not read {name}: it would have no effect ({span})",
                )
            )
            continue
        if measured and ncclinfo.parse_version(measured):
            for change in changes_between(measured, target.version, name, value, env, catalogue):
                out.append(
                    ReleaseFinding(
                        line,
                        name,
                        Severity.WARNING,
                        f"measured on NCCL {_short(measured)}, targeted at "
                        f"{target.version}: {change.change} ({change.cite})",
                    )
                )
    return out


def tuner_header(target: Target, catalogue: Catalogue | None = None) -> str:
    """The tuner CSV header line naming the plugin interfaces the target loads."""
    if target.version is None:
        return "tuner plugin interfaces: unknown (no NCCL release to check against)"
    versions = (catalogue or load_catalogue()).tuner_versions(target.version)
    if not versions:
        return (
            f"tuner plugin interfaces of NCCL {target.version}: not in the catalogue (a release it was not read from)"
        )
    names = ", ".join(f"v{v}" for v in versions)
    return (
        f"NCCL {target.version} loads tuner plugins of interface {names} "
        f"(ncclTunerPlugin_v{max(versions)} first); the plugin reading this file must "
        "export one of them"
    )


def check_export(env: dict[str, str] | None, measured: str | None, tgt: Target) -> tuple[str, ...]:
    """The release check of a profile about to be exported: NcclTuneError (nothing
    written) when the target does not read one of its variables, else the warnings."""
    if not env:
        return ()
    found = check([(None, k, v) for k, v in env.items()], tgt, measured)
    errors = [f for f in found if f.severity is Severity.ERROR]
    if errors:
        raise NcclTuneError(
            f"not exported: {errors[0].message} (pass --nccl-version for another release, or drop the variable)"
        )
    return tuple(f"{f.variable}: {f.message}" for f in found)
