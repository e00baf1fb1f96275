"""Read a running process's current environment from its memory (Linux), without
stopping it: for processes whose /proc/PID/environ no longer shows it.

Why: /proc/PID/environ is the memory between the env_start and env_end addresses of
/proc/PID/stat (fields 50 and 51), i.e. the strings execve put on the stack. Python's
setproctitle (used by vLLM's engine core and workers and SGLang's schedulers) takes that
area for the new title: its save_ps_display_args (src/spt_status.c) first copies every
environment string with strdup into a malloc'd array and points libc's `environ` at the
copy, then set_ps_display pads the old area with NUL bytes. The original bytes are gone
from the stack, but the process's environment lives on, in the heap, behind `environ`:
exactly what getenv() (and so NCCL) reads, changes made with putenv/os.environ included.

How: find the object that defines the `environ` data symbol (the executable first, since
a non-PIE program such as Debian's python3 holds it by copy relocation, then libc), add
its load address from /proc/PID/maps, read the pointer there through /proc/PID/mem, then
the NULL-terminated array of string pointers and each string. /proc/PID/mem needs ptrace
access (PTRACE_MODE_ATTACH: root, or the same user where Yama's ptrace_scope allows it;
with ptrace_scope 1 only a parent reads its descendants). 64-bit little-endian ELF only.
"""

from __future__ import annotations

import functools
import os
import struct

PROC = "/proc"
ENV_SYMBOLS = (b"environ", b"__environ")
MAX_VARS = 65536
MAX_BYTES = 4 * 1024 * 1024


class MemoryReadError(Exception):
    """The environment could not be read from the process's memory; the message says why."""


def _maps(pid: int) -> list[tuple[int, int, int, str]]:
    # (start, end, file offset, path) of every file-backed mapping
    out = []
    try:
        with open(f"{PROC}/{pid}/maps", encoding="utf-8", errors="replace") as handle:
            for line in handle:
                parts = line.split(None, 5)
                if len(parts) == 6 and parts[5].startswith("/"):
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    out.append((start, end, int(parts[2], 16), parts[5].rstrip("\n")))
    except OSError as exc:
        raise MemoryReadError(f"cannot read its memory map: {exc.strerror}") from None
    return out


@functools.lru_cache(maxsize=32)
def _elf_symbol(path: str, size: int, mtime: float) -> tuple[int, int, int] | None:
    """(e_type, first PT_LOAD vaddr, st_value of environ) of an ELF file, or None."""
    del size, mtime  # cache key only: a replaced file is read again
    try:
        with open(path, "rb") as handle:
            data = handle.read()
    except OSError:
        return None
    if data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        return None  # not a 64-bit little-endian ELF
    (e_type,) = struct.unpack_from("<H", data, 16)
    e_phoff, e_shoff = struct.unpack_from("<QQ", data, 32)
    e_phentsize, e_phnum, e_shentsize, e_shnum = struct.unpack_from("<HHHH", data, 54)
    first_load = None
    for i in range(e_phnum):
        p_type, _, p_offset, p_vaddr = struct.unpack_from("<IIQQ", data, e_phoff + i * e_phentsize)
        if p_type == 1 and p_offset == 0:  # PT_LOAD mapping the file's start
            first_load = p_vaddr
            break
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, e_shoff + i * e_shentsize) for i in range(e_shnum)]
    for kind in (11, 2):  # SHT_DYNSYM, then SHT_SYMTAB
        for sh in sections:
            if sh[1] != kind:
                continue
            offset, size_, link, entsize = sh[4], sh[5], sh[6], sh[9] or 24
            strtab = sections[link]
            str_off = strtab[4]
            for j in range(size_ // entsize):
                st_name, st_info, _, st_shndx, st_value, _ = struct.unpack_from("<IBBHQQ", data, offset + j * entsize)
                if st_shndx == 0 or (st_info & 0xF) != 1:  # undefined, or not an object
                    continue
                end = data.find(b"\0", str_off + st_name)
                if data[str_off + st_name : end] in ENV_SYMBOLS:
                    return e_type, first_load or 0, st_value
    return None


def environ_address(pid: int) -> int:
    """The address of `environ` (the char ** variable) in `pid`; MemoryReadError if unknown."""
    maps = _maps(pid)
    try:
        exe = os.readlink(f"{PROC}/{pid}/exe")
    except OSError as exc:
        raise MemoryReadError(f"cannot read its executable: {exc.strerror}") from None
    libs = [
        path
        for _, _, _, path in maps
        if os.path.basename(path).startswith("libc.so") or os.path.basename(path).startswith("libc-")
    ]
    for path in dict.fromkeys([exe, *libs]):
        local = f"{PROC}/{pid}/root{path}"  # the process's own file, also in a container
        try:
            st = os.stat(local)
        except OSError:
            continue
        found = _elf_symbol(local, st.st_size, st.st_mtime)
        if found is None:
            continue
        e_type, first_load, value = found
        if e_type == 2:  # ET_EXEC: linked at fixed addresses
            return value
        starts = [start for start, _, off, p in maps if p == path and off == 0]
        if starts:
            return min(starts) - first_load + value
    raise MemoryReadError("no `environ` symbol found in its executable or libc")


def _read(fd: int, address: int, size: int) -> bytes:
    try:
        return os.pread(fd, size, address)
    except OSError as exc:
        raise MemoryReadError(f"cannot read its memory at {address:#x}: {exc.strerror}") from None


def _string(fd: int, address: int, budget: int) -> bytes:
    out = b""
    while len(out) < budget:
        chunk = _read(fd, address + len(out), 256)
        if not chunk:
            break
        end = chunk.find(b"\0")
        if end >= 0:
            return out + chunk[:end]
        out += chunk
    raise MemoryReadError("an environment string has no end within the size limit")


def read_environ_from_memory(pid: int) -> dict[str, str]:
    """The process's current environment (libc `environ`) read from /proc/PID/mem.

    MemoryReadError says why it could not be read (permission, an unknown layout).
    """
    address = environ_address(pid)
    try:
        fd = os.open(f"{PROC}/{pid}/mem", os.O_RDONLY)
    except OSError as exc:
        raise MemoryReadError(f"cannot open its memory: {exc.strerror}") from None
    try:
        (pointer,) = struct.unpack("<Q", _read(fd, address, 8).ljust(8, b"\0"))
        if pointer == 0:
            return {}
        env: dict[str, str] = {}
        used = 0
        for i in range(MAX_VARS):
            (slot,) = struct.unpack("<Q", _read(fd, pointer + 8 * i, 8).ljust(8, b"\0"))
            if slot == 0:
                return env
            entry = _string(fd, slot, MAX_BYTES - used)
            used += len(entry) + 1
            if b"=" in entry:
                key, value = entry.split(b"=", 1)
                env[key.decode("utf-8", "replace")] = value.decode("utf-8", "replace")
        raise MemoryReadError(f"more than {MAX_VARS} environment entries")
    finally:
        os.close(fd)
