"""The `nccl-tune` command line: a click group whose commands load on first use.

Each command lives in `nccl_tune/commands/<module>.py` (one concern each, so the CLI
stays thin and no single file holds every command). The group lists them from the
table below without importing them, so `nccl-tune --help` never imports torch.

Errors: a command raises `NcclTuneError` (or click's own exceptions) for bad input, or
another `nccl_tune.errors.ToolError` (a run that failed, a command exec cannot start);
the group turns it into one line on stderr and the exit code its kind carries
(nccl_tune.errors decides them all: 2 bad input, 1 failed run, 127/126, 130 interrupted:
Ctrl-C or SIGTERM, in every command). A value refused by its option's type is one line
too ("Error: Invalid value for '--pid': ..."); usage mistakes (an unknown option, a
missing argument) keep click's usage lines above their `Error:` line.

The contract every command inherits from the group (DESIGN.md section 8): options typed
from nccl_tune.vocab are checked as they are parsed; then, before the command runs, an
output that is the same file as an input is refused (`with_contract`); `--json` output is
strict JSON (`emit_json`).
"""

from __future__ import annotations

import functools
import importlib
import json
import math
import shlex
import signal
import sys
from typing import Any

import click

from nccl_tune import __version__, vocab
from nccl_tune.errors import EXIT_INTERRUPTED, ToolError

ARGV_KEY = "nccl_tune.words"  # ctx.meta: the words after `nccl-tune` (command_line)

# name -> (module:attribute, one-line description); the order is the workflow's.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": (
        "nccl_tune.commands.doctor:doctor",
        "Show NCCL libraries, torch, GPUs, topology, conf files and NCCL_* env.",
    ),
    "bench": (
        "nccl_tune.commands.bench:bench",
        "Measure small-message collective latency (torchrun microbench.allreduce).",
    ),
    "sweep": ("nccl_tune.commands.sweep:sweep", "Measure a grid of NCCL settings safely: timeouts, resume, rounds."),
    "import-nccl-tests": (
        "nccl_tune.commands.import_nccl_tests:import_nccl_tests",
        "Convert nccl-tests output (text or -J JSON) into results records.",
    ),
    "report": (
        "nccl_tune.commands.report:report",
        "Summarise results: per cell and size, intervals and verdicts vs baseline.",
    ),
    "recommend": (
        "nccl_tune.commands.recommend:recommend",
        "Turn latencies into time saved per token; pick and export a profile.",
    ),
    "model": (
        "nccl_tune.commands.model:model",
        "Predict NCCL's choice and latency, or fit the model to your measurements.",
    ),
    "spec-plan": (
        "nccl_tune.commands.spec_plan:spec_plan",
        "Plan the speculative draft step count from verify/draft timings.",
    ),
    "validate": (
        "nccl_tune.commands.validate:validate",
        "A/B a profile on a real TP speculative decode loop (built-in or SGLang).",
    ),
    "lint": ("nccl_tune.commands.lint:lint", "Check .env profiles: values, unknown names, unsafe LL128, quoting."),
    "profiles": ("nccl_tune.commands.profiles:profiles", "List and show the shipped profiles with their provenance."),
    "exec": ("nccl_tune.commands.exec_:exec_", "Run a command with a profile applied (no shell involved)."),
    "check": ("nccl_tune.commands.check:check", "Check that a running process (and its workers) carries a profile."),
    "logs": (
        "nccl_tune.commands.logs:logs",
        "Summarise SGLang/vLLM server logs; check NCCL's own log per rank (logs nccl).",
    ),
}


class LazyGroup(click.Group):
    """A click group that imports a command's module only when it is invoked."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        entry = COMMANDS.get(cmd_name)
        if entry is None:
            return None
        module_name, attr = entry[0].split(":")
        return with_contract(getattr(importlib.import_module(module_name), attr))

    def resolve_command(self, ctx: click.Context, args: list[str]):
        ctx.meta.setdefault(ARGV_KEY, list(args))  # shared with the command's context
        return super().resolve_command(ctx, args)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The table's descriptions, so listing commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])

    def invoke(self, ctx: click.Context) -> Any:
        previous = _on_sigterm(_raise_interrupt)
        try:
            return super().invoke(ctx)
        except ToolError as exc:  # the error's kind decides the exit code (nccl_tune.errors)
            raise CodedError(str(exc), exc.exit_code) from None
        except click.BadParameter as exc:  # a value refused at its option: one line, as tool errors
            raise CodedError(exc.format_message(), exc.exit_code) from None
        except KeyboardInterrupt:  # click would say "Aborted!" and exit 1
            raise CodedError("interrupted", EXIT_INTERRUPTED) from None
        finally:
            _on_sigterm(previous)


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt


def _on_sigterm(handler):
    """Install `handler` for SIGTERM (so SIGTERM ends a command as Ctrl-C does: exit 130);
    returns the previous one. A no-op outside the main thread, where signals cannot be set."""
    if handler is None:
        return None
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:
        return None


def with_contract(command: click.Command) -> click.Command:
    """`command` and its subcommands, each run only after `vocab.check_apart` has refused
    an output that is the same file as an input (or as another output). Applied by the
    group to every command it hands out, so a new command inherits it; idempotent."""
    if getattr(command, "_nccl_tune_contract", False):
        return command
    command._nccl_tune_contract = True  # type: ignore[attr-defined]
    for sub in getattr(command, "commands", {}).values():
        with_contract(sub)
    callback = command.callback
    if callback is not None:

        @functools.wraps(callback)
        def checked(*args, **kwargs):
            vocab.check_apart(click.get_current_context())
            return callback(*args, **kwargs)

        command.callback = checked
    return command


def command_line(ctx: click.Context | None = None) -> str:
    """The command as it was typed ('nccl-tune sweep --set ...'), for resume hints and
    provenance; its words are quoted for a POSIX shell."""
    ctx = ctx or click.get_current_context()
    return "nccl-tune " + shlex.join(ctx.meta.get(ARGV_KEY, []))


class CodedError(click.ClickException):
    """One line on stderr and the exit code nccl_tune.errors decided (2 for bad input)."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="nccl-tune")
def cli() -> None:
    """Measure, choose and keep NCCL settings for tensor-parallel LLM decoding.

    Typical flow: `doctor` -> `bench` / `sweep` -> `report` -> `recommend --export`
    -> `validate` -> `exec` / `check` in production.
    """


def emit_json(obj: Any) -> None:
    """Print `obj` as indented, strict JSON on stdout (the `--json` output of every command).

    Strict: no NaN or Infinity tokens (they are not JSON). Inputs that could make them are
    refused at the option (vocab.Finite); should a computed value still be non-finite, it
    is written as null and a warning on stderr names where.
    """
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, default=str, allow_nan=False)
    except ValueError:
        where: list[str] = []
        text = json.dumps(_finite_only(obj, "$", where), indent=2, default=str, allow_nan=False)
        click.echo(
            f"warning: --json: non-finite number(s) written as null at {', '.join(where[:5])}"
            + (f" and {len(where) - 5} more" if len(where) > 5 else ""),
            err=True,
        )
    click.echo(text)


def _finite_only(obj: Any, path: str, where: list[str]) -> Any:
    """`obj` with NaN and infinities replaced by None; their paths appended to `where`."""
    if isinstance(obj, float) and not math.isfinite(obj):
        where.append(path)
        return None
    if isinstance(obj, dict):
        return {k: _finite_only(v, f"{path}.{k}", where) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_only(v, f"{path}[{i}]", where) for i, v in enumerate(obj)]
    return obj


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="nccl-tune")
    except KeyboardInterrupt:
        click.echo("nccl-tune: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
