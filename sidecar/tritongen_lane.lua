-- tritongen's native fast lane, run by nginx in front of the sidecar (sidecar/lane.py says why).
--
-- A request goes straight to Triton only when nginx can judge it without parsing it: a unary infer
-- of a model the control plane granted slots to, naming no class, tenant or priority, with a body
-- held in memory; and only while the model's in-flight lane requests are under its slots. Anything
-- else is handed, unchanged, to the sidecar's Python path (`ngx.exec` to a named location), which
-- queues, refuses or admits it by the whole policy.
--
-- Shared dicts: tg_caps (model -> slots), tg_inflight (model -> lane requests at Triton), tg_stats
-- (model.."\td" finished, model.."\ts" their seconds, model.."\to" overflowed to Python, model.."\tp" the
-- most in flight at once since the control plane last read the counts).
-- `$tg_lane` (set "" at server level, so an error_page redirect keeps it) names the model whose
-- count a request holds; the log phase gives it back however the request ended.

local M = {}

local find, byte, sub, concat = string.find, string.byte, string.sub, table.concat

local caps = ngx.shared.tg_caps
local inflight = ngx.shared.tg_inflight
local stats = ngx.shared.tg_stats

-- Rendered from the policy by sidecar/nginx_front.py through M.configure.
local class_var, tenant_var = "http_x_traffic_class", "http_x_tenant"
local class_json, class_raw = '"traffic_class"', "traffic_class"

function M.configure(cfg)
    class_var, tenant_var = cfg.class_var, cfg.tenant_var
    class_json, class_raw = '"' .. cfg.class_parameter .. '"', cfg.class_parameter
end

local function named(var)
    local v = ngx.var[var]
    return v ~= nil and v ~= ""
end

-- Take a slot of `model` or hand the request to the Python path at `where`.
local function take(model, where)
    local cap = caps:get(model)
    if not cap then
        return ngx.exec(where)
    end
    local n = inflight:incr(model, 1, 0)
    if n > cap then
        inflight:incr(model, -1)
        stats:incr(model .. "\to", 1, 0)
        return ngx.exec(where)
    end
    ngx.var.tg_lane = model
    local peak = model .. "\tp"
    if n > (stats:get(peak) or 0) then
        stats:set(peak, n)
    end
end

-- HTTP/REST: POST /v2/models/M[/versions/V]/infer. The class and a client priority can only be in
-- the JSON part (the first Inference-Header-Content-Length bytes, or the whole body).
function M.http(model)
    if ngx.req.get_method() ~= "POST" or named(class_var) or named(tenant_var)
            or named("http_content_encoding") or not caps:get(model) then
        return ngx.exec("@sidecar")
    end
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if body == nil then  -- empty, or too large for memory (in a file): Python reads it
        return ngx.exec("@sidecar")
    end
    local head = #body
    local given = ngx.var.http_inference_header_content_length
    if given ~= nil then  -- binary tensors follow the JSON part; a length outside the body: Python says so
        head = tonumber(given)
        if head == nil or head < 0 or head > #body or head % 1 ~= 0 then
            return ngx.exec("@sidecar")
        end
    end
    local at = find(body, '"priority"', 1, true)
    if at and at <= head then
        return ngx.exec("@sidecar")
    end
    at = find(body, class_json, 1, true)
    if at and at <= head then
        return ngx.exec("@sidecar")
    end
    return take(model, "@sidecar")
end

-- gRPC ModelInfer: one uncompressed message; model_name is field 1 (tag 0x0A), first after the
-- 5-byte frame header. A class or priority parameter is a map key in the message: any mention
-- sends it to Python (which parses it properly).
function M.grpc()
    if named(class_var) or named(tenant_var) then
        return ngx.exec("@sidecar_grpc")
    end
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if body == nil or #body < 8 or byte(body, 1) ~= 0 or byte(body, 6) ~= 10 then
        return ngx.exec("@sidecar_grpc")
    end
    local len, at = byte(body, 7), 8
    if len >= 128 then
        local more = byte(body, 8)
        if more >= 128 then
            return ngx.exec("@sidecar_grpc")
        end
        len, at = len - 128 + more * 128, 9
    end
    local model = sub(body, at, at + len - 1)
    if not caps:get(model) or find(body, "priority", at + len, true) or find(body, class_raw, at + len, true) then
        return ngx.exec("@sidecar_grpc")
    end
    return take(model, "@sidecar_grpc")
end

function M.log()
    local model = ngx.var.tg_lane
    if model == nil or model == "" then
        return
    end
    inflight:incr(model, -1)
    stats:incr(model .. "\td", 1, 0)
    stats:incr(model .. "\ts", ngx.now() - ngx.req.start_time(), 0)
end

-- The control plane (sidecar/lane_control.py), on a Unix socket only the sidecar knows:
-- POST sets the slots (`model<TAB>slots` lines; models not listed lose their lane); any method
-- answers the counts, `model<TAB>inflight<TAB>done<TAB>seconds<TAB>overflow<TAB>peak` lines.
function M.control()
    if ngx.req.get_method() == "POST" then
        ngx.req.read_body()
        local body = ngx.req.get_body_data() or ""
        local given = {}
        for name, cap in body:gmatch("([^\t\n]+)\t(%d+)\n") do
            given[name] = tonumber(cap)
        end
        for _, name in ipairs(caps:get_keys(0)) do
            if given[name] == nil then
                caps:delete(name)
            end
        end
        for name, cap in pairs(given) do
            caps:set(name, cap)
        end
    end
    local seen = {}
    for _, name in ipairs(inflight:get_keys(0)) do
        seen[name] = true
    end
    for _, key in ipairs(stats:get_keys(0)) do
        local name = key:match("^(.*)\t[dsop]$")
        if name then
            seen[name] = true
        end
    end
    local out = {}
    for name in pairs(seen) do
        local now = inflight:get(name) or 0
        out[#out + 1] = concat({ name, now, stats:get(name .. "\td") or 0, stats:get(name .. "\ts") or 0,
                                 stats:get(name .. "\to") or 0, stats:get(name .. "\tp") or now }, "\t")
        stats:set(name .. "\tp", now)  -- the peak is per reading: it starts again from what is in flight
    end
    ngx.header["Content-Type"] = "text/plain"
    ngx.print(concat(out, "\n"), "\n")
end

return M
