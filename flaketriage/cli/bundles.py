"""``flaketriage bundle``: list, show, verify and export bundles; push and pull them between stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console
from rich.table import Table

from flaketriage.cli.console import JsonOption, StoreOption, err, labelled, out, plain, settings_for
from flaketriage.errors import StoreError
from flaketriage.text.os_strings import shell_join, shell_word

if TYPE_CHECKING:
    from flaketriage.bundle.manifest import Manifest
    from flaketriage.bundle.transfer import TransferReport
    from flaketriage.store import Store

# Bundles and stores are imported by the commands that use them: every command starts faster.
DEFAULT_THREADS = 8
"""`flaketriage.bundle.transfer.DEFAULT_THREADS` (a test keeps the two equal)."""

app = typer.Typer(help="Inspect, verify, export and copy captured bundles.", no_args_is_help=True)

BundleIds = Annotated[list[str], typer.Argument(help="Bundle ids or unique prefixes.", show_default=False)]
ParentOption = Annotated[
    bool,
    typer.Option("--with-parent", help="Copy the bundle a minimized bundle came from too (and its own)."),
]
LINE_UNLIMITED = 1_000_000
"""The width `bundle list` lays its table out in when stdout is not a terminal."""
ThreadsOption = Annotated[int, typer.Option("--threads", min=1, max=64, help="Objects sent at once.")]


def _readonly_store(store: str | None) -> Store:
    from flaketriage.store import open_store

    settings = settings_for(store)
    return open_store(settings.store, readonly=True, settings=settings)


@app.command("list")
def list_command(store: StoreOption = None, as_json: JsonOption = False) -> None:
    """List bundles, newest first."""
    from flaketriage.bundle.io import BundleIndex, read_index
    from flaketriage.store import local_path, open_store

    settings = settings_for(store)
    location = settings.store
    path = local_path(location)
    missing = path is not None and not _is_dir(path)  # no store yet: nothing captured here
    index = BundleIndex() if missing else read_index(open_store(location, readonly=True, settings=settings))
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
        # Ids, times and fingerprints are copied whole; the text columns fold on a terminal.
        whole = col in ("id", "created", "fingerprint")
        table.add_column(col, overflow="fold", no_wrap=whole, min_width=19 if col == "created" else None)
    for s in summaries:
        table.add_row(
            plain(s.id[:12] + ("*" if s.parent else "")),
            s.created_at.strftime("%Y-%m-%d %H:%M:%S"),
            plain(s.test_id or s.command),
            plain(s.failure),
            plain(s.fingerprint[:12]),
        )
    # Piped (to grep, cut, a file), each bundle is one line however long: nothing wraps.
    (out if out.is_terminal else Console(width=LINE_UNLIMITED, highlight=False)).print(table)


def _is_dir(path: Path) -> bool:
    try:
        return path.is_dir()
    except OSError as exc:
        raise StoreError(f"cannot open the store at {path}: {exc.strerror or exc}; pass --store") from exc


def _show(manifest: Manifest) -> None:
    from flaketriage.bundle.io import describe_failure

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
    from flaketriage.bundle.io import load_manifest

    manifest = load_manifest(_readonly_store(store), bundle)
    if as_json:  # with its file lists, which the stored form keeps in objects of their own
        out.print_json(json.dumps(manifest.model_dump(mode="json"), sort_keys=True), ensure_ascii=True)
    else:
        _show(manifest)


@app.command("verify")
def verify_command(
    bundle: Annotated[str, typer.Argument(help="Bundle id or unique prefix.")], store: StoreOption = None
) -> None:
    """Check a bundle's index entry, manifest (schema, paths, commit) and every blob (re-hashed,
    sizes); exit 1 when the bundle is damaged, 2 when no bundle has that id."""
    from flaketriage.bundle.io import verify_bundle

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
    from flaketriage.bundle.io import load_manifest
    from flaketriage.process.git import Git
    from flaketriage.workers.export import export_bundle

    st = _readonly_store(store)
    manifest = load_manifest(st, bundle)
    path = export_bundle(st, manifest, manifest.bundle_id, dest, git=Git())
    run = f"cd {shell_word(str(path))} && bash run.sh"
    out.print(plain(f"exported {manifest.bundle_id[:12]} to {path}; run it with: {run}"))


@app.command("push")
def push_command(
    bundles: BundleIds,
    to: Annotated[
        str,
        typer.Option("--to", help="The store to copy into: s3://bucket/prefix, a directory or a URL."),
    ],
    store: StoreOption = None,
    with_parent: ParentOption = False,
    threads: ThreadsOption = DEFAULT_THREADS,
    as_json: JsonOption = False,
) -> None:
    """Copy bundles from the store to another: only the objects it lacks, its index entry last."""
    from flaketriage.bundle.transfer import copy_bundles
    from flaketriage.store import open_store

    settings = settings_for(store)
    source = open_store(settings.store, readonly=True, settings=settings)
    dest = open_store(to, shared=settings.store_shared, settings=settings)
    _transferred(copy_bundles(source, dest, bundles, parents=with_parent, threads=threads), "pushed", as_json)


@app.command("pull")
def pull_command(
    bundles: BundleIds,
    source_url: Annotated[
        str,
        typer.Option("--from", help="The store to copy from: s3://bucket/prefix, a directory or a URL."),
    ],
    store: StoreOption = None,
    with_parent: ParentOption = False,
    threads: ThreadsOption = DEFAULT_THREADS,
    as_json: JsonOption = False,
) -> None:
    """Copy bundles from another store into the store: only the objects it lacks, its index entry last."""
    from flaketriage.bundle.transfer import copy_bundles
    from flaketriage.store import open_store

    settings = settings_for(store)
    source = open_store(source_url, readonly=True, settings=settings)
    dest = open_store(settings.store, shared=settings.store_shared, settings=settings)
    _transferred(copy_bundles(source, dest, bundles, parents=with_parent, threads=threads), "pulled", as_json)


def _transferred(report: TransferReport, verb: str, as_json: bool) -> None:
    if as_json:
        out.print_json(json.dumps(report.to_json()), ensure_ascii=True)
        return
    target = report.destination if verb == "pushed" else report.source
    where = "to" if verb == "pushed" else "from"
    out.print(
        plain(
            f"{verb} {len(report.bundles)} bundle(s) {where} {target}: {report.objects_sent} object(s) sent "
            f"({byte_size(report.bytes_sent)}), {report.objects_present} already there"
        )
    )


def byte_size(count: int) -> str:
    """``1.5 MB``-style, for people (powers of 1000, as `du --si`)."""
    size = float(count)
    for unit in ("bytes", "kB", "MB", "GB", "TB"):
        if size < 1000 or unit == "TB":
            return f"{int(size)} bytes" if unit == "bytes" else f"{size:.1f} {unit}"
        size /= 1000
    raise AssertionError("unreachable")
