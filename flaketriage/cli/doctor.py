"""``flaketriage doctor``: checks the setup a CI job sends with, one line per check, exit 1 on a problem.

The settings, the store, the outbox, the service URL, the secret (a signed ``POST /v1/ping``, a
no-op the receiver answers only when the signature is right), the stores the service reads, and
the quarantine list. Each line says what was found and, for a problem, the setting to change.
"""

from __future__ import annotations

import difflib
import json
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer
from rich.text import Text

from flaketriage import __version__
from flaketriage.cli.console import JsonOption, StoreOption, out, plain, settings_for
from flaketriage.errors import ConfigError, FlaketriageError
from flaketriage.settings import ENV_PREFIX, Settings, env_var

if TYPE_CHECKING:
    import httpx

Status = Literal["ok", "problem", "off"]

NOT_SETTINGS = frozenset(
    ENV_PREFIX + name
    for name in ("PYTEST", "REPLAY", "TEST_ORDER", "DETERMINISTIC", "HANG_DUMP", "TORCH_PROFILE")
)
"""``FLAKETRIAGE_*`` variables that flaketriage reads which are not settings (switches, markers)."""
EVENTS_PATH = "/v1/events"
PING_PATH = "/v1/ping"


@dataclass(frozen=True)
class Check:
    """One line of the doctor's answer."""

    name: str
    status: Status
    detail: str
    setting: str | None = None
    """For a problem, the setting to change (None when no setting would fix it)."""

    def to_json(self) -> dict[str, object]:
        return {"check": self.name, "status": self.status, "detail": self.detail, "setting": self.setting}


def doctor(
    timeout: Annotated[float, typer.Option(min=0.1, help="Seconds to wait for each request.")] = 5.0,
    store: StoreOption = None,
    as_json: JsonOption = False,
) -> None:
    """Check the settings, the store, the service URL, the secret, the stores the service reads and
    the quarantine list: one line each; exit 1 when one has a problem."""
    checks = list(run_checks(store, os.environ, timeout_s=timeout))
    if as_json:
        print(json.dumps([c.to_json() for c in checks]))
    else:
        width = max(len(c.name) for c in checks)
        styles = {"ok": "green", "problem": "bold red", "off": "dim"}
        for c in checks:
            out.print(
                Text.assemble((f"{c.status:<8}", styles[c.status]), f"{c.name:<{width}}  ", plain(c.detail))
            )
    if any(c.status == "problem" for c in checks):
        raise typer.Exit(1)


def run_checks(store: str | None, environ: Mapping[str, str], *, timeout_s: float = 5.0) -> Iterator[Check]:
    """Every check, in order; those a failed check makes pointless are ``off`` and say why."""
    try:
        settings = settings_for(store)
    except ConfigError as exc:
        yield Check("settings", "problem", str(exc))
        return
    yield check_settings(environ)
    yield check_store(settings)
    yield check_outbox(settings)
    yield from check_service(settings, timeout_s)
    yield check_quarantine(settings, timeout_s)


def check_settings(environ: Mapping[str, str]) -> Check:
    """The settings read, and any ``FLAKETRIAGE_*`` variable that looks like a misspelt setting."""
    known = {env_var(field) for field in Settings.model_fields}
    given = sorted(name for name in environ if name.startswith(ENV_PREFIX))
    for name in given:
        if name in known or name in NOT_SETTINGS:
            continue
        close = difflib.get_close_matches(name, sorted(known), n=1, cutoff=0.8)
        if close:
            return Check(
                "settings",
                "problem",
                f"{name} is not a flaketriage setting: did you mean {close[0]}?",
                close[0],
            )
    used = [name for name in given if name in known]
    return Check(
        "settings", "ok", f"{len(used)} set" + (f": {', '.join(used)}" if used else " (all defaults)")
    )


def check_store(settings: Settings) -> Check:
    from flaketriage.store import local_path, open_store, store_url

    setting = "FLAKETRIAGE_STORE"
    try:
        url = store_url(settings.store)
        root = local_path(url)
    except FlaketriageError as exc:
        return Check("store", "problem", str(exc), setting)
    if root is not None:
        return _local_store(root, setting)
    try:
        open_store(url, readonly=True, settings=settings)
    except FlaketriageError as exc:
        return Check("store", "problem", f"{url}: {exc}", setting)
    return Check("store", "ok", f"{url} opens")


def _local_store(root: Path, setting: str) -> Check:
    if root.is_dir():
        if not os.access(root, os.W_OK | os.X_OK):
            return Check("store", "problem", f"{root} is not writable by this user", setting)
        return Check("store", "ok", f"{root} (a directory, writable)")
    if root.exists():
        return Check("store", "problem", f"{root} exists and is not a directory", setting)
    parent = next((p for p in root.parents if p.exists()), None)
    if parent is None or not os.access(parent, os.W_OK | os.X_OK):
        return Check("store", "problem", f"{root} does not exist and cannot be created here", setting)
    return Check("store", "ok", f"{root} (created at the first capture)")


def check_outbox(settings: Settings) -> Check:
    from flaketriage.ci.outbox import Outbox
    from flaketriage.files.modes import FileModes

    try:
        outbox = Outbox(settings.resolved_outbox_dir(), modes=FileModes.of(settings.store_shared))
    except ConfigError as exc:
        status: Status = "problem" if settings.notify_url else "off"
        return Check("outbox", status, str(exc), "FLAKETRIAGE_OUTBOX_DIR")
    waiting = len(outbox.pending())
    return Check("outbox", "ok", f"{outbox.directory.absolute()}: {waiting} event(s) waiting")


# -- the service ------------------------------------------------------------------------------------
def check_service(settings: Settings, timeout_s: float) -> Iterator[Check]:
    """The service URL, the secret and the allowed stores, from one signed ping."""
    url = settings.notify_url
    if not url:
        yield Check("service", "off", "FLAKETRIAGE_NOTIFY_URL is not set: no events are sent")
        yield Check("secret", "off", "no service to check it with")
        yield Check("allowed stores", "off", "no service to ask")
        return
    answer = _ping(settings, url, timeout_s)
    yield answer.service
    has_secret = settings.webhook_secret is not None and settings.webhook_secret.get_secret_value()
    yield answer.secret if has_secret else _secret_refused(b"", "")
    yield answer.stores


@dataclass(frozen=True)
class _PingAnswer:
    service: Check
    secret: Check
    stores: Check

    @classmethod
    def down(cls, service: Check) -> _PingAnswer:
        return cls(
            service,
            Check("secret", "off", "the service did not answer"),
            Check("allowed stores", "off", "the service did not answer"),
        )


def _ping(settings: Settings, url: str, timeout_s: float) -> _PingAnswer:
    import httpx

    setting = "FLAKETRIAGE_NOTIFY_URL"
    base = url.rstrip("/")
    if not base.startswith(("http://", "https://")) or not base.endswith(EVENTS_PATH):
        return _PingAnswer.down(
            Check(
                "service",
                "problem",
                f"{url!r} is not an events endpoint: use https://HOST{EVENTS_PATH}",
                setting,
            )
        )
    secret = settings.webhook_secret.get_secret_value().encode() if settings.webhook_secret else b""
    body, location = _ping_body(settings)
    try:
        response = _post(base.removesuffix(EVENTS_PATH) + PING_PATH, body, secret, timeout_s)
    except httpx.HTTPError as exc:
        return _PingAnswer.down(
            Check(
                "service",
                "problem",
                f"cannot reach {url}: {type(exc).__name__}: {exc or 'no detail'}",
                setting,
            )
        )
    code = response.status_code
    if code in (404, 405) or 300 <= code < 400:
        where = f" (it redirects to {response.headers.get('Location')!r})" if 300 <= code < 400 else ""
        return _PingAnswer.down(
            Check(
                "service",
                "problem",
                f"no flaketriage service at {url}: POST {PING_PATH} answered HTTP {code}{where}; set "
                f"{setting} to https://HOST{EVENTS_PATH} (a service older than this flaketriage has no "
                f"{PING_PATH}: upgrade it)",
                setting,
            )
        )
    if code >= 500 or code in (408, 429):
        return _PingAnswer.down(
            Check("service", "problem", f"{url} answered HTTP {code}: {_detail(response)}")
        )
    service = Check("service", "ok", f"{url} answers")
    if code == 401:
        return _PingAnswer(
            service,
            _secret_refused(secret, _detail(response)),
            Check("allowed stores", "off", "needs the secret"),
        )
    if code != 200:
        return _PingAnswer(
            service,
            Check("secret", "problem", f"the ping was answered HTTP {code}: {_detail(response)}"),
            Check("allowed stores", "off", "needs a ping answer"),
        )
    try:
        pong = response.json()
    except ValueError:
        pong = None
    if not isinstance(pong, dict) or pong.get("status") != "ok":
        return _PingAnswer.down(
            Check(
                "service",
                "problem",
                f"{url} is not a flaketriage service: its ping answer is not one",
                setting,
            )
        )
    service = Check("service", "ok", f"{url} answers (flaketriage {pong.get('version', '?')})")
    return _PingAnswer(
        service, Check("secret", "ok", "signed requests are accepted"), _stores(pong, location)
    )


def _ping_body(settings: Settings) -> tuple[bytes, str | None]:
    """The ping, naming the store this machine's events would name (when it can be named)."""
    from flaketriage.events import StoreLocation

    try:
        store = StoreLocation.parse(settings.store)
    except FlaketriageError:
        return b'{"kind":"ping"}', None
    body = {"kind": "ping", "store": store.model_dump(mode="json")}
    return json.dumps(body, sort_keys=True, separators=(",", ":")).encode(), store.location


def _post(url: str, body: bytes, secret: bytes, timeout_s: float) -> httpx.Response:
    import httpx

    from flaketriage.signing import signed_headers

    headers = {"Content-Type": "application/json", "User-Agent": f"flaketriage/{__version__}"}
    if secret:
        headers |= signed_headers(secret, body)
    return httpx.post(url, content=body, headers=headers, timeout=timeout_s)


def _secret_refused(secret: bytes, detail: str) -> Check:
    setting = "FLAKETRIAGE_WEBHOOK_SECRET"
    if not secret:
        return Check("secret", "problem", f"{setting} is not set here: events cannot be signed", setting)
    if "is not set" in detail:
        return Check("secret", "problem", f"the service has no secret: set {setting} on the service", setting)
    if "clock" in detail:
        return Check("secret", "problem", f"{detail}: sync this machine's clock (NTP)")
    return Check(
        "secret",
        "problem",
        f"the service refused the signature ({detail}): set {setting} to the service's secret",
        setting,
    )


def _stores(pong: Mapping[str, object], location: str | None) -> Check:
    allowed = pong.get("allowed_stores")
    reads = ", ".join(str(a) for a in allowed) if isinstance(allowed, list) else "?"
    store = pong.get("store")
    if location is None or not isinstance(store, dict):
        return Check(
            "allowed stores", "off", f"this store cannot be named in an event; the service reads {reads}"
        )
    if store.get("allowed"):
        return Check("allowed stores", "ok", f"the service reads {location}")
    return Check(
        "allowed stores",
        "problem",
        f"the service does not read {location} (it reads {reads}): set FLAKETRIAGE_STORE to one of those, or "
        "add this one to the service's FLAKETRIAGE_ALLOWED_STORES",
        "FLAKETRIAGE_STORE",
    )


def _detail(response: httpx.Response) -> str:
    try:
        parsed = response.json()
    except ValueError:
        parsed = None
    text = (
        parsed["detail"]
        if isinstance(parsed, dict) and isinstance(parsed.get("detail"), str)
        else response.text
    )
    return " ".join(str(text).split())[:300] or "no detail"


# -- the quarantine list ----------------------------------------------------------------------------
def check_quarantine(settings: Settings, timeout_s: float) -> Check:
    from flaketriage.quarantine import QuarantineDocument

    url = settings.quarantine_url
    if not url:
        return _quarantine_file(settings)
    import httpx

    setting = "FLAKETRIAGE_QUARANTINE_URL"
    headers = {"Accept": "application/json", "User-Agent": f"flaketriage/{__version__}"}
    if settings.api_token is not None:
        headers["Authorization"] = f"Bearer {settings.api_token.get_secret_value()}"
    try:
        response = httpx.get(url, headers=headers, timeout=timeout_s, follow_redirects=True)
    except (httpx.HTTPError, httpx.InvalidURL) as exc:
        return Check(
            "quarantine",
            "problem",
            f"cannot reach {url}: {type(exc).__name__}: {exc or 'no detail'}",
            setting,
        )
    if response.status_code == 401:
        token = "FLAKETRIAGE_API_TOKEN"
        return Check("quarantine", "problem", f"{url} wants a token: set {token} to the service's", token)
    if not response.is_success:
        return Check(
            "quarantine",
            "problem",
            f"{url} answered HTTP {response.status_code}: {_detail(response)}",
            setting,
        )
    try:
        document = QuarantineDocument.from_json(response.content, where=url)
    except FlaketriageError as exc:
        return Check("quarantine", "problem", str(exc), setting)
    return Check(
        "quarantine",
        "ok",
        f"{url}: {len(document.entries)} entr{'y' if len(document.entries) == 1 else 'ies'}",
    )


def _quarantine_file(settings: Settings) -> Check:
    from flaketriage.quarantine import QuarantineDocument

    try:
        path = settings.resolved_quarantine_file().absolute()
    except ConfigError as exc:
        return Check("quarantine", "off", f"FLAKETRIAGE_QUARANTINE_URL is not set, and {exc}")
    if not path.exists():
        return Check(
            "quarantine", "off", f"FLAKETRIAGE_QUARANTINE_URL is not set and {path} does not exist: no list"
        )
    try:
        QuarantineDocument.from_json(path.read_bytes(), where=str(path))
    except (OSError, FlaketriageError) as exc:
        return Check("quarantine", "problem", f"{path}: {exc}", "FLAKETRIAGE_QUARANTINE_FILE")
    return Check("quarantine", "ok", f"{path} (FLAKETRIAGE_QUARANTINE_URL is not set)")
