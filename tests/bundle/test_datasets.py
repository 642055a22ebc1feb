"""Reducible data formats: detection, counting, and byte-exact subsets."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from flaketriage.bundle.datasets import count_items, detect_format, write_subset
from flaketriage.errors import DatasetError

CSV = (
    "id,text,score\r\n"
    "0,plain,0.5\r\n"
    '1,"quoted, with comma",0.25\r\n'
    '2,"multi\r\nline ""field""\r\n",0.75\r\n'
    "\r\n"
    "3,last,1.0"
)
RECORDS = [
    "0,plain,0.5\r\n",
    '1,"quoted, with comma",0.25\r\n',
    '2,"multi\r\nline ""field""\r\n",0.75\r\n',
    "3,last,1.0",
]


@pytest.mark.parametrize(
    ("name", "fmt"),
    [("a.csv", "csv"), ("a.TSV", "csv"), ("a.jsonl", "jsonl"), ("a.ndjson", "jsonl"), ("a.npy", "npy")],
)
def test_detect_format_by_suffix(tmp_path: Path, name: str, fmt: str) -> None:
    path = tmp_path / name
    path.write_bytes(b"")
    assert detect_format(path) == fmt


def test_detect_format_directory(tmp_path: Path) -> None:
    assert detect_format(tmp_path) == "dir"


def test_missing_path_names_it(tmp_path: Path) -> None:
    missing = tmp_path / "nope.csv"
    with pytest.raises(DatasetError, match=r"nope\.csv"):
        detect_format(missing)
    with pytest.raises(DatasetError, match=r"nope\.csv"):
        count_items(missing, "csv")


def test_unknown_suffix_names_path_and_formats(tmp_path: Path) -> None:
    path = tmp_path / "data.parquet"
    path.write_bytes(b"PAR1")
    with pytest.raises(DatasetError, match=r"data\.parquet.*'\.parquet'.*JSON Lines"):
        detect_format(path)


def test_csv_keeps_header_and_exact_records(tmp_path: Path) -> None:
    src = tmp_path / "in.csv"
    src.write_bytes(CSV.encode())
    assert count_items(src, "csv") == 4
    dest = tmp_path / "out" / "deep" / "sub.csv"
    write_subset(src, dest, "csv", [3, 2])
    assert dest.read_bytes() == ("id,text,score\r\n" + RECORDS[2] + RECORDS[3]).encode()
    write_subset(src, dest, "csv", [])
    assert dest.read_bytes() == b"id,text,score\r\n"
    assert count_items(dest, "csv") == 0


def test_tsv(tmp_path: Path) -> None:
    src = tmp_path / "in.tsv"
    src.write_bytes(b'a\tb\n1\t"x\ty"\n2\tz\n')
    assert count_items(src, "csv") == 2
    write_subset(src, tmp_path / "out.tsv", "csv", [1])
    assert (tmp_path / "out.tsv").read_bytes() == b"a\tb\n2\tz\n"


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=6), min_size=2, max_size=2)
    ),
    st.data(),
)
def test_csv_round_trip(
    tmp_path_factory: pytest.TempPathFactory, rows: list[list[str]], data: st.DataObject
) -> None:
    import csv
    import io

    buffer = io.StringIO(newline="")
    writer = csv.writer(buffer)
    writer.writerow(["k", "v"])
    records = []
    for row in rows:
        start = buffer.tell()
        writer.writerow(row)
        records.append(buffer.getvalue()[start:])
    # csv writes "" for a row of empty fields, which reads back as a field, never as a blank line.
    src = tmp_path_factory.mktemp("csv") / "in.csv"
    src.write_bytes(buffer.getvalue().encode("utf-8", "surrogateescape"))
    assert count_items(src, "csv") == len(rows)
    keep = data.draw(st.lists(st.integers(0, max(len(rows) - 1, 0)), unique=True)) if rows else []
    dest = src.with_name("out.csv")
    write_subset(src, dest, "csv", keep)
    expected = "k,v\r\n" + "".join(records[i] for i in sorted(keep))
    assert dest.read_bytes() == expected.encode("utf-8", "surrogateescape")


def test_jsonl(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_bytes(b'{"a": 1}\n\n   \n{"a": "\xe2\x80\xa8"}\r\n{"a": 3}')
    assert count_items(src, "jsonl") == 3
    dest = tmp_path / "out.jsonl"
    write_subset(src, dest, "jsonl", [2, 1])
    assert dest.read_bytes() == b'{"a": "\xe2\x80\xa8"}\r\n{"a": 3}'
    write_subset(src, dest, "jsonl", [])
    assert dest.read_bytes() == b""


def test_npy_keeps_dtype_and_order(tmp_path: Path) -> None:
    src = tmp_path / "in.npy"
    array = np.arange(24, dtype=np.float16).reshape(6, 2, 2)
    np.save(src, array)
    assert count_items(src, "npy") == 6
    dest = tmp_path / "out" / "subset.npy"
    write_subset(src, dest, "npy", [4, 1])
    out = np.load(dest)
    assert out.dtype == np.float16
    np.testing.assert_array_equal(out, array[[1, 4]])
    write_subset(src, dest, "npy", [])
    assert np.load(dest).shape == (0, 2, 2)


def test_npy_without_npy_suffix_is_written_where_asked(tmp_path: Path) -> None:
    src = tmp_path / "in.npy"
    np.save(src, np.arange(3))
    write_subset(src, tmp_path / "target", "npy", [0])
    assert (tmp_path / "target").exists() and not (tmp_path / "target.npy").exists()


def test_npy_scalar_is_not_reducible(tmp_path: Path) -> None:
    src = tmp_path / "scalar.npy"
    np.save(src, np.float32(1.0))
    with pytest.raises(DatasetError, match=r"scalar\.npy"):
        count_items(src, "npy")


def test_directory(tmp_path: Path) -> None:
    src = tmp_path / "shards"
    (src / "b_dir" / "inner").mkdir(parents=True)
    (src / "b_dir" / "inner" / "x.bin").write_bytes(b"\x00\x01")
    (src / "a.txt").write_text("a", encoding="utf-8")
    (src / "c.txt").write_text("c", encoding="utf-8")
    assert count_items(src, "dir") == 3
    dest = tmp_path / "new" / "shards"
    write_subset(src, dest, "dir", [1, 2])
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == [
        "b_dir",
        "b_dir/inner",
        "b_dir/inner/x.bin",
        "c.txt",
    ]
    assert (dest / "b_dir" / "inner" / "x.bin").read_bytes() == b"\x00\x01"
    with pytest.raises(DatasetError, match="already exists"):
        write_subset(src, dest, "dir", [0])
    empty = tmp_path / "empty"
    write_subset(src, empty, "dir", [])
    assert empty.is_dir() and not any(empty.iterdir())


def test_out_of_range_index(tmp_path: Path) -> None:
    src = tmp_path / "in.jsonl"
    src.write_text("{}\n{}\n", encoding="utf-8")
    with pytest.raises(DatasetError, match="item 2 is out of range"):
        write_subset(src, tmp_path / "out.jsonl", "jsonl", [0, 2])
