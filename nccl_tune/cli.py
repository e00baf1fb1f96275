"""The `nccl-tune` command line: a click group whose commands load on first use.

Each command lives in `nccl_tune/commands/<module>.py` (one concern each, so the CLI
stays thin and no single file holds every command). The group lists them from the
table below without importing them, so `nccl-tune --help` never imports torch.

Errors: a command raises `NcclTuneError` (or click's own exceptions) for bad input, or
another `nccl_tune.errors.ToolError` (a run that failed, a command exec cannot start);
the group turns it into one line on stderr and the exit code its kind carries
(nccl_tune.errors decides them all: 2 bad input, 1 failed run, 127/126). Ctrl-C exits 130.
"""

from __future__ import annotations

import importlib
import json
import sys
from typing import Any

import click

from nccl_tune import __version__
from nccl_tune.errors import EXIT_INTERRUPTED, ToolError

# name -> (module:attribute, one-line description); the order is the workflow's.
COMMANDS: dict[str, tuple[str, str]] = {
    "doctor": ("nccl_tune.commands.doctor:doctor",
               "Show NCCL libraries, torch, GPUs, topology, conf files and NCCL_* env."),
    "bench": ("nccl_tune.commands.bench:bench",
              "Measure small-message collective latency (torchrun microbench.allreduce)."),
    "sweep": ("nccl_tune.commands.sweep:sweep",
              "Measure a grid of NCCL settings safely: timeouts, resume, rounds."),
    "import-nccl-tests": ("nccl_tune.commands.import_nccl_tests:import_nccl_tests",
                          "Convert nccl-tests output (text or -J JSON) into results records."),
    "report": ("nccl_tune.commands.report:report",
               "Summarise results: per cell and size, intervals and verdicts vs baseline."),
    "recommend": ("nccl_tune.commands.recommend:recommend",
                  "Turn latencies into time saved per token; pick and export a profile."),
    "model": ("nccl_tune.commands.model:model",
              "Predict NCCL's choice and latency, or fit the model to your measurements."),
    "spec-plan": ("nccl_tune.commands.spec_plan:spec_plan",
                  "Plan the speculative draft step count from verify/draft timings."),
    "validate": ("nccl_tune.commands.validate:validate",
                 "A/B a profile on a real TP speculative decode loop (built-in or SGLang)."),
    "lint": ("nccl_tune.commands.lint:lint",
             "Check .env profiles: values, unknown names, unsafe LL128, quoting."),
    "profiles": ("nccl_tune.commands.profiles:profiles",
                 "List and show the shipped profiles with their provenance."),
    "exec": ("nccl_tune.commands.exec_:exec_",
             "Run a command with a profile applied (no shell involved)."),
    "check": ("nccl_tune.commands.check:check",
              "Check that a running process (and its workers) carries a profile."),
    "logs": ("nccl_tune.commands.logs:logs",
             "Summarise SGLang/vLLM server logs; check NCCL's own log per rank (logs nccl)."),
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
        return getattr(importlib.import_module(module_name), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # The table's descriptions, so listing commands imports none of them.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, help_) in COMMANDS.items()])

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except ToolError as exc:  # the error's kind decides the exit code (nccl_tune.errors)
            raise CodedError(str(exc), exc.exit_code) from None


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
    """Print `obj` as indented JSON on stdout (the `--json` output of every command)."""
    click.echo(json.dumps(obj, indent=2, sort_keys=False, default=str))


def main() -> None:
    """Console-script entry point."""
    try:
        cli.main(prog_name="nccl-tune")
    except KeyboardInterrupt:
        click.echo("nccl-tune: interrupted", err=True)
        sys.exit(EXIT_INTERRUPTED)
