"""Profile linting: `.env` text in, findings out (pure apart from finding libnccl once).

Rules (severity):

- error: every line the profile grammar refuses (nccl_tune.live.grammar says why: a
  name off the allow-list or one that loads a library, a character bash, docker,
  systemd or NCCL's conf reader would read differently, a line that does not parse, a
  cap); an invalid value for a catalogued NCCL variable (settings.check_value) or for
  an allow-listed engine switch (grammar.value_pattern_problem).
- warning: an NCCL_* name neither the catalogue nor the installed libnccl knows (libnccl's
  own strings list every variable it reads), with a did-you-mean; any NCCL_PROTO that
  enables LL128 (it forces LL128 even on PCIe, where it can corrupt data); a P2P level
  in the wrong case; a variable set twice; `export` (bash only); version notes from the
  catalogue.

`lint_text` is the core (text -> findings); `lint_env` checks an environment mapping
(`--env` options, doctor's current environment) with the same rules.
"""

from __future__ import annotations

import difflib
import functools
from dataclasses import asdict, dataclass

from nccl_tune.live import grammar
from nccl_tune.nccl import settings

ERROR = settings.ERROR
WARNING = settings.WARNING


@dataclass(frozen=True)
class Finding:
    """One problem: where (path, line), which variable, how bad, and why."""

    path: str
    line: int | None
    variable: str | None
    severity: str  # "error" | "warning"
    message: str

    def to_dict(self) -> dict:
        """The `--json` form: keys path, line, variable, severity, message."""
        return asdict(self)

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line is not None else self.path
        named = self.variable and not self.message.startswith(f"{self.variable} ")
        name = f" {self.variable}:" if named else ""
        return f"{where}: {self.severity}:{name} {self.message}"


@dataclass(frozen=True)
class KnownNames:
    """The NCCL_* names the installed libnccl reads, and which library said so.

    `names` is None when no loadable libnccl was found (then only the catalogue counts).
    """

    names: frozenset[str] | None
    version: str | None = None
    path: str | None = None

    def describe(self) -> str:
        """'libnccl 2.32.3 (/path)' or a sentence saying none was found."""
        if self.names is None:
            return "no libnccl was found to consult"
        return f"libnccl {self.version} ({self.path})"

    @property
    def version_tuple(self) -> tuple[int, int, int] | None:
        """The library's version as a tuple, for version-dependent value checks."""
        from nccl_tune.nccl.ncclinfo import parse_version

        return parse_version(self.version)


@functools.lru_cache(maxsize=1)
def installed_names() -> KnownNames:
    """The names of the libnccl `ncclinfo.default_library()` picks (cached per process)."""
    from nccl_tune.nccl import ncclinfo

    try:
        lib = ncclinfo.default_library()
        if lib is None:
            return KnownNames(None)
        return KnownNames(ncclinfo.variable_names(lib.path), lib.version, lib.path)
    except OSError:
        return KnownNames(None)


def _unknown_name_finding(path: str, number: int | None, key: str, known: KnownNames) -> Finding | None:
    """A warning for an NCCL_* name neither the catalogue nor libnccl knows (other names
    are the grammar's business: off its allow-list they are errors there)."""
    pool = set(settings.CATALOGUE) | set(known.names or ())
    if key in pool or not key.startswith("NCCL_"):
        return None
    guess = difflib.get_close_matches(key, sorted(pool), n=1, cutoff=0.75)
    hint = f"; did you mean {guess[0]}?" if guess else ""
    if known.names is None:
        consulted = "the catalogue (no libnccl was found to consult)"
    else:
        consulted = f"the catalogue and to {known.describe()}"
    return Finding(path, number, key, WARNING, f"unknown to {consulted}, so NCCL would ignore it{hint}")


def _value_findings(
    path: str, number: int | None, key: str, value: str, version: tuple[int, int, int] | None
) -> list[Finding]:
    pattern = grammar.value_pattern_problem(key, value)
    if pattern:
        return [Finding(path, number, key, ERROR, f"invalid value: {pattern}")]
    # check_value names the variable; the finding already carries it.
    return [
        Finding(path, number, key, severity, message.replace(f"invalid value for {key}: ", "invalid value: "))
        for severity, message in settings.check_value(key, value, version)
    ]


_EXPORT = (
    "'export' is read by bash only: docker --env-file refuses the whole file "
    "(\"variable 'export NAME' contains whitespaces\") and systemd drops the line "
    "(not a valid name); write NAME=VALUE"
)


def lint_text(text: str, path: str = "<text>", known: KnownNames | None = None) -> list[Finding]:
    """Every finding for profile text, in line order.

    `known` is the libnccl consulted for unknown names and version notes; by default the
    installed one (`installed_names()`). NcclTuneError (not findings) when the text is
    over the grammar's file or line caps.
    """
    known = installed_names() if known is None else known
    version = known.version_tuple
    findings: list[Finding] = []
    first_line: dict[str, int] = {}
    for line in grammar.parse_lines(text, path):
        if line.kind == grammar.BAD:
            name = line.key if line.key and grammar.NAME_RE.fullmatch(line.key) else None
            findings += [Finding(path, line.number, name, ERROR, error) for error in line.errors]
            continue
        if line.kind != grammar.ASSIGN:
            continue
        key, value, number = line.key, line.value, line.number
        unknown = _unknown_name_finding(path, number, key, known)
        if unknown:
            findings.append(unknown)
        if key in first_line:
            findings.append(
                Finding(
                    path, number, key, WARNING, f"set twice (first on line {first_line[key]}); the later value wins"
                )
            )
        else:
            first_line[key] = number
        if line.exported:
            findings.append(Finding(path, number, key, WARNING, _EXPORT))
        findings += _value_findings(path, number, key, value, version)
    return findings


def lint_env(env: dict[str, str], source: str = "<environment>", known: KnownNames | None = None) -> list[Finding]:
    """Findings for an environment mapping (no lines): the grammar's refusals, unknown
    names, values."""
    known = installed_names() if known is None else known
    version = known.version_tuple
    refused = grammar.env_problems(env)
    findings = [Finding(source, None, name or None, ERROR, why) for name, why in refused]
    bad = {name for name, _ in refused}
    for key, value in env.items():
        if key in bad:
            continue
        unknown = _unknown_name_finding(source, None, key, known)
        if unknown:
            findings.append(unknown)
        findings += _value_findings(source, None, key, value, version)
    return findings


def unknown_names(names, source: str = "<names>", known: KnownNames | None = None) -> list[Finding]:
    """The unknown-name findings (with their did-you-mean) for variable `names`: the one
    rule `lint` warns with and `sweep` refuses with (unless --allow-unknown)."""
    known = installed_names() if known is None else known
    found = (_unknown_name_finding(source, None, name, known) for name in dict.fromkeys(names))
    return [f for f in found if f is not None]


def has_errors(findings: list[Finding]) -> bool:
    """True when any finding is an error."""
    return any(f.severity == ERROR for f in findings)


def counts(findings: list[Finding]) -> tuple[int, int]:
    """(errors, warnings)."""
    errors = sum(1 for f in findings if f.severity == ERROR)
    return errors, len(findings) - errors


def lint_file(path: str, known: KnownNames | None = None) -> list[Finding]:
    """Findings for one profile file; NcclTuneError when it cannot be read or is too large."""
    from nccl_tune.live.profile import read_text

    return lint_text(read_text(path), path=path, known=known)
