"""Test factories: plain functions that build what many test files need (conftest.py keeps
the fixtures). Results records and sweeps of them, grids, a free port, records on disk,
and the Welch verdict recomputed from runs (scipy directly, not the project's helper).

A sweep's records are drawn the way a real machine behaves: each round shifts every
cell by the same drift, and each sample adds its own noise. The random stream is fixed
by `seed` and drawn in one order (per round: the drift, then per cell and size the
samples), so a test's data stays the same when the factory serves another test too.
"""

from __future__ import annotations

import socket
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

import numpy as np
from scipy import stats as scipy_stats

from nccl_tune import stats, store
from nccl_tune.measure import grid as gridlib

Extra = dict | Callable[[int], dict]


def record(
    env: dict | None = None,
    nbytes: int = 14336,
    *,
    samples: Iterable[float] | None = None,
    p50: float | None = None,
    round_: int | None = 0,
    backend: str = "nccl",
    world_size: int = 8,
    op: str = "allreduce",
    **fields,
) -> dict:
    """One results record (store.make_record): `lat_us` summarised from `samples` (which
    are kept as `samples_us`), or just {"p50": p50}; any other field passes through."""
    lat_us = fields.pop("lat_us", None)
    if samples is not None:
        samples = [float(x) for x in samples]
        lat_us = stats.summarize(samples)
        fields.setdefault("samples_us", samples)
    elif p50 is not None:
        lat_us = {"p50": p50}
    return store.make_record(
        env={} if env is None else env,
        backend=backend,
        op=op,
        world_size=world_size,
        bytes=nbytes,
        lat_us=lat_us,
        round=round_,
        **fields,
    )


def sweep_records(
    cells: Sequence[tuple],
    sizes: Sequence[int],
    *,
    rounds: int,
    noise: float,
    samples: int,
    seed: int = 0,
    drift_sd: float | None = None,
    drift: Sequence[float] | None = None,
    first_round: int = 0,
    **fields,
) -> list[dict]:
    """Records of a sweep: `cells` = [(env, lat_fn(bytes) -> us[, extra])], where extra
    is a dict of record fields or a function of the size returning one.

    Per round the drift is `drift[round]` when given, else drawn N(0, drift_sd) when
    `drift_sd` is given (even 0: the stream stays the same), else none; each (cell, size)
    then gets `samples` values lat_fn(b) + drift + N(0, noise). Rounds are numbered from
    `first_round`. Records are on one node in bf16 and correct unless `fields` say else.
    """
    rng = np.random.default_rng(seed)
    fields = {"nnodes": 1, "dtype": "bf16", "iters": samples, "correct": True, **fields}
    out = []
    for index in range(rounds):
        shift = drift[index] if drift is not None else rng.normal(0, drift_sd) if drift_sd is not None else 0.0
        for env, lat_fn, *extra in cells:
            for nbytes in sizes:
                values = lat_fn(nbytes) + shift + rng.normal(0, noise, samples)
                rec = record(env, nbytes, samples=values, round_=first_round + index, **fields)
                add = extra[0] if extra else {}
                rec.update(add(nbytes) if callable(add) else add)
                out.append(rec)
    return out


def write_records(folder: Path, records: Iterable[dict], name: str = "r.jsonl") -> str:
    """`records` appended to folder/name (store.append_records); the path as a string."""
    path = Path(folder) / name
    store.append_records(str(path), list(records))
    return str(path)


def read_records(path) -> list[dict]:
    """Every record of a results file, in file order (store.read_records)."""
    return store.read_records([str(path)])


def grid(*sets: str, topology: str | None = None, allow_unsafe: bool = False) -> gridlib.Grid:
    """The grid of `--set NAME=v1,v2` strings, as `nccl-tune sweep --set` builds it."""
    return gridlib.build_grid(gridlib.spec_from_sets(list(sets)), topology, allow_unsafe)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now (the OS's choice)."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def welch_verdict(
    profile_runs: Sequence[float], baseline_runs: Sequence[float], confidence: float = 0.95
) -> tuple[str, float, float]:
    """(verdict, lo, hi) of validate's rule, recomputed with scipy: the Welch t interval
    of mean profile tok/s minus mean baseline tok/s; 'helps' above 0, 'hurts' below."""
    a, b = np.array(profile_runs, float), np.array(baseline_runs, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    diff = a.mean() - b.mean()
    if va + vb == 0:
        lo = hi = diff
    else:
        dof = (va + vb) ** 2 / (va**2 / (len(a) - 1) + vb**2 / (len(b) - 1))
        half = scipy_stats.t.ppf(0.5 + confidence / 2, dof) * np.sqrt(va + vb)
        lo, hi = diff - half, diff + half
    verdict = "helps" if lo > 0 else "hurts" if hi < 0 else "no significant difference"
    return verdict, float(lo), float(hi)


def validate_verdict(data: dict) -> tuple[str, float, float]:
    """welch_verdict of a `validate --json` output: its best profile row against its best
    baseline row, each the step count with the highest mean tok/s (read from the rows)."""
    best = {
        c: max((r for r in data["rows"] if r["config"] == c and r["tok_s"]), key=lambda r: r["tok_s"])
        for c in ("baseline", "profile")
    }
    return welch_verdict(best["profile"]["runs_tok_s"], best["baseline"]["runs_tok_s"])
