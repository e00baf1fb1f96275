"""The shared `--arch` option: the GPUs' compute capability an engine's path depends on.

vLLM picks its allreduce path per compute capability (all_reduce_utils.py's tables are
keyed "9.0", "10.0", ...). `recommend --engine` and `validate` take `--arch`; without it
they ask nvidia-smi on this machine (as `doctor` shows it) and say so when it cannot.
"""

from __future__ import annotations

import re

import click

_ARCH_RE = re.compile(r"^(?:sm_?)?(?:(\d+)\.(\d+)|(\d+)(\d))[af]?$", re.IGNORECASE)
HELP = (
    "Compute capability of the server's GPUs for the engine's allreduce path: 9.0, 10.0, "
    "sm90, 100 (default: nvidia-smi on this machine)."
)


def parse_arch(text: str) -> str:
    """'9.0', '90', 'sm90', 'sm_100a' -> '9.0' / '10.0'; ValueError otherwise."""
    match = _ARCH_RE.match(text.strip())
    if not match:
        raise ValueError(f"'{text}' is not a compute capability (9.0, 10.0, sm90, 100)")
    major, minor = (match.group(1), match.group(2)) if match.group(1) else (match.group(3), match.group(4))
    return f"{int(major)}.{int(minor)}"


def _check(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    if value is None:
        return None
    try:
        return parse_arch(value)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from None


def arch_option(command):
    """Decorate a click command with `--arch` (parameter `arch`, normalised to 'X.Y')."""
    return click.option("--arch", "arch", metavar="CC", callback=_check, help=HELP)(command)


def resolve_arch(arch: str | None, engine: str) -> str | None:
    """--arch, else this machine's GPUs (only when an engine is named: nvidia-smi costs time)."""
    if arch or engine in ("none", "builtin"):
        return arch
    from nccl_tune.live import sysinfo

    return sysinfo.compute_capability()
