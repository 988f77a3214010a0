"""Start-up self-check: the pod is not started (so never ready) until every model answered one real request.

Runs inside the Triton container (stdlib only; the -py3 images ship python3) as the startupProbe:
  python3 selfcheck.py --url 127.0.0.1:8000 --requests /etc/tritongen/scripts/warmup.json
Exit 0 only when the server is ready (strict readiness: every model loaded) AND each warm-up request
succeeded; unary models through /v2/models/M/infer, decoupled (streaming) models through
/v2/models/M/generate_stream. The first real inference is what pays for lazy initialisation (CUDA
graphs, allocator growth, JIT), so no client request ever lands on a cold replica.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import urllib.error
import urllib.request


def _post(url: str, body: object, timeout: float) -> tuple[int, str]:
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, response.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode("utf-8", "replace")


def check(url: str, requests: list[dict], timeout: float) -> list[str]:
    """Problems found; empty when the server is ready and every model answered."""
    base = f"http://{url}"
    try:
        with urllib.request.urlopen(f"{base}/v2/health/ready", timeout=timeout) as response:
            if response.status != 200:
                return [f"server not ready (HTTP {response.status})"]
    except (urllib.error.URLError, OSError) as err:
        return [f"server not ready: {err}"]
    problems = []
    for item in requests:
        model, path, stream = item["model"], item["path"], bool(item.get("stream"))
        start = time.monotonic()
        try:
            status, text = _post(base + path, item["body"], timeout)
        except (urllib.error.URLError, OSError) as err:
            problems.append(f"{model}: {err}")
            continue
        took = time.monotonic() - start
        if status != 200:
            problems.append(f"{model}: HTTP {status}: {text.strip()[:300]}")
        elif stream and ("data:" not in text or '"error"' in text):
            problems.append(f"{model}: stream gave no data: {text.strip()[:300]}")
        else:
            print(f"selfcheck: {model} answered in {took * 1000:.0f} ms")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="127.0.0.1:8000", help="Triton HTTP address host:port")
    parser.add_argument("--requests", required=True, help="JSON list of {model, path, body, stream}")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds per request")
    args = parser.parse_args(argv)
    with open(args.requests) as handle:
        requests = json.load(handle)
    problems = check(args.url, requests, args.timeout)
    for problem in problems:
        print(f"selfcheck: {problem}", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
