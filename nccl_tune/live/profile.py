"""Profiles: `.env` files of NCCL settings with a provenance header.

The format is the profile grammar (nccl_tune.live.grammar: what it accepts, bash
`set -a; . f.env`, `docker run --env-file`, systemd `EnvironmentFile=`, NCCL's conf
reader and `nccl-tune exec` all read the same way, and it runs nothing):

    # nccl-tune profile
    # source: measured
    # gpus: 8x NVIDIA RTX PRO 6000 (PCIe)
    #
    # free notes go after a lone '#' line
    NCCL_PROTO=LL
    NCCL_ALGO=Ring

This module reads and writes whole profiles with it: reading never evaluates anything
and refuses the first line the grammar refuses (path and line named); writing renders
only what the grammar accepts (never quoting or escaping) and replaces the file
atomically. Provenance is the `# key: value` comment lines of the leading comment
block, up to a lone `#` line (after which free notes follow).

Shipped profiles live in the repository's `profiles/` folder (a source checkout or an
editable install finds it beside the package; a wheel installs it as data files under
`<prefix>/share/nccl-tune/profiles`): see `shipped_profiles_dir`.
"""

from __future__ import annotations

import os
import re
import sys
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path

from nccl_tune import fileio
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import grammar

# `# key: value`: the key is everything before the first ':' (one pass, no backtracking
# between the key and the blanks before the colon), then checked on its own.
_PROVENANCE_RE = re.compile(r"^#\s?([^:]*):\s?(.*)$")
_PROVENANCE_KEY_RE = re.compile(r"^[A-Za-z][A-Za-z0-9 _-]*$")
HEADER_TITLE = "nccl-tune profile"
NOTES_SEPARATOR = "#"


@dataclass
class Profile:
    """An ordered NCCL environment plus where it came from."""

    env: dict[str, str]
    provenance: dict[str, str] = field(default_factory=dict)
    path: str | None = None
    lines: dict[str, int] = field(default_factory=dict)  # key -> line of its last assignment

    @property
    def name(self) -> str:
        """The file name without `.env`, or '<memory>' for a profile not read from disk."""
        if self.path is None:
            return "<memory>"
        base = os.path.basename(self.path)
        return base[:-4] if base.endswith(".env") else base


def parse_provenance(lines: list[grammar.Line]) -> dict[str, str]:
    """The `# key: value` comments of the leading comment block (up to a lone `#`)."""
    out: dict[str, str] = {}
    for line in lines:
        if line.kind == grammar.BLANK:
            continue
        if line.kind != grammar.COMMENT or line.raw.strip() == NOTES_SEPARATOR:
            break
        match = _PROVENANCE_RE.match(line.raw.strip())
        key = match.group(1).rstrip() if match else ""
        if key and _PROVENANCE_KEY_RE.match(key):
            out[key] = match.group(2).strip()
    return out


def parse_profile(text: str, path: str | None = None) -> Profile:
    """Read profile text; NcclTuneError naming the first line the grammar refuses."""
    lines = grammar.parse_lines(text, path)
    error = grammar.first_error(lines, path)
    if error:
        raise error
    env: dict[str, str] = {}
    where: dict[str, int] = {}
    for line in lines:
        if line.kind == grammar.ASSIGN:
            env.pop(line.key, None)  # a later assignment wins and moves to the end
            env[line.key] = line.value
            where[line.key] = line.number
    return Profile(env=env, provenance=parse_provenance(lines), path=path, lines=where)


def read_text(path: str) -> str:
    """A profile's text by the input policy (nccl_tune.fileio.read_text: strict UTF-8)
    under the grammar's size cap (grammar.MAX_FILE_BYTES), or NcclTuneError naming the
    file. Long lines are the grammar's to refuse, line by line."""
    return fileio.read_text(path, what="profile", max_bytes=grammar.MAX_FILE_BYTES)


def load_profile(path: str) -> Profile:
    """Read a profile file; NcclTuneError when it is unreadable, too large or malformed."""
    return parse_profile(read_text(path), path=path)


def render_profile(
    env: dict[str, str], provenance: dict[str, str] | None = None, notes: list[str] | None = None
) -> str:
    """The text of a profile: title, provenance, free notes, then NAME=VALUE lines.

    Provenance keys and values are written stripped (that is how they read back).
    NcclTuneError for a variable the grammar refuses (a name off the allow-list, a value
    outside its characters) or provenance/note text that would not read back as one
    comment line; the text is checked against the grammar once more before it is
    returned, so what is written is what every reader reads.
    """
    out = [grammar.render_comment(HEADER_TITLE)]
    for key, value in (provenance or {}).items():
        key, value = str(key).strip(), str(value).strip()
        if not _PROVENANCE_KEY_RE.match(key):
            raise NcclTuneError(f"provenance entry {grammar.shown(key)} cannot be written as a '# key: value' comment")
        out.append(grammar.render_comment(f"{key}: {value}"))
    if notes:
        out.append(NOTES_SEPARATOR)
        for note in notes:
            for part in note.split("\n"):
                out.append(grammar.render_comment(part.rstrip()))
    out.append("")
    grammar.check_env(env, "cannot write the profile")
    out.extend(grammar.render_assignment(key, value) for key, value in env.items())
    text = "\n".join(out) + "\n"
    if dict(grammar.assignments(text)) != env:  # never reached while the checks above hold
        raise NcclTuneError("the profile would not read back as written")
    return text


def write_profile(
    path: str, env: dict[str, str], provenance: dict[str, str] | None = None, notes: list[str] | None = None
) -> None:
    """Render and write a profile atomically (see `render_profile` for what it refuses)."""
    fileio.write_atomic(path, render_profile(env, provenance, notes))


def nccl_env(environ: dict[str, str] | os._Environ) -> dict[str, str]:
    """The NCCL_* variables of an environment, sorted by name."""
    return {k: environ[k] for k in sorted(environ) if k.startswith("NCCL_")}


# ---------------------------------------------------------------- shipped profiles


def shipped_profiles_dir() -> Path | None:
    """The folder of shipped profiles, or None when this installation has none.

    Order: $NCCL_TUNE_PROFILES (a folder), the `profiles/` folder beside the package
    (source checkout, editable install), then `<prefix>/share/nccl-tune/profiles`
    (where a wheel's data files land).
    """
    candidates = []
    if os.environ.get("NCCL_TUNE_PROFILES"):
        candidates.append(Path(os.environ["NCCL_TUNE_PROFILES"]))
    candidates.append(Path(__file__).resolve().parents[2] / "profiles")
    for prefix in {sysconfig.get_path("data"), sys.prefix}:
        if prefix:
            candidates.append(Path(prefix) / "share" / "nccl-tune" / "profiles")
    for folder in candidates:
        if folder.is_dir():
            return folder
    return None


def list_shipped() -> list[Path]:
    """The shipped `.env` files, sorted by name (empty when there are none)."""
    folder = shipped_profiles_dir()
    return sorted(folder.glob("*.env")) if folder else []


def resolve_profile(name_or_path: str) -> Path:
    """A profile path from a file path or a shipped profile's name (with or without .env).

    An existing file wins over a shipped name. NcclTuneError, naming the shipped
    profiles, when neither exists.
    """
    candidate = Path(name_or_path)
    if candidate.exists() and not candidate.is_dir():  # a pipe or /dev/stdin too: read_text decides
        return candidate
    wanted = name_or_path[:-4] if name_or_path.endswith(".env") else name_or_path
    for path in list_shipped():
        if path.stem == wanted:
            return path
    names = ", ".join(p.stem for p in list_shipped()) or "none found"
    raise NcclTuneError(f"no such file or shipped profile (shipped: {names})", path=name_or_path)
