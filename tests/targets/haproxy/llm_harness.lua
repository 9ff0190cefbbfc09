-- Runs lbtune's HAProxy scheduler (scheduler.lua) outside HAProxy for the conformance test
-- (tests/targets/haproxy/test_llm_conformance.py): `core`, `Map` and the transaction are
-- stubs, the scrape task is a coroutine resumed once per `scrape` event, /metrics bodies
-- come from `metrics` events, and math.random picks the first choice (the twin's side of
-- the test draws the same way). Usage: lua5.3 llm_harness.lua scheduler.lua < events
--
-- Events, one a line (a `pick` line is followed by its body on the next line):
--   case                              fresh scheduler state (the script loaded again)
--   knob NAME VALUE | fact NAME VALUE the map's entries
--   backend NAME SERVER...            a backend and its servers (`all` holds every one)
--   time MS                           the clock
--   metrics SERVER WAITING KV TTFT_SUM TTFT_COUNT [RUNNING [ITL_SUM ITL_COUNT
--           [PROMPT_TOKENS QUEUE_SUM]]]
--   scrape                            one round of the scrape task
--   pick ID BACKEND SESSION|- NBYTES  then the body: prints "ID SERVER|reject|fallback"
--   release ID                        the response headers of pick ID passed

local script = arg[1]
local MAP = {}
local BACKENDS = {}
local METRICS = {}
local NOW_MS = 0
local actions, task

math.random = function(m) return 1 end  -- luacheck: ignore (the first choice)

Map = { _str = 0 }
function Map.new(path, kind)
    return { lookup = function(self, key) return MAP[key] end }
end

local function socket(addr)
    local s = {}
    function s:settimeout(t) end
    function s:connect(host, port) s.addr = host .. ":" .. tostring(port) return true end
    function s:send(data) return #data end
    function s:receive(pattern)
        local m = METRICS[s.addr]
        if m == nil then return nil end
        return "HTTP/1.0 200 OK\r\n\r\n" .. m
    end
    function s:close() end
    return s
end

core = {
    now = function() return { sec = NOW_MS // 1000, usec = (NOW_MS % 1000) * 1000 } end,
    backends = BACKENDS,
    register_action = function(name, where, fn, n) actions[name] = fn end,
    register_task = function(fn) task = coroutine.create(fn) end,
    register_service = function() end,
    Warning = function(msg) io.stderr:write(msg, "\n") end,
    msleep = function(ms) coroutine.yield() end,
    tcp = function() return socket() end,
}

local function server(name)
    return {
        get_stats = function(self) return { status = "UP" } end,
        get_addr = function(self) return name .. ":1" end,
    }
end

local real_getenv = os.getenv
os.getenv = function(name)
    if name == "LBTUNE_LLM_MAP" then return "map" end
    return real_getenv(name)
end

local function load()
    actions = {}
    task = nil
    dofile(script)
end

local function txn(be, body, session)
    local vars = {}
    return {
        f = {
            be_name = function() return be end,
            req_body = function() return body end,
            req_body_size = function() return #body end,
        },
        http = {
            req_get_headers = function()
                if session == nil then return {} end
                return { ["x-session-id"] = { [0] = session } }
            end,
        },
        c = { xxh64 = function(self, s) return s end },  -- equal exactly when equal
        set_var = function(self, k, v) vars[k] = v end,
        get_var = function(self, k) return vars[k] end,
        unset_var = function(self, k) vars[k] = nil end,
        vars = vars,
    }
end

local ids = {}  -- the test's pick id -> the scheduler's txn.llm_id
local lines = io.lines()
for line in lines do
    local words = {}
    for w in line:gmatch("%S+") do words[#words + 1] = w end
    local cmd = words[1]
    if cmd == "case" then
        for k in pairs(MAP) do MAP[k] = nil end
        for k in pairs(BACKENDS) do BACKENDS[k] = nil end
        for k in pairs(METRICS) do METRICS[k] = nil end
        ids = {}
        NOW_MS = 0
        load()
    elseif cmd == "knob" or cmd == "fact" then
        MAP[words[2]] = words[3]
    elseif cmd == "backend" then
        local servers = {}
        for i = 3, #words do servers[words[i]] = server(words[i]) end
        BACKENDS[words[2]] = { servers = servers }
    elseif cmd == "time" then
        NOW_MS = tonumber(words[2])
    elseif cmd == "metrics" then
        METRICS[words[2] .. ":1"] = string.format(
            "vllm:num_requests_waiting{model_name=\"m\"} %s\n"
            .. "vllm:kv_cache_usage_perc{model_name=\"m\"} %s\n"
            .. "vllm:time_to_first_token_seconds_sum{model_name=\"m\"} %s\n"
            .. "vllm:time_to_first_token_seconds_count{model_name=\"m\"} %s\n",
            words[3], words[4], words[5], words[6])
        if words[7] ~= nil then
            METRICS[words[2] .. ":1"] = METRICS[words[2] .. ":1"]
                .. "vllm:num_requests_running{model_name=\"m\"} " .. words[7] .. "\n"
        end
        if words[9] ~= nil then
            METRICS[words[2] .. ":1"] = METRICS[words[2] .. ":1"]
                .. "vllm:inter_token_latency_seconds_sum{model_name=\"m\"} " .. words[8] .. "\n"
                .. "vllm:inter_token_latency_seconds_count{model_name=\"m\"} " .. words[9] .. "\n"
        end
        if words[11] ~= nil then
            METRICS[words[2] .. ":1"] = METRICS[words[2] .. ":1"]
                .. "vllm:prompt_tokens_total{model_name=\"m\"} " .. words[10] .. "\n"
                .. "vllm:request_queue_time_seconds_sum{model_name=\"m\"} " .. words[11] .. "\n"
        end
    elseif cmd == "scrape" then
        local ok, err = coroutine.resume(task)
        if not ok then error(err) end
    elseif cmd == "pick" then
        local body = lines()
        local session = words[4]
        if session == "-" then session = nil end
        local t = txn(words[3], body, session)
        actions["llm_pick"](t)
        local out = t.vars["txn.llm_srv"]
        if t.vars["txn.llm_reject"] ~= nil then
            out = "reject"
        elseif out == nil then
            out = "fallback"
        else
            ids[words[2]] = t.vars["txn.llm_id"]
        end
        io.write(words[2], " ", out, "\n")
    elseif cmd == "release" then
        local id = ids[words[2]]
        if id ~= nil then
            local t = txn("", "", nil)
            t.vars["txn.llm_id"] = id
            actions["llm_release"](t)
        end
    end
end
