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
  before the GPU reaches them; then start event, op(s), end event on the current
  stream. A synchronous collective (async_op=False) is ordered with the current stream:
  since torch 2.8 it is launched on the current stream itself (pytorch#148590, relanded
  as #150398); before, on NCCL's own stream, which WorkNCCL::wait then made the current
  stream wait for. Either way the start event fires after the aligning collective and
  the end event when the timed one is done. The interval then holds the device time of
  the op(s) only: with `per_sample` > 1 eager ops after the first are enqueued while
  the GPU runs, so a host slower than the device shows there (host overhead per op), as
  in a server running eagerly.
- The head start is a count of GPU cycles, and the SM clock moves: an idle GPU runs far
  below its boost clock (345 vs 1980 MHz on an H200), so cycles per microsecond measured
  on an idle GPU would give a wait up to ~5x shorter once the clocks rise, and host
  launch time would leak into the samples. So the GPU is warmed up (`warm_up`) before the
  rate is measured, the rate is measured again right before each timed loop, the wait is
  sized with the highest rate seen (a wait longer than needed costs only wall time), and
  every sample records what it really got: an event before the busy wait and the start
  event give the achieved head start, and the host's own enqueue time after the wait is
  compared with it (`DeviceAlign.describe`: `head_start_short` counts the samples whose
  host enqueue outlasted it).
- CUDA graph: K collectives captured in one graph; per-op time = replay time / K. This
  is what a server with CUDA graphs runs: no host work per collective at all (and no
  NCCL log line either: NCCL logs at enqueue, i.e. at capture).

The Watchdog bounds the whole thing: a rank that sees no heartbeat for `timeout_s`
seconds (a collective that never completes, a replay that hangs) reports and exits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence

Op = Callable[[], object]


def cpu_eager(
    op: Op,
    align: Callable[[], object],
    iters: int,
    beat: Callable[[], object] = lambda: None,
    per_sample: int = 1,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
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


def cpu_gapped(
    op: Op,
    align: Callable[[], object],
    iters: int,
    beat: Callable[[], object] = lambda: None,
    per_sample: int = 1,
    gap_s: float = 0.0,
) -> list[float]:
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
    per_op = [max(s[2 * i + 1] for s in stamps_by_rank) - max(s[2 * i] for s in stamps_by_rank) for i in range(ops)]
    return [sum(per_op[i : i + per_sample]) * 1e6 / per_sample for i in range(0, ops, per_sample)]


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
START_WARMUP_S = 0.3  # GPU work before the first rate measurement of a process
LOOP_WARMUP_S = 0.02  # and before each timed loop's own measurement


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


def median(values: Sequence[float]) -> float | None:
    """The middle value (the upper one of an even count); None for no values."""
    ordered = sorted(values)
    return ordered[len(ordered) // 2] if ordered else None


class DeviceAlign:
    """The device-side part of a CUDA sample's alignment: the aligning collective, then
    the head start (see the module docstring). `pre` is an untimed collective of the
    measured group; `head_start_us` the intended wait, turned into GPU cycles at `rate`
    (cycles per us; None: no torch.cuda._sleep, no wait). After a timed loop,
    `achieved_us` holds each sample's measured head start (CUDA events from before the
    busy wait to the start event) and `host_after_us` the host's time from enqueuing the
    wait to enqueuing the end event; `describe` turns them into the record's fields."""

    def __init__(self, pre: Op, head_start_us: float, rate: float | None, rate_before_loop: float | None = None):
        self.pre = pre
        self.rate = rate
        self.rate_before_loop = rate_before_loop
        self.head_start_us = head_start_us if rate else None
        self.cycles = sleep_cycles(head_start_us, rate)
        self.achieved_us: list[float] = []
        self.host_after_us: list[float] = []

    def __call__(self, mark=None) -> None:
        """Enqueue the aligning collective, then (recording `mark`, an event, first) the wait."""
        import torch

        self.pre()
        if self.cycles:
            if mark is not None:
                mark.record()
            torch.cuda._sleep(self.cycles)

    def describe(self) -> dict:
        """What a record says about the alignment: the head start achieved (measured: the
        median of the samples; None before a timed loop or without a wait), its minimum,
        the one intended, the samples whose host enqueue outlasted it, and the GPU rate."""
        achieved = median(self.achieved_us)
        short = sum(1 for a, h in zip(self.achieved_us, self.host_after_us) if h >= a)
        host_after = median(self.host_after_us)
        out = {
            "head_start_us": round(achieved, 1) if achieved is not None else None,
            "head_start_basis": (
                f"measured: CUDA events around the busy wait, median of {len(self.achieved_us)} samples"
            )
            if self.achieved_us
            else None,
            "head_start_min_us": round(min(self.achieved_us), 1) if self.achieved_us else None,
            "head_start_intended_us": round(self.head_start_us, 1) if self.head_start_us else None,
            "host_after_head_start_us": round(host_after, 2) if host_after is not None else None,
            "head_start_short": short if self.achieved_us else None,
            "gpu_cycles_per_us": round(self.rate, 1) if self.rate else None,
            "gpu_cycles_per_us_before_loop": (round(self.rate_before_loop, 1) if self.rate_before_loop else None),
        }
        return out


def warm_up(seconds: float, clock: Callable[[], float] = time.perf_counter) -> int:
    """Keep the current GPU busy with matrix products for about `seconds`, so its clocks
    leave their idle state before anything is measured (see the module docstring).
    Returns the number of products run."""
    import torch

    if seconds <= 0:
        return 0
    a = torch.ones(4096, 4096, dtype=torch.float16, device="cuda")
    done = 0
    end = clock() + seconds
    while clock() < end:
        for _ in range(8):  # ~1 ms of work per check on an H200: the GPU stays busy
            torch.matmul(a, a)
        torch.cuda.synchronize()
        done += 8
    return done


def measure_sleep_rate(cycles: int = 200_000, runs: int = 3) -> float | None:
    """GPU cycles per microsecond of torch.cuda._sleep, timed with CUDA events; None where
    torch has no _sleep (the head start is then left out, and the record says so).
    The SM clock follows the load: measure right after work (warm_up), not on an idle GPU."""
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


def _cuda_timed(
    run: Op,
    divisor: int,
    align: Callable[[], object],
    iters: int,
    beat: Callable[[], object],
    device_align: DeviceAlign | None,
    clock: Callable[[], float] = time.perf_counter,
) -> list[float]:
    """CUDA-event microseconds of `iters` aligned calls of `run`, each divided by `divisor`.

    `align` runs on the host (device sync, gloo barrier); `device_align` (a DeviceAlign)
    right before the start event, so the ranks leave it together on the device; it is
    given each sample's achieved head start and host enqueue time after its wait.
    """
    import torch

    starts = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(iters)]
    waiting = device_align is not None and device_align.cycles > 0
    marks = [torch.cuda.Event(enable_timing=True) for _ in range(iters)] if waiting else []
    host_after = [0.0] * iters
    for i in range(iters):
        beat()
        align()
        if device_align is not None:
            device_align(marks[i] if waiting else None)
        enqueued = clock()
        starts[i].record()
        run()
        ends[i].record()
        host_after[i] = (clock() - enqueued) * 1e6
    torch.cuda.synchronize()
    if waiting:
        device_align.achieved_us = [m.elapsed_time(s) * 1000.0 for m, s in zip(marks, starts)]
        device_align.host_after_us = host_after
    return [s.elapsed_time(e) * 1000.0 / divisor for s, e in zip(starts, ends)]


def cuda_eager(
    op: Op,
    align: Callable[[], object],
    iters: int,
    beat: Callable[[], object] = lambda: None,
    per_sample: int = 1,
    device_align: DeviceAlign | None = None,
) -> list[float]:
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


def cuda_graph(
    graph,
    ops_per_replay: int,
    align: Callable[[], object],
    iters: int,
    beat: Callable[[], object] = lambda: None,
    device_align: DeviceAlign | None = None,
) -> list[float]:
    """Per-op microseconds of `iters` aligned replays: replay time / ops_per_replay."""
    return _cuda_timed(graph.replay, ops_per_replay, align, iters, beat, device_align)


class Watchdog:
    """Calls `on_expire(what, seconds)` once if no heartbeat arrives for `timeout_s`.

    `beat(what)` is cheap (one clock read and an attribute store), so the timers call
    it every iteration. The thread is a daemon and polls a few times a second.
    """

    def __init__(
        self,
        timeout_s: float,
        on_expire: Callable[[str, float], None],
        poll_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
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

    def start(self) -> Watchdog:
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
