"""`nccl-tune model predict|fit`: the latency model, as is or fitted to one machine.

Thin: parse, call nccl_tune.model.calibrate / references, render. Every figure printed here
is modelled; a fitted model says which measurements it was fitted to.
"""

from __future__ import annotations

import click
from tabulate import tabulate

from nccl_tune import fileio, store, vocab
from nccl_tune.commands.ranges_render import range_notes, range_text
from nccl_tune.errors import NcclTuneError
from nccl_tune.live import envcheck
from nccl_tune.model import calibrate, costmodel, references

MODELLED_NOTE = (
    "MODELLED, not measured: NCCL's cost tables plus this project's labelled "
    "guesses and constants fitted to public tables (nccl_tune/model/costmodel.py)"
)


def _sizes(text: str) -> list[int]:
    from microbench import options as mb_options  # torch-free

    items = [s.strip() for s in text.split(",")]
    if not text.strip() or any(not s for s in items):
        raise NcclTuneError(f"--sizes: expected a comma list of sizes (8K,16K,...), got '{text}'")
    return [mb_options.parse_size(s) for s in items]


@click.group("model")
def model() -> None:
    """The latency model: predict NCCL's choice and time, or fit it to your measurements."""


@model.command("predict")
@click.option(
    "--topology",
    type=click.Choice(list(costmodel.TOPOLOGIES)),
    default=None,
    help="Machine kind (default: the --model file's).",
)
@click.option(
    "--nranks",
    type=vocab.Count(2, max=vocab.MAX_RANKS),
    default=None,
    help="Ranks (GPUs) in the communicator [default: the model file's, else 8].",
)
@click.option(
    "--sizes",
    default="8K,16K,32K,64K",
    show_default=True,
    type=vocab.ByteSizes(),
    help="Message sizes: bytes or K/M/G, comma list.",
)
@click.option(
    "--env",
    "env_text",
    default="",
    type=envcheck.Assignments(),
    help='NCCL settings, e.g. "NCCL_PROTO=LL NCCL_ALGO=Ring".',
)
@click.option(
    "--mode",
    type=click.Choice(["graph", "eager"]),
    default=None,
    help="graph: CUDA-graph replay; eager: adds host launch time, as nccl-tests "
    "without -G [default: the model file's, else eager].",
)
@click.option(
    "--model",
    "model_path",
    type=vocab.InputFile(),
    help="A `model fit` file: time NCCL's choice with constants fitted to your machine.",
)
@click.option("--json", "as_json", is_flag=True, help="Print a JSON list, one object per size.")
def predict(topology, nranks, sizes, env_text, mode, model_path, as_json):
    """Per size: modelled time, NCCL's algorithm, protocol, channels, whether the time is
    calibrated, and its range (published machines of the kind, or the fit's own error)."""
    from nccl_tune.measure.importers import parse_env_option

    loaded = calibrate.load(model_path) if model_path else None
    if loaded and topology and topology != loaded.topology:
        raise NcclTuneError(
            f"--topology {topology} differs from the model file's '{loaded.topology}' (a fit describes one machine)",
            path=model_path,
        )
    topology = topology or (loaded.topology if loaded else None)
    if topology is None:
        raise NcclTuneError(f"--topology is required without --model ({', '.join(costmodel.TOPOLOGIES)})")
    nranks = nranks or (loaded.nranks if loaded else 8)
    mode = mode or (loaded.mode if loaded else "eager")
    env = parse_env_option(env_text) if env_text else {}
    refs = references.load()
    rows = calibrate.predict_rows(topology, nranks, _sizes(sizes), env, mode, loaded, refs)
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json(rows)
        return
    click.echo(loaded.describe() if loaded else MODELLED_NOTE)
    click.echo(
        f"topology {topology}: {costmodel.topology(topology).description}; {nranks} ranks; "
        f"mode {mode}; settings: {store.cell_label(env) if env else 'NCCL defaults'}"
    )
    table = [
        [
            r["bytes"],
            f"{r['time_us']:.2f}",
            r["algo"],
            r["proto"],
            r["channels"],
            r["transport"],
            "yes" if r["calibrated"] else "no",
            range_text(r["range_us"]),
        ]
        for r in rows
    ]
    click.echo(
        tabulate(
            table,
            headers=["bytes", "model us", "algo", "proto", "channels", "transport", "calibrated", "range us"],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    for line in range_notes(rows):
        click.echo(line)


@model.command("fit")
@click.argument("results", nargs=-1, required=True, type=vocab.InputFile())
@click.option(
    "--topology",
    type=click.Choice(list(costmodel.TOPOLOGIES)),
    default=None,
    help="Machine kind [default: the records' topology field].",
)
@click.option(
    "--out",
    "out_path",
    required=True,
    type=vocab.OutputFile(vocab.OutputKind.EXPORT),
    help="Write the fitted model (JSON) here, atomically.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the fitted model as JSON.")
def fit(results, topology, out_path, as_json):
    """Fit the model's constants to one machine's records (bench, sweep, import-nccl-tests)."""
    fileio.check_output(out_path, kind=fileio.OutputKind.EXPORT, inputs=results, option="--out")
    records = store.read_records(results, warn=lambda m: click.echo(f"warning: {m}", err=True))
    if not records:
        raise NcclTuneError("no results records to read", path=", ".join(results))
    cal = calibrate.fit(records, topology)
    calibrate.save(cal, out_path)
    if as_json:
        from nccl_tune.cli import emit_json

        emit_json(cal.to_dict())
        return
    src = cal.source
    click.echo(
        f"CALIBRATED to {src.get('points')} points ({src.get('sizes')} sizes) of one machine "
        f"(host {src.get('host')}): topology {cal.topology}, {cal.nranks} ranks, {cal.mode}"
    )
    table = [
        [
            pt.nbytes,
            store.cell_label(pt.env) if pt.env else "defaults",
            f"{pt.algo}/{pt.proto}",
            pt.link,
            "yes" if cal.is_calibrated(pt) else "no",
            f"{pt.measured_us:.2f}",
            f"{pt.model_us:.2f}",
            f"{pt.ratio:.3f}",
        ]
        for pt in cal.points
    ]
    click.echo(
        tabulate(
            table,
            headers=[
                "bytes",
                "settings",
                "NCCL runs",
                "transport",
                "calibrated",
                "measured us",
                "model us",
                "model/measured",
            ],
            tablefmt="simple",
            disable_numparse=True,
        )
    )
    p = cal.params
    click.echo(
        f"calibrated: {', '.join(cal.calibrated_pairs)} (every other algorithm/protocol "
        "stays uncalibrated, with the published range of the kind)"
    )
    click.echo(
        f"fitted: {', '.join(cal.fitted)}; launch {p.launch_us:.2f} us; "
        + ", ".join(
            f"{k}: latency x{p.pair_lat_scale[k]:.3g}"
            + (f", bandwidth x{p.pair_bw_scale[k]:.3g}" if k in p.pair_bw_scale else "")
            for k in cal.calibrated_pairs
        )
    )
    for name, why in cal.held.items():
        click.echo(f"held: {name}: {why}")
    click.echo(f"worst calibrated point: {cal.worst_ratio():.3f}x; wrote {out_path}")
