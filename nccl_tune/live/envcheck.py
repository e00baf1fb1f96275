"""NCCL settings given on a command line or in a grid file: one check for names and values.

The NCCL part of the option vocabulary (nccl_tune.vocab holds the rest): an NCCL_* name
neither the catalogue nor the installed libnccl knows (lint's rule, with its
did-you-mean), a name or value the profile grammar refuses (nccl_tune.live.grammar: a
library-loading variable, a value bash would run or another reader would change), and a
value the catalogue's grammar rejects (settings.check_value, with a did-you-mean over
the allowed words), are refused the same way wherever they come from:
`sweep --set`, `sweep --keep-env`, grid files, `model predict --env`,
`import-nccl-tests --env`. Each is one line naming where, exit 2, before anything runs.
Warnings (LL128 forced, a P2P level in the wrong case) are not refusals: lint says them.

`check_settings` is the rule; `Assignments` and `Name` are its click types. `PROFILE`
is the type of an option naming a profile (a file, or a shipped profile's name).
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable
from typing import Any

import click

from nccl_tune import vocab
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar, lint, profile
from nccl_tune.nccl import settings

NAME_RE = re.compile(r"^NCCL_[A-Z0-9_]+$")


def name_problem(name: str, known: lint.KnownNames | None = None) -> str | None:
    """Why `name` is not an NCCL variable NCCL reads, or None."""
    if not NAME_RE.match(name):
        upper = name.upper()
        hint = f"; did you mean {upper}?" if NAME_RE.match(upper) else ""
        return f"'{name}' is not an NCCL_* variable name{hint}"
    found = lint.unknown_names([name], known=known)
    return found[0].message if found else None


def value_problem(name: str, value: str) -> str | None:
    """Why NCCL would reject or misread `value` for `name` (the catalogue's grammar), or None."""
    for severity, message in settings.check_value(name, value):
        if severity == settings.ERROR:
            return message.replace(f"invalid value for {name}: ", "")
    return None


def check_settings(
    pairs: Iterable[tuple[str, str | None]],
    where: str,
    *,
    allow_unknown: bool | None = None,
    known: lint.KnownNames | None = None,
) -> None:
    """NcclTuneError for the first (name, value) that is refused: an unknown name or a value
    the catalogue rejects. A value of None (unset) is not checked. `allow_unknown`: the
    command's --allow-unknown (True keeps well-formed unknown names; False: the refusal
    names the option; None: the command has no such option)."""
    known = lint.installed_names() if known is None else known
    for name, value in pairs:
        problem = name_problem(name, known)
        well_formed = bool(NAME_RE.match(name))
        if problem and not (allow_unknown and well_formed):
            hint = "; --allow-unknown to keep it" if allow_unknown is False and well_formed else ""
            raise NcclTuneError(f"{where}: {name}: {problem}{hint}")
        if well_formed and grammar.name_problem(name):  # e.g. NCCL_NET_PLUGIN loads a library
            raise NcclTuneError(f"{where}: {grammar.name_problem(name)}")
        if value is not None:
            # The profile grammar first: these settings end up in records and exports, and
            # the value is not echoed in full.
            problem = grammar.value_problem(value)
            if problem:
                raise NcclTuneError(f"{where}: {name}: {problem}")
            problem = value_problem(name, value)
            if problem:
                raise NcclTuneError(f"{where}: {name}={value}: {problem}")


def parse_assignments(text: str, option: str = "--env") -> dict[str, str]:
    """``"NCCL_PROTO=LL NCCL_ALGO=Ring"`` -> mapping (shell-style words, no shell run);
    NcclTuneError on an item that is not NAME=VALUE. Names and values are not checked here."""
    try:
        items = shlex.split(text)
    except ValueError as exc:
        raise NcclTuneError(f"{option}: cannot split '{text}': {exc}") from None
    env = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name:
            raise NcclTuneError(f"{option}: '{item}' is not NCCL_NAME=VALUE")
        env[name] = value
    return env


def _fail(kind: click.ParamType, exc: NcclTuneError, option: str, param, ctx):
    kind.fail(str(exc).removeprefix(f"{option}: "), param, ctx)


def _option(param) -> str:
    return max(param.opts, key=len) if isinstance(param, click.Option) and param.opts else "--env"


class Assignments(click.ParamType):
    """``"NCCL_A=x NCCL_B=y"``: every name known and every value valid (`check_settings`).
    The value stays the text given; the command parses it with `parse_assignments`."""

    name = "NCCL_NAME=VALUE ..."

    def convert(self, value: Any, param, ctx) -> str:
        option = _option(param)
        try:
            check_settings(parse_assignments(str(value), option).items(), option)
        except NcclTuneError as exc:
            _fail(self, exc, option, param, ctx)
        return value


class Name(click.ParamType):
    """One NCCL_* variable name the catalogue or the installed libnccl knows; names with one
    of the `also` prefixes (TORCH_NCCL_ for --keep-env) pass as they are."""

    name = "NCCL_NAME"

    def __init__(self, also: tuple[str, ...] = ()):
        self.also = also

    def convert(self, value: Any, param, ctx) -> str:
        option = _option(param)
        if self.also and str(value).startswith(self.also):
            return value
        try:
            check_settings([(str(value), None)], option)
        except NcclTuneError as exc:
            _fail(self, exc, option, param, ctx)
        return value


def shipped_name(value: str) -> bool:
    """True when `value` names a shipped profile (with or without .env)."""
    wanted = value[:-4] if value.endswith(".env") else value
    return any(path.stem == wanted for path in profile.list_shipped())


# A profile option or argument: an existing file, or a shipped profile's name.
PROFILE = vocab.InputFile(names=shipped_name, missing="no such file or shipped profile")
