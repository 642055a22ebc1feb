"""`open_store`: one way to a store from a path or URL, backends picked by scheme and imported lazily."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest

from flaketriage.errors import ConfigError, MissingDependencyError, StoreError
from flaketriage.events import StoreLocation
from flaketriage.settings import load_settings
from flaketriage.store import (
    LocalStore,
    MemoryStore,
    local_path,
    open_store,
    register_backend,
    registry,
    store_url,
)


def _name() -> str:
    return f"test-{uuid.uuid4().hex[:8]}"


def test_a_path_and_its_file_url_open_the_same_local_store(tmp_path: Path) -> None:
    store = open_store(tmp_path / "s")
    assert isinstance(store, LocalStore) and store.root == tmp_path / "s"
    assert store.url == (tmp_path / "s").as_uri() and store.url.startswith("file:///")
    key = store.put_bytes(b"hello").sha256
    again = open_store(store.url, readonly=True)
    assert isinstance(again, LocalStore) and again.root == store.root and again.url == store.url
    assert again.get_bytes(key) == b"hello"
    with pytest.raises(StoreError, match="read-only"):
        again.put_bytes(b"no")


def test_relative_paths_resolve_against_relative_to(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert store_url(".flaketriage") == (tmp_path / ".flaketriage").as_uri()
    assert store_url("st", relative_to=tmp_path / "proj") == (tmp_path / "proj" / "st").as_uri()
    store = open_store("st", relative_to=tmp_path / "proj")
    assert isinstance(store, LocalStore) and store.root == tmp_path / "proj" / "st"


def test_file_urls_with_spaces_round_trip(tmp_path: Path) -> None:
    store = open_store(tmp_path / "a store")
    assert "%20" in store.url
    assert local_path(store.url) == tmp_path / "a store"


def test_a_memory_name_is_one_store_per_process() -> None:
    name = _name()
    writer = open_store(f"memory://{name}")
    assert isinstance(writer, MemoryStore) and writer.url == f"memory://{name}"
    key = writer.put_bytes(b"shared").sha256
    writer.put_ref("bundles/x", b"{}")
    reader = open_store(f"memory://{name}/", readonly=True)
    assert reader.get_bytes(key) == b"shared" and reader.list_refs("bundles/") == ["bundles/x"]
    assert MemoryStore(name).has(key)
    with pytest.raises(StoreError, match="read-only"):
        reader.put_bytes(b"no")
    assert not open_store(f"memory://{_name()}").has(key)


def test_an_unnamed_memory_store_reopens_by_its_url_while_in_use() -> None:
    store = MemoryStore()
    key = store.put_bytes(b"mine").sha256
    assert open_store(store.url).get_bytes(key) == b"mine"
    assert not MemoryStore().has(key)


def test_a_memory_store_nobody_wrote_cannot_be_opened_read_only() -> None:
    with pytest.raises(StoreError, match="nothing in this process"):
        open_store(f"memory://{_name()}", readonly=True)


@pytest.mark.parametrize(
    ("url", "needles"),
    [
        ("ftp://host/x", ["ftp://", "no store backend", "memory://NAME", "directory path"]),
        ("", ["empty"]),
        ("   ", ["empty"]),
        ("memory://", ["memory://NAME"]),
        ("file://relative/dir", ["file:///absolute/path"]),
    ],
)
def test_bad_locations_are_config_errors(url: str, needles: list[str]) -> None:
    with pytest.raises(ConfigError) as caught:
        open_store(url)
    for needle in needles:
        assert needle in str(caught.value)


def test_s3_urls_open_the_s3_backend(s3_url: str) -> None:
    assert store_url("s3://bucket/prefix/") == "s3://bucket/prefix"  # a known scheme
    assert local_path("s3://bucket/prefix") is None
    store = open_store(s3_url + "/", settings=load_settings())
    assert type(store).__name__ == "S3Store" and store.url == s3_url
    key = store.put_bytes(b"shared").sha256
    assert open_store(store.url, readonly=True, settings=load_settings()).get_bytes(key) == b"shared"
    with pytest.raises(ConfigError) as caught:
        open_store("nope://x")
    assert "s3://BUCKET/PREFIX" in str(caught.value)  # installed, so offered


def test_a_backend_is_imported_only_when_its_scheme_is_opened(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    register_backend("lazy", "flaketriage_lazy_backend_for_tests:Store")
    assert store_url("lazy://x") == "lazy://x"  # registered: accepted without importing anything
    assert "flaketriage_lazy_backend_for_tests" not in sys.modules
    with pytest.raises(ConfigError, match="lazy:// store is not available"):
        open_store("lazy://x")


def test_a_backend_whose_library_is_missing_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "ft_fake_s3_backend.py").write_text("import boto3\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    monkeypatch.setitem(sys.modules, "boto3", None)  # what `import` does for an absent module
    register_backend("fake-s3", "ft_fake_s3_backend:S3Store", extra="s3")
    with pytest.raises(MissingDependencyError, match=r"pip install 'flaketriage\[s3\]'") as caught:
        open_store("fake-s3://bucket/prefix")
    assert caught.value.module == "boto3" and "fake-s3://" in str(caught.value)


def test_a_registered_target_must_be_a_store_class(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(registry, "_BACKENDS", dict(registry._BACKENDS))
    with pytest.raises(ConfigError, match="module:Class"):
        register_backend("bad", "no_colon_here")
    register_backend("notastore", "pathlib:Path")
    with pytest.raises(ConfigError, match="not a Store class"):
        open_store("notastore://x")


def test_an_event_store_location_resolves_through_open_store(tmp_path: Path, s3_url: str) -> None:
    local = StoreLocation.parse(tmp_path / "s")
    assert (local.kind, local.location) == ("local", str(tmp_path / "s"))
    assert local.url == (tmp_path / "s").as_uri()
    open_store(local.url).put_bytes(b"x")
    opened = local.open()
    assert isinstance(opened, LocalStore) and opened.readonly and opened.root == tmp_path / "s"

    name = _name()
    key = open_store(f"memory://{name}").put_bytes(b"in memory").sha256
    memory = StoreLocation.parse(f"memory://{name}")
    assert memory.kind == "memory" and memory.open().get_bytes(key) == b"in memory"

    s3 = StoreLocation.parse("s3://bucket/ft/")
    assert (s3.kind, s3.location, s3.url) == ("s3", "s3://bucket/ft", "s3://bucket/ft")
    key = open_store(s3_url, settings=load_settings()).put_bytes(b"in a bucket").sha256
    opened_s3 = StoreLocation.parse(s3_url + "/").open(settings=load_settings())
    assert opened_s3.readonly and opened_s3.get_bytes(key) == b"in a bucket"


def test_an_event_store_location_must_fit_its_kind() -> None:
    with pytest.raises(ValueError, match="absolute path"):
        StoreLocation(kind="local", location="relative/dir")
    with pytest.raises(ValueError, match="s3:// URL"):
        StoreLocation(kind="s3", location="/tmp/store")
    with pytest.raises(ConfigError, match="no store backend"):
        StoreLocation.parse("ftp://host/x")
