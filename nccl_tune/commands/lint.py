"""`nccl-tune lint FILE... [--json]`: check `.env` profiles before they reach a server.

Exit 0 when no file has an error, 1 when any has, 2 for usage errors or an unreadable file.
"""

from __future__ import annotations

import sys

import click

from nccl_tune import vocab
from nccl_tune.commands import nccl_target
from nccl_tune.live import lint as linter
from nccl_tune.live.profile import read_text


@click.command("lint")
@click.argument("files", nargs=-1, required=True, type=vocab.InputFile())
@click.option("--json", "as_json", is_flag=True, help="Print findings as JSON objects.")
@nccl_target.nccl_version_option
def lint(files: tuple[str, ...], as_json: bool, nccl_version: str | None) -> None:
    """Check .env profiles: the profile grammar (NCCL_* and a short allow-list of
    names, plain values that bash, docker and systemd read alike), values, unknown
    names, unsafe LL128.

    Unknown NCCL_* names are checked against the catalogue and the strings of the
    installed libnccl (the NCCL version consulted is named in the message). With
    --nccl-version, against that release: a variable it does not read is an error, a
    value whose meaning changed since the release in the profile's `# nccl:` line a
    warning.
    """
    from nccl_tune.cli import emit_json

    # Read everything first: an unreadable file is exit 2 before any finding is printed.
    texts = {path: read_text(path) for path in files}
    target = nccl_target.target(nccl_version)
    known = nccl_target.known_names(target)
    findings = [f for path in files for f in nccl_target.lint_for(texts[path], path, target)]
    errors, warnings = linter.counts(findings)
    if as_json:
        emit_json([f.to_dict() for f in findings])
    else:
        for finding in findings:
            click.echo(str(finding))
    click.echo(
        f"{len(files)} file(s) checked against the catalogue and "
        f"{nccl_target.describe(target, known)}: {errors} error(s), {warnings} warning(s)",
        err=True,
    )
    sys.exit(1 if errors else 0)
