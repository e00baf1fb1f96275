"""Timers for one collective: CPU wall clock, CUDA events (eager), CUDA graph replay.

Every timer runs `iters` iterations of: heartbeat, align the ranks, time the op. It
returns this rank's per-iteration times in microseconds; the caller gathers them from
all ranks and keeps the slowest rank per iteration (stats.slowest_rank).

- CPU (gloo): `time.perf_counter` around one blocking collective, after a gloo barrier
  (`cpu-barrier`), or per collective from the last rank's arrival (`cpu-last-arrival`,
  --gap-us). These complete on the host, so host clocks time them.
- CUDA (`device-aligned`, eager and graph): a host barrier cannot align GPUs. It
  releases ranks tens of microseconds apart; an early rank's start event would fire on
  an idle GPU while its kernel spins for the last rank, so its interval (the one the
  slowest-rank statistic keeps) would hold the skew, and host launch latency too. So
  each sample is: device sync and gloo barrier (the queue is empty and ranks are
  roughly together), then an untimed one-element allreduce of the *same group*
  (`DeviceAlign.pre`): it completes on every GPU only once the last rank's kernel has
  joined, so every rank leaves it together; then a device-side busy wait (`head start`,
  torch.cuda._sleep; one duration for every rank, the slowest host's need, in each GPU's
  own cycles) long enough for the host to enqueue the start event and the timed op
  before the GPU reaches them; then start
  event, op(s), end event on the current stream. torch makes the current stream wait
  for NCCL's stream after a collective (WorkNCCL::wait -> synchronizeStream blocks the
  current stream on the work's end event), so the start event fires after the aligning
  collective and the end event when the timed one is done. The interval then holds the
  device time of the op(s) only: with `per_sample` > 1 eager ops after the first are
  enqueued while the GPU runs, so a host slower than the device shows there (host
  overhead per op), as in a server running eagerly.
- CUDA graph: K collectives captured in one graph; per-op time = replay time / K. This
  is what a server with CUDA graphs runs: no host work per collective at all (and no
  NCCL log line either: NCCL logs at enqueue, i.e. at capture).

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


# The timing method of each timer (a record's `timing_method`) and what it means.
TIMING_METHODS = {
    "cpu-barrier": "host wall clock around the op(s) after a gloo barrier (gloo on CPU)",
    "cpu-last-arrival": "host stamps of every rank; each op from the last rank's arrival "
                        "until the last rank is done (gloo on CPU, --gap-us)",
    "device-aligned": "CUDA events after an untimed collective of the same group and a "
                      "device-side head start: ranks leave the alignment together and the "
                      "host's launch is not inside the interval",
}
HEAD_START_MIN_US = 20.0
HEAD_START_MAX_US = 5000.0


def timing_method(device_type: str, gap_us: float | None = None) -> str:
    """The TIMING_METHODS key a measurement on `device_type` uses."""
    if device_type == "cuda":
        return "device-aligned"
    return "cpu-last-arrival" if gap_us else "cpu-barrier"


def head_start_us(host_enqueue_us: float | None) -> float:
    """Device-side wait after the aligning collective: long enough for the host to enqueue
    the start event and the timed op (twice one op's measured host time plus 20 us, so a
    hiccup fits too), bounded to [20 us, 5 ms]. Unknown host time: 200 us."""
    if host_enqueue_us is None or not host_enqueue_us == host_enqueue_us or host_enqueue_us < 0:
        return 200.0
    return min(HEAD_START_MAX_US, max(HEAD_START_MIN_US, 2.0 * host_enqueue_us + 20.0))


def cycles_per_us(cycles: int, elapsed_ms: Sequence[float]) -> float | None:
    """GPU clock cycles per microsecond from timed busy waits of `cycles` cycles each
    (the median of the runs; None when no run gave a positive time)."""
    times = sorted(t for t in elapsed_ms if t and t > 0)
    if not times or cycles <= 0:
        return None
    return cycles / (times[len(times) // 2] * 1000.0)


def sleep_cycles(us: float, rate: float | None) -> int:
    """Cycles for a device busy wait of `us` microseconds at `rate` cycles/us (0: none)."""
    if not rate or us <= 0:
        return 0
    return int(round(us * rate))


def host_time_us(call: Op, repeat: int = 5) -> float:
    """Median host microseconds of one `call` (its enqueue time on CUDA: nothing waits)."""
    clock = time.perf_counter
    times = []
    for _ in range(max(1, repeat)):
        start = clock()
        call()
        times.append((clock() - start) * 1e6)
    times.sort()
    return times[len(times) // 2]


class DeviceAlign:
    """The device-side part of a CUDA sample's alignment: the aligning collective, then
    the head start (see the module docstring). `pre` is an untimed collective of the
    measured group; `cycles` the head start in GPU cycles (0: none)."""

    def __init__(self, pre: Op, head_start_us: float, rate: float | None):
        self.pre = pre
        self.rate = rate
        self.head_start_us = head_start_us if rate else None
        self.cycles = sleep_cycles(head_start_us, rate)

    def __call__(self) -> None:
        import torch

        self.pre()
        if self.cycles:
            torch.cuda._sleep(self.cycles)

    def describe(self) -> dict:
        """What a record says about the alignment."""
        return {"head_start_us": round(self.head_start_us, 1) if self.head_start_us else None,
                "gpu_cycles_per_us": round(self.rate, 1) if self.rate else None}


def measure_sleep_rate(cycles: int = 200_000, runs: int = 3) -> float | None:
    """GPU cycles per microsecond of torch.cuda._sleep, timed with CUDA events; None where
    torch has no _sleep (the head start is then left out, and the record says so)."""
    import torch

    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    elapsed = []
    for _ in range(runs):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        sleep(cycles)
        end.record()
        end.synchronize()
        elapsed.append(start.elapsed_time(end))
    return cycles_per_us(cycles, elapsed)


def _cuda_timed(run: Op, divisor: int, align: Callable[[], object], iters: int,
                beat: Callable[[], object], device_align: Callable[[], object] | None) -> list[float]:
    """CUDA-event microseconds of `iters` aligned calls of `run`, each divided by `divisor`.

    `align` runs on the host (device sync, gloo barrier); `device_align` (a DeviceAlign)
    right before the start event, so the ranks leave it together on the device.
    """
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    for i in range(iters):
        beat()
        align()
        if device_align is not None:
            device_align()
        starts[i].record()
        run()
        ends[i].record()
    torch.cuda.synchronize()
    return [s.elapsed_time(e) * 1000.0 / divisor for s, e in zip(starts, ends)]


def cuda_eager(op: Op, align: Callable[[], object], iters: int,
               beat: Callable[[], object] = lambda: None, per_sample: int = 1,
               device_align: Callable[[], object] | None = None) -> list[float]:
    """CUDA-event microseconds per collective: `iters` samples, each `per_sample`
    collectives enqueued back to back after one alignment, divided by `per_sample`."""
    def run() -> None:
        for _ in range(per_sample):
            op()

    return _cuda_timed(run, per_sample, align, iters, beat, device_align)


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
               beat: Callable[[], object] = lambda: None,
               device_align: Callable[[], object] | None = None) -> list[float]:
    """Per-op microseconds of `iters` aligned replays: replay time / ops_per_replay."""
    return _cuda_timed(graph.replay, ops_per_replay, align, iters, beat, device_align)


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
