"""The shared `--nccl-version` option and the release check every decision command runs.

One option, defined here once: `lint`, `check`, `exec`, `recommend` (its exports) and
`profiles convert` take `--nccl-version X.Y.Z`; without it they check against the
libnccl a pip-installed torch loads (nccl_tune.nccl.releases.resolve_target) and say
which release they used. The release rules themselves live in nccl_tune.nccl.releases;
this module only joins their findings with lint's (same file, line and variable).
"""

from __future__ import annotations

import re

import click

from nccl_tune.live import lint as linter
from nccl_tune.live.grammar import parse_lines
from nccl_tune.live.profile import parse_provenance
from nccl_tune.nccl import releases

_VERSION_RE = re.compile(r"^\d+\.\d+\.\d+$")
CATALOGUE_WORDS = "nccl-tune's release catalogue"
HELP = (
    "NCCL release the profile will run on (X.Y.Z): variables it does not read are errors, "
    "values whose meaning changed since the release measured are warnings. Default: the "
    "libnccl a pip-installed torch loads (nvidia-nccl-cu12, as doctor lists it)."
)


def _check_version(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is not None and not _VERSION_RE.match(value.strip()):
        raise click.BadParameter(f"'{value}' is not X.Y.Z (e.g. 2.30.7)")
    return value.strip() if value else None


def nccl_version_option(command):
    """Decorate a click command with `--nccl-version` (parameter `nccl_version`)."""
    return click.option("--nccl-version", "nccl_version", metavar="X.Y.Z", callback=_check_version, help=HELP)(command)


def target(nccl_version: str | None) -> releases.Target:
    """The release to check against: the option's, else the installed libnccl's."""
    return releases.resolve_target(nccl_version)


def known_names(tgt: releases.Target) -> linter.KnownNames:
    """lint's name source for the target: the installed libnccl when it is the target,
    else the catalogue's names for that release."""
    installed = linter.installed_names()
    if tgt.version is None or tgt.version == installed.version:
        return installed
    catalogue = releases.load_catalogue()
    names = catalogue.names_read_by(tgt.version)
    if not names:  # older than the catalogue: the installed library's names, said so
        return linter.KnownNames(
            installed.names,
            tgt.version,
            f"names of {installed.describe()}: {tgt.version} predates the catalogue ({catalogue.oldest})",
        )
    return linter.KnownNames(names, tgt.version, CATALOGUE_WORDS)


def to_findings(path: str, found: list[releases.ReleaseFinding]) -> list[linter.Finding]:
    """Release findings as lint findings of `path`."""
    return [linter.Finding(path, f.line, f.variable, f.severity.value, f.message) for f in found]


def release_findings(text: str, path: str, tgt: releases.Target) -> list[linter.Finding]:
    """The release findings for profile text (measured release: its header's nccl line)."""
    lines = parse_lines(text)
    assignments = [(line.number, line.key, line.value) for line in lines if line.kind == "assign"]
    measured = parse_provenance(lines).get("nccl")
    return to_findings(path, releases.check(assignments, tgt, measured))


def merge(findings: list[linter.Finding], extra: list[linter.Finding]) -> list[linter.Finding]:
    """lint's findings and the release findings in line order. A variable the target does
    not read makes lint's warnings on the same line moot (its value changes nothing)."""
    unread = {(f.line, f.variable) for f in extra if f.severity == linter.ERROR}
    kept = [f for f in findings if not (f.severity == linter.WARNING and (f.line, f.variable) in unread)]
    return sorted(kept + extra, key=lambda f: (f.path, f.line if f.line is not None else -1))


def lint_for(text: str, path: str, tgt: releases.Target) -> list[linter.Finding]:
    """lint_text against the target's names and version, plus the release findings."""
    return merge(linter.lint_text(text, path, known_names(tgt)), release_findings(text, path, tgt))


def used(tgt: releases.Target) -> str:
    """'checked against NCCL 2.30.7 (--nccl-version)' for a command's stderr line."""
    return f"checked against {tgt.describe()}"


def describe(tgt: releases.Target, known: linter.KnownNames) -> str:
    """The release and where its variable names came from, in a few words."""
    if tgt.version is None:
        return known.describe()
    if known.path == CATALOGUE_WORDS:
        return f"{tgt.describe()}, names from {CATALOGUE_WORDS}"
    return tgt.describe() if known.version == tgt.version else f"{tgt.describe()}, {known.describe()}"
