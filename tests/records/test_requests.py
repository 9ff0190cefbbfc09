"""Records: JSONL (incremental, torn-write tolerant) and Parquet round trips."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from lbtune.errors import ConfigError
from lbtune.loadgen.recordio import (
    RecordWriter,
    decode_line,
    encode_record,
    finalize,
    is_header,
    read_records,
    write_parquet,
)
from lbtune.records.requests import RequestRecord


def rec(i: int, **kw: object) -> RequestRecord:
    base: dict[str, object] = dict(
        request_id=f"r{i}",
        index=i,
        model="m",
        api="chat",
        stream=True,
        sent_at=100.0 + i,
        ended_at=101.5 + i,
        outcome="ok",
        status_code=200,
        scheduled_at=99.999 + i,
        headers_at=100.01 + i,
        first_token_at=100.05 + i,
        chunk_times=(100.05 + i, 100.0612345678 + i, 100.07 + i),
        prompt_tokens=12,
        output_tokens=3,
        replica="h100-0",
        priority=1,
        prefix_group=2,
        session_id=7,
        worker="w0",
    )
    base.update(kw)
    return RequestRecord(**base)  # type: ignore[arg-type]


def test_parquet_round_trip(tmp_path: Path) -> None:
    rs = [
        rec(0),
        rec(
            1,
            outcome="timeout",
            first_token_at=None,
            chunk_times=(),
            error="x",
            status_code=None,
            replica=None,
            scheduled_at=None,
        ),
    ]
    p = write_parquet(rs, tmp_path / "requests.parquet")
    assert read_records(p) == rs


def test_jsonl_incremental_and_torn_line(tmp_path: Path) -> None:
    w = RecordWriter(tmp_path / "records-w0.jsonl")
    w.add(rec(0))
    w.flush()
    w.add(rec(1))
    w.close()
    with (tmp_path / "records-w0.jsonl").open("a") as f:
        f.write('["torn", 1, ')  # a crash mid-write
    w2 = RecordWriter(tmp_path / "records-w1.jsonl")
    w2.add(rec(2, worker="w1"))
    w2.close()
    assert [r.index for r in read_records(tmp_path)] == [0, 1, 2]
    out = finalize(tmp_path)
    back = read_records(out)
    assert back == [rec(0), rec(1), rec(2, worker="w1")]  # chunk_times exact (float64)


def test_a_line_is_the_type_adapters_json_and_validated_back() -> None:
    r = rec(7, chunk_times=(1.0, 2.5), timing="kernel", first_token_bound_s=0.0)
    line = encode_record(r)
    assert line.endswith("\n") and not is_header(line)
    assert json.loads(line)["chunk_times"] == [1.0, 2.5]
    assert decode_line(line) == r
    obj = json.loads(line)
    obj["added_by_a_newer_lbtune"] = 1  # unknown fields are ignored
    assert decode_line(json.dumps(obj)) == r


def test_a_corrupt_record_is_one_config_error_line(tmp_path: Path) -> None:
    obj = json.loads(encode_record(rec(0)))
    obj["outcome"] = "exploded"
    with pytest.raises(ConfigError, match="not an lbtune request record \\(outcome: "):
        decode_line(json.dumps(obj))
    path = write_parquet([rec(0)], tmp_path / "requests.parquet")
    table = pq.read_table(path)
    bad = table.set_column(
        table.column_names.index("outcome"), "outcome", pa.array(["exploded"], pa.string())
    )
    pq.write_table(bad, path)
    with pytest.raises(ConfigError, match=r"requests\.parquet: not lbtune.s request records"):
        read_records(path)
