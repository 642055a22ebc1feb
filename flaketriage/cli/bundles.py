"""``flaketriage bundle``: list, show, verify and export bundles."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Annotated

import typer
from rich.markup import escape
from rich.table import Table

from flaketriage.bundle import describe_failure, list_bundles, load_manifest, verify_bundle
from flaketriage.cli.console import JsonOption, StoreOption, err, out, settings_for
from flaketriage.manifest import Manifest
from flaketriage.store import Store, local_path, open_store

app = typer.Typer(help="Inspect, verify and export captured bundles.", no_args_is_help=True)


def _readonly_store(store: str | None) -> Store:
    return open_store(settings_for(store).store, readonly=True)


@app.command("list")
def list_command(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List bundles, newest first."""
    location = settings_for(store).store
    path = local_path(location)
    missing = path is not None and not path.is_dir()  # no store yet: nothing captured here
    summaries = [] if missing else list_bundles(open_store(location, readonly=True))
    if as_json:
        out.print_json(json.dumps([s.to_json() for s in summaries]))
        return
    if not summaries:
        err.print(f"no bundles in {path.absolute() if path is not None else location}")
        return
    table = Table(box=None, pad_edge=False)
    for col in ("id", "created", "command / test", "failure", "fingerprint"):
        table.add_column(col, overflow="fold")
    for s in summaries:
        table.add_row(
            s.id[:12] + ("*" if s.parent else ""),
            s.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            s.test_id or s.command,
            s.failure,
            s.fingerprint[:12],
        )
    out.print(table)


def _show(manifest: Manifest) -> None:
    f = manifest.failure
    rows = [
        ("bundle", manifest.bundle_id),
        ("created", manifest.created_at.isoformat()),
        ("kind", manifest.kind),
        ("command", shlex.join(manifest.command.argv)),
        ("cwd", manifest.command.cwd),
        ("failure", describe_failure(manifest)),
        ("fingerprint", f.fingerprint),
        ("signature", f.signature),
        ("exit code", str(f.exit_code)),
        ("duration", f"{f.duration_s:.2f} s"),
    ]
    src = manifest.source
    if src.kind == "git":
        rows.append(("source", f"git {src.commit} ({src.branch}) {src.remote or src.repo_path}"))
        rows.append(("uncommitted", f"diff: {'yes' if src.diff else 'no'}, {len(src.files)} untracked files"))
    else:
        rows.append(("source", f"{src.kind}, {len(src.files)} files"))
    seeds = manifest.seeds
    seed_text = f"PYTHONHASHSEED={seeds.python_hash_seed}" + (
        " (chosen)" if seeds.python_hash_seed_chosen else ""
    )
    seed_text += "".join(f", {k}={v}" for k, v in {**seeds.env, **seeds.values}.items())
    rows.append(("seeds", seed_text))
    for d in manifest.data:
        rows.append(("data", f"{d.path} ({d.format}, {d.items} items)"))
    env = manifest.environment
    rows.append(("python", f"{env.python} {env.implementation} on {env.platform}"))
    hw = manifest.hardware
    gpus = ", ".join(g.name for g in hw.gpus) or "none"
    rows.append(("hardware", f"{hw.cpu_model or '?'} ×{hw.cpu_count or '?'}, GPUs: {gpus}"))
    prov = manifest.provenance
    rows.append(
        ("provenance", " ".join(x for x in (prov.ci_provider, prov.run_url, prov.job, prov.host) if x))
    )
    if manifest.parent:
        rows.append(("parent", manifest.parent))
    if manifest.minimization:
        kept = ", ".join(f"{p}: {k} of {n}" for p, (k, n) in manifest.minimization.data.items())
        rows.append(("minimized", kept or "arguments only"))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="bold")
    table.add_column(overflow="fold")
    for key, value in rows:
        table.add_row(key, value)
    out.print(table)
    if f.traceback:
        out.print("\n[bold]traceback[/bold]")
        out.print(f.traceback, markup=False)


@app.command("show")
def show_command(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")],
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a readable summary of one bundle."""
    manifest = load_manifest(_readonly_store(store), bundle)
    if as_json:
        out.print_json(manifest.canonical_json().decode())
    else:
        _show(manifest)


@app.command("verify")
def verify_command(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")], store: StoreOption = None
) -> None:
    """Re-hash the manifest and every blob of a bundle; exit 1 when anything is wrong."""
    report = verify_bundle(_readonly_store(store), bundle)
    if report.ok:
        out.print(f"ok: bundle {report.bundle_id[:12]}, {report.blobs} blobs, {report.bytes} bytes verified")
        return
    for problem in report.problems:
        err.print(f"[red]problem:[/red] {escape(problem)}")
    raise typer.Exit(1)


@app.command("export")
def export_command(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")],
    dest: Annotated[Path, typer.Argument(help="New directory for the reproduction.")],
    store: StoreOption = None,
) -> None:
    """Write a self-contained reproduction that runs without flaketriage."""
    from flaketriage.git import Git
    from flaketriage.workers.export import export_bundle

    st = _readonly_store(store)
    manifest = load_manifest(st, bundle)
    path = export_bundle(st, manifest, manifest.bundle_id, dest, git=Git())
    out.print(f"exported {manifest.bundle_id[:12]} to {path}; run it with: cd {path} && bash run.sh")
