"""`nccl-tune lint FILE... [--json]`: check `.env` profiles before they reach a server.

Exit 0 when no file has an error, 1 when any has, 2 for usage errors or an unreadable file.
"""

from __future__ import annotations

import sys

import click

from nccl_tune.live import lint as linter
from nccl_tune.live.profile import read_profile_text


@click.command("lint")
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print findings as JSON objects.")
def lint(files: tuple[str, ...], as_json: bool) -> None:
    """Check .env profiles: the profile grammar (NCCL_* and a short allow-list of
    names, plain values that bash, docker and systemd read alike), values, unknown
    names, unsafe LL128.

    Unknown NCCL_* names are checked against the catalogue and the strings of the
    installed libnccl (the NCCL version consulted is named in the message).
    """
    from nccl_tune.cli import emit_json

    # Read everything first: an unreadable file is exit 2 before any finding is printed.
    texts = {path: read_profile_text(path) for path in files}
    known = linter.installed_names()
    findings = [f for path in files for f in linter.lint_text(texts[path], path, known)]
    errors, warnings = linter.counts(findings)
    if as_json:
        emit_json([f.to_dict() for f in findings])
    else:
        for finding in findings:
            click.echo(str(finding))
        click.echo(f"{len(files)} file(s) checked against the catalogue and "
                   f"{known.describe()}: {errors} error(s), {warnings} warning(s)", err=True)
    sys.exit(1 if errors else 0)
