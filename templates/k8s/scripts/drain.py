"""preStop drain: wait until this pod has nothing queued or in flight, then let the container stop.

Order of a pod's shutdown, and what each step is for:
  1. the pod turns Terminating: the endpoints controller drops it from the Service (no new traffic
     once kube-proxy and the load balancers have caught up: --delay seconds);
  2. this script then polls the pod's own metrics until the work is done: Triton's queued requests
     (nv_inference_pending_request_count) and the sidecar's in-flight requests (streams included)
     are zero and Triton's completion counters stopped moving, twice in a row (or --timeout passes);
  3. the container gets SIGTERM: tritonserver refuses new work, waits up to --exit-timeout-secs for
     executions still running, unloads and exits.
terminationGracePeriodSeconds covers all three (delay + timeout + exit timeout + margin).
Stdlib only: it runs in the Triton image and in the sidecar image.
"""

from __future__ import annotations

import argparse
import sys
import time
import urllib.error
import urllib.request

GAUGES = ("nv_inference_pending_request_count", "sidecar_inflight_requests_total", "sidecar_queue_depth")
COUNTERS = ("nv_inference_request_success", "nv_inference_request_failure", "nv_inference_exec_count")


def sums(text: str, names: tuple[str, ...]) -> float:
    """Sum of every sample of the named families in Prometheus text format."""
    total = 0.0
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in names:
            try:
                total += float(line.rsplit(" ", 1)[1])
            except (IndexError, ValueError):
                pass
    return total


def scrape(urls: list[str], timeout: float = 2.0) -> tuple[float, float]:
    """(work pending or in flight, completions so far) over every reachable endpoint."""
    busy = done = 0.0
    for url in urls:
        try:
            with urllib.request.urlopen(url, timeout=timeout) as response:
                text = response.read().decode("utf-8", "replace")
        except (urllib.error.URLError, OSError):
            continue  # not serving metrics (any more): nothing to wait for there
        busy += sums(text, GAUGES)
        done += sums(text, COUNTERS)
    return busy, done


def drain(urls: list[str], delay: float, timeout: float, interval: float, sleep=time.sleep, clock=time.monotonic) -> bool:
    """True when the pod drained before the deadline."""
    sleep(delay)
    deadline = clock() + timeout
    quiet = 0
    last_done = None
    while clock() < deadline:
        busy, done = scrape(urls)
        quiet = quiet + 1 if busy == 0 and done == last_done else 0
        last_done = done
        if quiet >= 2:
            return True
        sleep(interval)
    return False


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--metrics", action="append", default=[], help="metrics URL to watch (repeatable)")
    parser.add_argument("--delay", type=float, default=10.0, help="seconds for the endpoint removal to propagate")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the work to finish")
    parser.add_argument("--interval", type=float, default=1.0, help="seconds between polls")
    args = parser.parse_args(argv)
    drained = drain(args.metrics, args.delay, args.timeout, args.interval)
    print("drain: done" if drained else f"drain: still busy after {args.timeout:.0f} s; stopping anyway", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
