-- lbtune's LLM-aware endpoint scheduler for HAProxy 2.6 (Lua 5.3), rendered by
-- lbtune/targets/haproxy (algorithm: llm). See docs/targets.md, "The LLM scheduler".
--
-- Per request, in a model backend (the backend already holds only the replicas that
-- serve the request's model), `http-request lua.llm_pick`:
--   filter  replicas that are UP and whose free KV holds the request's estimated tokens;
--   admit   when no replica has room: route anyway, 429 + Retry-After, or hold and retry;
-- then, in `mode score` (v1):
--   score   weighted, 0..1 scorers: queue, KV headroom, own in-flight tokens, recent TTFT,
--           prefix affinity (block hashes vs a bounded per-replica LRU), session affinity,
--           plus a length-class bias;
--   pick    highest score (random tie-break) or power of two choices;
-- or in `mode predict` (v2):
--   predict each replica's time to first token: its front-end time, the prefill work already
--           routed there and not yet done (a per-replica backlog in GPU seconds that drains
--           at one GPU second a second), then the step that prefills this prompt's uncached
--           tokens (prompt minus the prefix blocks that replica holds): their time at its
--           prefill rate and a decode step of its running batch on a smooth roofline; and
--           its time per output token: a decode step at its running batch plus this one, or
--           the mean inter-token latency it showed since the last scrape if longer;
--   cap     keep the replicas that meet both SLOs (ttft_slo_ms, tpot_slo_ms); when none
--           does but one would with its queue drained, hold the request in the balancer
--           (re-predicting every refresh_ms / 2) up to queue_timeout_ms, then route it
--           anyway: never a 429 for latency;
--   pick    the lowest predicted TTFT + w_decode x its output tokens (max_tokens) x TPOT.
-- Rates (tps.<backend>.<server> tokens/s, step.<backend>.<server> and stepk.<...> seconds,
-- ovh.<server> seconds, all GPU seconds; time_scale divides them) are facts of the map; a
-- replica without them is predicted with what its /metrics showed (its prefill tokens a
-- second between queue and first token, its last inter-token latency), else defaults.
-- The choice goes to txn.llm_srv (the backend's `use-server` lines read it). Anything that
-- goes wrong leaves txn.llm_srv unset: the backend's own `balance leastconn` places the
-- request, and lbtune_llm_fallback_total{reason} counts it.
--
-- Knobs and per-replica facts live in a map file (LBTUNE_LLM_MAP): `set map` on the
-- runtime API changes them live. State is refreshed by a task that scrapes each
-- replica's /metrics every refresh_ms.

local MAP_PATH = os.getenv("LBTUNE_LLM_MAP")
local knobs = nil
if MAP_PATH ~= nil and MAP_PATH ~= "" then
    knobs = Map.new(MAP_PATH, Map._str)
end

local DEFAULTS = {
    w_queue = 1.0, w_kv = 1.0, w_load = 1.0, w_ttft = 0.5, w_prefix = 1.0, w_session = 1.0,
    picker = "max", refresh_ms = 250, stale_ms = 2000,
    block_tokens = 64, max_blocks = 16, lru_size = 2048,
    short_tokens = 512, long_tokens = 4096, short_bias = 0.0, long_bias = 0.2,
    admission = "route", kv_headroom = 0.05, queue_timeout_ms = 5000, retry_after_s = 1,
    queue_ceiling = 16, ttft_ceiling_s = 1.0, bytes_per_token = 4,
    all_backend = "all", session_header = "x-session-id", fault = "",
    mode = "score", ttft_slo_ms = 1000, tpot_slo_ms = 150, w_decode = 1.0,
    out_tokens = 256, prefill_tps = 4000, step_ms = 30,
}

local function knob(name)
    local v = nil
    if knobs ~= nil then
        v = knobs:lookup(name)
    end
    if v == nil or v == "" then
        return DEFAULTS[name]
    end
    if type(DEFAULTS[name]) == "number" then
        return tonumber(v) or DEFAULTS[name]
    end
    return v
end

local function fact(name)
    if knobs == nil then
        return nil
    end
    local v = knobs:lookup(name)
    if v == nil or v == "" then
        return nil
    end
    return tonumber(v) or v
end

-- ---------------------------------------------------------------------------------------
-- state

local replicas = {}   -- server name -> {waiting, kv, ttft, t, inflight, lru_new, lru_old, n_new}
local pending = {}    -- request id -> {srv, tokens, t}
local sessions_new, sessions_old, n_sessions = {}, {}, 0
local counters = {
    fallback = {}, picks = {}, rejected = 0, held = 0, hold_expired = 0,
    scrapes = 0, scrape_errors = 0,
    truncated = 0, cost_us_sum = 0, cost_n = 0, cost_us_max = 0,
}
local next_id = 0
local COST_BUCKETS = { 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000, 5000 }
local cost_hist = {}
for i = 1, #COST_BUCKETS + 1 do cost_hist[i] = 0 end

local function now_ms()
    local t = core.now()
    return t.sec * 1000 + t.usec / 1000
end

local function replica(name)
    local r = replicas[name]
    if r == nil then
        r = { waiting = 0, kv = 0, ttft = 0, t = nil, inflight = 0,
              lru_new = {}, lru_old = {}, n_new = 0, up = true, since = 0,
              running = 0, since_n = 0, backlog = 0, bt = nil, itl = 0,
              itl_last = 0, tps_seen = 0 }
        replicas[name] = r
    end
    return r
end

local function count_fallback(reason)
    counters.fallback[reason] = (counters.fallback[reason] or 0) + 1
end

-- ---------------------------------------------------------------------------------------
-- request parsing

-- The prompt text (from the first "messages" content or "prompt") and whether the body
-- looks like a JSON object at all. Only the buffered part of the body is visible.
local function prompt_of(body)
    if body == nil or not body:find("^%s*{") then
        return nil
    end
    local s = body:find('"messages"%s*:', 1) or body:find('"prompt"%s*:', 1)
    if s == nil then
        return nil
    end
    return body:sub(s)
end

local function block_hashes(txn, text, block_bytes, max_blocks)
    local out = {}
    local h = ""
    local n = math.min(max_blocks, math.floor(#text / block_bytes))
    for i = 1, n do
        local piece = text:sub((i - 1) * block_bytes + 1, i * block_bytes)
        h = txn.c:xxh64(h .. piece)
        out[i] = h
    end
    return out
end

local function lru_has(r, h)
    return r.lru_new[h] ~= nil or r.lru_old[h] ~= nil
end

-- Two generations: each holds up to lru_size/2 hashes; the older one is dropped whole.
local function lru_add(r, hashes, lru_size)
    for _, h in ipairs(hashes) do
        if r.lru_new[h] == nil then
            if r.n_new >= math.max(1, lru_size // 2) then
                r.lru_old, r.lru_new, r.n_new = r.lru_new, {}, 0
            end
            r.lru_new[h] = true
            r.n_new = r.n_new + 1
        end
    end
end

local function session_get(id)
    return sessions_new[id] or sessions_old[id]
end

local function session_put(id, srv, lru_size)
    if sessions_new[id] == nil then
        if n_sessions >= math.max(1, lru_size // 2) then
            sessions_old, sessions_new, n_sessions = sessions_new, {}, 0
        end
        n_sessions = n_sessions + 1
    end
    sessions_new[id] = srv
end

-- ---------------------------------------------------------------------------------------
-- filter, score, pick

local function clamp01(x)
    if x ~= x then return 0 end
    if x < 0 then return 0 end
    if x > 1 then return 1 end
    return x
end

-- Does `name` have room for `tokens` more KV tokens of backend `be`?
local function fits(name, r, tokens, be, fresh, headroom)
    local cap_bytes = fact("kvcap." .. name)
    local bpt = fact("kvbpt." .. be)
    local cap = nil
    if type(cap_bytes) == "number" and type(bpt) == "number" and bpt > 0 then
        cap = cap_bytes / bpt
    end
    local ctx = fact("ctx." .. be)
    if type(ctx) == "number" and tokens > ctx then
        return false
    end
    if fresh then
        if cap == nil then
            return r.kv < 1 - headroom
        end
        -- tokens routed there since the scrape are not in its kv yet
        return tokens + r.since <= (1 - r.kv - headroom) * cap
    end
    if cap == nil then
        return true
    end
    return r.inflight + tokens <= (1 - headroom) * cap
end

-- candidates: list of {name, r}; returns {name -> score} and the score parts
local function score_all(cands, ctx)
    local t = now_ms()
    local stale = knob("stale_ms")
    local qc, tc = knob("queue_ceiling"), knob("ttft_ceiling_s")
    local w = {
        queue = knob("w_queue"), kv = knob("w_kv"), load = knob("w_load"),
        ttft = knob("w_ttft"), prefix = knob("w_prefix"), session = knob("w_session"),
    }
    local max_load = 0
    for _, c in ipairs(cands) do
        if c.r.inflight > max_load then max_load = c.r.inflight end
    end
    local scores = {}
    for _, c in ipairs(cands) do
        local r = c.r
        local load = 1
        if max_load > 0 then load = 1 - r.inflight / max_load end
        local queue, kv, ttft = load, load, load
        if r.t ~= nil and t - r.t <= stale then
            queue = 1 - clamp01(r.waiting / qc)
            kv = 1 - clamp01(r.kv)
            ttft = 1 - clamp01(r.ttft / tc)
        end
        local prefix = 0
        local nh = #ctx.hashes
        if nh > 0 then
            local m = 0
            for i = 1, nh do
                if lru_has(r, ctx.hashes[i]) then m = i else break end
            end
            prefix = m / nh
        end
        local session = 0
        if ctx.session_srv ~= nil and ctx.session_srv == c.name then session = 1 end
        local s = w.queue * queue + w.kv * kv + w.load * load + w.ttft * ttft
            + w.prefix * prefix + w.session * session
        local long_srv = fact("long." .. c.name) == 1
        if ctx.class == "long" and long_srv then s = s + knob("long_bias") end
        if ctx.class == "short" and not long_srv then s = s + knob("short_bias") end
        scores[c.name] = s
    end
    return scores
end

local function pick(cands, scores)
    if knob("picker") == "p2c" and #cands > 2 then
        local a = math.random(#cands)
        local b = math.random(#cands - 1)
        if b >= a then b = b + 1 end
        local ca, cb = cands[a], cands[b]
        if scores[cb.name] > scores[ca.name] then return cb.name end
        return ca.name
    end
    local best, ties = -math.huge, {}
    for _, c in ipairs(cands) do
        local s = scores[c.name]
        if s > best + 1e-9 then
            best, ties = s, { c.name }
        elseif s >= best - 1e-9 then
            ties[#ties + 1] = c.name
        end
    end
    return ties[math.random(#ties)]
end

-- ---------------------------------------------------------------------------------------
-- mode predict (v2)

local function time_scale()
    local v = fact("time_scale")
    if type(v) == "number" and v > 0 then return v end
    return 1
end

-- A per-(backend, server) rate of the map, or the default.
local function rate(kind, be, name, default)
    local v = fact(kind .. "." .. be .. "." .. name)
    if type(v) == "number" and v > 0 then return v end
    return default
end

-- The server's prefill backlog (GPU seconds) at t: it drains at time_scale GPU seconds
-- a wall second since its last update.
local function backlog_at(r, t, scale)
    if r.bt ~= nil then
        r.backlog = math.max(0, r.backlog - (t - r.bt) / 1000 * scale)
    end
    r.bt = t
    return r.backlog
end

-- Leading blocks of the request that `r` was sent before.
local function matched(r, hashes)
    local m = 0
    for i = 1, #hashes do
        if lru_has(r, hashes[i]) then m = i else break end
    end
    return m
end

-- {ttft, tpot, work}: predicted TTFT and time per output token (GPU seconds) of the
-- request on candidate c, and the prefill work it adds there.
local function predict(c, ctx, be, t, scale)
    local r = c.r
    -- the map's rates; for a replica it has none of, what the replica showed (wall
    -- seconds, in GPU seconds), else the defaults
    local tps_default, step_default = knob("prefill_tps"), knob("step_ms") / 1000
    if r.tps_seen > 0 then tps_default = r.tps_seen / scale end
    if r.itl_last > 0 then step_default = r.itl_last * scale end
    local tps = rate("tps", be, c.name, tps_default)
    local step = rate("step", be, c.name, step_default)
    local stepk = fact("stepk." .. be .. "." .. c.name)
    if type(stepk) ~= "number" then stepk = 0 end
    local ovh = fact("ovh." .. c.name)
    if type(ovh) ~= "number" then ovh = 0 end
    local cached = math.min(ctx.tokens - 1, matched(r, ctx.hashes) * ctx.block)
    local work = (ctx.tokens - cached) / tps
    local n = r.running + r.waiting + r.since_n
    -- the decode step its batch takes, or what its tokens took since the last scrape
    -- (other models on the GPU, prefill chunks between decodes), whichever is longer
    local seen = r.itl * scale
    local busy = math.max(step + stepk * n, seen)
    -- its own prefill step: the decode batch's weights and KV read, or the chunk's FLOPs,
    -- on a smooth roofline (as the simulator's cost model), after the backlog
    local ttft = ovh + backlog_at(r, t, scale) + math.sqrt(busy * busy + work * work)
    local tpot = math.max(step + stepk * (n + 1), seen + stepk)
    -- what it would take there alone: within the SLOs, waiting for that replica can help
    local alone = ovh + math.sqrt(step * step + work * work)
    return { ttft = ttft, tpot = tpot, work = work, alone = alone, alone_tpot = step + stepk }
end

-- The v2 pick: a server, or nil and "slo_hold" (no server meets the SLOs, hold on).
local function predict_pick(cands, ctx, be, t, expired)
    local scale = time_scale()
    local ttft_slo = knob("ttft_slo_ms") / 1000 * scale
    local tpot_slo = knob("tpot_slo_ms") / 1000 * scale
    local wd = knob("w_decode") * ctx.out
    local preds, best, ties, any_ok, can_wait = {}, math.huge, {}, false, false
    for _, c in ipairs(cands) do
        local p = predict(c, ctx, be, t, scale)
        p.ok = p.ttft <= ttft_slo and p.tpot <= tpot_slo
        p.cost = p.ttft + wd * p.tpot
        preds[c.name] = p
        any_ok = any_ok or p.ok
        can_wait = can_wait or (p.alone <= ttft_slo and p.alone_tpot <= tpot_slo)
    end
    -- hold only a request that some replica would serve within the SLOs once its queue
    -- drains (one whose own prefill exceeds the SLO everywhere gains nothing by waiting)
    if not any_ok and can_wait and not expired and knob("queue_timeout_ms") > 0 then
        return nil, "slo_hold"
    end
    for _, c in ipairs(cands) do
        local p = preds[c.name]
        if p.ok or not any_ok then
            if p.cost < best - 1e-12 then
                best, ties = p.cost, { c.name }
            elseif p.cost <= best + 1e-12 then
                ties[#ties + 1] = c.name
            end
        end
    end
    local srv = ties[math.random(#ties)]
    local r = replica(srv)
    r.backlog = r.backlog + preds[srv].work
    r.since_n = r.since_n + 1
    return srv
end

local function length_class(tokens)
    if tokens < knob("short_tokens") then return "short" end
    if tokens >= knob("long_tokens") then return "long" end
    return "medium"
end

-- ---------------------------------------------------------------------------------------
-- the action

local function decide(txn, expired)
    if knob("fault") == "error" then
        error("fault injected (map key `fault`)")
    end
    local be = txn.f:be_name()
    local proxy = core.backends[be]
    if proxy == nil then
        return nil, "no_backend"
    end
    local body = txn.f:req_body()
    local size = tonumber(txn.f:req_body_size()) or (body and #body) or 0
    if body ~= nil and #body < size then
        counters.truncated = counters.truncated + 1
    end
    local text = prompt_of(body)
    if text == nil or knob("fault") == "bad_body" then
        return nil, "bad_body"
    end
    local tokens = math.max(1, size / knob("bytes_per_token"))
    local bt = math.max(1, knob("block_tokens"))
    local hashes = block_hashes(txn, text, bt * knob("bytes_per_token"), knob("max_blocks"))
    local sid = txn.http:req_get_headers()[knob("session_header")]
    if sid ~= nil then sid = sid[0] end
    local ctx = { hashes = hashes, class = length_class(tokens), session_srv = nil,
                  tokens = tokens, block = bt,
                  out = tonumber(body:match('"max_tokens"%s*:%s*(%d+)')) or knob("out_tokens") }
    if sid ~= nil then ctx.session_srv = session_get(sid) end

    local t = now_ms()
    local stale = knob("stale_ms")
    local headroom = knob("kv_headroom")
    local up, cands = {}, {}
    for name, _ in pairs(proxy.servers) do
        local r = replica(name)
        if r.up then
            up[#up + 1] = { name = name, r = r }
            local fresh = r.t ~= nil and t - r.t <= stale
            if fits(name, r, tokens, be, fresh, headroom) then
                cands[#cands + 1] = { name = name, r = r }
            end
        end
    end
    if #up == 0 then
        return nil, "no_candidate"
    end
    if #cands == 0 then
        local mode = knob("admission")
        if mode == "reject" then
            return nil, "reject"
        elseif mode == "hold" then
            return nil, "hold"
        end
        cands = up  -- route: the best of the replicas that are up, KV or not
    end
    table.sort(cands, function(a, b) return a.name < b.name end)
    local srv
    if knob("mode") == "predict" then
        local why
        srv, why = predict_pick(cands, ctx, be, t, expired)
        if srv == nil then return nil, why end
    else
        srv = pick(cands, score_all(cands, ctx))
    end
    lru_add(replica(srv), hashes, knob("lru_size"))
    if sid ~= nil then session_put(sid, srv, knob("lru_size")) end
    return srv, tokens
end

local function route(txn, srv, tokens)
    next_id = next_id + 1
    local id = tostring(next_id)
    pending[id] = { srv = srv, tokens = tokens, t = now_ms() }
    replica(srv).inflight = replica(srv).inflight + tokens
    replica(srv).since = replica(srv).since + tokens
    counters.picks[srv] = (counters.picks[srv] or 0) + 1
    txn:set_var("txn.llm_id", id)
    txn:set_var("txn.llm_srv", srv)
end

local function llm_pick(txn)
    local c0 = os.clock()  -- process CPU seconds: core.now() only moves once per poll loop
    local deadline = nil
    local expired = false
    while true do
        local ok, srv, info = pcall(decide, txn, expired)
        if not ok then
            count_fallback("lua_error")
            core.Warning("lbtune llm_pick: " .. tostring(srv))
            break
        elseif srv ~= nil then
            route(txn, srv, info)
            break
        elseif info == "reject" then
            counters.rejected = counters.rejected + 1
            txn:set_var("txn.llm_reject", 1)
            txn:set_var("txn.llm_retry", tostring(math.floor(knob("retry_after_s"))))
            break
        elseif info == "hold" then
            if deadline == nil then
                counters.held = counters.held + 1
                deadline = now_ms() + knob("queue_timeout_ms")
            end
            if now_ms() >= deadline then
                counters.rejected = counters.rejected + 1
                txn:set_var("txn.llm_reject", 1)
                txn:set_var("txn.llm_retry", tostring(math.floor(knob("retry_after_s"))))
                break
            end
            core.msleep(math.max(10, math.floor(knob("refresh_ms") / 2)))
        elseif info == "slo_hold" then
            -- no replica meets the SLOs: wait for one, then route anyway (never a 429)
            if deadline == nil then
                counters.held = counters.held + 1
                deadline = now_ms() + knob("queue_timeout_ms")
            end
            if now_ms() >= deadline then
                counters.hold_expired = counters.hold_expired + 1
                expired = true
            else
                core.msleep(math.max(10, math.floor(knob("refresh_ms") / 2)))
            end
        else
            count_fallback(info)
            break
        end
    end
    if deadline == nil then
        local us = math.floor((os.clock() - c0) * 1000000 + 0.5)
        counters.cost_us_sum = counters.cost_us_sum + us
        counters.cost_n = counters.cost_n + 1
        if us > counters.cost_us_max then counters.cost_us_max = us end
        local b = #COST_BUCKETS + 1
        for i, le in ipairs(COST_BUCKETS) do
            if us <= le then b = i break end
        end
        cost_hist[b] = cost_hist[b] + 1
    end
end

local function release(txn)
    local id = txn:get_var("txn.llm_id")
    if id == nil then return end
    local p = pending[id]
    if p == nil then return end
    pending[id] = nil
    local r = replica(p.srv)
    r.inflight = math.max(0, r.inflight - p.tokens)
    txn:unset_var("txn.llm_id")
end

core.register_action("llm_pick", { "http-req" }, llm_pick, 0)

-- Removes a request's tokens from its replica's in-flight load once the replica answers
-- (`http-response lua.llm_release`): from then on its own /metrics (running requests, KV
-- usage) carries the request. Not a Lua filter's end_analyze, which held them to the end
-- of the stream: under a study's load HAProxy 2.6.12's worker segfaulted after reloads
-- with errors inside that filter (`attempt to index a thread value`), three times in about
-- 90 reloads; Lua filters of that branch have such bugs (haproxy/haproxy#2467).
core.register_action("llm_release", { "http-res" }, function(txn) pcall(release, txn) end, 0)

-- ---------------------------------------------------------------------------------------
-- fresh state: scrape /metrics

local function sum_metric(body, name)
    local total, found = 0, false
    for v in body:gmatch("\n" .. name:gsub("[%:%_%-]", "%%%0") .. "[^\n ]* ([^\n]+)") do
        local n = tonumber(v)
        if n ~= nil then
            total = total + n
            found = true
        end
    end
    if found then return total end
    return nil
end

-- One HTTP/1.0 GET over a cosocket (core.tcp), the body or nil. Not core.httpclient:
-- it was the other suspect when HAProxy 2.6.12's worker segfaulted with this Lua state
-- corrupted (a "bad self" on the knob map; haproxy/haproxy#1958 and #1593 are
-- httpclient use-after-free bugs of that branch); the Socket class is the older path.
local function http_get(addr, path)
    local host, port = addr:match("^(.+):(%d+)$")
    if host == nil then
        return nil
    end
    local sock = core.tcp()
    sock:settimeout(1)
    local body = nil
    if sock:connect(host, tonumber(port)) then
        local sent = sock:send("GET " .. path .. " HTTP/1.0\r\nHost: " .. addr
            .. "\r\nConnection: close\r\n\r\n")
        local data = sent and sock:receive("*a")
        if data ~= nil then
            local status = data:match("^HTTP/%d%.%d (%d%d%d)")
            local head_end = data:find("\r\n\r\n", 1, true)
            if status == "200" and head_end ~= nil then
                body = data:sub(head_end + 4)
            end
        end
    end
    sock:close()
    return body
end

local function scrape(name, addr, last)
    local text = http_get(addr, "/metrics")
    if text == nil then
        return false
    end
    local body = "\n" .. text
    local waiting = sum_metric(body, "vllm:num_requests_waiting")
    local kv = sum_metric(body, "vllm:kv_cache_usage_perc")
    if waiting == nil or kv == nil then
        return false
    end
    local r = replica(name)
    r.waiting, r.kv = waiting, kv
    r.running = sum_metric(body, "vllm:num_requests_running") or 0
    r.since_n = 0
    if waiting == 0 and r.running == 0 then
        r.backlog = 0  -- idle: nothing of what was routed there is still to prefill
    end
    local s = sum_metric(body, "vllm:time_to_first_token_seconds_sum")
    local n = sum_metric(body, "vllm:time_to_first_token_seconds_count")
    local pt = sum_metric(body, "vllm:prompt_tokens_total")
    local qs = sum_metric(body, "vllm:request_queue_time_seconds_sum")
    if s ~= nil and n ~= nil then
        if last.n ~= nil and n > last.n then
            r.ttft = (s - last.s) / (n - last.n)
            -- a replica's own prefill rate, for mode predict where the map has none: the
            -- prompt tokens that got their first token since the last scrape over the time
            -- those requests spent between leaving the queue and their first token
            if pt ~= nil and qs ~= nil and last.pt ~= nil and last.qs ~= nil then
                local busy = (s - last.s) - (qs - last.qs)
                if busy > 0 and pt > last.pt then
                    r.tps_seen = (pt - last.pt) / busy
                end
            end
        end
        last.s, last.n = s, n
    end
    last.pt, last.qs = pt, qs
    local is = sum_metric(body, "vllm:inter_token_latency_seconds_sum")
        or sum_metric(body, "vllm:time_per_output_token_seconds_sum")
    local ic = sum_metric(body, "vllm:inter_token_latency_seconds_count")
        or sum_metric(body, "vllm:time_per_output_token_seconds_count")
    if is ~= nil and ic ~= nil then
        if last.ic ~= nil and ic > last.ic then
            r.itl = (is - last.is) / (ic - last.ic)
            r.itl_last = r.itl
        elseif r.running == 0 then
            r.itl = 0  -- nothing decoding: the engine rates alone
        end
        last.is, last.ic = is, ic
    end
    r.t = now_ms()
    r.since = 0
    return true
end

-- A request routed but never answered (the client left, HAProxy answered itself) is
-- dropped from the in-flight load after this long: longer than any queue or prefill wait.
local PENDING_MAX_MS = 120000

local function prune(max_age_ms)
    local t = now_ms()
    for id, p in pairs(pending) do
        if t - p.t > max_age_ms then
            pending[id] = nil
            local r = replica(p.srv)
            r.inflight = math.max(0, r.inflight - p.tokens)
        end
    end
end

core.register_task(function()
    local last = {}
    while true do
        local all = core.backends[knob("all_backend")]
        if all ~= nil then
            for name, srv in pairs(all.servers) do
                local r = replica(name)
                local ok, stats = pcall(srv.get_stats, srv)
                if ok and stats ~= nil and stats.status ~= nil then
                    r.up = stats.status:find("^UP") ~= nil or stats.status == "no check"
                end
                last[name] = last[name] or {}
                local sok, good = pcall(scrape, name, srv:get_addr(), last[name])
                counters.scrapes = counters.scrapes + 1
                if not sok or not good then
                    counters.scrape_errors = counters.scrape_errors + 1
                end
            end
        end
        prune(PENDING_MAX_MS)
        core.msleep(math.max(10, math.floor(knob("refresh_ms"))))
    end
end)

-- ---------------------------------------------------------------------------------------
-- Prometheus: `http-request use-service lua.llm_metrics` on the stats frontend

local FALLBACK_REASONS = { "lua_error", "bad_body", "no_candidate", "no_backend" }

local function exposition()
    local out = {}
    local function add(s) out[#out + 1] = s end
    add("# HELP lbtune_llm_fallback_total Requests placed by the backend's leastconn instead of the scheduler.")
    add("# TYPE lbtune_llm_fallback_total counter")
    for _, reason in ipairs(FALLBACK_REASONS) do
        add(string.format('lbtune_llm_fallback_total{reason="%s"} %d', reason, counters.fallback[reason] or 0))
    end
    add("# TYPE lbtune_llm_rejected_total counter")
    add(string.format("lbtune_llm_rejected_total %d", counters.rejected))
    add("# HELP lbtune_llm_held_total Requests held in the balancer (no KV room, or no replica within the SLOs).")
    add("# TYPE lbtune_llm_held_total counter")
    add(string.format("lbtune_llm_held_total %d", counters.held))
    add("# HELP lbtune_llm_hold_expired_total Held requests routed after queue_timeout_ms with no replica within the SLOs.")
    add("# TYPE lbtune_llm_hold_expired_total counter")
    add(string.format("lbtune_llm_hold_expired_total %d", counters.hold_expired))
    add("# TYPE lbtune_llm_truncated_bodies_total counter")
    add(string.format("lbtune_llm_truncated_bodies_total %d", counters.truncated))
    add("# TYPE lbtune_llm_scrape_errors_total counter")
    add(string.format("lbtune_llm_scrape_errors_total %d", counters.scrape_errors))
    add("# TYPE lbtune_llm_scrapes_total counter")
    add(string.format("lbtune_llm_scrapes_total %d", counters.scrapes))
    add("# HELP lbtune_llm_pick_microseconds Process CPU time of llm_pick (all threads: an upper bound).")
    add("# TYPE lbtune_llm_pick_microseconds histogram")
    local cum = 0
    for i, le in ipairs(COST_BUCKETS) do
        cum = cum + cost_hist[i]
        add(string.format('lbtune_llm_pick_microseconds_bucket{le="%d"} %d', le, cum))
    end
    add(string.format('lbtune_llm_pick_microseconds_bucket{le="+Inf"} %d', counters.cost_n))
    add(string.format("lbtune_llm_pick_microseconds_sum %d", counters.cost_us_sum))
    add(string.format("lbtune_llm_pick_microseconds_count %d", counters.cost_n))
    add("# TYPE lbtune_llm_pick_microseconds_max gauge")
    add(string.format("lbtune_llm_pick_microseconds_max %d", counters.cost_us_max))
    local names = {}
    for name, _ in pairs(replicas) do names[#names + 1] = name end
    table.sort(names)
    local t = now_ms()
    -- one gauge or counter, a sample per server in name order: `fmt` formats value(name)
    local function per_server(metric, kind, fmt, value, help)
        if help ~= nil then add("# HELP " .. metric .. " " .. help) end
        add("# TYPE " .. metric .. " " .. kind)
        for _, n in ipairs(names) do
            add(string.format('%s{server="%s"} ' .. fmt, metric, n, value(n)))
        end
    end
    per_server("lbtune_llm_picks_total", "counter", "%d", function(n)
        return counters.picks[n] or 0
    end)
    per_server("lbtune_llm_inflight_tokens", "gauge", "%d", function(n)
        return math.floor(replicas[n].inflight)
    end)
    per_server("lbtune_llm_state_age_seconds", "gauge", "%.3f", function(n)
        local r = replicas[n]
        if r.t == nil then return -1 end
        return (t - r.t) / 1000
    end)
    per_server("lbtune_llm_kv_usage", "gauge", "%.4f", function(n) return replicas[n].kv end)
    per_server("lbtune_llm_waiting", "gauge", "%g", function(n) return replicas[n].waiting end)
    per_server("lbtune_llm_backlog_seconds", "gauge", "%.4f", function(n)
        local r = replicas[n]
        if r.bt == nil then return r.backlog end
        return math.max(0, r.backlog - (t - r.bt) / 1000 * time_scale())
    end, "Predicted prefill work routed to a server and not yet done (GPU seconds).")
    per_server("lbtune_llm_ttft_seconds", "gauge", "%.4f", function(n) return replicas[n].ttft end)
    return table.concat(out, "\n") .. "\n"
end

core.register_service("llm_metrics", "http", function(applet)
    local body = exposition()
    applet:set_status(200)
    applet:add_header("content-type", "text/plain; version=0.0.4")
    applet:add_header("content-length", tostring(#body))
    applet:start_response()
    applet:send(body)
end)
