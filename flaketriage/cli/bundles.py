"""``flaketriage bundle``: list, show, verify and export bundles."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from flaketriage.bundle import BundleIndex, describe_failure, load_manifest, read_index, verify_bundle
from flaketriage.cli.console import JsonOption, StoreOption, err, labelled, out, plain, settings_for
from flaketriage.errors import StoreError
from flaketriage.manifest import Manifest
from flaketriage.os_strings import shell_join, shell_word
from flaketriage.store import Store, local_path, open_store

app = typer.Typer(help="Inspect, verify and export captured bundles.", no_args_is_help=True)


def _readonly_store(store: str | None) -> Store:
    return open_store(settings_for(store).store, readonly=True)


@app.command("list")
def list_command(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List bundles, newest first."""
    location = settings_for(store).store
    path = local_path(location)
    missing = path is not None and not _is_dir(path)  # no store yet: nothing captured here
    index = BundleIndex() if missing else read_index(open_store(location, readonly=True))
    for problem in index.problems:  # a damaged entry is said, and never hides the others
        err.print(labelled("warning:", "yellow", problem))
    summaries = index.bundles
    if as_json:
        out.print_json(json.dumps([s.to_json() for s in summaries]), ensure_ascii=True)
        return
    if not summaries:
        err.print(plain(f"no bundles in {path.absolute() if path is not None else location}"))
        return
    table = Table(box=None, pad_edge=False)
    for col in ("id", "created", "command / test", "failure", "fingerprint"):
        table.add_column(col, overflow="fold")
    for s in summaries:
        table.add_row(
            plain(s.id[:12] + ("*" if s.parent else "")),
            s.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            plain(s.test_id or s.command),
            plain(s.failure),
            plain(s.fingerprint[:12]),
        )
    out.print(table)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError as exc:
        raise StoreError(f"cannot open the store at {path}: {exc.strerror or exc}; pass --store") from exc


def _show(manifest: Manifest) -> None:
    f = manifest.failure
    rows = [
        ("bundle", manifest.bundle_id),
        ("created", manifest.created_at.isoformat()),
        ("kind", manifest.kind),
        ("command", shell_join(manifest.command.argv)),
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
    if src.masked:
        masked = ", ".join(src.masked)
        rows.append(("masked", f"{masked} (secrets replaced by [REDACTED]; replays run these copies)"))
    left_out = manifest.excluded_files()
    if left_out:
        rows.append(("left out", "; ".join(f"{e.path}: {e.reason}" for e in left_out)))
    seeds = manifest.seeds
    seed_text = f"PYTHONHASHSEED={seeds.python_hash_seed}" + (
        " (chosen)" if seeds.python_hash_seed_chosen else ""
    )
    seed_text += "".join(f", {shell_word(k)}={shell_word(v)}" for k, v in seeds.env.items())
    seed_text += "".join(f", {k}={v}" for k, v in seeds.values.items())
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
        table.add_row(key, plain(value))
    out.print(table)
    if f.traceback:
        out.print("\n[bold]traceback[/bold]")
        out.print(plain(f.traceback, multiline=True))


@app.command("show")
def show_command(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")],
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Show a readable summary of one bundle."""
    manifest = load_manifest(_readonly_store(store), bundle)
    if as_json:
        out.print_json(manifest.canonical_json().decode(), ensure_ascii=True)
    else:
        _show(manifest)


@app.command("verify")
def verify_command(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")], store: StoreOption = None
) -> None:
    """Check a bundle's index entry, manifest (schema, paths, commit) and every blob (re-hashed,
    sizes); exit 1 when the bundle is damaged, 2 when no bundle has that id."""
    report = verify_bundle(_readonly_store(store), bundle)
    if report.ok:
        out.print(f"ok: bundle {report.bundle_id[:12]}, {report.blobs} blobs, {report.bytes} bytes verified")
        return
    for problem in report.problems:
        err.print(labelled("problem:", "red", problem))
    err.print(
        labelled(
            "error:",
            "red",
            f"bundle {report.bundle_id[:12]} is damaged: {len(report.problems)} problem(s) above; "
            "re-capture the failure, or restore the store from a copy",
        )
    )
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
    run = f"cd {shell_word(str(path))} && bash run.sh"
    out.print(plain(f"exported {manifest.bundle_id[:12]} to {path}; run it with: {run}"))
