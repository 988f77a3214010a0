-- Requests nginx carries and Python decides (sidecar/decisions.py says why and speaks the other end).
--
-- access: the request's body, the class and tenant headers and an infer's
-- Inference-Header-Content-Length go to the Python controller over a Unix socket; its answer is
-- "admit" (maybe with a rewritten body: the class's priority written in) or "refuse" (status,
-- Retry-After and the JSON body nginx writes back). A queued request waits here, in nginx, on that
-- socket; a client that goes away closes it, and Python drops the request
-- from its queue.
-- body filter: the first chunk of a stream is its first token; "data:" events are counted; an
-- error event or an error answer is kept (its text decides the outcome: out of memory, or not).
-- log: the end (status, events, the error) is queued for Python; however the request ended, the
-- reservation goes back.
--
-- First tokens and ends leave through one background thread per worker that sends them in batches
-- on one kept connection: the body filter and log phases cannot use sockets themselves.
-- `$tg_decided` (set "" at server level, so an error_page redirect keeps it) holds the request's id.

local M = {}

local find, sub, concat = string.find, string.sub, table.concat
local semaphore = require("ngx.semaphore")

local path = nil -- "unix:/.../decide.sock", from M.configure
local pending = {} -- event lines not yet sent (this worker)
local wake = semaphore.new()
local active = 0 -- admitted requests of this worker whose end is not yet queued

function M.configure(socket_path)
    path = "unix:" .. socket_path
end

local function push(line)
    pending[#pending + 1] = line
    wake:post(1)
end

local function sender(premature)
    if premature then
        return
    end
    local sock = nil
    while true do
        if #pending == 0 then
            if ngx.worker.exiting() and active == 0 then
                break
            end
            wake:wait(1)
        end
        if #pending > 0 then
            local batch = pending
            pending = {}
            if sock == nil then
                sock = ngx.socket.tcp()
                sock:settimeout(2000)
                local ok, err = sock:connect(path)
                if not ok then
                    ngx.log(ngx.ERR, "tritongen: the sidecar's decision socket: ", err)
                    sock = nil
                end
            end
            local sent = false
            if sock ~= nil then
                local ok, err = sock:send(concat(batch))
                if ok then
                    sent = true
                else
                    ngx.log(ngx.ERR, "tritongen: sending request ends to the sidecar: ", err)
                    sock:close()
                    sock = nil
                end
            end
            if not sent then -- kept, in order, for the next try
                for i = 1, #pending do
                    batch[#batch + 1] = pending[i]
                end
                pending = batch
                ngx.sleep(0.05)
            end
        end
    end
    if sock ~= nil then
        sock:close()
    end
end

function M.start_worker()
    local ok, err = ngx.timer.at(0, sender)
    if not ok then
        ngx.log(ngx.ERR, "tritongen: cannot start the sender of request ends: ", err)
    end
end

local function clean(value)
    if value == nil then
        return ""
    end
    return (value:gsub("[\t\r\n]", " "))
end

local GRPC = "grpc_infer" -- a gRPC ModelInfer: its body is one length-prefixed protobuf message
local GRPC_STREAM = "grpc_stream" -- a gRPC ModelStreamInfer: decided as it opens, no body

-- A gRPC answer of headers alone (no message): the status, its message percent-encoded as gRPC
-- asks, and Retry-After as metadata. 204 makes nginx end the HTTP/2 stream with these headers.
local function grpc_refuse(code, message, retry_after)
    ngx.status = 204
    ngx.header["Content-Type"] = "application/grpc"
    ngx.header["grpc-status"] = code
    ngx.header["grpc-message"] = (message:gsub("[%%%c\128-\255]", function(c)
        return string.format("%%%02X", c:byte())
    end))
    if retry_after ~= nil and retry_after ~= "" then
        ngx.header["retry-after"] = retry_after
    end
    return ngx.exit(204)
end

-- The sidecar is not there (restarting, or gone): the Python listener behind nginx says so properly.
local function unavailable(err, grpc)
    ngx.log(ngx.ERR, "tritongen: the sidecar's decision socket: ", err)
    if grpc then
        return grpc_refuse("14", "the sidecar cannot decide now (its decision socket: " .. clean(err) .. ")", "1")
    end
    ngx.status = 503
    ngx.header["Content-Type"] = "application/json"
    ngx.header["Retry-After"] = "1"
    ngx.print('{"error": "the sidecar cannot decide now (its decision socket: ', clean(err),
        ')", "reason": "sidecar_unavailable", "retry_after_s": 1}')
    return ngx.exit(503)
end

local function be32(n)
    return string.char(math.floor(n / 16777216) % 256, math.floor(n / 65536) % 256, math.floor(n / 256) % 256, n % 256)
end

-- Ask the sidecar about one request (its body, or "" for a stream) and act on the answer: return to
-- let nginx carry it (admitted, maybe with a rewritten body), or end it here (refused, or handed to
-- the Python listener).
local function decide(model, op, class_var, tenant_var, body)
    local grpc = op == GRPC or op == GRPC_STREAM
    local sock = ngx.socket.tcp()
    sock:settimeout(3600000) -- a queued request waits for its grant; the sidecar answers by the class's deadline
    local ok, err = sock:connect(path)
    if not ok then
        return unavailable(err, grpc)
    end
    ngx.on_abort(function()
        ngx.exit(499) -- ends the request's threads; its socket closes and the sidecar drops the request
    end)
    ok, err = sock:send(concat({ "admit\t", model, "\t", op, "\t", clean(ngx.var[class_var]), "\t",
        clean(ngx.var[tenant_var]), "\t", clean(ngx.var.http_inference_header_content_length), "\t",
        string.format("%.3f", ngx.req.start_time()), "\t", #body, "\n", body }))
    if not ok then
        return unavailable(err, grpc)
    end
    local line
    line, err = sock:receive("*l")
    if not line then
        return unavailable(err, grpc)
    end
    local kind, a, b, n = line:match("^(%a+)\t([^\t]*)\t([^\t]*)\t(%d+)$")
    n = tonumber(n)
    local data = ""
    if n ~= nil and n > 0 then
        data, err = sock:receive(n)
        if not data then
            return unavailable(err, grpc)
        end
    end
    if kind == "admit" then -- a = the id; data = the body as it goes upstream, if rewritten, and b its
        -- Inference-Header-Content-Length (an infer's JSON part grew when a priority was written in)
        ngx.var.tg_decided = a
        local ctx = ngx.ctx
        ctx.tg_stream = op == "generate_stream"
        ctx.tg_unary = op == "infer" or op == GRPC -- an answer of tensors: only its status says it failed
        ctx.tg_grpc = grpc
        active = active + 1
        -- The grant reached nginx: from now on the log phase reports the end. A client gone before
        -- this line closes the socket instead, and the sidecar takes its grant back.
        sock:send("ok\t" .. a .. "\n")
        sock:setkeepalive(60000, 512)
        if n > 0 then
            if op == GRPC then
                ngx.req.set_body_data("\0" .. be32(#data) .. data)
            else
                ngx.req.set_body_data(data)
                if b ~= "" then
                    ngx.req.set_header("Inference-Header-Content-Length", b)
                end
            end
        end
        return
    end
    sock:setkeepalive(60000, 512)
    if kind == "pass" then -- not carried this way (a reloaded policy relays streams): the Python listener
        return ngx.exec("@sidecar_grpc")
    end
    if kind ~= "refuse" then
        return unavailable("unexpected answer " .. clean(sub(line, 1, 80)), grpc)
    end
    if grpc then -- a = the gRPC code, data = the status message
        return grpc_refuse(a, data, b)
    end
    ngx.status = tonumber(a) -- b = Retry-After, or empty
    ngx.header["Content-Type"] = "application/json"
    if b ~= "" then
        ngx.header["Retry-After"] = b
    end
    ngx.print(data)
    return ngx.exit(ngx.status)
end

function M.access(model, op, class_var, tenant_var)
    local grpc = op == GRPC
    ngx.req.read_body()
    local body = ngx.req.get_body_data()
    if body == nil then -- empty, or too large for memory (in a file): the Python path reads it
        return ngx.exec(grpc and "@sidecar_grpc" or "@sidecar")
    end
    if grpc then -- one uncompressed message, nothing after it; else the Python relay reads it
        local b1, b2, b3, b4, b5 = string.byte(body, 1, 5)
        if b1 ~= 0 or b5 == nil or #body ~= 5 + ((b2 * 256 + b3) * 256 + b4) * 256 + b5 then
            return ngx.exec("@sidecar_grpc")
        end
        body = sub(body, 6)
    end
    return decide(model, op, class_var, tenant_var, body)
end

-- A gRPC ModelStreamInfer, decided once as it opens (its requests are inside the open HTTP/2 stream,
-- which Lua cannot read): the sidecar picks the model and prices a slot (sidecar/stream_path.py).
function M.stream(class_var, tenant_var)
    ngx.ctx.tg_frames = { opened = ngx.now() } -- the response frames' reader state, for stream_body
    return decide("", GRPC_STREAM, class_var, tenant_var, "")
end

function M.body()
    local id = ngx.var.tg_decided
    if id == nil or id == "" then
        return
    end
    local chunk = ngx.arg[1]
    if chunk == nil or #chunk == 0 then
        return
    end
    local ctx = ngx.ctx
    if ctx.tg_stream and not ctx.tg_first then
        ctx.tg_first = true
        push("first\t" .. id .. "\n")
    end
    local count, at = ctx.tg_events or 0, 1
    while true do
        local s = find(chunk, "data:", at, true)
        if not s then
            break
        end
        count = count + 1
        at = s + 5
    end
    ctx.tg_events = count
    if ctx.tg_error == nil and (ngx.status >= 400 or (not ctx.tg_unary and find(chunk, '"error"', 1, true))) then
        ctx.tg_error = sub(chunk, 1, 2000)
    end
end

-- The response frames of a carried ModelStreamInfer. Each gRPC message (a 5-byte prefix: compressed
-- flag, big-endian length) holds a ModelStreamInferResponse: error_message (field 1) and
-- infer_response (field 2: id is its field 3, parameters its field 4, a map whose
-- "triton_final_response" entry holds bool_param, field 1). Protobuf writes fields in number order,
-- so the id and the parameters come before the outputs: of a large message only its first
-- PARSE_PREFIX bytes are kept, the rest is passed over uncopied.
local PARSE_PREFIX = 65536
local FINAL = "triton_final_response"
local byte = string.byte

local function varint(data, pos, stop)
    local value, scale = 0, 1
    while pos <= stop do
        local c = byte(data, pos)
        pos = pos + 1
        value = value + (c % 128) * scale
        if c < 128 then
            return value, pos
        end
        scale = scale * 128
    end
    return nil, stop + 1
end

-- Calls each(field, wire, from, to) for the fields of the message in data[pos..stop] (from..to: a
-- length-delimited field's bytes, else the value's first byte); stops at the first field cut short.
local function fields(data, pos, stop, each)
    while pos <= stop do
        local key
        key, pos = varint(data, pos, stop)
        if key == nil then
            return
        end
        local field, wire = math.floor(key / 8), key % 8
        if wire == 2 then
            local length
            length, pos = varint(data, pos, stop)
            if length == nil or pos + length - 1 > stop then
                return
            end
            each(field, wire, pos, pos + length - 1)
            pos = pos + length
        elseif wire == 0 then
            local from = pos
            local _
            _, pos = varint(data, pos, stop)
            each(field, wire, from, pos - 1)
        elseif wire == 1 then
            pos = pos + 8
        elseif wire == 5 then
            pos = pos + 4
        else
            return
        end
    end
end

local function is_final(data, from, to) -- one parameters map entry
    local key, on = nil, false
    fields(data, from, to, function(field, wire, a, b)
        if field == 1 and wire == 2 then
            key = sub(data, a, b)
        elseif field == 2 and wire == 2 then
            fields(data, a, b, function(f, w, x)
                if f == 1 and w == 0 then
                    on = byte(data, x) ~= 0
                end
            end)
        end
    end)
    return key == FINAL and on
end

-- One request inside a carried stream ended (its final flag or an error response): its span, its time
-- to first response and the error's text go to Python, which counts it as a request of its own
-- (sidecar/decisions.py: `req`). nginx cannot see when the client sent it (the request messages stay
-- inside the HTTP/2 stream), so both count from the later of the stream's opening and the end of the
-- request before it as its first response came (exact for a client that sends one request after
-- another; with requests sent together, later ones lose what they waited).
local function request_ended(state, stream_id, id, err)
    local now = ngx.now()
    local start = state.start_at[id] or state.last_end or state.opened or now
    local first = state.first_at[id] or now
    state.first_at[id], state.start_at[id] = nil, nil
    state.last_end = now
    err = err or ""
    push(concat({ "req\t", stream_id, "\t", math.floor((now - start) * 1000000), "\t",
        math.floor((first - start) * 1000000), "\t", #err, "\n", err }))
end

local function response(state, data, from, to, stream_id)
    local id, final, err, outputs = "", false, nil, false
    fields(data, from, to, function(field, wire, a, b)
        if field == 1 and wire == 2 and b >= a then
            err = sub(data, a, b)
        elseif field == 2 and wire == 2 then
            fields(data, a, b, function(f, w, x, y)
                if f == 3 and w == 2 then
                    id = sub(data, x, y)
                elseif f == 4 and w == 2 and is_final(data, x, y) then
                    final = true
                elseif (f == 5 or f == 6) and w == 2 then
                    outputs = true
                end
            end)
        end
    end)
    local seen = state.ids[id]
    if seen == nil then
        state.requests = state.requests + 1
        seen = 0
    end
    if err ~= nil then
        state.errors = state.errors + 1
        state.error = state.error or err
    end
    if final or err ~= nil then
        state.finals = state.finals + 1
        state.ids[id] = nil
        request_ended(state, stream_id, id, err)
    else
        if seen == 0 then
            state.first_at[id] = ngx.now()
            state.start_at[id] = state.last_end or state.opened
        end
        state.ids[id] = seen + 1
    end
    return outputs and err == nil
end

function M.stream_body()
    local id = ngx.var.tg_decided
    local state = ngx.ctx.tg_frames
    local chunk = ngx.arg[1]
    if id == nil or id == "" or state == nil or chunk == nil or #chunk == 0 then
        return
    end
    if state.ids == nil then
        state.ids, state.first_at, state.start_at = {}, {}, {}
        state.requests, state.finals, state.errors, state.skip = 0, 0, 0, 0
    end
    local data, at = chunk, 1
    if state.skip > 0 then -- the rest of a large message, already read
        local passed = math.min(state.skip, #data)
        state.skip = state.skip - passed
        at = passed + 1
    end
    if state.buf ~= nil then
        data, at = state.buf .. sub(data, at), 1
        state.buf = nil
    end
    local stop = #data
    while at <= stop do
        local have = stop - at + 1
        if have < 5 then
            state.buf = sub(data, at)
            break
        end
        local b1, b2, b3, b4, b5 = byte(data, at, at + 4)
        local length = ((b2 * 256 + b3) * 256 + b4) * 256 + b5
        local whole = have >= 5 + length
        if not whole and have < 5 + PARSE_PREFIX then
            state.buf = sub(data, at) -- wait for the rest (or for PARSE_PREFIX bytes of it)
            break
        end
        local last = whole and at + 4 + length or stop
        state.events = (state.events or 0) + 1
        if b1 == 0 and response(state, data, at + 5, last, id) and not state.first then
            state.first = true
            push("first\t" .. id .. "\n")
        end
        if not whole then
            state.skip = 5 + length - have
            break
        end
        at = at + 5 + length
    end
end

-- Triton's gRPC status of a carried call (the lane's too): in its trailers, or in its headers when it
-- answered with headers alone. nil when it is OK or the call was not gRPC, else Triton's message.
function M.grpc_failure()
    local code = ngx.var.upstream_trailer_grpc_status or ngx.var.upstream_http_grpc_status
    if code == nil or code == "" or code == "0" then
        return nil
    end
    return ngx.unescape_uri(ngx.var.upstream_trailer_grpc_message or ngx.var.upstream_http_grpc_message or "")
end

-- A carried ModelInfer's (HTTP status, error text), as an HTTP answer would give them.
local function grpc_end()
    local message = M.grpc_failure()
    if message == nil then
        return ngx.status, ""
    end
    return 500, message
end

-- how: "ok" (nginx carried it to its end, or the client left), "down" (Triton could not be reached).
function M.log(how)
    local id = ngx.var.tg_decided
    if id == nil or id == "" then
        return
    end
    active = active - 1
    local ctx = ngx.ctx
    local status, err = ngx.status, ctx.tg_error or ""
    local events = ctx.tg_events or 0
    if ctx.tg_grpc and how == "ok" and status ~= 499 then
        status, err = grpc_end()
    end
    local state = ctx.tg_frames
    if state ~= nil and state.ids ~= nil then -- a carried stream: how its requests ended, then its end
        events = state.events or 0
        if status == 499 and state.requests > 0 and state.finals >= state.requests then
            -- gRPC clients cancel a stream once its last response came (tritonclient's aio stream
            -- does): every request it sent had ended at the engine, so the stream ended well; a 499
            -- would keep its slot lingering as if the engine still ran a request.
            status = 200
        end
        if err == "" then
            err = state.error or "" -- an error response inside the stream (the call itself went OK)
        end
        push(concat({ "stream\t", id, "\t", state.requests, "\t", state.finals, "\t", state.errors, "\n" }))
    end
    push(concat({ "end\t", id, "\t", status, "\t", events, "\t", how or "ok", "\t", #err, "\n", err }))
end

return M
