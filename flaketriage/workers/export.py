"""Export a bundle as a self-contained reproduction that a person runs without flaketriage.

The export holds the materialized workspace, ``run.sh`` (seeds, deterministic settings, the exact
command), pinned requirements, a Dockerfile on the recorded Python, the original logs and a README
saying what should happen and what happened. It is built in a temp sibling directory and renamed
into place, so a failed export never leaves half a reproduction behind.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from flaketriage.bundle.io import describe_failure
from flaketriage.bundle.manifest import Manifest
from flaketriage.errors import BundleError, GitError, SandboxError
from flaketriage.process.git import Git
from flaketriage.process.replay_env import DETERMINISTIC_ENV, DETERMINISTIC_SETTINGS
from flaketriage.store import Store
from flaketriage.text.markdown import code_span, escaped, fenced
from flaketriage.text.os_strings import has_undecodable, shell_join, shell_word
from flaketriage.text.printable import printable
from flaketriage.workers.environment.key import WORKER_PACKAGES, local_project_names
from flaketriage.workers.report.render import environment_rows, markdown_table

SITECUSTOMIZE = Path(__file__).parent / "sitecustomize" / "sitecustomize.py"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_PYTHON_NAME = re.compile(r"^python[0-9.]*$")
# A recorded version that may become an image tag: ``3.11.7``, or ``3.12.1 (main, Jan 1 2024)``.
_PYTHON_VERSION = re.compile(r"(\d{1,2}\.\d{1,3}(?:\.\d{1,3})?)(?: \([ -~]*\))?")
# Local version labels that name a published PyTorch wheel index rather than a local build.
_TORCH_INDEX_LABEL = re.compile(r"^(cu\d+|cpu|rocm[\d.]+)$")
_TORCH_FAMILY = {"torch", "torchvision", "torchaudio"}


def export_bundle(store: Store, manifest: Manifest, bundle_id: str, dest: Path, *, git: Git) -> Path:
    """Write the reproduction of `manifest` to `dest` (absent or empty) and return `dest`; a git
    source is checked out with `git`."""
    dest = Path(dest).absolute()
    _check_dest(dest)
    try:
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.export-"))
    except OSError as exc:
        raise BundleError(
            f"cannot export to {dest}: {exc.strerror or exc}; choose a writable directory"
        ) from exc
    try:
        _build(store, manifest, bundle_id, tmp, git)
        os.chmod(tmp, 0o755)  # mkdtemp makes it private; the export is meant to be shared
        if dest.exists():
            dest.rmdir()  # checked empty above; rename cannot replace it portably
        os.replace(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return dest


def _check_dest(dest: Path) -> None:
    if dest.is_dir() and not any(dest.iterdir()):
        return
    if dest.exists() or dest.is_symlink():
        raise BundleError(
            f"cannot export to {dest}: it already exists and is not an empty directory; "
            "name a new directory, or remove this one first"
        )


def _build(store: Store, manifest: Manifest, bundle_id: str, out: Path, git: Git) -> None:
    from flaketriage.workers.materialize import materialize

    try:
        workspace = materialize(store, manifest, out / "workspace", git=git)
    except (SandboxError, GitError) as exc:
        raise BundleError(f"cannot export bundle {bundle_id[:12]}: {exc}") from exc
    cwd = workspace.cwd.resolve().relative_to(out.resolve())
    has_sitecustomize = SITECUSTOMIZE.is_file()
    if has_sitecustomize:
        (out / "sitecustomize").mkdir()
        shutil.copyfile(SITECUSTOMIZE, out / "sitecustomize" / "sitecustomize.py")
    run = out / "run.sh"
    run.write_text(run_script(manifest, bundle_id, cwd, sitecustomize=has_sitecustomize))
    run.chmod(0o755)
    (out / "requirements.txt").write_text(requirements(manifest, bundle_id))
    (out / "Dockerfile").write_text(dockerfile(manifest, bundle_id))
    _write_logs(store, manifest, out / "logs")
    (out / "README.md").write_text(readme(manifest, bundle_id, cwd, sitecustomize=has_sitecustomize))


# -- run.sh ---------------------------------------------------------------------------------------
def seed_env(manifest: Manifest) -> dict[str, str]:
    """The environment variables that carry the recorded seeds, ``PYTHONHASHSEED`` first."""
    seeds = manifest.seeds
    env = {"PYTHONHASHSEED": seeds.python_hash_seed} if seeds.python_hash_seed is not None else {}
    env.update(seeds.env)
    return env


def run_script(manifest: Manifest, bundle_id: str, cwd: Path, *, sitecustomize: bool = True) -> str:
    """``run.sh``: the recorded command with its seeds, from `cwd` (relative to the export)."""
    argv = list(manifest.command.argv)
    if not argv:
        raise BundleError(f"bundle {bundle_id[:12]} records no command to run; it cannot be exported")
    lines = [
        "#!/usr/bin/env bash",
        f"# Reproduces flaketriage bundle {bundle_id}",
        f"# Recorded failure: {printable(describe_failure(manifest))}",
        "# Expected: the command exits 0. See README.md.",
        "set -euo pipefail",
        "",
        'here="$(cd -- "$(dirname -- "${BASH_SOURCE[0]}")" && pwd)"',
        "",
        "# The recorded seeds.",
    ]
    for name, value in seed_env(manifest).items():
        if _ENV_NAME.match(name):
            lines.append(f"export {name}={shell_word(value)}")
        else:
            lines.append(f"# skipped seed variable {name!r}: not a valid shell variable name")
    lines.append("# Deterministic settings, as flaketriage's replays use them.")
    lines += [f"export {name}={shlex.quote(value)}" for name, value in DETERMINISTIC_SETTINGS.items()]
    if sitecustomize:
        lines.append('export PYTHONPATH="$here/sitecustomize${PYTHONPATH:+:$PYTHONPATH}"')
    first = argv[0]
    if os.path.isabs(first) and _PYTHON_NAME.match(Path(first).name) and printable(first) == first:
        # The recorded interpreter where it exists (this machine), else the one on PATH.
        lines += [
            "",
            f'PYTHON="${{PYTHON:-{_dq(first)}}}"',
            'command -v "$PYTHON" >/dev/null 2>&1 || PYTHON=python3',
        ]
        words = ['"$PYTHON"']
    else:
        words = [_shell_word(first, _roots(manifest, cwd))]
    words += [_shell_word(arg, _roots(manifest, cwd)) for arg in argv[1:]]
    lines += ["", f'cd "$here"/{shell_word(cwd.as_posix())}', "exec " + " ".join(words), ""]
    return "\n".join(lines)


def _dq(text: str) -> str:
    """`text` escaped for use inside double quotes."""
    return re.sub(r'([\\"$`])', r"\\\1", text)


def _roots(manifest: Manifest, cwd: Path) -> list[tuple[str, str]]:
    """(recorded absolute path, its place relative to the export) for paths that moved."""
    recorded = {manifest.command.cwd}
    if manifest.source.repo_path:
        recorded.add(manifest.source.repo_path)
    out = []
    for root in sorted(recorded, key=len, reverse=True):
        rel = os.path.normpath(cwd / os.path.relpath(root, manifest.command.cwd))
        if rel != ".." and not rel.startswith("../") and root != "/":
            out.append((root, Path(rel).as_posix()))
    return out


def _shell_word(arg: str, roots: Sequence[tuple[str, str]]) -> str:
    """`arg` as one shell word, recorded workspace paths in it pointing into the export."""
    for original, rel in roots:
        match = re.search(re.escape(original) + r"(?![\w.-])", arg)
        if match:
            head, tail = arg[: match.start()], arg[match.end() :]
            parts = [_shell_word(head, roots) if head else "", f'"$here"/{shell_word(rel)}']
            parts.append(_shell_word(tail, roots) if tail else "")
            return "".join(parts)
    return shell_word(arg)  # bytes that are not UTF-8 become $'\xNN': exact, and run.sh stays ASCII


# -- environment files ----------------------------------------------------------------------------
def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name.strip()).lower()


def _local_names(manifest: Manifest) -> set[str]:
    """Names the project under test may be installed as (it is in the workspace, not on an index)."""
    return {*WORKER_PACKAGES, *local_project_names(manifest)}


def requirements(manifest: Manifest, bundle_id: str) -> str:
    """``requirements.txt`` pinned from the recorded packages, without local or editable ones."""
    local = _local_names(manifest)
    pins: list[str] = []
    skipped: list[str] = []
    indexes: set[str] = set()
    for entry in manifest.environment.packages:
        pin = _pin(entry)
        if pin is None:
            skipped.append(entry)
            continue
        name, version = pin
        if _normalize(name) in local:
            skipped.append(entry)
            continue
        _, plus, label = version.partition("+")
        if plus and not (_normalize(name) in _TORCH_FAMILY and _TORCH_INDEX_LABEL.match(label)):
            skipped.append(entry)
            continue
        if plus:
            indexes.add(f"https://download.pytorch.org/whl/{label}")
        pins.append(f"{name}=={version}")
    env = manifest.environment
    lines = [
        f"# Pinned from the environment of flaketriage bundle {bundle_id}",
        printable(f"# (Python {env.python}, {env.platform} {env.machine})."),
    ]
    lines += [f"--extra-index-url {url}" for url in sorted(indexes)]
    lines += pins
    if skipped:
        lines += ["", "# Left out: the project itself, local builds, editable installs and invalid pins:"]
        lines += [f"#   {printable(entry)}" for entry in skipped]
    return "\n".join(lines) + "\n"


def _pin(entry: str) -> tuple[str, str] | None:
    """(name, version) of a plain ``name==version`` pin, valid under PEP 508 and PEP 440; None for
    anything else (a URL, a marker, a name or version that is not one), which is left out."""
    from packaging.requirements import InvalidRequirement, Requirement
    from packaging.version import InvalidVersion, Version

    try:
        req = Requirement(entry)
        (spec,) = req.specifier
        Version(spec.version)
    except (InvalidRequirement, InvalidVersion, ValueError):
        return None
    if req.url or req.marker or req.extras or spec.operator != "==" or "*" in spec.version:
        return None
    return req.name, spec.version


def python_image_tag(python: str) -> str:
    """``3.11.7`` from a recorded version like ``3.11.7`` or ``3.11.7 (main, ...)``; ``3`` (the
    latest 3.x image) for anything else, which the Dockerfile notes."""
    match = _PYTHON_VERSION.fullmatch(python.strip())
    return match.group(1) if match else "3"


def dockerfile(manifest: Manifest, bundle_id: str) -> str:
    """A Dockerfile on the recorded Python that installs the pins and runs ``run.sh``."""
    env, hw = manifest.environment, manifest.hardware
    lines = [
        f"# Reproduction of flaketriage bundle {bundle_id}",
        printable(f"# Recorded on {env.platform} {env.machine} with {env.implementation} {env.python}."),
    ]
    tag = python_image_tag(env.python)
    if not _PYTHON_VERSION.fullmatch(env.python.strip()):
        lines.append(f"# The recorded Python version is not a version number: using python:{tag}.")
    if env.implementation != "CPython":
        lines.append("# The official python images are CPython; the recorded interpreter was not.")
    if hw.gpus:
        gpu = printable(f"{hw.gpus[0].name}, CUDA {hw.cuda_version or '?'}")
        lines.append(
            f"# The run used {len(hw.gpus)} GPU(s) ({gpu}): "
            "run with `docker run --gpus all` (NVIDIA Container Toolkit)."
        )
    lines += [
        f"FROM python:{tag}-slim",
        "WORKDIR /repro",
        "COPY requirements.txt ./",
        "RUN pip install --no-cache-dir -r requirements.txt",
        "COPY . .",
        'CMD ["bash", "run.sh"]',
        "",
    ]
    return "\n".join(lines)


def _write_logs(store: Store, manifest: Manifest, logs: Path) -> None:
    logs.mkdir()
    for name, ref in sorted(manifest.logs.items()):
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", name).lstrip(".") or "log"
        store.get_file(ref.sha256, logs / f"{safe}.txt", max_size=ref.size)
    if manifest.failure.traceback:
        (logs / "traceback.txt").write_text(manifest.failure.traceback)


# -- README ---------------------------------------------------------------------------------------
def _md_text(text: str) -> str:
    """`text` as Markdown prose on one line: control characters escaped, and the characters that
    make code, emphasis, links or HTML backslash-escaped."""
    return escaped(printable(text))


def _md_code(text: str) -> str:
    """`text` as one Markdown code span, on one line, whatever backticks it holds."""
    return code_span(printable(text))


def _md_block(text: str, lang: str) -> list[str]:
    """`text` as a fenced code block whose fence no line of it can close."""
    return [fenced(printable(text, keep_newlines=True), lang)]


def _determinism_note(sitecustomize: bool) -> str:
    note = "`run.sh` sets " + ", ".join(f"`{k}={v}`" for k, v in DETERMINISTIC_SETTINGS.items())
    if not sitecustomize:
        return note + "."
    return (
        note + " and puts `sitecustomize/` on `PYTHONPATH`, which turns on PyTorch deterministic "
        f"algorithms when the program imports torch (`{DETERMINISTIC_ENV}=0` turns that off)."
    )


def readme(manifest: Manifest, bundle_id: str, cwd: Path, *, sitecustomize: bool = True) -> str:
    """README.md: how to run it, what should happen, what happened, with which seeds and where."""
    f = manifest.failure
    tag = f"repro-{bundle_id[:12]}"
    actual = [("Failure kind", f.kind), ("Test", f.test_id), ("Exception", f.exception_type)]
    actual += [("Message", f.message), ("Exit code", None if f.exit_code is None else str(f.exit_code))]
    actual += [("Signal", f.signal), ("Detail", f.detail), ("Fingerprint", f.fingerprint)]
    timeout = manifest.command.timeout_s
    parts = [
        f"# Reproduction: {_md_text(describe_failure(manifest))}",
        "",
        f"Exported by flaketriage from bundle `{bundle_id}`. Nothing here needs flaketriage.",
        "",
        "## Run it",
        "",
        "```bash",
        "bash run.sh    # here, with the Python on PATH (or set PYTHON=/path/to/python)",
        f"docker build -t {tag} . && docker run --rm {tag}    # with the recorded Python version",
        "```",
        "",
        f"The recorded command, run in {_md_code(manifest.command.cwd)}:",
        "",
        *_md_block(shell_join(manifest.command.argv), "bash"),
        "",
        f"`run.sh` sets the seeds and runs it in {_md_code(cwd.as_posix())}, with paths under the recorded "
        "working tree pointing into `workspace/`.",
    ]
    if timeout:
        parts += ["", f"The recorded run had a time limit of {timeout:g} s; `run.sh` sets none."]
    parts += [
        "",
        "## Expected and actual behaviour",
        "",
        "- **Expected:** the command exits 0.",
        f"- **Actual** (recorded, in `logs/`): {_md_text(describe_failure(manifest))}.",
        "",
        markdown_table(actual),
        "",
        "## Seeds",
        "",
        *_seed_lines(manifest),
        "",
        "## Environment",
        "",
        markdown_table(environment_rows(manifest)),
        "",
        "`requirements.txt` pins the recorded packages (the project itself and local builds left out).",
        _determinism_note(sitecustomize),
        "",
        "## Files",
        "",
        "- `workspace/`: the source and data as they were when the failure was captured",
        "- `run.sh`: runs the command with the recorded seeds",
        "- `requirements.txt`, `Dockerfile`: the recorded environment",
        "- `logs/`: the original stdout, stderr and traceback",
        "",
        *_left_out_lines(manifest),
    ]
    return "\n".join(parts)


def _left_out_lines(manifest: Manifest) -> list[str]:
    """What `workspace/` lacks or holds masked, so that a run that fails differently is explained."""
    lines: list[str] = []
    masked = manifest.source.masked
    if masked:
        lines += [
            "Secrets were replaced by `[REDACTED]` in these files (the run uses the masked copies):",
            "",
        ]
        lines += [f"- `{printable(path)}`" for path in masked] + [""]
    left_out = manifest.excluded_files()
    if left_out:
        lines += ["Never captured, so not in `workspace/`:", ""]
        lines += [f"- `{printable(e.path)}`: {printable(e.reason)}" for e in left_out] + [""]
    return lines


def _seed_lines(manifest: Manifest) -> list[str]:
    seeds = manifest.seeds
    lines = []
    for name, value in seed_env(manifest).items():
        note = ""
        if name == "PYTHONHASHSEED" and seeds.python_hash_seed_chosen:
            note = " (the run left it unset; flaketriage chose this value and ran with it)"
        shown = shell_word(value) if has_undecodable(value) else value  # readable, and never a crash
        lines.append(f"- {_md_code(f'{name}={shown}')}{note}")
    for label, reported in sorted(seeds.values.items()):
        lines.append(
            f"- {_md_code(label)}: {_md_code(str(reported))} (reported by the program, which sets it itself)"
        )
    return lines or ["No seeds were recorded."]
