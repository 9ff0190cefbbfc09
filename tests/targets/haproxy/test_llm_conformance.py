"""One scheduler, two runtimes: the ``llm`` scheduler's Lua (``scheduler.lua``, run by a
Lua 5.3 interpreter with HAProxy's ``core`` stubbed: ``llm_harness.lua``) and the twin's
model of it (:class:`lbtune.targets.haproxy.twin.llm.LlmScheduler`) get the same knobs,
facts, replica states (scraped ``/metrics``), requests and releases, over generated cases,
and must make the same decision for every request: the same server, a refusal, or the
fallback. Ties and ``p2c`` take the first choice on both sides (their random sequences
differ by design). A third of the cases run ``mode predict`` (v2) with engine-rate facts
present or missing; their holds are left to the live tests (``queue_timeout_ms 0``: the
harness cannot sleep inside a pick)."""

from __future__ import annotations

import random
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from lbtune.targets.haproxy.llm import lua_source
from lbtune.targets.haproxy.twin.llm import LlmScheduler
from lbtune.twin.routing import ClusterView, Refuse

LUA = shutil.which("lua5.3")
HARNESS = Path(__file__).with_name("llm_harness.lua")
CASES = 2000
SERVERS = ("a", "b", "c", "d")
BACKENDS = {"be8b": SERVERS, "be70b": ("a", "b")}

pytestmark = pytest.mark.skipif(LUA is None, reason="lua5.3 needed (apt-get install lua5.3)")


@dataclass(frozen=True)
class Req:
    """A request as the scheduler reads it (the rest of RequestView, unused, is empty)."""

    index: int
    body: bytes
    session_id: str | None
    model: str = "m"
    api: str = "chat"
    stream: bool = True
    prompt_text: str = ""
    prompt_tokens: int = 0
    prompt_ids: Sequence[int] = ()


@dataclass(frozen=True)
class Rep:
    """A replica's ``/metrics`` as the scrape reads it."""

    name: str
    num_waiting: int
    kv_usage: float
    ttft_sum_s: float
    ttft_count: int
    gpu: str = "g"
    models: tuple[str, ...] = ("m",)
    num_running: int = 0
    kv_capacity_bytes: int = 0
    in_flight: int = 0
    itl_sum_s: float = 0.0
    itl_count: int = 0
    prompt_tokens_total: int = 0
    queue_sum_s: float = 0.0


class First:
    """The first choice, as ``math.random`` returns 1 in the harness."""

    def randrange(self, n: int) -> int:
        return 0


@dataclass(frozen=True)
class Event:
    kind: str
    """time, metrics, scrape, release or pick."""
    ms: int = 0
    rep: Rep | None = None
    req: Req | None = None
    backend: str = ""


@dataclass
class Case:
    knobs: dict[str, str]
    facts: dict[str, str]
    lines: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)


def _knobs(rng: random.Random) -> dict[str, str]:
    k = {f"w_{w}": f"{rng.choice([0, 0.25, 0.5, 1, 1.5, 2])}" for w in (
        "queue", "kv", "load", "ttft", "prefix", "session")}  # fmt: skip
    k |= {
        "picker": rng.choice(["max", "max", "p2c"]),
        "admission": rng.choice(["route", "reject"]),
        "kv_headroom": rng.choice(["0", "0.05", "0.2"]),
        "stale_ms": rng.choice(["250", "1000", "100000"]),
        "block_tokens": str(rng.choice([2, 4, 8])),
        "max_blocks": str(rng.choice([4, 16])),
        "lru_size": str(rng.choice([4, 8, 64])),
        "short_tokens": str(rng.choice([20, 60])),
        "long_tokens": str(rng.choice([100, 300])),
        "short_bias": rng.choice(["0", "0.3"]),
        "long_bias": rng.choice(["0", "0.2", "1"]),
        "queue_ceiling": rng.choice(["4", "16"]),
        "ttft_ceiling_s": rng.choice(["0.5", "1"]),
    }
    if rng.random() < 1 / 3:
        k |= {
            "mode": "predict",
            "queue_timeout_ms": "0",
            "ttft_slo_ms": rng.choice(["20", "100", "1000"]),
            "tpot_slo_ms": rng.choice(["8", "30", "150"]),
            "w_decode": rng.choice(["0", "0.5", "1"]),
            "out_tokens": rng.choice(["16", "256"]),
            "prefill_tps": rng.choice(["400", "4000"]),
            "step_ms": rng.choice(["5", "30"]),
        }
    return k


def _facts(rng: random.Random) -> dict[str, str]:
    f: dict[str, str] = {}
    for s in SERVERS:
        if rng.random() < 0.7:
            f[f"kvcap.{s}"] = str(rng.choice([2000, 8000, 40000]))
        if rng.random() < 0.3:
            f[f"long.{s}"] = "1"
    for be in BACKENDS:
        if rng.random() < 0.7:
            f[f"kvbpt.{be}"] = str(rng.choice([4, 16, 64]))
        if rng.random() < 0.3:
            f[f"ctx.{be}"] = str(rng.choice([100, 400]))
        for s in BACKENDS[be]:  # engine rates (mode predict), each maybe missing
            if rng.random() < 0.7:
                f[f"tps.{be}.{s}"] = str(rng.choice([500, 3000, 20000]))
            if rng.random() < 0.7:
                f[f"step.{be}.{s}"] = str(rng.choice([0.004, 0.012, 0.06]))
            if rng.random() < 0.7:
                f[f"stepk.{be}.{s}"] = str(rng.choice([0.0001, 0.001]))
    for s in SERVERS:
        if rng.random() < 0.7:
            f[f"ovh.{s}"] = str(rng.choice([0.007, 0.02]))
    if rng.random() < 0.5:
        f["time_scale"] = rng.choice(["1", "4"])
    return f


def _body(rng: random.Random, prefixes: Sequence[str]) -> bytes:
    tail = "".join(rng.choice("xyz ") for _ in range(rng.randrange(0, 400)))
    text = rng.choice(prefixes) + tail
    out = f'"max_tokens":{rng.randrange(1, 600)},' if rng.random() < 0.7 else ""
    head = '{"model":"m",' + out
    return (head + '"messages":[{"role":"user","content":"' + text + '"}]}').encode()


def make_case(seed: int) -> Case:
    rng = random.Random(seed)
    case = Case(_knobs(rng), _facts(rng))
    prefixes = ["".join(rng.choice("abcd") for _ in range(rng.randrange(8, 300))) for _ in range(4)]
    case.lines = ["case"]
    case.lines += [f"knob {k} {v}" for k, v in case.knobs.items()]
    case.lines += [f"fact {k} {v}" for k, v in case.facts.items()]
    case.lines += [f"backend {be} {' '.join(s)}" for be, s in BACKENDS.items()]
    case.lines.append(f"backend all {' '.join(SERVERS)}")
    ms, ttft, itl = 0, dict.fromkeys(SERVERS, (0.0, 0)), dict.fromkeys(SERVERS, (0.0, 0))
    prompt = dict.fromkeys(SERVERS, (0, 0.0))  # prompt tokens, queue seconds: cumulative
    picked: list[int] = []
    for i in range(40):
        ms += 125 * rng.randrange(0, 5)  # multiples of 1/8 s: exact on both sides
        case.lines.append(f"time {ms}")
        case.events.append(Event("time", ms=ms))
        roll = rng.random()
        if roll < 0.15:
            for s in SERVERS:
                total, n = ttft[s]
                n += rng.randrange(0, 3)
                total = round(total + rng.random() * 0.8 * n, 4)
                ttft[s] = (total, n)
                waiting = rng.choice([0, rng.randrange(0, 20)])
                running = rng.choice([0, rng.randrange(0, 40)])
                isum, icount = itl[s]
                tokens = rng.choice([0, rng.randrange(0, 200)])
                isum = round(isum + rng.choice([0.004, 0.03, 0.09]) * tokens, 4)
                icount += tokens
                itl[s] = (isum, icount)
                ptok, qsum = prompt[s]
                ptok += rng.randrange(0, 3000)
                qsum = round(qsum + rng.choice([0.0, 0.05, 2.0]) * rng.random(), 4)
                prompt[s] = (ptok, qsum)
                rep = Rep(
                    s, waiting, round(rng.random(), 4), total, n, num_running=running,
                    itl_sum_s=isum, itl_count=icount, prompt_tokens_total=ptok, queue_sum_s=qsum,
                )  # fmt: skip
                case.lines.append(
                    f"metrics {s} {rep.num_waiting} {rep.kv_usage} {total} {n} {running}"
                    f" {isum} {icount} {ptok} {qsum}"
                )
                case.events.append(Event("metrics", rep=rep))
            case.lines.append("scrape")
            case.events.append(Event("scrape"))
        elif roll < 0.3 and picked:
            j = picked.pop(rng.randrange(len(picked)))
            case.lines.append(f"release {j}")
            case.events.append(Event("release", ms=j))
        else:
            be = rng.choice(list(BACKENDS))
            sid = rng.choice([None, "s1", "s2", "s3", "s4", "s5"])
            body = _body(rng, prefixes)
            case.lines += [f"pick {i} {be} {sid or '-'} {len(body)}", body.decode()]
            case.events.append(Event("pick", req=Req(i, body, sid), backend=be))
            picked.append(i)
    return case


def twin_decisions(case: Case) -> list[str]:
    sched = LlmScheduler(case.knobs, case.facts, list(SERVERS))
    sched.rng = First()  # type: ignore[assignment]
    out: list[str] = []
    now = 0.0
    metrics: dict[str, Rep] = {}
    reqs: dict[int, Req] = {}
    for e in case.events:
        if e.kind == "time":
            now = e.ms / 1000
        elif e.kind == "metrics" and e.rep is not None:
            metrics[e.rep.name] = e.rep
        elif e.kind == "scrape":
            sched.scrape(now, ClusterView(dict(metrics)))
        elif e.kind == "release":
            sched.release(reqs[e.ms])
        elif e.req is not None:
            reqs[e.req.index] = e.req
            got = sched.decide(e.req, e.backend, list(BACKENDS[e.backend]), now)
            name = "reject" if isinstance(got, Refuse) else "fallback" if got is None else got
            assert isinstance(name, str), got
            out.append(f"{e.req.index} {name}")
    return out


def test_the_lua_and_the_twin_make_the_same_decisions(tmp_path: Path) -> None:
    assert LUA is not None
    script = tmp_path / "scheduler.lua"
    script.write_text(lua_source())
    cases = [make_case(seed) for seed in range(CASES)]
    events = "\n".join(line for c in cases for line in c.lines) + "\n"
    p = subprocess.run(
        [LUA, str(HARNESS), str(script)], input=events, capture_output=True, text=True,
        timeout=120, check=False,
    )  # fmt: skip
    assert p.returncode == 0, p.stderr[-2000:]
    lua_out = p.stdout.splitlines()
    per_case = [twin_decisions(c) for c in cases]
    twin_out = [d for ds in per_case for d in ds]
    assert len(lua_out) == len(twin_out) > CASES * 20
    kinds = {d.split()[1] for d in lua_out}
    assert {"a", "b", "c", "d", "reject"} <= kinds  # the cases reach every outcome
    predicted = {
        d.split()[1] for c, ds in zip(cases, per_case, strict=True) for d in ds
        if c.knobs.get("mode") == "predict"
    }  # fmt: skip
    assert {"a", "b", "c", "d"} <= predicted
    first = next(
        (i for i, (a, b) in enumerate(zip(lua_out, twin_out, strict=True)) if a != b), None
    )
    assert first is None, f"decision {first}: lua {lua_out[first]!r}, twin {twin_out[first]!r}"
