"""Where `flaketriage cases` reads cases from: the service's API, or the embedded database, both
answering with the API's JSON; whatever keeps them from answering is a `CasesUnavailable`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from flaketriage.errors import ConfigError, FlaketriageError, RecordsError
from flaketriage.settings import Settings, load_settings

MAX_ID = 2**31 - 1
"""The largest case id (an integer column's range, as the API's own bound): past it, no case."""


class CasesUnavailable(FlaketriageError):
    """The cases cannot be read: the service does not answer or refuses (a token, a filter, an id
    it does not have), or the embedded database cannot be read. Said as one ``error:`` line, exit 1."""


Case = dict[str, Any]
"""A case as the API's JSON has it (`flaketriage.orchestrator.api_models.CaseSummary`/`CaseDetail`)."""


class CaseSource(Protocol):
    where: str
    """What is read, for messages: the service's URL or the database's."""

    def list(self, *, status: str | None, verdict: str | None, limit: int) -> list[Case]: ...

    def get(self, case_id: int) -> Case: ...


def open_source(service: str | None, store: str | None, timeout: float) -> CaseSource:
    """The service at `service` (else FLAKETRIAGE_SERVICE_URL, else the origin of FLAKETRIAGE_NOTIFY_URL),
    or without one the embedded database beside `store`; a bad setting is a `ConfigError`."""
    overrides: dict[str, Any] = {}
    if store is not None:
        overrides["store"] = store
    if service is not None:
        overrides["service_url"] = service
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:  # the option is named as it was given
        raise ConfigError(str(exc).replace("service_url=", "--service ")) from None
    url = settings.resolved_service_url()
    if url is not None:
        token = settings.api_token.get_secret_value() if settings.api_token else None
        return ServiceCases(url, token=token, timeout_s=timeout)
    return DatabaseCases(settings)


class ServiceCases:
    """The cases the service's API serves (``GET /v1/cases``, ``GET /v1/cases/{id}``), its JSON as
    it is; every way it fails to answer is a `CasesUnavailable` that says what to change."""

    def __init__(self, url: str, *, token: str | None, timeout_s: float) -> None:
        self.where = url
        self.token = token
        self.timeout_s = timeout_s

    def list(self, *, status: str | None, verdict: str | None, limit: int) -> list[Case]:
        params = {k: v for k, v in (("status", status), ("verdict", verdict)) if v is not None}
        found = self._get("/v1/cases", {**params, "limit": str(limit)})
        if not isinstance(found, list):
            raise CasesUnavailable(self._not_the_service("/v1/cases"))
        return found

    def get(self, case_id: int) -> Case:
        found = self._get(f"/v1/cases/{case_id}", {}, case_id=case_id)
        if not isinstance(found, dict):
            raise CasesUnavailable(self._not_the_service(f"/v1/cases/{case_id}"))
        return found

    def _get(self, path: str, params: dict[str, str], *, case_id: int | None = None) -> Any:
        import httpx  # only when a service is asked

        url = self.where + path
        headers = {"Accept": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        try:
            response = httpx.get(url, params=params, headers=headers, timeout=self.timeout_s)
        except httpx.TimeoutException as exc:
            raise CasesUnavailable(
                f"the service at {self.where} did not answer within {self.timeout_s:g} s; is it running "
                "(`flaketriage serve`)? --timeout waits longer"
            ) from exc
        except httpx.HTTPError as exc:
            raise CasesUnavailable(
                f"the service at {self.where} does not answer ({_reason(exc)}); is it running "
                "(`flaketriage serve`), and is FLAKETRIAGE_SERVICE_URL (or --service) its address?"
            ) from exc
        if response.status_code == 200:
            try:
                return response.json()
            except ValueError:
                raise CasesUnavailable(self._not_the_service(path)) from None
        raise CasesUnavailable(
            self._refusal(response.status_code, _detail(response), path, case_id, response)
        )

    def _refusal(self, status: int, detail: str, path: str, case_id: int | None, response: Any) -> str:
        if status in (401, 403):
            if not self.token:
                return (
                    f"the service at {self.where} needs its API token ({status}): set FLAKETRIAGE_API_TOKEN"
                )
            return (
                f"the service at {self.where} refused FLAKETRIAGE_API_TOKEN ({status}): set it to the "
                "service's token"
            )
        if status == 404 and case_id is not None and detail.startswith("no case"):
            return f"no case {case_id} at {self.where}; `flaketriage cases` lists them"
        if status == 404:
            return self._not_the_service(path, status)
        if status == 422:
            return (
                f"the service refused the request (422): {_options(detail)}; see `flaketriage cases --help`"
            )
        if 300 <= status < 400:
            where = response.headers.get("location", "")
            return (
                f"the service at {self.where} answered {status}, a redirect"
                + (f" to {where}" if where else "")
                + ": set FLAKETRIAGE_SERVICE_URL (or --service) to the address it names"
            )
        if status == 503:
            return f"the service at {self.where} cannot read its records now (503): {detail}; retry later"
        return f"the service at {self.where} answered {status} to GET {path}" + (
            f": {detail}" if detail else ""
        )

    def _not_the_service(self, path: str, status: int = 200) -> str:
        answer = "404" if status == 404 else "something that is not the API's JSON"
        return (
            f"{self.where}{path} answered {answer}: is FLAKETRIAGE_SERVICE_URL (or --service) the "
            "flaketriage service's base URL, such as https://flaketriage.acme.dev?"
        )


def _reason(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text[:200] if text else type(exc).__name__


def _detail(response: Any) -> str:
    """The API's ``{"detail": ...}`` (a `Problem`), else the body's start."""
    try:
        data = response.json()
    except ValueError:
        return " ".join(response.text.split())[:200]
    detail = data.get("detail") if isinstance(data, dict) else None
    return str(detail) if detail is not None else json.dumps(data)[:200]


def _options(detail: str) -> str:
    """The API's names of query parameters as this command's options: ``query.verdict`` → ``--verdict``."""
    return detail.replace("query.", "--")


class DatabaseCases:
    """The cases in the embedded database (``FLAKETRIAGE_DATABASE_URL``, by default
    ``<store>/service.db``), as the API would answer; a database that does not exist has none."""

    def __init__(self, settings: Settings) -> None:
        self.url = settings.resolved_database_url()
        self.where = _safe(self.url)
        self.path = _sqlite_path(self.url)

    def list(self, *, status: str | None, verdict: str | None, limit: int) -> list[Case]:
        from flaketriage.orchestrator.api_models import CaseVerdict
        from flaketriage.records import CaseStatus

        _check_filter("status", status, [s.value for s in CaseStatus])
        _check_filter("verdict", verdict, [v.value for v in CaseVerdict])
        if self._missing():
            return []
        from flaketriage.orchestrator.cases import CaseQuery

        found = self._read(lambda db: CaseQuery(db).list(status=status, verdict=verdict, limit=limit))
        return [c.model_dump(mode="json") for c in found]

    def get(self, case_id: int) -> Case:
        from flaketriage.orchestrator.api_models import CaseDetail
        from flaketriage.orchestrator.cases import CaseQuery

        found: CaseDetail | None = None
        if not self._missing() and 0 < case_id <= MAX_ID:
            found = self._read(lambda db: CaseQuery(db).get(case_id))
        if found is None:
            raise CasesUnavailable(f"no case {case_id} in {self.where}; `flaketriage cases` lists them")
        return found.model_dump(mode="json")

    def _missing(self) -> bool:
        """No database file yet (no service ran beside this store): read as no cases, and not
        created, as opening it would."""
        return self.path is not None and not self.path.exists()

    def _read(self, query: Any) -> Any:
        from flaketriage.dependencies import require

        require("sqlalchemy", "server", "reading cases from the database")
        from flaketriage.records import Database

        database = Database(self.url)
        try:
            return query(database)
        except RecordsError as exc:
            raise CasesUnavailable(
                f"cannot read the cases in {self.where}: {exc}; is it a flaketriage service's database "
                "(FLAKETRIAGE_DATABASE_URL)? `flaketriage serve` upgrades one of an older version"
            ) from exc
        finally:
            database.dispose()


def _check_filter(name: str, value: str | None, accepted: Sequence[str]) -> None:
    if value is not None and value not in accepted:
        raise CasesUnavailable(f"--{name} {value!r} is not a {name}: use one of {', '.join(accepted)}")


def _sqlite_path(url: str) -> Path | None:
    """The file of a ``sqlite:///path`` URL (None for any other database, or one in memory)."""
    for prefix in ("sqlite:///", "sqlite+pysqlite:///"):
        if url.startswith(prefix):
            path = url[len(prefix) :].partition("?")[0]
            return Path(path) if path and path != ":memory:" else None
    return None


def _safe(url: str) -> str:
    """`url` without its password."""
    head, at, tail = url.rpartition("@")
    if not at or "://" not in head:
        return url
    scheme, _, user = head.partition("://")
    return f"{scheme}://{user.partition(':')[0]}:***@{tail}" if ":" in user else url
