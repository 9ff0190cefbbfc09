"""Small trace files in every format, written by the tests themselves (no downloads)."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path

import pytest

T0 = 1_700_000_000.0
"""First request's wall time in the generated Azure trace."""


def azure_text(n: int, gap: float = 0.25) -> str:
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(n):
        stamp = datetime.fromtimestamp(T0 + i * gap, tz=UTC).strftime("%Y-%m-%d %H:%M:%S.%f")
        lines.append(f"{stamp}0,{40 + 7 * i},{5 + i % 9}")
    return "\n".join(lines) + "\n"


def burstgpt_text(n: int, gap: float = 0.5) -> str:
    lines = ["Timestamp,Model,Request tokens,Response tokens,Total tokens,Log Type"]
    for i in range(n):
        model = "ChatGPT" if i % 3 else "llama-3.1-8b-instruct"
        out = 0 if i == 4 else 3 + i
        lines.append(f"{i * gap:g},{model},{20 + i},{out},{20 + i + out},Conversation log")
    return "\n".join(lines) + "\n"


def mooncake_text(n: int, gap_ms: float = 100.0, shared: int = 2) -> str:
    """Every request shares its first ``shared`` blocks; the rest are its own."""
    rows = []
    for i in range(n):
        hashes = [*list(range(shared)), 1000 + 2 * i, 1001 + 2 * i]
        rows.append(
            {
                "timestamp": i * gap_ms,
                "input_length": 512 * (shared + 1) + 100 + i,
                "output_length": 4 + i % 5,
                "hash_ids": hashes,
            }
        )
    return "".join(json.dumps(r) + "\n" for r in rows)


def sharegpt_doc(n: int) -> list[dict[str, object]]:
    convs: list[dict[str, object]] = []
    for c in range(n):
        turns = [
            {"from": "human", "value": f"Question {c} about balancers?"},
            {"from": "gpt", "value": f"Answer {c}: spread the load evenly over replicas."},
        ]
        if c % 2 == 0:
            turns += [
                {"from": "human", "value": f"Follow-up {c}, what about stickiness?"},
                {"from": "gpt", "value": "Send a session back to its replica."},
            ]
        convs.append({"id": f"c{c}", "conversations": turns})
    return convs


@pytest.fixture
def traces(tmp_path: Path) -> dict[str, Path]:
    """One small file per format (``lbtune`` is added by the tests that need a run)."""
    files = {
        "azure": tmp_path / "azure.csv",
        "burstgpt": tmp_path / "burst.csv",
        "mooncake": tmp_path / "mooncake.jsonl",
        "sharegpt": tmp_path / "sharegpt.json",
    }
    files["azure"].write_text(azure_text(20))
    files["burstgpt"].write_text(burstgpt_text(12))
    files["mooncake"].write_text(mooncake_text(10))
    files["sharegpt"].write_text(json.dumps(sharegpt_doc(6), indent=1))
    return files
