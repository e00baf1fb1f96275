"""An analytical small-message latency model of NCCL collectives on one node.

This is an approximation, not a measurement. Sources:

- NCCL src/graph/tuning.cc (2.2x-2.30), `ncclTopoTuneModel` and `ncclTopoGetAlgoTime`:
  baseLat (Tree 6.8/14.0/8.4, Ring 6.6/14.0/8.4 us for LL/LL128/Simple), hwLat per hop
  for NVLink (Tree .6/1.25/4.0, Ring .6/1.9/3.4) and PCI (Tree 1.0/1.9/4.0, Ring
  1.0/2.5/5.7), NVLS 25 us on one node; one-node allreduce latency
  `baseLat + 2(n-1) * hwLat` for Ring and for the intra-node Tree chain; bandwidth
  refinements (Ring LL x0.5, Ring LL128 x0.92; Tree x0.92, Tree LL /3.8, Tree LL128
  x7/9 on one node; Ring algorithm bandwidth = bus bandwidth x n/nsteps, Tree x0.5) and
  Tree's per-size correction factors; `time = latency + bytes / (1000 * bandwidth)`.
- NCCL src/enqueue.cc, `topoGetAlgoInfo`: how many channels and threads a collective
  really uses: start from the communicator's channels and the (algo, proto) thread
  maximum, then drop channels, then halve threads, while
  `bytes < channels * threads * threshold` (thresholds: LL 8 x nRanks for Ring, LL128
  8, Simple 64 bytes per thread). A 14 KB Ring/LL allreduce on 8 ranks runs on 1 channel.
- NCCL src/graph/paths.cc, `ncclTopoCheckP2p`: P2P is used up to path type PXB by
  default (NCCL_P2P_LEVEL overrides; NCCL_P2P_DISABLE=1 means LOC); farther pairs go
  through host shared memory (SHM).
- LL128 is enabled by default only where the intra-node graph is NVLink; any
  NCCL_PROTO that names LL128 forces it (DESIGN.md section 5).

Two views of the same machine, because NCCL cannot see everything:
- NCCL's choice (`choose`, `simulate`'s selection) uses NCCL's own view: the hardware
  is NVLink or PCI, never SHM (tuning.cc has no SHM latency), and bandwidth uses the
  communicator's channel pool.
- The time a collective takes (`op_time_us`) uses the transport really in use (SHM is
  far slower per hop than P2P) and the channels and threads it really runs with.

What NCCL's tables do not give, and this module adds as labelled guesses:
- `shm` per-hop latencies: PCI's plus 0.3 us (LL), 0.5 (LL128) and 1.0 (Simple), and
  5 GB/s per channel. Fitted to a public result: a 4-GPU RTX PRO 6000 box measured with
  p2pmark (voipmonitor/rtx6kpro, hardware/asus-esc8000a-e13p-broadcom-switches.md) took
  15.4 us at 32 KB by default (host memory for the pairs across virtual switches) and
  13.4 us with NCCL_P2P_LEVEL=SYS: about 0.3 us more per LL ring step; LL128's and
  Simple's extras are guesses in proportion. (Earlier versions used +2.5 us per hop,
  chosen so that NCCL_P2P_LEVEL=SYS alone gave the 8x PCIe report's 38 us per allreduce;
  the published tables do not support that: on that report's machines the gain comes
  from the protocol NCCL picks, see `pcie-amd-2s`.)
- per-channel bandwidths by link (pci: NCCL's Gen4 x16 figure; shm fitted to public
  host-memory tables, see `ModelParams.bw_per_channel`), a small per-channel launch
  cost, throughput scaling with a CTA's maximum threads (NCCL_NTHREADS) up to 512, and
  NCCL_BUFFSIZE limiting the bytes one Simple pipeline slot carries.

`simulate` can time NCCL's choice with different ("true") parameters from those NCCL
selects with, which is how the sweep's `sim` backend makes landscapes where a forced
setting beats the default.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from nccl_tune.nccl import settings

LINKS = ("nvlink", "pci", "shm")
STEPS_PER_BUFFER = 8  # NCCL_STEPS: a channel's Simple buffer is split into 8 pipeline slots
DEFAULT_BUFFSIZE = 4 << 20  # NCCL's default NCCL_BUFFSIZE
LL128_MAX_NTHREADS = 640  # NCCL_LL128_MAX_NTHREADS
# Bytes per thread before NCCL adds threads/channels (enqueue.cc; NCCL_*_THREAD_THRESHOLD).
THREAD_THRESHOLDS = {"LL": 8, "LL128": 8, "Simple": 64}
# tuning.cc treeCorrectionFactor, powers of two from 64 B (index log2(bytes/64)), 2.2x+.
_TREE_CORRECTION = {
    "LL": (
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.7,
        0.7,
        0.7,
        0.7,
        0.6,
        0.5,
        0.4,
        0.4,
        0.5,
        0.6,
        0.7,
        0.8,
        0.9,
        1.0,
        1.0,
        1.0,
        1.0,
    ),
    "LL128": (
        1.0,
        1.0,
        1.0,
        1.0,
        1.0,
        0.9,
        0.8,
        0.8,
        0.8,
        0.7,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.6,
        0.8,
        0.9,
        0.9,
        0.9,
        0.9,
        1.0,
        1.0,
    ),
    "Simple": (
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.9,
        0.8,
        0.7,
        0.6,
        0.6,
        0.5,
        0.5,
        0.5,
        0.5,
        0.6,
        0.7,
        0.8,
        0.7,
        0.7,
        0.8,
        0.9,
        0.9,
    ),
}


def _table(ring: tuple[float, float, float], tree: tuple[float, float, float]) -> dict:
    protos = settings.PROTOCOLS
    out = {("Ring", p): v for p, v in zip(protos, ring)}
    out.update({("Tree", p): v for p, v in zip(protos, tree)})
    return out


@dataclass(frozen=True)
class ModelParams:
    """Constants of the latency model (us, GB/s). Defaults: NCCL's tables plus guesses."""

    # NCCL tuning.cc baseLat, order LL / LL128 / Simple.
    base_lat: dict = field(default_factory=lambda: _table((6.6, 14.0, 8.4), (6.8, 14.0, 8.4)))
    # NCCL tuning.cc hwLat per hop for NVLink and PCI; `shm` is this module's guess (see doc).
    hw_lat: dict = field(
        default_factory=lambda: {
            "nvlink": _table((0.6, 1.9, 3.4), (0.6, 1.25, 4.0)),
            "pci": _table((1.0, 2.5, 5.7), (1.0, 1.9, 4.0)),
            # PCI + 0.3 / 0.5 / 1.0 us per hop (LL / LL128 / Simple): see the module doc.
            "shm": _table((1.3, 3.0, 6.7), (1.3, 2.4, 5.0)),
        }
    )
    nvls_lat: float = 25.0  # tuning.cc hwLat[NVLINK][NVLS][Simple]; never wins small messages
    # GB/s one channel moves over each link. pci: NCCL's own figure for a PCIe Gen4 x16 link
    # (topo.cc: width x speed / 80; 12 is Gen3). shm: a guess, fitted to public results: the
    # host-memory tables of 2x and 4x L40S (yumibyte/CS244C-Research) and 4x RTX PRO 6000
    # (voipmonitor/rtx6kpro, p2pmark) grow from 8 to 64 KB at ~10 GB/s per channel, not the
    # 5 this model used before (and its 12 for pci made every PCIe curve twice too steep).
    bw_per_channel: dict = field(default_factory=lambda: {"nvlink": 20.0, "pci": 24.0, "shm": 10.0})
    # Ring bandwidth factor per protocol (tuning.cc: LL x0.5, LL128 x0.92).
    proto_eff: dict = field(default_factory=lambda: {"LL": 0.5, "LL128": 0.92, "Simple": 1.0})
    # Tree bandwidth factor per protocol on one node (tuning.cc: x0.92, then LL /3.8, LL128 x7/9).
    tree_eff: dict = field(default_factory=lambda: {"LL": 0.92 / 3.8, "LL128": 0.92 * 7 / 9, "Simple": 0.92})
    # Cap on Ring/Tree LL bus bandwidth (tuning.cc llMaxBws, one node: Ampere 87.7, Hopper 141).
    ll_max_bw: float = 87.7
    channel_cost_us: float = 0.04  # per extra channel (CTA launch and sync), a guess
    default_nthreads: int = 512  # threads at which a CTA's throughput is taken as full, a guess
    # Simple over PCIe (and host memory) takes (base, per ring step) us in time, not NCCL's
    # 8.4 + 5.7 per step, which NCCL's selection still uses. Fitted to public results:
    # 2x L40S 21.5 us (2 steps; yumibyte/CS244C-Research, NCCL_PROTO=Simple) and 8x RTX
    # 5090 36-38 us (14 steps; aikitoria/open-gpu-kernel-modules README) at 4-32 KB fit a
    # larger fixed cost and a smaller per-step one. None: NCCL's table for time too.
    pcie_simple_time: tuple | None = (15.0, 1.5)
    # Eager mode only: host time to launch one collective that a timer between CUDA events
    # sees (graph replay hides it). A guess; published eager figures imply 0.5 to 40 us
    # (nccl-tests -g N in one process launches N kernels), so `model fit` replaces it.
    launch_us: float = 4.0
    # Calibration (`model fit`; 1.0 = NCCL's tables as they are): a factor on every latency
    # term (baseLat, hops x hwLat, pipeline steps) and one on each protocol's bandwidth.
    lat_scale: float = 1.0
    bw_scale: dict = field(default_factory=lambda: {"LL": 1.0, "LL128": 1.0, "Simple": 1.0})
    # Calibration per (algorithm, protocol), keys like "Ring/LL": `model fit` moves only the
    # pairs NCCL ran in the records; the others stay at 1.0 (uncalibrated).
    pair_lat_scale: dict = field(default_factory=dict)
    pair_bw_scale: dict = field(default_factory=dict)

    def perturbed(self, **changes) -> ModelParams:
        """A copy with some fields replaced (for sim landscapes)."""
        return replace(self, **changes)


NCCL_PARAMS = ModelParams()


# The machine kinds (Topology, TOPOLOGIES) live in nccl_tune.model.kinds; re-exported here.
from nccl_tune.model.kinds import TOPOLOGIES, Topology  # noqa: E402

# Path order for NCCL_P2P_LEVEL comparisons (NCCL's PATH_* order); legacy integers 0-5
# map through NCCL's levelsOldToNew. NODE is nvidia-smi's name for a PHB-class path.
_PATH_ORDER = {
    "LOC": 0,
    "NVL": 1,
    "NVB": 2,
    "C2C": 3,
    "PIX": 4,
    "PXB": 5,
    "P2C": 6,
    "PXN": 7,
    "PHB": 8,
    "NODE": 8,
    "SYS": 9,
}
_LEGACY_LEVEL = {0: "LOC", 1: "PIX", 2: "PXB", 3: "PHB", 4: "SYS", 5: "SYS"}
DEFAULT_P2P_LEVEL = "PXB"  # NCCL's default (paths.cc: PATH_PXB; AMD with <= 2 GPUs: SYS)


@dataclass(frozen=True)
class Choice:
    """What NCCL would run for one collective and how long it takes (us)."""

    algo: str
    proto: str
    channels: int
    link: str
    time_us: float
    nthreads: int = 0  # threads per channel NCCL launches for this size (0: not modelled)


# The machine the model assumes when none is given or detected: the public 8x PCIe report's
# (P2P between CPU sockets through host memory). One default for recommend, validate and
# the sim sweep (resolve_topology).
DEFAULT_TOPOLOGY = "pcie-amd-2s"  # the public 8x PCIe report's machines: two AMD Turin sockets


def resolve_topology(choice: str) -> tuple[str, str]:
    """(topology name, how it was found) for a --topology choice ('auto' detects); without
    a detected machine, DEFAULT_TOPOLOGY, said to be ASSUMED. recommend and validate (and
    the sim sweep) model the same machine by default because they all ask here."""
    if choice != "auto":
        return choice, f"{choice} (--topology)"
    try:
        from nccl_tune.nccl import topology as topo_mod  # helper module; may be absent or fail

        kind = topo_mod.detect_kind()
    except ImportError:
        reason = "topology detection is not available in this install"
    except Exception as exc:  # detection is best effort: never let it stop a recommendation
        reason = f"topology detection failed: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
    else:
        if isinstance(kind, str) and kind in TOPOLOGIES:
            return kind, f"{kind} (detected)"
        reason = "no GPU found" if not kind else f"detected '{kind}', which the model does not know"
    return DEFAULT_TOPOLOGY, (
        f"{DEFAULT_TOPOLOGY} ASSUMED ({reason}): the public 8x PCIe report's machines (two AMD "
        "sockets), where NCCL's default P2P level sends traffic between GPUs on different "
        "CPU sockets through host memory, and NCCL's topology search on AMD hosts makes it "
        f"pick Simple for small messages; pass --topology ({'|'.join(TOPOLOGIES)}) to model "
        "another machine"
    )


def topology(name: str) -> Topology:
    """The named topology; ValueError listing the known ones otherwise."""
    try:
        return TOPOLOGIES[name]
    except KeyError:
        raise ValueError(f"unknown topology '{name}' (known: {', '.join(TOPOLOGIES)})") from None


def effective_link(topo: Topology, env: dict[str, str]) -> str:
    """The transport small collectives use: nvlink, pci (P2P) or shm (through host memory)."""
    if env.get("NCCL_P2P_DISABLE", "").strip() == "1":
        return "shm"
    level = env.get("NCCL_P2P_LEVEL")
    if level is None:
        level = DEFAULT_P2P_LEVEL
    elif level.strip().isdigit():
        level = _LEGACY_LEVEL.get(min(int(level), 5))
    elif level not in _PATH_ORDER:  # wrong case or unknown: NCCL ignores it
        level = DEFAULT_P2P_LEVEL
    if _PATH_ORDER[topo.p2p_path] > _PATH_ORDER[level]:
        return "shm"
    return "nvlink" if topo.link == "nvlink" else "pci"


def _selection_link(topo: Topology) -> str:
    # tuning.cc knows NVLink and PCI only: SHM transport is costed as PCI.
    return "nvlink" if topo.link == "nvlink" else "pci"


def _proto_explicit(value: str | None, func: str) -> bool:
    """True when an NCCL_PROTO value decides the protocols of `func` (else NCCL's defaults)."""
    if not value:
        return False
    try:
        table = settings.parse_coll_list(value, settings.PROTOCOLS, "protocol")
    except settings.SettingError:
        return False  # NCCL rejects it; the lint reports it
    return func in table or "*" in table


def candidates(topo: Topology, env: dict[str, str], op: str = "allreduce") -> list[tuple[str, str]]:
    """(algo, proto) pairs NCCL may use here under `env`."""
    func = _func(op)
    algos = settings.allowed_algorithms(env.get("NCCL_ALGO"), func)
    protos = settings.allowed_protocols(env.get("NCCL_PROTO"), func)
    if not _proto_explicit(env.get("NCCL_PROTO"), func) and not topo.ll128_by_default:
        protos = protos - {"LL128"}  # off by default without NVLink; forced only by NCCL_PROTO
    out = []
    for algo in ("Ring", "Tree", "NVLS"):
        if algo not in algos:
            continue
        if algo == "NVLS" and not (topo.has_nvls and env.get("NCCL_NVLS_ENABLE", "2") != "0"):
            continue
        if algo == "Tree" and op != "allreduce":
            continue  # NCCL's tree serves allreduce only among these collectives
        for proto in settings.PROTOCOLS:
            if proto in protos and not (algo == "NVLS" and proto != "Simple"):
                out.append((algo, proto))
    return out


def _func(op: str) -> str:
    return {"allreduce": "allreduce", "all_gather": "allgather", "reduce_scatter": "reducescatter"}.get(op, op)


def bus_factor(op: str, nranks: int) -> float:
    """nccl-tests' bus bandwidth factor: 2(n-1)/n for allreduce, 1 for broadcast and
    reduce, (n-1)/n for all_gather and reduce_scatter."""
    if nranks <= 1:
        return 0.0
    if op in ("broadcast", "reduce"):
        return 1.0
    return 2 * (nranks - 1) / nranks if op == "allreduce" else (nranks - 1) / nranks


def _int_env(env: dict[str, str], name: str, default: int) -> int:
    try:
        return int(env[name], 0)
    except (KeyError, ValueError):
        return default


def max_threads(algo: str, proto: str, link: str, env: dict[str, str]) -> int:
    """Threads per channel NCCL allows for (algo, proto): tuning.cc's maxThreads.

    LL and Simple take NCCL_NTHREADS (64-512, multiple of 32); LL128 takes
    NCCL_LL128_NTHREADS (default 640). Ring/Simple defaults to 256 on PCIe machines.
    """
    if proto == "LL128":
        nt = _int_env(env, "NCCL_LL128_NTHREADS", LL128_MAX_NTHREADS)
        return nt if 160 <= nt <= LL128_MAX_NTHREADS and nt % 32 == 0 else LL128_MAX_NTHREADS
    default = 256 if (algo == "Ring" and proto == "Simple" and link != "nvlink") else 512
    nt = _int_env(env, "NCCL_NTHREADS", default)
    if nt <= 0:
        return default
    if nt % 32:
        return 512  # NCCL warns and uses the maximum
    return min(max(nt, 64), 512)


def channels_used(
    nbytes: int,
    proto: str,
    max_channels: int,
    min_channels: int = 1,
    algo: str = "Ring",
    nranks: int = 8,
    nthreads: int = 512,
) -> int:
    """Channels NCCL runs a collective of `nbytes` on (enqueue.cc's reduction loop)."""
    return launch_shape(nbytes, algo, proto, _pool(max_channels, min_channels), nthreads, nranks)[0]


def launch_shape(nbytes: int, algo: str, proto: str, pool: int, nthreads: int, nranks: int) -> tuple[int, int]:
    """(channels, threads) NCCL launches: fewer channels, then fewer threads, for small sizes."""
    if algo == "NVLS":
        return max(1, pool), 512
    threshold = THREAD_THRESHOLDS[proto] * (nranks if (algo == "Ring" and proto == "LL") else 1)
    nc, nt = max(1, pool), nthreads
    while nbytes < nc * nt * threshold and nc >= 2:
        nc -= 1
    while nbytes < nc * nt * threshold and nt % 128 == 0:
        nt //= 2
    return nc, max(nt, 96)


def _pool(max_channels: int, min_channels: int) -> int:
    return max(1, max(min_channels, 1) if max_channels < min_channels else max_channels)


def ring_hops(op: str, nranks: int) -> int:
    """Hops NCCL's latency estimate charges a one-node ring (tuning.cc): 2(n-1) for
    allreduce, n-1 for all_gather and reduce_scatter, and for broadcast and reduce one
    (NCCL charges a single hop when every channel runs the same ring, `sameChannels`,
    which its search achieves on one node; n hops otherwise)."""
    if op == "allreduce":
        return 2 * (nranks - 1)
    if op in ("broadcast", "reduce"):
        return 1
    return nranks - 1


def latency_term_us(
    op: str, nranks: int, algo: str, proto: str, link: str, params: ModelParams = NCCL_PARAMS, for_time: bool = False
) -> float:
    """The fixed part of a collective's time: baseLat + hops x hwLat (NVLS: its own).

    `for_time`: the time the machine takes rather than NCCL's estimate; differs only for
    Simple over PCIe and host memory (`ModelParams.pcie_simple_time`).
    """
    if algo == "NVLS":
        return params.nvls_lat
    hops = ring_hops(op, nranks)
    if for_time and proto == "Simple" and link in ("pci", "shm") and params.pcie_simple_time:
        base, hop = params.pcie_simple_time
        extra = params.hw_lat["shm"][(algo, proto)] - params.hw_lat["pci"][(algo, proto)]
        return base + hops * (hop + (extra if link == "shm" else 0.0))
    return params.base_lat[(algo, proto)] + hops * params.hw_lat[link][(algo, proto)]


def _alg_bandwidth(
    op: str,
    nranks: int,
    algo: str,
    proto: str,
    link: str,
    channels: int,
    params: ModelParams,
    per_channel: float | None = None,
) -> float:
    """Algorithm bandwidth (GB/s) = bus bandwidth x NCCL's algorithm ratio."""
    if per_channel is None:
        per_channel = (
            params.bw_per_channel[link]
            * params.bw_scale.get(proto, 1.0)
            * params.pair_bw_scale.get(f"{algo}/{proto}", 1.0)
        )
    if algo == "Tree":
        bus = channels * per_channel * params.tree_eff[proto]
        return (min(bus, params.ll_max_bw) if proto == "LL" else bus) * 0.5
    if algo == "NVLS":
        return channels * per_channel * 5.0 / 6.0
    bus = channels * per_channel * params.proto_eff[proto]
    if proto == "LL":
        bus = min(bus, params.ll_max_bw)
    return bus / max(bus_factor(op, nranks), 1e-9)


def op_time_us(
    op: str,
    nbytes: int,
    nranks: int,
    algo: str,
    proto: str,
    link: str,
    channels: int,
    nthreads: int = 512,
    buffsize: int = DEFAULT_BUFFSIZE,
    params: ModelParams = NCCL_PARAMS,
    pool: int | None = None,
    mode: str | None = None,
) -> float:
    """Modelled time of one collective (us) launched on `channels`, CTAs of up to `nthreads`.

    latency (baseLat + hops x hwLat) + bytes / algorithm bandwidth of the communicator's
    `pool` of channels (default: `channels`; NCCL launches fewer channels only where their
    bandwidth is not needed, so the pool's is used, as NCCL's own model does), where a CTA
    with fewer than `params.default_nthreads` threads moves proportionally less (a guess),
    plus a small cost per launched channel beyond the first and, for Simple, one hop
    latency per pipeline slot beyond the first when NCCL_BUFFSIZE is small; in `mode`
    "eager", plus the host launch time (`params.launch_us`). Non-decreasing in `nbytes`
    for a fixed (algo, proto).
    """
    if nranks <= 1:
        return params.base_lat[("Ring", proto)] if algo != "NVLS" else params.nvls_lat
    pool = max(pool or channels, channels)
    lat_scale = params.lat_scale * params.pair_lat_scale.get(f"{algo}/{proto}", 1.0)
    latency = latency_term_us(op, nranks, algo, proto, link, params, for_time=True) * lat_scale
    thread_scale = 1.0 if proto == "LL128" else min(1.0, nthreads / params.default_nthreads)
    bandwidth = _alg_bandwidth(op, nranks, algo, proto, link, pool, params) * thread_scale
    transfer = nbytes / (bandwidth * 1e3)  # GB/s = 1e3 bytes/us
    step_cost = 0.0
    if proto == "Simple" and algo != "NVLS":
        # NCCL_BUFFSIZE only sizes the Simple protocol's buffer (LL/LL128 have their own).
        slot = max(1, buffsize // STEPS_PER_BUFFER)
        per_step = nbytes / (pool * nranks)
        step_cost = max(0, math.ceil(per_step / slot) - 1) * params.hw_lat[link][(algo, proto)] * lat_scale
    launch = params.launch_us if mode == "eager" else 0.0
    return launch + latency + transfer + step_cost + params.channel_cost_us * (channels - 1)


def nccl_estimate_us(
    op: str,
    nbytes: int,
    nranks: int,
    algo: str,
    proto: str,
    topo: Topology,
    pool: int,
    params: ModelParams = NCCL_PARAMS,
    env: dict[str, str] | None = None,
) -> float:
    """NCCL's own time estimate for (algo, proto): what its selection compares.

    Uses NCCL's view of the hardware (NVLink or PCI, never SHM), the channel pool (not
    the channels finally launched) and tuning.cc's tree correction factors; where the
    kind's topology search finds a degraded graph (`search_bw`), that graph's bandwidth
    and channels, unless NCCL_GRAPH_FILE supplies the graph instead.
    """
    link = _selection_link(topo)
    latency = latency_term_us(op, nranks, algo, proto, link, params)
    if topo.search_bw is not None and not (env or {}).get("NCCL_GRAPH_FILE"):
        bandwidth = _alg_bandwidth(
            op, nranks, algo, proto, link, topo.search_channels or pool, params, per_channel=topo.search_bw
        )
    else:
        bandwidth = _alg_bandwidth(op, nranks, algo, proto, link, pool, params)
    if algo == "Tree":
        log_size = int(math.log2(nbytes >> 6)) if nbytes >= 64 else -1
        if 0 <= log_size < len(_TREE_CORRECTION[proto]):
            bandwidth *= _TREE_CORRECTION[proto][log_size]
    return latency + nbytes / (bandwidth * 1e3)


@dataclass(frozen=True)
class _Resources:
    pool: int
    buffsize: int


def _resources(topo: Topology, env: dict[str, str]) -> _Resources:
    max_ch = _int_env(env, "NCCL_MAX_NCHANNELS", _int_env(env, "NCCL_MAX_NRINGS", 64))
    min_ch = _int_env(env, "NCCL_MIN_NCHANNELS", _int_env(env, "NCCL_MIN_NRINGS", 0))
    # The topology search finds `default_channels`; MIN raises and MAX caps the pool.
    pool = min(max(topo.default_channels, min_ch), max(max_ch, 1))
    if min_ch > max_ch:
        pool = min_ch  # NCCL raises the max to the min
    buffsize = _int_env(env, "NCCL_BUFFSIZE", DEFAULT_BUFFSIZE)
    return _Resources(max(1, pool), buffsize if buffsize > 0 else DEFAULT_BUFFSIZE)


def channel_pool(topo: Topology, env: dict[str, str]) -> int:
    """Channels the communicator holds under `env` (before the per-size reduction)."""
    return _resources(topo, env).pool


def _time_choice(
    op: str,
    nbytes: int,
    nranks: int,
    algo: str,
    proto: str,
    topo: Topology,
    env: dict[str, str],
    res: _Resources,
    params: ModelParams,
    mode: str | None = None,
) -> Choice:
    link = effective_link(topo, env)
    nt_max = max_threads(algo, proto, link, env)
    channels, nthreads = launch_shape(nbytes, algo, proto, res.pool, nt_max, nranks)
    t = op_time_us(
        op, nbytes, nranks, algo, proto, link, channels, nt_max, res.buffsize, params, pool=res.pool, mode=mode
    )
    return Choice(algo, proto, channels, link, t, nthreads)


def choose(
    op: str,
    nbytes: int,
    nranks: int,
    env: dict[str, str],
    topo: Topology,
    params: ModelParams = NCCL_PARAMS,
    mode: str | None = None,
) -> Choice:
    """NCCL's choice under its own model, timed with the same parameters on the real transport."""
    return simulate(op, nbytes, nranks, env, topo, params, params, mode=mode)


def predict(
    op: str,
    nbytes: int,
    nranks: int,
    env: dict[str, str],
    topo: Topology,
    params: ModelParams = NCCL_PARAMS,
    mode: str | None = None,
) -> Choice:
    """NCCL's choice (with NCCL's own constants: it knows no calibration) timed with `params`.

    This is how a calibrated model (`model fit`) predicts: the fit changes how long each
    (algorithm, protocol) takes on the machine, never what NCCL selects.
    """
    return simulate(op, nbytes, nranks, env, topo, params, NCCL_PARAMS, mode=mode)


def simulate(
    op: str,
    nbytes: int,
    nranks: int,
    env: dict[str, str],
    topo: Topology,
    true_params: ModelParams = NCCL_PARAMS,
    select_params: ModelParams = NCCL_PARAMS,
    mode: str | None = None,
) -> Choice:
    """NCCL's choice (made with `select_params`, NCCL's view) timed with `true_params`."""
    res = _resources(topo, env)
    algo, proto = selected_pair(op, nbytes, nranks, env, topo, select_params)
    return _time_choice(op, nbytes, nranks, algo, proto, topo, env, res, true_params, mode)


def selected_pair(
    op: str, nbytes: int, nranks: int, env: dict[str, str], topo: Topology, select_params: ModelParams = NCCL_PARAMS
) -> tuple[str, str]:
    """The (algorithm, protocol) NCCL's own estimate picks; ValueError when none is allowed."""
    res = _resources(topo, env)
    pairs = candidates(topo, env, op)
    if not pairs:
        raise ValueError("no algorithm/protocol is allowed by this environment on this topology")
    return min(
        pairs, key=lambda ap: nccl_estimate_us(op, nbytes, nranks, ap[0], ap[1], topo, res.pool, select_params, env)
    )


def latency_us(
    nbytes: int,
    nranks: int,
    topology_name: str,
    env: dict[str, str] | None = None,
    op: str = "allreduce",
    params: ModelParams | None = None,
    mode: str | None = None,
) -> float:
    """Modelled latency (us) of one collective of `nbytes` under `env` on a named topology.

    With `params` (a calibrated model) NCCL's choice is timed with them (`predict`).
    """
    topo = topology(topology_name)
    if params is None:
        return choose(op, nbytes, nranks, env or {}, topo, mode=mode).time_us
    return predict(op, nbytes, nranks, env or {}, topo, params, mode=mode).time_us


def is_calibrated(params: ModelParams | None, algo: str, proto: str) -> bool:
    """True when `params` carry a fit (`model fit`) of this algorithm and protocol.

    A fit names what it calibrated in `pair_lat_scale`; an older fit (one latency factor for
    every pair) calibrates everything; NCCL's own constants calibrate nothing."""
    if params is None or params == NCCL_PARAMS:
        return False
    if params.pair_lat_scale:
        return f"{algo}/{proto}" in params.pair_lat_scale
    return True


def fastest(
    op: str,
    nbytes: int,
    nranks: int,
    env: dict[str, str],
    topo: Topology,
    params: ModelParams = NCCL_PARAMS,
    mode: str | None = None,
) -> Choice:
    """The allowed (algo, proto) this model times fastest (not necessarily NCCL's pick)."""
    res = _resources(topo, env)
    pairs = candidates(topo, env, op)
    if not pairs:
        raise ValueError("no algorithm/protocol is allowed by this environment on this topology")
    timed = [_time_choice(op, nbytes, nranks, a, p, topo, env, res, params, mode) for a, p in pairs]
    return min(timed, key=lambda c: c.time_us)
