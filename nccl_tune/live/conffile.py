"""NCCL conf files: profiles written in NCCL's own conf-file syntax, and how NCCL reads them.

NCCL reads conf files itself, so a profile in one survives launchers and containers that
drop environment variables. What NCCL does (src/misc/param.cc initEnvFunc / setEnvFile,
src/os/linux.cc ncclOsSetEnv; the same since 2.23.4):

- at the first NCCL_* lookup of the process, once: the file named by NCCL_CONF_FILE
  (read from NCCL 2.23.4 on, commit 68b54236; an empty value counts as unset) or else
  $HOME/.nccl.conf, then /etc/nccl.conf;
- each line: dropped if it starts with '#' or has no '='; the name is everything before
  the first '=', the value everything after it up to the end of the line (a trailing
  '\\r' removed) - no trimming, no quote removal, no `export`; names and values are cut at
  1023 characters, lines read 4095 at a time;
- each pair is applied with setenv(name, value, 0): a variable already in the
  environment is kept. So the ENVIRONMENT WINS over every conf file, NCCL_CONF_FILE /
  ~/.nccl.conf win over /etc/nccl.conf, and within one file the FIRST line of a name wins.

The conf text written here is rendered by the profile grammar (nccl_tune.live.grammar:
NCCL_* names only here, plain values, printable comments, lines short enough for NCCL's
4096-byte reads) and checked to read back through `read_like_nccl` as written, so it is
also a valid nccl-tune profile that `lint`, `profiles show` and `logs nccl --profile`
read. `read_like_nccl` is NCCL's reading, not the grammar's: doctor and check use it to
show what a machine's own conf files really set, whatever is in them.
"""

from __future__ import annotations

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import profile

CONF_FILE_SINCE = (2, 23, 4)  # first NCCL release that reads NCCL_CONF_FILE
MAX_CONF_BYTES = 1024 * 1024  # a conf file holds a few NCCL_* lines
MAX_CONF_LINE = 4096  # characters per line (NCCL keeps 1023 of a name or value)
MAX_PART = 1023  # setEnvFile's envVar / envValue buffers, without the NUL

CONF_NOTES = [
    "NCCL conf-file syntax (src/misc/param.cc): NAME=VALUE, no spaces, no quotes, '#' comments.",
    "Use: NCCL_CONF_FILE=/path/to/this.conf (NCCL >= 2.23.4), or copy it to ~/.nccl.conf",
    "or /etc/nccl.conf (read since NCCL 2.4). NCCL reads it at its first variable lookup.",
    "The environment wins: a variable already set in the environment keeps its value.",
    "Check what NCCL read: NCCL_DEBUG=INFO logs '<NAME> set by environment to <value>'",
    "for conf-file values too; nccl-tune logs nccl LOG --profile THIS.conf checks every rank.",
]


def read_like_nccl(text: str) -> dict[str, str]:
    """The variables NCCL would take from conf-file `text` (first line of a name wins)."""
    out: dict[str, str] = {}
    for raw in text.split("\n"):
        line = raw[:-1] if raw.endswith("\r") else raw
        if line.startswith("#") or "=" not in line:
            continue
        name, value = line.split("=", 1)
        out.setdefault(name[:MAX_PART], value[:MAX_PART])
    return out


def conf_problems(env: dict[str, str]) -> list[str]:
    """Why `env` cannot be delivered by a conf file as written (empty when it can)."""
    problems = []
    for name, value in env.items():
        if name == "NCCL_CONF_FILE":
            problems.append("NCCL_CONF_FILE inside a conf file is never read (NCCL has chosen its file by then)")
        elif not name.startswith("NCCL_"):
            problems.append(
                f"{name} is not an NCCL variable: NCCL would set it, but only after "
                "the program that reads it has started"
            )
        if len(name) > MAX_PART or len(value) > MAX_PART:
            problems.append(f"{name}: longer than the 1023 characters NCCL reads")
    return problems


def render_conf(env: dict[str, str], provenance: dict[str, str] | None = None) -> str:
    """Conf-file text for `env` with `provenance` as comments; NcclTuneError when a variable
    cannot travel in a conf file or NCCL would read the text back differently."""
    problems = conf_problems(env)
    if problems:
        raise NcclTuneError("cannot write a conf file: " + "; ".join(problems))
    text = profile.render_profile(env, provenance, CONF_NOTES)
    if read_like_nccl(text) != env:
        raise NcclTuneError("the conf file would not read back as written")
    return text


def write_conf(path: str, env: dict[str, str], provenance: dict[str, str] | None = None) -> None:
    """Write `env` as an NCCL conf file, atomically."""
    fileio.write_atomic(path, render_conf(env, provenance))


def convert(source: str) -> str:
    """A profile file (.env) as conf-file text, provenance kept and the conversion noted."""
    prof = profile.load_profile(source)
    prov = dict(prof.provenance)
    prov["converted"] = f"from {source} by nccl-tune profiles convert --to conf"
    return render_conf(prof.env, prov)
