-- tritongen's native fast lane, run by nginx in front of the sidecar (sidecar/lane.py says why).
--
-- A request goes straight to Triton only when nginx can judge it without a full parse: a unary infer
-- naming no tenant and no priority, with a body held in memory, whose (model, class) the control
-- plane granted slots to; the class comes from the class header, else the class parameter, else
-- the policy's default. And only while that pair's in-flight lane requests are under its slots.
-- Any other HTTP infer is decided by Python over the decision socket and still carried by nginx;
-- any other gRPC infer is handed, unchanged, to the sidecar's Python path (`ngx.exec` to a named
-- location). Either queues, refuses or admits it by the whole policy.
--
-- Shared dicts, keyed by "model<TAB>class": tg_caps (slots), tg_inflight (lane requests at
-- Triton), tg_stats (key.."\td" finished, key.."\ts" their seconds, key.."\tb"..i those whose
-- seconds fall in latency bucket i (the sidecar's histogram bounds; one past the last: longer),
-- key.."\to" overflowed, key.."\tp" the most in flight at once since the control plane last read
-- the counts, key.."\tx"..e those that ended as `e`, the status 400 and up, or "down": what the
-- sidecar's one classification of ends names, sidecar/accounting.py's `outcome`).
-- `$tg_lane` (set "" at server level, so an error_page redirect keeps it) names the key whose count
-- a request holds; the log phase gives it back however the request ended.

local M = {}

local find, byte, sub, match, concat = string.find, string.byte, string.sub, string.match, table.concat

local caps = ngx.shared.tg_caps
local inflight = ngx.shared.tg_inflight
local stats = ngx.shared.tg_stats

-- Rendered from the policy by sidecar/nginx_front.py through M.configure. The priority parameter's
-- name is sidecar/reading.py's: a request naming one goes to Python, which rewrites it by its one rule.
local class_var, tenant_var = "http_x_traffic_class", "http_x_tenant"
local class_json, class_raw, default_class = '"traffic_class"', "traffic_class", "normal"
local priority_json, priority_raw = nil, nil -- from M.configure, never a copy of the name here
local bounds = {} -- the sidecar's latency histogram bounds, in seconds, ascending

function M.configure(cfg)
    class_var, tenant_var, default_class = cfg.class_var, cfg.tenant_var, cfg.default_class
    class_json, class_raw = '"' .. cfg.class_parameter .. '"', cfg.class_parameter
    priority_json, priority_raw = '"' .. cfg.priority_parameter .. '"', cfg.priority_parameter
    bounds = cfg.buckets
end

local function header(var)
    local v = ngx.var[var]
    if v == nil or v == "" then
        return nil
    end
    return v
end

-- Take a slot of `key`, or hand the request on: `overflow(model)` decides it another way.
local function take(key, overflow, model)
    local cap = caps:get(key)
    if not cap then
        return overflow(model)
    end
    local n = inflight:incr(key, 1, 0)
    if n > cap then
        inflight:incr(key, -1)
        stats:incr(key .. "\to", 1, 0)
        return overflow(model)
    end
    ngx.var.tg_lane = key
    local peak = key .. "\tp"
    if n > (stats:get(peak) or 0) then
        stats:set(peak, n)
    end
end

-- A protobuf varint at `at`: value, next position (nil past two bytes: no name or string here is longer).
local function varint(body, at)
    local b = byte(body, at)
    if b == nil then
        return nil
    end
    if b < 128 then
        return b, at + 1
    end
    local more = byte(body, at + 1)
    if more == nil or more >= 128 then
        return nil
    end
    return b - 128 + more * 128, at + 2
end

local function decided(model)
    return require("tritongen_decide").access(model, "infer", class_var, tenant_var)
end

local function decided_grpc(model)
    return require("tritongen_decide").access(model, "grpc_infer", class_var, tenant_var)
end

-- HTTP/REST: POST /v2/models/M[/versions/V]/infer. A class or client priority can only be in the
-- JSON part (the first Inference-Header-Content-Length bytes, or the whole body). What the lane
-- does not take, nginx still carries: Python decides it over the decision socket
-- (tritongen_decide.lua), which writes the class's priority in where it must. Only a compressed
-- body, or one too large for memory, is handed to the Python listener, which decodes or reads it.
function M.http(model)
    if ngx.req.get_method() ~= "POST" or header("http_content_encoding") then
        return ngx.exec("@sidecar")
    end
    if header(tenant_var) ~= nil then
        return decided(model)
    end
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if body == nil then  -- empty, or too large for memory (in a file): decided() hands it to Python
        return decided(model)
    end
    local head = #body
    local given = ngx.var.http_inference_header_content_length
    if given ~= nil then  -- binary tensors follow the JSON part; a length outside the body: Python says so
        head = tonumber(given)
        if head == nil or head < 0 or head > #body or head % 1 ~= 0 then
            return decided(model)
        end
    end
    local at = find(body, priority_json, 1, true)
    if at and at <= head then
        return decided(model)
    end
    local class = header(class_var)
    at = find(body, class_json, 1, true)
    if at and at <= head then
        if class == nil then  -- "traffic_class": "name" (anything else: Python reads it properly)
            class = match(body, '^%s*:%s*"([%w_.-]+)"', at + #class_json)
            if class == nil then
                return decided(model)
            end
        end
    end
    return take(model .. "\t" .. (class or default_class), decided, model)
end

-- gRPC ModelInfer: one uncompressed ModelInferRequest; model_name is field 1 (tag 0x0A), first
-- after the 5-byte frame header. Parameters are map entries (field 4): {1: key, 2: InferParameter
-- {3: string_param}}; a class parameter of that shape is read. Any other mention of it or of
-- "priority", a tenant, or no free slot: Python decides it over the decision socket (parsing it
-- properly) and nginx carries it; a body it cannot frame goes to the Python relay.
function M.grpc()
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if body == nil or #body < 8 or byte(body, 1) ~= 0 or byte(body, 6) ~= 10 then
        return ngx.exec("@sidecar_grpc")
    end
    local len, at = varint(body, 7)
    if len == nil then
        return ngx.exec("@sidecar_grpc")
    end
    local model = sub(body, at, at + len - 1)
    local rest = at + len
    if header(tenant_var) ~= nil or find(body, priority_raw, rest, true) then
        return decided_grpc(model)
    end
    local class = header(class_var)
    local key_at = find(body, class_raw, rest, true)
    if key_at then
        if class == nil then
            local after = key_at + #class_raw
            if byte(body, key_at - 1) ~= #class_raw or byte(body, after) ~= 0x12 then
                return decided_grpc(model)
            end
            local _, pos = varint(body, after + 1)
            if pos == nil or byte(body, pos) ~= 0x1A then
                return decided_grpc(model)
            end
            local n, from = varint(body, pos + 1)
            if n == nil then
                return decided_grpc(model)
            end
            class = sub(body, from, from + n - 1)
        end
    end
    return take(model .. "\t" .. (class or default_class), decided_grpc, model)
end

-- How a lane request ended, for the sidecar to name (sidecar/accounting.py's `outcome`): "down" when
-- Triton could not be reached, else the status the client got, a gRPC status other than OK in the
-- trailers or headers counting as 500 (as tritongen_decide.lua reports a carried call's). Tallied
-- apart only from 400 up: by that rule every other end is ok, and the done count holds it. nil: ok.
local function ended(how)
    if how == "down" then
        return "down"
    end
    local status = ngx.status
    if status < 400 and require("tritongen_decide").grpc_failure() then
        status = 500
    end
    if status >= 400 then
        return status
    end
    return nil
end

-- how: "ok" (nginx carried it to its end, or the client left), "down" (Triton could not be reached).
function M.log(how)
    local key = ngx.var.tg_lane
    if key == nil or key == "" then
        return
    end
    inflight:incr(key, -1)
    local seconds = ngx.now() - ngx.req.start_time()
    stats:incr(key .. "\td", 1, 0)
    local tally = ended(how)
    if tally then
        stats:incr(key .. "\tx" .. tally, 1, 0)
    end
    stats:incr(key .. "\ts", seconds, 0)
    local i = 1
    while i <= #bounds and seconds > bounds[i] do
        i = i + 1
    end
    stats:incr(key .. "\tb" .. i, 1, 0)
end

-- The control plane (sidecar/lane_control.py), on a Unix socket only the sidecar knows:
-- POST sets the slots (`model<TAB>class<TAB>slots` lines; pairs not listed lose their lane); any
-- method answers the counts, `model<TAB>class<TAB>inflight<TAB>done<TAB>seconds<TAB>overflow<TAB>peak
-- <TAB>buckets<TAB>ends` (buckets: the count in each latency bucket, comma-separated, the longer
-- ones last; ends: `end=count` for each end tallied apart, comma-separated).
function M.control()
    if ngx.req.get_method() == "POST" then
        ngx.req.read_body()
        local body = ngx.req.get_body_data() or ""
        local given = {}
        for key, cap in body:gmatch("([^\t\n]+\t[^\t\n]+)\t(%d+)\n") do
            given[key] = tonumber(cap)
        end
        for _, key in ipairs(caps:get_keys(0)) do
            if given[key] == nil then
                caps:delete(key)
            end
        end
        for key, cap in pairs(given) do
            caps:set(key, cap)
        end
    end
    local seen, ends = {}, {}
    for _, key in ipairs(inflight:get_keys(0)) do
        seen[key] = true
    end
    for _, stat in ipairs(stats:get_keys(0)) do
        local key, kind, tally = match(stat, "^(.*)\t([dsopbx])(%w*)$")
        if key then
            seen[key] = true
            if kind == "x" then
                local list = ends[key] or {}
                list[#list + 1] = tally .. "=" .. (stats:get(stat) or 0)
                ends[key] = list
            end
        end
    end
    local out = {}
    for key in pairs(seen) do
        local now = inflight:get(key) or 0
        local buckets = {}
        for i = 1, #bounds + 1 do
            buckets[i] = stats:get(key .. "\tb" .. i) or 0
        end
        out[#out + 1] = concat({ key, now, stats:get(key .. "\td") or 0, stats:get(key .. "\ts") or 0,
                                 stats:get(key .. "\to") or 0, stats:get(key .. "\tp") or now,
                                 concat(buckets, ","), concat(ends[key] or {}, ",") }, "\t")
        stats:set(key .. "\tp", now)  -- the peak is per reading: it starts again from what is in flight
    end
    ngx.header["Content-Type"] = "text/plain"
    ngx.print(concat(out, "\n"), "\n")
end

return M
