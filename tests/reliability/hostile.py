"""Hostile requests for the receiver's three write routes, as Hypothesis strategies.

Bodies are plausible: the payloads GitHub and Sentry really send (``tests/orchestrator/payloads/``)
and a real captured bundle's ``failure.captured`` event, each naming a bundle of the test store so
the intake reads it, with a few places replaced by hostile values: lone surrogates, NULs, huge and
right-to-left strings, combining marks, path traversal, NaN and Infinity, integers past every
column, deep nesting, the wrong type. Schemathesis adds requests built from the served OpenAPI
document. Every request is signed correctly when it is sent (`Probe`), so it gets past the
signature; a few reuse an earlier delivery id with a different body.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import strategies as st

PAYLOADS = Path(__file__).parents[1] / "orchestrator" / "payloads"
GITHUB_PAYLOADS = {
    "github_workflow_run.completed.json": "workflow_run",
    "github_check_run.completed.json": "check_run",
    "github_issues.labeled.json": "issues",
    "github_issue_comment.created.json": "issue_comment",
    "github_ping.json": "ping",
}
SENTRY_PAYLOADS = {
    "sentry_event_alert.triggered.json": "event_alert",
    "sentry_metric_alert.critical.json": "metric_alert",
    "sentry_installation.created.json": "installation",
}


@dataclass(frozen=True)
class Raw:
    """JSON text put into a document as it is: what `json.dumps` will not write (an integer of
    5,000 digits, ten thousand open brackets)."""

    text: str


@dataclass(frozen=True)
class Append:
    """Hostile text added to the string already at a place (the original stays recognizable, so
    the value still reaches the parser that reads it)."""

    text: str


@dataclass(frozen=True)
class Request:
    """One request to a write route: its body and the headers that are not the signature.

    `repeat` reuses the route's previous delivery id (with this, different, body)."""

    route: str
    body: bytes
    headers: dict[str, str] = field(default_factory=dict)
    repeat: bool = False
    origin: str = ""
    """What it was built from and how: the payload and the places replaced."""

    def __repr__(self) -> str:
        body = self.body if len(self.body) <= 600 else self.body[:300] + b"..." + self.body[-200:]
        headers = {k: v if len(v) <= 80 else f"{v[:40]}...({len(v)} chars)" for k, v in self.headers.items()}
        return f"Request({self.route}, {self.origin}, headers={headers}, repeat={self.repeat}, body={body!r})"


# -- values ---------------------------------------------------------------------------------------
HOSTILE_TEXTS = (
    "\ud800",
    "\udfff",
    "x\ud83dy",
    "\x00",
    "nul\x00inside",
    "\u202eevil\u202c.txt",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "e" + "\u0301" * 64,
    "../../../../etc/passwd",
    "..\\..\\windows\\system32",
    "/dev/zero",
    "%00%2e%2e%2f",
    "%s%n%x{0}{}",
    "'; DROP TABLE cases; --",
    "\r\nX-Injected: 1",
    "\ufeff\u200b\u2028\u2029",
    "\U0001f525" * 16,
    "\uffff\ufffe",
    "",
    " ",
    "NaN",
    "-0",
)
LONG_TEXTS = (("9", 5000), ("A", 40_000), ("\u202e", 2000), ("../", 3000))
"""(text, times): strings too long to keep whole in a strategy (its repr would be as long)."""
NUMBERS = (
    float("nan"),
    float("inf"),
    float("-inf"),
    -0.0,
    5e-324,
    1.7976931348623157e308,
    2**31,
    2**63,
    2**64,
    -(2**63) - 1,
    10**400,
)
RAW_TOKENS = (
    ("", "1", 5000, "", ""),
    ("-", "9", 4301, "", ""),
    ("", "1e999999", 1, "", ""),
    ("", "[", 20_000, "", "]"),
    ("", '{"a":', 3000, "1", "}"),
)
"""(prefix, opener, times, middle, closer): JSON text no encoder writes (an integer of 5,000
digits, 20,000 open brackets), kept short until drawn."""


def _repeated(spec: tuple[str, int]) -> str:
    return spec[0] * spec[1]


def _raw(spec: tuple[str, str, int, str, str]) -> Raw:
    prefix, opener, times, middle, closer = spec
    return Raw(prefix + opener * times + middle + closer * times)


hostile_texts = (
    st.sampled_from(HOSTILE_TEXTS)
    | st.sampled_from(LONG_TEXTS).map(_repeated)
    | st.text(max_size=40)
    | st.builds("".join, st.lists(st.sampled_from(HOSTILE_TEXTS), min_size=2, max_size=4))
)
hostile_scalars = (
    hostile_texts
    | st.sampled_from(NUMBERS)
    | st.sampled_from(RAW_TOKENS).map(_raw)
    | st.integers()
    | st.floats()
    | st.none()
    | st.booleans()
)
hostile_values = st.recursive(
    hostile_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(hostile_texts, inner, max_size=3),
    max_leaves=6,
) | st.integers(2, 600).map(lambda depth: json.loads("[" * depth + "]" * depth))
replacements = hostile_values | hostile_texts.map(Append)


def dumps(value: Any) -> str:
    """`value` as JSON text, with `Raw` tokens written as they are, NaN and Infinity as Python writes
    them, and lone surrogates as ``\\udXXX`` escapes."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(f"{json.dumps(str(k))}:{dumps(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)


# -- documents ------------------------------------------------------------------------------------
Place = tuple[Any, ...]


def places(value: Any, prefix: Place = ()) -> list[Place]:
    """Every place in a JSON document, dict keys and list indices, parents before children."""
    found = [prefix]
    if isinstance(value, dict):
        for key, item in value.items():
            found.extend(places(item, (*prefix, key)))
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found.extend(places(item, (*prefix, index)))
    return found


def replaced(document: Any, changes: Sequence[tuple[Place, Any]]) -> Any:
    """A copy of `document` with each change applied in turn; a place an earlier change removed is
    skipped."""
    copy = json.loads(json.dumps(document))
    for place, value in changes:
        if not place:
            continue
        parent = copy
        try:
            for part in place[:-1]:
                parent = parent[part]
            old = parent[place[-1]]
        except (KeyError, IndexError, TypeError):
            continue
        if not isinstance(parent, dict | list):  # an earlier change put a string there
            continue
        if isinstance(value, Append):
            value = old + value.text if isinstance(old, str) else value.text
        parent[place[-1]] = value
    return copy


def mutated(name: str, document: dict[str, Any]) -> st.SearchStrategy[tuple[str, bytes]]:
    """`document` with one to four of its places replaced, or one hostile value sprayed over some
    of its strings or numbers (a single place seldom is the one a parser reads): (what was done,
    the body)."""
    spots = places(document)[1:]  # not the root: a body that is not an object is a plain 400
    leaves = {kind: [p for p in spots if _leaf(document, p) == kind] for kind in ("str", "num")}

    @st.composite
    def body(draw: st.DrawFn) -> tuple[str, bytes]:
        if draw(st.booleans()):
            # Places drawn by index: a strategy over hundreds of places has a repr as long.
            indices = st.integers(0, len(spots) - 1).map(spots.__getitem__)
            changes = draw(st.lists(st.tuples(indices, replacements), min_size=1, max_size=4))
            what = f"{name} with {[(place, _short(v)) for place, v in changes]}"
        else:
            kind = draw(st.sampled_from([k for k in ("str", "num") if leaves[k]]))
            value = draw(hostile_texts.map(Append) if kind == "str" else st.sampled_from(NUMBERS))
            chosen = draw(st.lists(st.booleans(), min_size=len(leaves[kind]), max_size=len(leaves[kind])))
            changes = [(place, value) for place, hit in zip(leaves[kind], chosen, strict=True) if hit]
            what = (
                f"{name} with {_short(value)} at {len(changes)} {kind} places {[p for p, _ in changes][:8]}"
            )
        text = dumps(replaced(document, changes)).encode("utf-8", "surrogatepass")
        return what, text

    return body()


def _leaf(document: Any, place: Place) -> str:
    value = document
    for part in place:
        value = value[part]
    if isinstance(value, str):
        return "str"
    return "num" if isinstance(value, int | float) and not isinstance(value, bool) else ""


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}...({len(text)} chars)"


# -- requests -------------------------------------------------------------------------------------
HEADER_VALUES = ("", " ", "../../etc/passwd", "%00", "-1", "NaN", "1e309")
LONG_HEADER_VALUES = (("x", 5000), ("1", 4301), ("9", 20))


def _headers(names: Sequence[str]) -> st.SearchStrategy[dict[str, str]]:
    """Hostile values for some of the route's own headers (printable ASCII: what HTTP carries)."""
    ascii_text = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=64)
    return st.dictionaries(
        st.sampled_from(names),
        st.sampled_from(HEADER_VALUES) | st.sampled_from(LONG_HEADER_VALUES).map(_repeated) | ascii_text,
        max_size=2,
    )


@dataclass(frozen=True)
class Sources:
    """The payloads a request strategy starts from: the recorded webhooks, pointed at bundles of
    the receiver's store, and a captured bundle's event."""

    event: dict[str, Any]
    """The ``failure.captured`` event of a captured bundle, as `flaketriage notify` sends it."""
    bundles: tuple[str, ...]
    """Bundle ids in the receiver's store."""
    project: str
    """The directory the bundles were captured in (Sentry's frames name files under it)."""

    def github(self, name: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((PAYLOADS / name).read_text())
        if GITHUB_PAYLOADS[name] == "check_run":
            document["check_run"]["output"]["text"] = f"flaketriage-bundle: {self.bundles[-1]}"
        return document

    def sentry(self, name: str) -> dict[str, Any]:
        document: dict[str, Any] = json.loads((PAYLOADS / name).read_text())
        if SENTRY_PAYLOADS[name] == "event_alert":
            frames = document["data"]["event"]["exception"]["values"][-1]["stacktrace"]["frames"]
            for frame in frames:
                frame["abs_path"] = f"{self.project}/{frame['filename']}"
            document["data"]["event"]["tags"].append(["flaketriage.bundle", self.bundles[0]])
        return document


def requests(
    sources: Sources, extra: Sequence[st.SearchStrategy[Request]] = ()
) -> st.SearchStrategy[Request]:
    """Hostile requests to all three write routes (and `extra`, e.g. schemathesis's)."""
    built: list[st.SearchStrategy[Request]] = [
        st.builds(
            _event_request,
            mutated("failure.captured event", sources.event),
            _headers(("X-Flaketriage-Timestamp",)),
            st.booleans(),
        )
    ]
    for name, event in GITHUB_PAYLOADS.items():
        built.append(
            st.builds(
                _webhook("/webhooks/github", {"X-GitHub-Event": event}),
                mutated(name, sources.github(name)),
                _headers(("X-GitHub-Event", "X-GitHub-Delivery", "X-GitHub-Hook-ID")),
                st.booleans(),
            )
        )
    for name, resource in SENTRY_PAYLOADS.items():
        built.append(
            st.builds(
                _webhook("/webhooks/sentry", {"Sentry-Hook-Resource": resource}),
                mutated(name, sources.sentry(name)),
                _headers(("Sentry-Hook-Resource", "Sentry-Hook-Timestamp", "Request-ID")),
                st.booleans(),
            )
        )
    bundles = st.sampled_from((*sources.bundles, "0" * 64))
    built.append(st.builds(_bundle_list, st.integers(1, 700), bundles, st.booleans()))
    return st.one_of(*built, *extra)


def _event_request(body: tuple[str, bytes], headers: dict[str, str], repeat: bool) -> Request:
    return Request("/v1/events", body[1], headers, repeat, body[0])


def _webhook(
    route: str, base: dict[str, str]
) -> Callable[[tuple[str, bytes], dict[str, str], bool], Request]:
    def build(body: tuple[str, bytes], headers: dict[str, str], repeat: bool) -> Request:
        return Request(route, body[1], base | headers, repeat, body[0])

    return build


def _bundle_list(count: int, bundle: str, distinct: bool) -> Request:
    """A check run naming `count` bundles: the same one (of the store, or not), or as many
    different ones the store does not have."""
    document = json.loads((PAYLOADS / "github_check_run.completed.json").read_text())
    names = [hashlib.sha256(b"%d" % i).hexdigest() if distinct else bundle for i in range(count)]
    document["check_run"]["output"]["text"] = "\n".join(f"flaketriage-bundle: {n}" for n in names)
    return Request(
        "/webhooks/github",
        json.dumps(document).encode(),
        {"X-GitHub-Event": "check_run"},
        origin=f"check_run naming {count} bundles ({'distinct' if distinct else bundle[:12]})",
    )


# -- schemathesis ---------------------------------------------------------------------------------
WRITE_ROUTES = ("/v1/events", "/webhooks/github", "/webhooks/sentry")
_SIGNING_HEADERS = frozenset({"x-flaketriage-timestamp", "x-flaketriage-signature"})


def openapi_schema() -> Any:
    """Schemathesis's reading of the document the app serves (from an app never connected)."""
    import schemathesis

    from flaketriage.orchestrator.app import create_app
    from flaketriage.orchestrator.service import Service
    from flaketriage.records import Database
    from flaketriage.settings import load_settings
    from flaketriage.work.dispatch import MemorySender

    settings = load_settings(store="/nonexistent/.flaketriage", webhook_secret="unused")
    app = create_app(Service.assemble(settings, Database("sqlite://"), MemorySender()))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


def openapi_requests(schema: Any, store: str) -> list[st.SearchStrategy[Request]]:
    """Requests schemathesis builds from the served OpenAPI document, one strategy per write route.
    An event that names a store names `store`, or the store policy would refuse every one of them
    before the intake."""
    return [
        schema[route]["POST"].as_strategy().map(lambda case: from_case(case, store)) for route in WRITE_ROUTES
    ]


def from_case(case: Any, store: str) -> Request:
    """A schemathesis case as a `Request`."""
    body = case.body
    if case.path == "/v1/events" and isinstance(body, dict) and isinstance(body.get("store"), dict):
        body = {**body, "store": {"kind": "local", "location": store}}
    if isinstance(body, bytes):
        raw = body
    elif type(body).__name__ == "NotSet":
        raw = b""
    else:
        raw = dumps(body).encode("utf-8", "surrogatepass")
    # The generated signing headers are noise that never signs; `Probe` signs instead.
    headers = {k: str(v) for k, v in (case.headers or {}).items() if k.lower() not in _SIGNING_HEADERS}
    if case.path == "/webhooks/github":
        headers.setdefault("X-GitHub-Event", "check_run")
    elif case.path == "/webhooks/sentry":
        headers.setdefault("Sentry-Hook-Resource", "event_alert")
    return Request(case.path, raw, headers, origin="schemathesis")


# -- known inputs ---------------------------------------------------------------------------------
def known(sources: Sources) -> dict[str, list[Request]]:
    """Hostile requests that broke (or could break) the receiver, by name: each a list sent in
    order, to one receiver. What the fuzzing found is kept here so that it is sent every run."""

    def event(top: dict[str, Any] | None = None, **failure: Any) -> bytes:
        document = json.loads(json.dumps(sources.event)) | (top or {})
        document["failure"].update(failure)
        return dumps(document).encode("utf-8", "surrogatepass")

    def sentry(change: Callable[[dict[str, Any]], None]) -> bytes:
        document = sources.sentry("sentry_event_alert.triggered.json")
        change(document["data"]["event"])
        return dumps(document).encode("utf-8", "surrogatepass")

    def github(change: Callable[[dict[str, Any]], None]) -> bytes:
        document = sources.github("github_workflow_run.completed.json")
        change(document["workflow_run"])
        return dumps(document).encode("utf-8", "surrogatepass")

    def numbers(event: dict[str, Any], value: float) -> None:
        for key, item in event.items():
            if isinstance(item, int | float) and not isinstance(item, bool):
                event[key] = value

    events, hub, hook = "/v1/events", "/webhooks/github", "/webhooks/sentry"
    alert, run = {"Sentry-Hook-Resource": "event_alert"}, {"X-GitHub-Event": "workflow_run"}
    return {
        "event timestamp of 4,301 digits": [
            Request(events, event(), {"X-Flaketriage-Timestamp": "1" * 4301})
        ],
        "event text with NUL and lone surrogates": [Request(events, event(message="a\x00b\ud800c\udfff"))],
        "sentry timestamp of 4,301 digits": [
            Request(hook, sentry(lambda e: None), alert | {"Sentry-Hook-Timestamp": "1" * 4301})
        ],
        "sentry bundle tag with a NUL": [
            Request(hook, sentry(lambda e: e["tags"][-1].__setitem__(1, e["tags"][-1][1] + "\x00")), alert)
        ],
        "sentry text with NUL and lone surrogates": [
            Request(hook, sentry(lambda e: e["exception"]["values"][-1].update(value="a\x00\ud800")), alert)
        ],
        "sentry numbers NaN": [Request(hook, sentry(lambda e: numbers(e, float("nan"))), alert)],
        "sentry numbers Infinity": [Request(hook, sentry(lambda e: numbers(e, float("-inf"))), alert)],
        "workflow run text with NUL and lone surrogates": [
            Request(hub, github(lambda r: r.update(name="a\x00\ud800", head_branch="\udfff\x00")), run)
        ],
        "check run naming 700 different bundles": [_bundle_list(700, "", distinct=True)],
        "check run naming one bundle 700 times": [_bundle_list(700, sources.bundles[-1], distinct=False)],
        "event delivered again with another body": [
            Request(events, event(message="first")),
            Request(events, event({"fingerprint": "0" * 64}, exception_type="KeyError"), repeat=True),
        ],
        "workflow run delivered again with another body": [
            Request(hub, github(lambda r: None), run),
            Request(hub, github(lambda r: r.update(name="Other", head_sha="b" * 40)), run, repeat=True),
        ],
        "sentry alert delivered again with another body": [
            Request(hook, sentry(lambda e: None), alert),
            Request(
                hook,
                sentry(lambda e: e["exception"]["values"][-1].update(type="KeyError")),
                alert,
                repeat=True,
            ),
        ],
    }
