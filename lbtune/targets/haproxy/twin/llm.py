"""The LLM scheduler (``algorithm: llm``, ``lua/scheduler.lua``) in the twin.

The same decisions as the Lua, step for step (see the Lua's header): per request, in its
model backend, *filter* the servers whose free KV holds the request's estimated tokens
(``body bytes / 4``; from the last scrape when it is fresh, else from the scheduler's own
in-flight tokens), *score* them (queue, KV headroom, own load, recent TTFT, prefix
affinity over a two-generation LRU of block hashes, session affinity, length-class
bias), *pick* the highest score (random tie-break) or the better of two random
candidates, and when nothing fits *route* anyway, *reject* (429) or *hold* (retry every
``refresh_ms / 2`` up to ``queue_timeout_ms``, then 429). A request's tokens count as
in flight from its pick until its response headers pass (``http-response
lua.llm_release``). A timer scrapes every replica every ``refresh_ms`` (plus the scrapes'
own time): waiting and running requests, KV usage and the mean TTFT since the previous
scrape.

Under ``mode predict`` (v2) the score and pick are replaced by a prediction per candidate
(:mod:`.predict`, the Lua's ``predict_pick``); :meth:`LlmScheduler.decide` dispatches on
``mode``, and holds a request the prediction holds.

Defaults of the knobs not in the params, and of the Lua's fixed settings
(``max_blocks``, ``bytes_per_token``, ``retry_after_s``), are read from the Lua's own
``DEFAULTS`` table, so that the two cannot drift apart. Not reproduced: the Lua's own
random number sequence (ties and ``p2c`` draw from the twin's seeded generator), and the
fault injection keys.
"""

from __future__ import annotations

import hashlib
import math
import random
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache

from lbtune.targets.haproxy import llm as lua
from lbtune.targets.haproxy.twin.predict import Ask, Predictor
from lbtune.twin.routing import ClusterView, Decision, Refuse, RequestView, Retry

__all__ = ["LlmScheduler", "lua_defaults"]

SCRAPE_S = 0.002
"""Wall seconds one replica's ``/metrics`` scrape takes (the task scrapes them in turn)."""
PENDING_MAX_S = 120.0
"""The Lua's ``PENDING_MAX_MS``: unreleased tokens are dropped after this long."""
_ENTRY = re.compile(r'(\w+)\s*=\s*("[^"]*"|[-\d.]+)')
_MAX_TOKENS = re.compile(rb'"max_tokens"\s*:\s*(\d+)')


@cache
def lua_defaults() -> dict[str, float | str]:
    """The ``DEFAULTS`` table of ``scheduler.lua``."""
    src = lua.lua_source()
    start = src.index("local DEFAULTS = {")
    block = src[start : src.index("\n}", start)]
    out: dict[str, float | str] = {}
    for name, value in _ENTRY.findall(block):
        out[name] = value.strip('"') if value.startswith('"') else float(value)
    return out


@dataclass
class _Replica:
    waiting: float = 0.0
    kv: float = 0.0
    ttft: float = 0.0
    t: float | None = None
    inflight: float = 0.0
    since: float = 0.0
    lru_new: set[bytes] = field(default_factory=set)
    lru_old: set[bytes] = field(default_factory=set)
    last_sum: float | None = None
    last_n: int | None = None

    def has(self, h: bytes) -> bool:
        return h in self.lru_new or h in self.lru_old

    def matched(self, hashes: Sequence[bytes]) -> int:
        """Leading blocks of ``hashes`` the replica was sent before (the Lua's ``matched``)."""
        m = 0
        for i, h in enumerate(hashes):
            if not self.has(h):
                break
            m = i + 1
        return m

    def add(self, hashes: Sequence[bytes], lru_size: int) -> None:
        cap = max(1, lru_size // 2)
        for h in hashes:
            if h not in self.lru_new:
                if len(self.lru_new) >= cap:
                    self.lru_old, self.lru_new = self.lru_new, set()
                self.lru_new.add(h)


@dataclass
class _Pick:
    srv: str
    tokens: float
    t: float


class LlmScheduler:
    """The Lua scheduler's state and decisions for one HAProxy (shared by its backends)."""

    def __init__(
        self,
        knobs: Mapping[str, str | float],
        facts: Mapping[str, str],
        names: Sequence[str],
        scrape_s: Mapping[str, float] | None = None,
    ) -> None:
        """``scrape_s``: how long each replica's ``/metrics`` takes to answer where it was
        measured (``lbtune twin fit --steady``), else :data:`SCRAPE_S`."""
        base = lua_defaults()
        self.k: dict[str, float | str] = dict(base)
        for key, value in knobs.items():
            self.k[key] = float(value) if isinstance(base.get(key), float) else str(value)
        self.facts = {key: _num(v) for key, v in facts.items()}
        self.names = list(names)
        self.scrape_s = {n: (scrape_s or {}).get(n, SCRAPE_S) for n in self.names}
        self.state = {n: _Replica() for n in self.names}
        self.pending: dict[int, _Pick] = {}
        self.holds: dict[int, float] = {}
        self.sessions: dict[str, str] = {}
        """The newer generation of session → server (the Lua's ``sessions_new``)."""
        self.sessions_old: dict[str, str] = {}
        self.rng = random.Random(0)
        self.next_scrape = 0.0
        self.predictor = Predictor(self, self.names)
        """``mode predict``: the replicas' backlogs and rates, the predictions and the pick."""

    def num(self, key: str) -> float:
        v = self.k[key]
        return v if isinstance(v, float) else float(v)

    # -- per request ---------------------------------------------------------------------

    def decide(
        self, req: RequestView, backend: str, servers: Sequence[str], now: float
    ) -> str | Decision | None:
        """A server name (``use-server``), a refusal or retry, or ``None`` (fallback)."""
        bpt = self.num("bytes_per_token")
        tokens = max(1.0, len(req.body) / bpt)
        text = _prompt_of(req.body)
        if text is None:
            return None
        hashes = _block_hashes(
            text, int(max(1.0, self.num("block_tokens")) * bpt), self.num("max_blocks")
        )
        t = now * 1000.0
        up = list(servers)  # health checks are not simulated: every server is up
        cands = [n for n in up if self._fits(n, tokens, backend, t)]
        if not cands:
            mode = self.k["admission"]
            if mode == "reject":
                return self._refuse(req)
            if mode == "hold":
                deadline = self.holds.setdefault(req.index, t + self.num("queue_timeout_ms"))
                if t >= deadline:
                    return self._refuse(req)
                return Retry(max(10, math.floor(self.num("refresh_ms") / 2)) / 1000.0)
            cands = up
        cands = sorted(cands)
        if self.k["mode"] == "predict":
            m = _MAX_TOKENS.search(req.body)
            ask = Ask(
                hashes, tokens, max(1.0, self.num("block_tokens")),
                float(m.group(1)) if m else self.num("out_tokens"),
            )  # fmt: skip
            srv_or_none = self.predictor.pick(cands, ask, backend, t, expired=False)
            if srv_or_none is None:
                deadline = self.holds.setdefault(req.index, t + self.num("queue_timeout_ms"))
                if t < deadline:
                    return Retry(max(10, math.floor(self.num("refresh_ms") / 2)) / 1000.0)
                srv_or_none = self.predictor.pick(cands, ask, backend, t, expired=True)
                assert srv_or_none is not None
            srv = srv_or_none
        else:
            srv = self._pick(cands, self._scores(cands, hashes, req, tokens, t))
        self.state[srv].add(hashes, int(self.num("lru_size")))
        if req.session_id:
            self._session_put(req.session_id, srv)
        self.holds.pop(req.index, None)
        st = self.state[srv]
        st.inflight += tokens
        st.since += tokens
        self.pending[req.index] = _Pick(srv, tokens, now)
        return srv

    def _session_put(self, sid: str, srv: str) -> None:
        """The Lua's ``session_put``: two generations of ``lru_size / 2`` sessions each."""
        if sid not in self.sessions and len(self.sessions) >= max(
            1, int(self.num("lru_size")) // 2
        ):
            self.sessions_old, self.sessions = self.sessions, {}
        self.sessions[sid] = srv

    def _refuse(self, req: RequestView) -> Refuse:
        self.holds.pop(req.index, None)
        return Refuse(429, "No replica has KV cache room for this request; retry later")

    def fact(self, key: str) -> float | None:
        """A numeric fact of the map (``None`` when absent or not a number)."""
        v = self.facts.get(key)
        return v if isinstance(v, float) else None

    def _fresh(self, r: _Replica, t: float) -> bool:
        return r.t is not None and t - r.t <= self.num("stale_ms")

    def _fits(self, name: str, tokens: float, backend: str, t: float) -> bool:
        r = self.state[name]
        cap_bytes = self.fact(f"kvcap.{name}")
        bpt = self.fact(f"kvbpt.{backend}")
        cap = cap_bytes / bpt if cap_bytes is not None and bpt else None
        ctx = self.fact(f"ctx.{backend}")
        if ctx is not None and tokens > ctx:
            return False
        headroom = self.num("kv_headroom")
        if self._fresh(r, t):
            if cap is None:
                return r.kv < 1 - headroom
            return tokens + r.since <= (1 - r.kv - headroom) * cap
        if cap is None:
            return True
        return r.inflight + tokens <= (1 - headroom) * cap

    def _scores(
        self,
        cands: Sequence[str],
        hashes: Sequence[bytes],
        req: RequestView,
        tokens: float,
        t: float,
    ) -> dict[str, float]:
        k = self.num
        max_load = max(self.state[c].inflight for c in cands)
        sid = req.session_id
        session = (self.sessions.get(sid) or self.sessions_old.get(sid)) if sid else None
        cls = (
            "short" if tokens < k("short_tokens") else "long" if tokens >= k("long_tokens") else ""
        )
        scores: dict[str, float] = {}
        for c in cands:
            r = self.state[c]
            load = 1 - r.inflight / max_load if max_load > 0 else 1.0
            queue = kv = ttft = load
            if self._fresh(r, t):
                queue = 1 - _clamp01(r.waiting / k("queue_ceiling"))
                kv = 1 - _clamp01(r.kv)
                ttft = 1 - _clamp01(r.ttft / k("ttft_ceiling_s"))
            prefix = r.matched(hashes) / len(hashes) if hashes else 0.0
            s = (
                k("w_queue") * queue
                + k("w_kv") * kv
                + k("w_load") * load
                + k("w_ttft") * ttft
                + k("w_prefix") * prefix
                + k("w_session") * (1.0 if session == c else 0.0)
            )
            long_srv = self.fact(f"long.{c}") == 1
            if cls == "long" and long_srv:
                s += k("long_bias")
            if cls == "short" and not long_srv:
                s += k("short_bias")
            scores[c] = s
        return scores

    def _pick(self, cands: Sequence[str], scores: Mapping[str, float]) -> str:
        if self.k["picker"] == "p2c" and len(cands) > 2:
            a = self.rng.randrange(len(cands))
            b = self.rng.randrange(len(cands) - 1)
            if b >= a:
                b += 1
            return cands[b] if scores[cands[b]] > scores[cands[a]] else cands[a]
        best, ties = -math.inf, []
        for c in cands:
            s = scores[c]
            if s > best + 1e-9:
                best, ties = s, [c]
            elif s >= best - 1e-9:
                ties.append(c)
        return ties[self.rng.randrange(len(ties))]

    def set_time_scale(self, scale: float) -> None:
        """The cluster's time scale, as the map's ``time_scale`` fact tells the Lua (the
        twin learns it from the run, not from a site)."""
        self.facts["time_scale"] = float(scale)

    def release(self, req: RequestView) -> None:
        """``http-response lua.llm_release``: its tokens leave the in-flight load."""
        p = self.pending.pop(req.index, None)
        if p is not None:
            r = self.state[p.srv]
            r.inflight = max(0.0, r.inflight - p.tokens)

    # -- the scrape task ------------------------------------------------------------------

    def period_s(self) -> float:
        return max(10.0, math.floor(self.num("refresh_ms"))) / 1000.0 + sum(self.scrape_s.values())

    def scrape(self, now: float, cluster: ClusterView) -> None:
        """One round of the task: every replica's gauges and TTFT, then the pending prune."""
        t = now * 1000.0
        for name in self.names:
            rep = cluster.replicas.get(name)
            if rep is None:
                continue
            r = self.state[name]
            r.waiting, r.kv = float(rep.num_waiting), rep.kv_usage
            s, n = rep.ttft_sum_s, rep.ttft_count
            spent = None
            if r.last_n is not None and r.last_sum is not None and n > r.last_n:
                spent = s - r.last_sum
                r.ttft = spent / (n - r.last_n)
            r.last_sum, r.last_n = s, n
            self.predictor.scrape(name, rep, spent)
            r.t = t
            r.since = 0.0
        for index, p in list(self.pending.items()):
            if now - p.t > PENDING_MAX_S:
                self.pending.pop(index)
                r = self.state[p.srv]
                r.inflight = max(0.0, r.inflight - p.tokens)
        self.next_scrape = now + self.period_s()


def _num(v: str) -> float | str:
    try:
        return float(v)
    except ValueError:
        return v


def _clamp01(x: float) -> float:
    if x != x or x < 0:
        return 0.0
    return min(1.0, x)


def _prompt_of(body: bytes) -> bytes | None:
    """The body from its ``"messages":`` (or ``"prompt":``) key on, as the Lua reads it."""
    if not body.lstrip().startswith(b"{"):
        return None
    m = re.search(rb'"messages"\s*:', body) or re.search(rb'"prompt"\s*:', body)
    return None if m is None else body[m.start() :]


def _block_hashes(text: bytes, block_bytes: int, max_blocks: float) -> list[bytes]:
    """A chained hash per leading block (equal exactly when the prefixes are equal)."""
    n = int(min(max_blocks, len(text) // block_bytes))
    out: list[bytes] = []
    h = b""
    for i in range(n):
        h = hashlib.blake2b(
            h + text[i * block_bytes : (i + 1) * block_bytes], digest_size=16
        ).digest()
        out.append(h)
    return out
