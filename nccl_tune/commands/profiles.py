"""`nccl-tune profiles list`, `profiles show NAME|PATH` and `profiles convert P.env --to conf`.

Shipped profiles come from the repository's `profiles/` folder (see
profile.shipped_profiles_dir for where an installation finds it).
"""

from __future__ import annotations

import click

from nccl_tune import fileio, vocab
from nccl_tune.commands import nccl_target
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import envcheck
from nccl_tune.live import lint as linter
from nccl_tune.live.profile import list_shipped, load_profile, read_text, resolve_profile, shipped_profiles_dir

# Provenance keys worth a column in `list`, first found wins.
_SUMMARY_KEYS = ("summary", "source", "measured", "gpus")


def _summary(provenance: dict[str, str]) -> str:
    for key in _SUMMARY_KEYS:
        if provenance.get(key):
            return provenance[key]
    return "(no provenance)"


@click.group("profiles")
def profiles() -> None:
    """List and show the shipped profiles with their provenance."""


@profiles.command("list")
@click.option("--json", "as_json", is_flag=True, help="Print the list as JSON.")
def list_(as_json: bool) -> None:
    """The shipped profiles: name, variables, provenance summary."""
    from nccl_tune.cli import emit_json

    entries = []
    for path in list_shipped():
        prof = load_profile(str(path))
        entries.append(
            {
                "name": prof.name,
                "path": str(path),
                "variables": len(prof.env),
                "summary": _summary(prof.provenance),
                "provenance": prof.provenance,
            }
        )
    if as_json:
        emit_json(entries)
        return
    if not entries:
        click.echo(f"no shipped profiles found (looked in {shipped_profiles_dir() or 'profiles/'})")
        return
    from tabulate import tabulate

    click.echo(
        tabulate([[e["name"], e["variables"], e["summary"]] for e in entries], headers=["name", "vars", "summary"])
    )


@profiles.command("show")
@click.argument("name_or_path", type=envcheck.PROFILE)
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON.")
def show(name_or_path: str, as_json: bool) -> None:
    """One profile: provenance, variables (with scope) and lint result."""
    from nccl_tune.cli import emit_json
    from nccl_tune.nccl import settings

    path = str(resolve_profile(name_or_path))
    prof = load_profile(path)
    known = linter.installed_names()
    findings = linter.lint_text(read_text(path), path, known)
    if as_json:
        emit_json(
            {
                "name": prof.name,
                "path": path,
                "provenance": prof.provenance,
                "env": prof.env,
                "scope": {k: settings.scope_of(k) for k in prof.env},
                "lint": [f.to_dict() for f in findings],
            }
        )
        return
    click.echo(f"{prof.name} ({path})")
    for key, value in prof.provenance.items():
        click.echo(f"  {key}: {value}")
    click.echo("")
    for key, value in prof.env.items():
        setting = settings.lookup(key)
        meaning = setting.meaning if setting else "(not in the catalogue)"
        click.echo(f"  {key}={value}  [{settings.scope_of(key)}] {meaning}")
    errors, warnings = linter.counts(findings)
    click.echo(f"\nlint ({known.describe()}): {errors} error(s), {warnings} warning(s)")
    for finding in findings:
        click.echo(f"  {finding}")


@profiles.command("convert")
@click.argument("source", type=envcheck.PROFILE)
@click.option(
    "--to",
    "fmt",
    type=click.Choice(["conf"]),
    required=True,
    help="Target format: conf = NCCL's conf-file syntax (NCCL_CONF_FILE, ~/.nccl.conf).",
)
@click.option(
    "-o",
    "--output",
    type=vocab.OutputFile(vocab.OutputKind.EXPORT),
    help="Write here (atomically) instead of printing.",
)
@nccl_target.nccl_version_option
def convert(source: str, fmt: str, output: str | None, nccl_version: str | None) -> None:
    """Convert a profile (.env file or shipped name) into an NCCL conf file.

    The provenance header is kept as comments. The environment wins over a conf file:
    NCCL applies conf values only to variables the environment does not set. The
    profile is checked against an NCCL release (--nccl-version, default the installed
    libnccl): a variable that release does not read refuses the conversion.
    """
    from nccl_tune.live import conffile

    source_path = str(resolve_profile(source))
    target = nccl_target.target(nccl_version)
    release = nccl_target.release_findings(read_text(source_path), source_path, target)
    for finding in release:
        click.echo(str(finding), err=True)
    if linter.has_errors(release):
        raise NcclTuneError(f"not converted: {release[0].message}", path=source_path)
    if output:
        fileio.check_output(output, kind=fileio.OutputKind.EXPORT, inputs=[source_path], option="--output")
    text = conffile.convert(source_path)
    if output:
        fileio.write_atomic(output, text)
        click.echo(f"wrote {output} ({nccl_target.used(target)})", err=True)
    else:
        click.echo(text, nl=False)
        click.echo(f"converted {source_path} ({nccl_target.used(target)})", err=True)
