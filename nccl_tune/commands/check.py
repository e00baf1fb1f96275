"""`nccl-tune check --profile FILE --pid PID [--tree] [--json]`: does a running server
(and its workers) carry the profile? Exit 0 when every process matches, 1 when any does
not, 2 when the process cannot be read. Logic: nccl_tune.live.procenv (roles, rewritten
environment blocks, inheritance).
"""

from __future__ import annotations

import re
import sys

import click

from nccl_tune import vocab
from nccl_tune.commands import nccl_target
from nccl_tune.live import envcheck, procenv
from nccl_tune.live import lint as linter
from nccl_tune.live.profile import load_profile, read_text, resolve_profile

_SOURCE = {
    "environ": "/proc environ",
    "memory": "memory (rewritten block)",
    "inherited": "ancestor (rewritten block)",
    None: "-",
}


def _short(cmdline: list[str], width: int = 60) -> str:
    text = " ".join(cmdline) or "?"
    return text if len(text) <= width else text[: width - 3] + "..."


@click.command("check")
@click.option(
    "--profile",
    "profiles",
    multiple=True,
    required=True,
    type=envcheck.PROFILE,
    help="Profile .env file or shipped profile name (repeatable; later ones win).",
)
@click.option("--pid", type=vocab.Count(1, max=vocab.MAX_PID), required=True, help="Process to check.")
@click.option("--tree", is_flag=True, help="Also check every descendant (TP workers).")
@click.option("--json", "as_json", is_flag=True, help="Print one object per process.")
@nccl_target.nccl_version_option
def check(profiles: tuple[str, ...], pid: int, tree: bool, as_json: bool, nccl_version: str | None) -> None:
    """Check that a running process (and its workers) carries a profile.

    Reads /proc/PID/environ: the environment the process was started with. Where a
    process rewrote that block (setproctitle: vLLM's engine core and workers, SGLang's
    schedulers) its environment is read from its memory, or else taken from the
    nearest readable ancestor it inherited it from (said as such). Each process is
    named by its role (API server, engine core, TP worker N) where it is recognised.
    It also reads the NCCL conf files (NCCL_CONF_FILE or ~/.nccl.conf, then
    /etc/nccl.conf) that would supply what the environment lacks (the environment wins
    over them). The profile is also checked against an NCCL release (--nccl-version,
    default the installed libnccl): a variable that release does not read fails the
    check even where every process carries it (NCCL would ignore it).
    """
    from nccl_tune.cli import emit_json

    expected: dict[str, str] = {}
    target = nccl_target.target(nccl_version)
    release = []
    for name in profiles:
        path = str(resolve_profile(name))
        expected.update(load_profile(path).env)
        release += nccl_target.release_findings(read_text(path), path, target)
    results = procenv.check_processes(expected, pid, tree=tree)
    for finding in release:  # stderr in both modes: --json keeps one shape on stdout
        click.echo(str(finding), err=True)
    if as_json:
        emit_json([r.to_dict() for r in results])
    else:
        from tabulate import tabulate

        rows = []
        for r in results:
            if r.error:
                state = f"UNREADABLE: {r.error}"
            elif r.env_source is None:
                state = "UNVERIFIED"
            elif r.ok:
                state = "ok" if r.env_source != "inherited" else f"ok (inherited from {r.inherited_from})"
            else:
                bad = [v for v in r.variables if v.status not in procenv.OK_STATUSES]
                state = f"MISMATCH ({len(bad)} of {len(r.variables)})"
            rows.append([r.pid, r.ppid, r.role or "-", _short(r.cmdline, 40), _SOURCE.get(r.env_source, "-"), state])
        click.echo(tabulate(rows, headers=["pid", "ppid", "role", "command", "environment from", "profile"]))
        for r in results:
            if r.note:
                click.echo(f"pid {r.pid}: {r.note}")
            for v in r.variables:
                if v.status == "missing":
                    click.echo(f"pid {r.pid}: {v.name} missing (profile: {v.expected})")
                elif v.status == "different":
                    click.echo(f"pid {r.pid}: {v.name} different: process {v.actual}, profile {v.expected}")
                elif v.status == "conf":
                    click.echo(
                        f"pid {r.pid}: {v.name} not in the environment; the conf file "
                        f"{v.source} supplies {v.actual} (as the profile)"
                    )
                elif v.status == "conf-different":
                    click.echo(
                        f"pid {r.pid}: {v.name} not in the environment; the conf file "
                        f"{v.source} supplies {v.actual}, profile {v.expected}"
                    )
            others = {k: c for k, c in r.conf.items() if k not in {v.name for v in r.variables}}
            if others:
                click.echo(
                    f"pid {r.pid}: a conf file also supplies: "
                    + " ".join(f"{k}={c['value']} ({c['path']})" for k, c in others.items())
                )
            if r.extra:
                extra = " ".join(f"{k}={v}" for k, v in r.extra.items())
                click.echo(f"pid {r.pid}: NCCL_* not in the profile: {extra}")
        by_role: dict[str, list[bool]] = {}
        for r in results:
            if r.role:  # "vLLM TP worker 3" counts under "vLLM TP worker"
                by_role.setdefault(re.sub(r" \d+$", "", r.role), []).append(r.ok)
        for role, oks in by_role.items():
            click.echo(f"{role}: {sum(oks)} of {len(oks)} carry the profile", err=True)
        good = sum(r.ok for r in results)
        click.echo(
            f"{good} of {len(results)} process(es) carry all {len(expected)} profile "
            f"variable(s); profile {nccl_target.used(target)}",
            err=True,
        )
    sys.exit(0 if procenv.all_ok(results) and not linter.has_errors(release) else 1)
