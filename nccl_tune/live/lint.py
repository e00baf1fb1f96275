"""Profile linting: `.env` text in, findings out (pure apart from finding libnccl once).

Rules (severity):

- error: a malformed line (profile.parse_line says why); an invalid value for a
  catalogued variable (settings.check_value); an inline `# comment` after a value
  (bash drops it, docker and systemd keep it in the value); a value bash would execute
  or redirect when the profile is sourced (`$(`, backticks, `;`, `&`, `|`, `<`, `>`
  unquoted; `$(` and backticks inside double quotes).
- warning: an NCCL_* name neither the catalogue nor the installed libnccl knows (libnccl's
  own strings list every variable it reads), with a did-you-mean; an NCCL-looking name in
  the wrong case (NCCL's getenv is case-sensitive); any NCCL_PROTO that enables LL128 (it
  forces LL128 even on PCIe, where it can corrupt data); a P2P level in the wrong case; a
  variable set twice; a value that would need quoting (quoted values included: docker
  keeps the quotes); `export` (bash only); trailing blanks (docker keeps them);
  version notes from the catalogue.

`lint_text` is the core (text -> findings); `lint_env` checks an environment mapping
(sweep cells, `exec`, doctor's current environment) with the same value rules.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import asdict, dataclass

from nccl_tune.nccl import settings
from nccl_tune.live.profile import parse_lines

ERROR = settings.ERROR
WARNING = settings.WARNING
_INLINE_COMMENT_RE = re.compile(r"\s#")


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
        name = f" {self.variable}:" if self.variable else ""
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


def _unknown_name_finding(path: str, number: int | None, key: str,
                          known: KnownNames) -> Finding | None:
    """A warning for an NCCL_* name nobody knows (or an NCCL name in the wrong case)."""
    pool = set(settings.CATALOGUE) | set(known.names or ())
    if key in pool:
        return None
    upper = key.upper()
    if not key.startswith("NCCL_"):
        if upper.startswith("NCCL_") and upper in pool:
            return Finding(path, number, key, WARNING,
                           f"NCCL reads variable names case-sensitively and would ignore "
                           f"this one; did you mean {upper}?")
        return None
    guess = difflib.get_close_matches(key, sorted(pool), n=1, cutoff=0.75)
    hint = f"; did you mean {guess[0]}?" if guess else ""
    if known.names is None:
        consulted = "the catalogue (no libnccl was found to consult)"
    else:
        consulted = f"the catalogue and to {known.describe()}"
    return Finding(path, number, key, WARNING,
                   f"unknown to {consulted}, so NCCL would ignore it{hint}")


def _value_findings(path: str, number: int | None, key: str, value: str,
                    version: tuple[int, int, int] | None) -> list[Finding]:
    # check_value names the variable; the finding already carries it.
    return [Finding(path, number, key, severity, message.replace(f"invalid value for {key}: ", "invalid value: "))
            for severity, message in settings.check_value(key, value, version)]


def lint_text(text: str, path: str = "<text>", known: KnownNames | None = None) -> list[Finding]:
    """Every finding for profile text, in line order.

    `known` is the libnccl consulted for unknown names and version notes; by default the
    installed one (`installed_names()`).
    """
    known = installed_names() if known is None else known
    version = known.version_tuple
    findings: list[Finding] = []
    first_line: dict[str, int] = {}
    for line in parse_lines(text):
        if line.kind == "malformed":
            findings.append(Finding(path, line.number, line.key, ERROR,
                                    f"malformed line: {line.error}"))
            continue
        if line.kind != "assign":
            continue
        key, value, number = line.key, line.value, line.number
        unknown = _unknown_name_finding(path, number, key, known)
        if unknown:
            findings.append(unknown)
        if key in first_line:
            findings.append(Finding(path, number, key, WARNING,
                                    f"set twice (first on line {first_line[key]}); "
                                    "the later value wins"))
        else:
            first_line[key] = number
        if line.exported:
            findings.append(Finding(path, number, key, WARNING,
                                    "'export' works in bash only: docker --env-file and "
                                    "systemd EnvironmentFile do not accept it"))
        if not line.quoted and _INLINE_COMMENT_RE.search(value):
            findings.append(Finding(path, number, key, ERROR,
                                    "inline comment: bash drops it but docker and systemd keep "
                                    "'#...' in the value; put comments on their own line"))
            continue
        danger = shell_danger(value, _quote_char(line.raw) if line.quoted else None)
        if danger:
            findings.append(Finding(path, number, key, ERROR, danger))
        elif line.quoted:
            findings.append(Finding(path, number, key, WARNING,
                                    "quoted value: bash and systemd drop the quotes, docker "
                                    "--env-file keeps them; write it without quotes"))
        elif settings.needs_quoting(value):
            findings.append(Finding(path, number, key, WARNING,
                                    f"value {value!r} would need shell quoting, which a .env "
                                    "file cannot carry the same way to bash, docker and systemd"))
        if line.raw.rstrip("\r") != line.raw.rstrip():
            findings.append(Finding(path, number, key, WARNING,
                                    "trailing blanks: docker --env-file keeps them in the value"))
        findings += _value_findings(path, number, key, value, version)
    return findings


# What bash does with a value when a profile is sourced (`set -a; . f.env`).
_RUNS = (("$(", "command substitution '$('"), ("`", "a backtick (command substitution)"))
_ENDS = ((";", "';'"), ("&", "'&'"), ("|", "'|'"))
_REDIRECTS = (("<", "'<'"), (">", "'>'"))


def _quote_char(raw: str) -> str | None:
    value = raw.split("=", 1)[1].strip() if "=" in raw else ""
    return value[:1] if value[:1] in ("'", '"') else None


def shell_danger(value: str, quote: str | None = None) -> str | None:
    """Why bash would run or redirect something when sourcing `NAME=value`, or None.

    Unquoted, `$(`, backticks, `;`, `&`, `|`, `<` and `>` run commands, end the
    assignment or redirect; inside double quotes only `$(` and backticks still run;
    single quotes keep everything literal. (docker --env-file and systemd would keep the
    text, so the same profile would also mean different things to each.)
    """
    if quote == "'":
        return None
    found = [(what, "run a command") for token, what in _RUNS if token in value]
    if quote is None:
        found += [(what, "end the assignment and run the rest as a command")
                  for token, what in _ENDS if token in value]
        found += [(what, "redirect input or output") for token, what in _REDIRECTS if token in value]
    if not found:
        return None
    actions = list(dict.fromkeys(action for _, action in found))
    return (f"value {value!r} holds {', '.join(what for what, _ in found)}: bash would "
            f"{' and '.join(actions)} when the profile is sourced (set -a; . FILE); a profile "
            "value must be plain text")


def lint_env(env: dict[str, str], source: str = "<environment>",
             known: KnownNames | None = None) -> list[Finding]:
    """Findings for an environment mapping (no lines): names, values, quoting."""
    known = installed_names() if known is None else known
    version = known.version_tuple
    findings: list[Finding] = []
    for key, value in env.items():
        unknown = _unknown_name_finding(source, None, key, known)
        if unknown:
            findings.append(unknown)
        if settings.needs_quoting(value):
            findings.append(Finding(source, None, key, WARNING,
                                    f"value {value!r} would need shell quoting in a .env file"))
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
    """Findings for one profile file; NcclTuneError when it cannot be read."""
    from nccl_tune.live.profile import read_text

    return lint_text(read_text(path), path=path, known=known)
