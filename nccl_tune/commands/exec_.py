"""`nccl-tune exec --profile FILE [--profile FILE2 ...] [--clean] -- CMD [ARGS...]`.

Runs CMD with the profile applied, by replacing this process (os.execvpe): CMD keeps
this pid (so `nccl-tune check --pid` sees the server itself), receives signals directly,
and its exit code is the exit code. argv goes to the kernel as given; no shell is
involved. Only what the profile grammar accepts is applied (nccl_tune.live.grammar: NCCL
variables and a short allow-list, plain values): a profile with any lint error is
refused (exit 2) before anything runs; a command that does not exist exits 127, one that
is not executable 126 (as shells and env(1)).
"""

from __future__ import annotations

import os
import shutil
import sys

import click

from nccl_tune.commands import nccl_target
from nccl_tune.errors import CannotExecute, NcclTuneError
from nccl_tune.live import envcheck, grammar
from nccl_tune.live import lint as linter
from nccl_tune.live.profile import parse_profile, read_text, resolve_profile


def check_runnable(name: str, path: str | None) -> None:
    """CannotExecute when `name` (a path, or a command looked up on `path`) cannot be run:
    exit 127 when nothing by that name exists, 126 when it exists but cannot be executed,
    as bash and env(1) report them."""
    if os.sep in name:
        if not os.path.exists(name):
            raise CannotExecute(f"cannot run {name!r}: no such file", found=False)
        if os.path.isdir(name) or not os.access(name, os.X_OK):
            raise CannotExecute(
                f"cannot run {name!r}: " + ("a directory" if os.path.isdir(name) else "not executable"), found=True
            )
        return
    if shutil.which(name, path=path) is not None:
        return
    # On PATH but not executable is 126 (bash: "Permission denied"); absent is 127.
    for folder in (path or os.defpath).split(os.pathsep):
        candidate = os.path.join(folder or ".", name)
        if os.path.isfile(candidate):
            raise CannotExecute(f"cannot run {name!r}: {candidate} is not executable", found=True)
    raise CannotExecute(f"cannot run {name!r}: no such command on PATH", found=False)


def build_env(base: dict[str, str], profile_env: dict[str, str], clean: bool) -> tuple[dict[str, str], list[str]]:
    """(the environment CMD gets, the foreign NCCL_* names `clean` removed)."""
    env = dict(base)
    removed = []
    if clean:
        removed = sorted(k for k in env if k.startswith("NCCL_") and k not in profile_env)
        for key in removed:
            del env[key]
    env.update(profile_env)
    return env, removed


@click.command("exec", context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option(
    "--profile",
    "profiles",
    multiple=True,
    required=True,
    type=envcheck.PROFILE,
    help="Profile .env file or shipped profile name (repeatable; later ones win).",
)
@click.option("--clean", is_flag=True, help="First remove every NCCL_* variable the profiles do not set.")
@nccl_target.nccl_version_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
def exec_(profiles: tuple[str, ...], clean: bool, nccl_version: str | None, command: tuple[str, ...]) -> None:
    """Run a command with a profile applied (no shell involved).

    Put `--` before the command. Prints one line on stderr saying what was applied and
    the NCCL release it was checked against (--nccl-version, default the installed one):
    a variable that release does not read refuses the profile like a lint error.
    """
    applied: dict[str, str] = {}
    warnings = 0
    target = nccl_target.target(nccl_version)
    used = []
    for name in profiles:
        path = str(resolve_profile(name))
        used.append(path)
        text = read_text(path)
        findings = nccl_target.lint_for(text, path, target)
        errors = [f for f in findings if f.severity == linter.ERROR]
        if errors:
            raise NcclTuneError(f"refusing a profile with {len(errors)} lint error(s), first: {errors[0]}")
        warnings += len(findings)
        applied.update(parse_profile(text, path).env)
    grammar.check_env(applied, "exec")  # what is applied is what the grammar accepts
    env, removed = build_env(dict(os.environ), applied, clean)
    check_runnable(command[0], env.get("PATH"))
    names = ", ".join(os.path.basename(p) for p in used)
    summary = " ".join(f"{k}={v}" for k, v in applied.items()) or "(no variables)"
    line = f"nccl-tune exec: applied {names}: {summary}; {nccl_target.used(target)}"
    if clean:
        line += f"; removed {len(removed)} other NCCL_* ({' '.join(removed) or 'none'})"
    if warnings:
        line += f"; {warnings} lint warning(s), see nccl-tune lint"
    click.echo(line, err=True)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvpe(command[0], list(command), env)
    except FileNotFoundError as exc:
        raise CannotExecute(f"cannot run {command[0]!r}: {exc.strerror or exc}", found=False) from None
    except OSError as exc:  # permission, a bad binary format: found but not executable
        raise CannotExecute(f"cannot run {command[0]!r}: {exc.strerror or exc}", found=True) from None
