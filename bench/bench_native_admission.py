"""What admission costs when it runs inside the proxy instead of in the sidecar's Python data path.

    .venv/bin/python -m bench.bench_native_admission [--seconds 3] [--levels 1,16,64]

The evidence for a design question, not a feature: issue 15's pass-through goals (the sidecar's
throughput ratio at least nginx's) are out of reach of a Python data path on this host (see
bench_sidecar). Would a native data path that still admits per request keep nginx's figures? This
bench runs, on bench_sidecar's models, load and Triton, in the same run:
  * direct, nginx as bench_sidecar configures it, and the sidecar (`tritongen sidecar`);
  * nginx with admission in Lua (Debian's libnginx-mod-http-lua): an in-flight count per model in a
    `lua_shared_dict`, taken in `access_by_lua` and given back in `log_by_lua` (which runs however
    the request ends), a 429 with Retry-After over the limit. The model comes from the URL on HTTP
    and, on gRPC, from the request body: `model_name` is field 1 of ModelInferRequest, so it is the
    first bytes after the 5-byte gRPC frame header.
It then proves the Lua admission is not a no-op: with a limit of 1, of 16 requests sent at once 15
must be refused on each protocol.

What a product would add on top (not measured here): limits pushed by the Python control plane
(headroom, the adaptive limit, LowerShare) into the shared dict, a queue with deadlines
(`ngx.sleep` polling), the LLM cost from the body, gRPC status codes for refusals. Needs
/usr/sbin/nginx and the Lua module (`apt-get install nginx-light libnginx-mod-http-lua`); without
them it says so and takes no figures.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import bench_sidecar as bs
from tritongen.server import ServerOptions, TritonServer
from tritongen.sidecar_process import SidecarProcess

MODULES = (Path("/usr/lib/nginx/modules/ndk_http_module.so"), Path("/usr/lib/nginx/modules/ngx_http_lua_module.so"))
OPEN = 100_000  # the measured runs' limit: admission runs, never refuses

ADMIT = """
            access_by_lua_block {
                local m = ngx.var.model
                if m == "" then  -- gRPC: model_name, field 1, right after the 5-byte frame header
                    ngx.req.read_body()
                    local body = ngx.req.get_body_data()
                    m = "?"
                    if body and #body > 7 and body:byte(6) == 10 and body:byte(7) < 128 then
                        m = body:sub(8, 7 + body:byte(7))
                    end
                end
                local inflight = ngx.shared.inflight
                if inflight:incr(m, 1, 0) > (limits[m] or limits["*"]) then
                    inflight:incr(m, -1)
                    ngx.header["Retry-After"] = "1"
                    return ngx.exit(429)
                end
                ngx.ctx.admitted = m
            }
            log_by_lua_block {
                local m = ngx.ctx.admitted
                if m then ngx.shared.inflight:incr(m, -1) end
            }
"""


def lua_config(tmp: Path, http_up: str, http_port: int, grpc_up: str, grpc_port: int, limit: int) -> str:
    """bench_sidecar's nginx configuration with the admission above on the model endpoints."""
    conf = bs.nginx_config(tmp, http_up, http_port, grpc_up, grpc_port)
    modules = "".join(f"load_module {m};\n" for m in MODULES)
    conf = modules + conf.replace(
        "http {\n", f'http {{\n    lua_shared_dict inflight 1m;\n    init_by_lua_block {{ limits = {{ ["*"] = {limit} }} }}\n', 1)
    http_model = ("        location ~ ^/v2/models/(?<model>[^/]+)(/versions/[^/]+)?/infer$ {" + ADMIT +
                  "            proxy_pass http://triton_http;\n            proxy_http_version 1.1;\n"
                  '            proxy_set_header Connection "";\n        }\n')
    grpc_model = ('        location = /inference.GRPCInferenceService/ModelInfer {\n            set $model "";' + ADMIT +
                  "            grpc_pass grpc://triton_grpc;\n        }\n")
    conf = conf.replace("        location / {\n            proxy_pass", http_model + "        location / {\n            proxy_pass", 1)
    return conf.replace("        location / {\n            grpc_pass", grpc_model + "        location / {\n            grpc_pass", 1)


class LuaNginx(bs.Nginx):
    def __init__(self, http_up: str, grpc_up: str, limit: int) -> None:
        super().__init__(http_up, grpc_up)
        self.conf.write_text(lua_config(self.tmp, http_up, self.http_port, grpc_up, self.grpc_port, limit))


def missing() -> str | None:
    why = bs.nginx_missing()
    if why:
        return why
    absent = [str(m) for m in MODULES if not m.exists()]
    return f"{', '.join(absent)} not installed (Debian: `apt-get install libnginx-mod-http-lua`)" if absent else None


def refusals_at_limit_one(server: TritonServer) -> dict[str, list[int]]:
    """16 requests at once through a limit of 1, per protocol: the status of each."""
    out: dict[str, list[int]] = {}
    with LuaNginx(server.http_url, server.grpc_url, 1) as nginx:
        for proto, target in (("http", bs.HttpTarget(nginx.http_url, bs.workload("ranker"))),
                              ("grpc", bs.GrpcTarget(nginx.grpc_url, bs.workload("ranker")))):
            async def burst(t: Any = target) -> list[int]:
                await t.open()
                try:
                    return list(await asyncio.gather(*(t.send() for _ in range(16))))
                finally:
                    await t.close()
            out[proto] = sorted(bs.run_loop(burst()))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--levels", default="1,16,64")
    args = parser.parse_args()
    why = missing()
    if why:
        print(f"no figures: {why}")
        return 0
    levels = [int(x) for x in args.levels.split(",") if x.strip()]
    work = Path(tempfile.mkdtemp(prefix="bench-native-"))
    repo, flags, identity_models = bs.build_repository(work / "repo", False)
    policy = work / "sidecar_policy.json"
    bs.write_policy(policy, max(levels), identity_models)
    loads = {m: bs.workload(m) for m in ("ranker", "identity")}
    paths = ("direct", "nginx", "nginx+lua", "sidecar")
    print(f"closed loop, {args.seconds:g} s per path in 4 rotating segments; ratio = throughput / direct's; "
          "nginx as bench_sidecar; nginx+lua: the same nginx with a per-model in-flight count in Lua (limit open)")
    print("| protocol | model | c | " + " | ".join(f"{p} req/s (ratio) P50 ms" for p in paths) + " |")
    print("|---|---|---|" + "---|" * len(paths))
    with TritonServer(ServerOptions(repository=repo, extra_args=flags)) as server:
        with bs.Nginx(server.http_url, server.grpc_url) as plain, \
                LuaNginx(server.http_url, server.grpc_url, OPEN) as lua, \
                SidecarProcess(policy, server, work / "sidecar.log", grpc_upstream=server.grpc_url) as sidecar:
            for proto in ("http", "grpc"):
                target = bs.HttpTarget if proto == "http" else bs.GrpcTarget
                for model in ("ranker", "identity"):
                    for c in levels:
                        urls = {"direct": server, "nginx": plain, "nginx+lua": lua, "sidecar": sidecar}
                        targets = {name: target(x.http_url if proto == "http" else x.grpc_url, loads[model])
                                   for name, x in urls.items()}
                        res = bs.run_loop(bs.rotated(targets, c, args.seconds, 1.0, 4))
                        direct = res["direct"]["throughput"] or 1.0
                        cells = [f"{res[p]['throughput']:.0f} ({res[p]['throughput'] / direct:.2f}) "
                                 f"{res[p]['p50_ms']:.2f}" for p in paths]
                        print(f"| {proto} | {model} | {c} | " + " | ".join(cells) + " |", flush=True)
        checks = refusals_at_limit_one(server)
    for proto, codes in checks.items():
        admitted = sum(1 for c in codes if c == 200)
        print(f"limit 1, 16 {proto} requests at once: {admitted} served, {len(codes) - admitted} refused "
              f"({'as expected' if admitted == 1 else 'NOT the expected 1 served'}; gRPC refusals arrive as "
              "nginx's mapping of 429, UNAVAILABLE)" if proto == "grpc" else
              f"limit 1, 16 {proto} requests at once: {admitted} served, {len(codes) - admitted} refused with "
              f"{sorted(set(codes) - {200})} ({'as expected' if admitted == 1 else 'NOT the expected 1 served'})")
    return 0


if __name__ == "__main__":
    from bench.report import saved_report

    with saved_report("native_admission"):
        code = main()
    sys.exit(code)
