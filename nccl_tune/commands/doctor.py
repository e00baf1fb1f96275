"""`nccl-tune doctor [--json] [--topo-file FILE]`: what NCCL will find on this machine.

Logic lives in nccl_tune.live.sysinfo; this module renders it.
"""

from __future__ import annotations

import click

from nccl_tune import vocab


def _render(report: dict) -> None:
    from tabulate import tabulate

    click.echo("NCCL libraries (version from ncclGetVersion)")
    libs = report["nccl_libraries"]
    if libs:
        click.echo(
            tabulate(
                [[lib["source"], lib["version"] or f"unloadable: {lib['error']}", lib["path"]] for lib in libs],
                headers=["source", "version", "path"],
            )
        )
        for lib in libs:
            if "+" in lib["source"]:
                click.echo(
                    f"  warning: {lib['source'].replace('+', ' and ')} are all installed; each "
                    f"writes {lib['path']}, so it is the last one installed: keep the one "
                    "torch requires"
                )
    else:
        click.echo(
            "  none found (a CUDA torch brings its own; beside a CPU torch ./install.sh "
            "adds nvidia-nccl-cu12, or pip install 'nccl-tune[nccl]')"
        )

    torch = report["torch"]
    click.echo("\ntorch")
    if torch.get("version") is None:
        click.echo(f"  {torch.get('error') or torch.get('note')}")
    else:
        click.echo(
            f"  {torch['version']}  CUDA {torch.get('cuda') or 'none'}  "
            f"cuda available: {torch.get('cuda_available')}  "
            f"NCCL: {torch.get('nccl') or 'none'}"
        )
        if torch.get("nccl"):
            click.echo(
                f"  loads libnccl: {torch.get('nccl_library') or 'none of those found'} "
                f"({torch.get('nccl_library_basis')})"
            )
        if torch.get("note"):
            click.echo(f"  {torch['note']}")

    gpus = report["gpus"]
    click.echo("\nGPUs")
    if gpus["devices"]:
        click.echo(
            tabulate(
                [[d["index"], d["name"], d["pci_bus_id"], d["memory_mib"]] for d in gpus["devices"]],
                headers=["index", "name", "PCI bus", "MiB"],
            )
        )
        click.echo(f"  driver {gpus['driver']}, compute capability {gpus.get('compute_capability') or 'unknown'}")
    else:
        click.echo(f"  none: {gpus['note']}")

    topo = report["topology"]
    click.echo("\nTopology" + (f" ({topo['source']})" if topo.get("source") else ""))
    if topo.get("links"):
        gpu_names = topo["gpus"]
        rows = []
        for g in gpu_names:
            aff = topo["affinity"].get(g, {})
            rows.append(
                [g]
                + [("X" if h == g else topo["links"][g][h]) for h in gpu_names]
                + [aff.get("CPU Affinity", ""), aff.get("NUMA Affinity", "")]
            )
        click.echo(tabulate(rows, headers=[""] + gpu_names + ["CPU", "NUMA"]))
        click.echo(f"  kind: {topo.get('kind') or 'n/a'}  ({topo.get('note')})")
        for warning in topo.get("warnings") or []:
            click.echo(f"  warning: {warning}")
    else:
        click.echo(f"  {topo.get('note')}")

    click.echo("\nNCCL conf files (environment wins, then the first file that sets a name)")
    for item in report["conf_files"]:
        state = (
            "absent"
            if not item["exists"]
            else (item["error"] or ("read by NCCL" if item["read_by_nccl"] else "not read by NCCL"))
        )
        click.echo(f"  {item['path']} ({item['role']}): {state}")
        for key, value in item["sets"].items():
            mark = "" if key in item["effective"] else "  (overridden)"
            click.echo(f"    {key}={value}{mark}")
        for finding in item["findings"]:
            click.echo(f"    {finding['severity']}: line {finding['line']}: {finding['message']}")

    env = report["env"]
    click.echo("\nNCCL_* environment")
    if env["variables"]:
        for key, value in env["variables"].items():
            click.echo(f"  {key}={value}")
    else:
        click.echo("  none set")
    for finding in env["findings"]:
        click.echo(f"  {finding['severity']}: {finding['variable']}: {finding['message']}")


@click.command("doctor")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
@click.option(
    "--topo-file", type=vocab.InputFile(), help="Read a saved `nvidia-smi topo -m` output instead of running it."
)
def doctor(as_json: bool, topo_file: str | None) -> None:
    """Show NCCL libraries, torch, GPUs, topology, conf files and NCCL_* env."""
    from nccl_tune.cli import emit_json
    from nccl_tune.live import sysinfo

    report = sysinfo.doctor_report(topo_file=topo_file)
    if as_json:
        emit_json(report)
    else:
        _render(report)
