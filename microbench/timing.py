"""Timers for one collective: CPU wall clock, CUDA events (eager), CUDA graph replay.

Every timer runs `iters` iterations of: heartbeat, align the ranks, time the op. It
returns this rank's per-iteration times in microseconds; the caller gathers them from
all ranks and keeps the slowest rank per iteration (stats.slowest_rank).

- CPU (gloo): `time.perf_counter` around one blocking collective.
- CUDA eager: CUDA events recorded on the current stream around one collective;
  torch makes the current stream wait for NCCL's stream, so the end event fires when
  the collective is done. Launch overhead on the host is part of the interval, as it
  is for a server running eagerly.
- CUDA graph: K collectives captured in one graph; events around each replay; per-op
  time = replay time / K. This is what a server with CUDA graphs runs: no host work
  per collective at all (and no NCCL log line either: NCCL logs at enqueue, i.e. at
  capture).

`align` is the caller's: on CUDA it synchronises the device and then meets the other
ranks on a CPU (gloo) barrier, so no rank starts its timer while another is still busy.
The Watchdog bounds the whole thing: a rank that sees no heartbeat for `timeout_s`
seconds (a collective that never completes, a replay that hangs) reports and exits.
"""

from __future__ import annotations

import threading
import time
from typing import Callable, Sequence

Op = Callable[[], object]


def cpu_eager(op: Op, align: Callable[[], object], iters: int,
              beat: Callable[[], object] = lambda: None, per_sample: int = 1,
              clock: Callable[[], float] = time.perf_counter) -> list[float]:
    """Wall-clock microseconds per call: `iters` samples, each `per_sample` calls of a
    blocking `op` run back to back after one alignment, divided by `per_sample`
    (`clock` in seconds; a test passes its own to check the arithmetic exactly)."""
    out = [0.0] * iters
    for i in range(iters):
        beat()
        align()
        start = clock()
        for _ in range(per_sample):
            op()
        out[i] = (clock() - start) * 1e6 / per_sample
    return out


def spin(seconds: float, clock: Callable[[], float] = time.perf_counter) -> None:
    """Keep this core busy for `seconds`, as compute between a step's collectives does
    (sleeping instead would let an idle core's wake-up latency into the next collective)."""
    end = clock() + seconds
    while clock() < end:
        pass


def cpu_gapped(op: Op, align: Callable[[], object], iters: int,
               beat: Callable[[], object] = lambda: None, per_sample: int = 1,
               gap_s: float = 0.0) -> list[float]:
    """Host stamps of `iters` samples, each one alignment then `per_sample` times: `gap_s`
    of busy compute (untimed), then one blocking `op` stamped on entry and exit.

    Returns this rank's flat [enter, exit, enter, exit, ...] in seconds of the host's
    monotonic clock; `last_arrival_us` turns every rank's stamps into per-op latencies.
    """
    clock = time.perf_counter
    out = [0.0] * (2 * iters * per_sample)
    j = 0
    for _ in range(iters):
        beat()
        align()
        for _ in range(per_sample):
            spin(gap_s, clock)
            out[j] = clock()
            op()
            out[j + 1] = clock()
            j += 2
    return out


def last_arrival_us(stamps_by_rank: Sequence[Sequence[float]], per_sample: int) -> list[float]:
    """Per-sample microseconds from every rank's `cpu_gapped` stamps: for each op, the time
    from the last rank's arrival until the last rank is done (max exit - max enter; what
    a collective costs once every rank is there, the waiting for a late rank left out),
    averaged over the sample's `per_sample` ops. Stamps must share one clock (one host)."""
    lengths = {len(s) for s in stamps_by_rank}
    if len(lengths) != 1 or not stamps_by_rank or next(iter(lengths)) % (2 * per_sample):
        raise ValueError(f"stamps of unequal or partial length: {sorted(lengths)}")
    ops = next(iter(lengths)) // 2
    per_op = [max(s[2 * i + 1] for s in stamps_by_rank) - max(s[2 * i] for s in stamps_by_rank)
              for i in range(ops)]
    return [sum(per_op[i:i + per_sample]) * 1e6 / per_sample for i in range(0, ops, per_sample)]


def _cuda_timed(run: Op, divisor: int, align: Callable[[], object], iters: int,
                beat: Callable[[], object]) -> list[float]:
    """CUDA-event microseconds of `iters` aligned calls of `run`, each divided by `divisor`."""
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        beat()
        align()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / divisor for s, e in zip(starts, ends)]


def cuda_eager(op: Op, align: Callable[[], object], iters: int,
               beat: Callable[[], object] = lambda: None, per_sample: int = 1) -> list[float]:
    """CUDA-event microseconds per collective: `iters` samples, each `per_sample`
    collectives enqueued back to back after one alignment, divided by `per_sample`."""
    def run() -> None:
        for _ in range(per_sample):
            op()

    return _cuda_timed(run, per_sample, align, iters, beat)


def capture_graph(ops: Sequence[Op]):
    """Capture `ops` (run once each, in order) into one CUDA graph and return it.

    The ops run once on a side stream first, as torch requires before capture; that
    also makes sure NCCL's communicator exists (it cannot be created inside a capture).
    """
    import torch

    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for op in ops:
            op()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for op in ops:
            op()
    torch.cuda.synchronize()
    return graph


def cuda_graph(graph, ops_per_replay: int, align: Callable[[], object], iters: int,
               beat: Callable[[], object] = lambda: None) -> list[float]:
    """Per-op microseconds of `iters` aligned replays: replay time / ops_per_replay."""
    return _cuda_timed(graph.replay, ops_per_replay, align, iters, beat)


class Watchdog:
    """Calls `on_expire(what, seconds)` once if no heartbeat arrives for `timeout_s`.

    `beat(what)` is cheap (one clock read and an attribute store), so the timers call
    it every iteration. The thread is a daemon and polls a few times a second.
    """

    def __init__(self, timeout_s: float, on_expire: Callable[[str, float], None],
                 poll_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.timeout_s = timeout_s
        self.on_expire = on_expire
        self.poll_s = poll_s if poll_s is not None else min(1.0, max(0.05, timeout_s / 20))
        self.what = "start-up"
        self.clock = clock
        self.last = clock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="microbench-watchdog", daemon=True)

    def beat(self, what: str | None = None) -> None:
        """Record progress (and optionally what the rank is doing now)."""
        self.last = self.clock()
        if what is not None:
            self.what = what

    def start(self) -> "Watchdog":
        """Start watching; returns self."""
        self.last = self.clock()
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop watching (idempotent)."""
        self._stop.set()

    def expired(self) -> bool:
        """Whether more than `timeout_s` passed since the last heartbeat."""
        return self.clock() - self.last > self.timeout_s

    def _run(self) -> None:
        while not self._stop.wait(self.poll_s):
            if self.expired():
                self._stop.set()
                self.on_expire(self.what, self.timeout_s)
                return
