"""ShareGPT-style conversations: a JSON array of ``{"conversations": [{"from", "value"}]}``.

Roles: ``human`` (or ``user``), ``gpt`` (or ``assistant``, ``chatgpt``, ``bard``) and
``system``. Every human turn followed by a reply becomes one request: the real texts of
the conversation so far and that turn, with ``max_tokens`` the reply's length (counted by
the scenario's tokenizer), so a multi-turn conversation replays as a session. The file has
no times: the scenario's ``load`` sets the arrival process. Example::

    [{"id": "c1", "conversations": [
       {"from": "human", "value": "What is a load balancer?"},
       {"from": "gpt", "value": "A load balancer spreads requests over servers."},
       {"from": "human", "value": "And a sticky one?"},
       {"from": "gpt", "value": "It sends a client back to the same server."}]}]
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from lbtune import tokens
from lbtune.safety.files import MAX_TRACE_BYTES, read_text
from lbtune.scenario.limits import MAX_TOKENS
from lbtune.scenario.traces.rows import TraceRow, bad, check_count

MAX_TURNS = 1024
"""Most turns one conversation may hold (each reply becomes a request with the history)."""

_USER = {"human", "user"}
_REPLY = {"gpt", "assistant", "chatgpt", "bard", "model"}
_SYSTEM = {"system"}


def _records(text: str, shown: str) -> list[tuple[int, Any]]:
    """Each element of the top-level array with the line it starts on."""
    dec = json.JSONDecoder()
    pos = len(text) - len(text.lstrip())
    if not text[pos : pos + 1] == "[":
        raise bad(
            shown, text.count("\n", 0, pos) + 1, None, "expected a JSON array of conversations"
        )
    pos += 1
    out: list[tuple[int, Any]] = []
    line, counted = 1, 0  # newlines are counted once, as the position moves on
    while True:
        while pos < len(text) and text[pos] in " \t\r\n,":
            pos += 1
        if pos >= len(text):
            raise bad(shown, text.count("\n") + 1, None, "unterminated JSON array")
        if text[pos] == "]":
            return out
        line += text.count("\n", counted, pos)
        counted = pos
        try:
            obj, pos = dec.raw_decode(text, pos)
        except json.JSONDecodeError as exc:
            raise bad(
                shown, exc.lineno, None, f"invalid JSON at column {exc.colno}: {exc.msg}"
            ) from None
        except (ValueError, RecursionError) as exc:  # a huge integer, a deep nesting
            raise bad(shown, line, None, f"invalid JSON: {str(exc)[:200]}") from None
        out.append((line, obj))


def read(path: Path, shown: str) -> list[TraceRow]:
    rows: list[TraceRow] = []
    text = read_text(path, shown, max_bytes=MAX_TRACE_BYTES)
    for conv, (line, obj) in enumerate(_records(text, shown)):
        turns = obj.get("conversations") if isinstance(obj, dict) else None
        if not isinstance(turns, list):
            raise bad(shown, line, "conversations", "missing or not a list of turns")
        if len(turns) > MAX_TURNS:
            raise bad(shown, line, "conversations", f"more than {MAX_TURNS} turns")
        model = obj.get("model") if isinstance(obj.get("model"), str) else None
        history: list[tuple[str, str]] = []
        turn = 0
        for k, msg in enumerate(turns):
            col = f"conversations[{k}]"
            if not isinstance(msg, dict) or not isinstance(msg.get("value"), str):
                raise bad(shown, line, f"{col}.value", "each turn needs a text 'value'")
            who = str(msg.get("from", msg.get("role", ""))).lower()
            text = msg["value"]
            if who in _SYSTEM:
                history.append(("system", text))
            elif who in _USER:
                history.append(("user", text))
            elif who in _REPLY:
                if not history or history[-1][0] != "user":
                    history.append(("assistant", text))  # a reply with no question: context
                    continue
                prompt = max(sum(tokens.count(t) for _, t in history), 1)
                answer = max(tokens.count(text), 1)
                if max(prompt, answer) > MAX_TOKENS:
                    raise bad(
                        shown,
                        line,
                        f"{col}.value",
                        f"a turn of {max(prompt, answer)} tokens (with its history), more "
                        f"than the {MAX_TOKENS} lbtune sends",
                    )
                rows.append(
                    TraceRow(
                        line=line,
                        t=None,
                        prompt_tokens=prompt,
                        output_tokens=answer,
                        model=model,
                        messages=tuple(history),
                        session=conv,
                        turn=turn,
                    )
                )
                history.append(("assistant", text))
                turn += 1
                check_count(shown, line, len(rows))
            else:
                valid = "human, gpt, system (or user, assistant)"
                raise bad(shown, line, f"{col}.from", f"unknown role {who!r}; expected {valid}")
    return rows
