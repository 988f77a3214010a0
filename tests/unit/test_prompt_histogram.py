"""The sidecar's prompt-length histogram is what `tritongen doctor` reads for DR103 (prompt lengths
spread widely on one queue: split into length lanes): requests go through the real parsing, cost
and admission path, the sidecar's own exposition text is scraped by doctor's adapter between two
scrapes of (fake) Triton metrics, and the rule fires for a wide spread and not for a narrow one."""

from __future__ import annotations

import asyncio
import itertools
import random
from typing import Any

from sidecar import protocol
from sidecar.admission import AdmissionState
from sidecar.controller import AdmissionController
from sidecar.cost import cost_for
from sidecar.metrics import PROMPT_TOKEN_BUCKETS, PROMPT_TOKENS_METRIC, SidecarMetrics
from tritongen.core.sidecar_policy.schema import parse_policy
from tests.sidecar_rigs import FakeClock, generate_facts, policy_doc
from tritongen.core.diagnosis import diagnose
from tritongen.core.diagnosis_inputs import PROMPT_HISTOGRAM, Targets
from tritongen.doctor import Endpoint, parse_metrics, snapshot

TRITON_METRICS = "http://triton:8002/metrics"
SIDECAR_METRICS = "http://sidecar:9002/metrics"
CONFIG = {"name": "llm", "max_batch_size": 0, "instance_group": [{"kind": "KIND_CPU", "count": 1, "gpus": []}]}


def controller() -> AdmissionController:
    doc = policy_doc()
    llm = doc["models"][0]
    llm["memory_quota_bytes"] = 1_000_000
    llm["kv"].update(bytes_per_token=1, max_context=8192)
    return AdmissionController(AdmissionState(parse_policy(doc), FakeClock()), SidecarMetrics(), FakeClock())


def send(ctl: AdmissionController, prompt_bytes: int) -> None:
    """One /generate request of `prompt_bytes` through parsing, cost and admission."""
    model = ctl.state.model_policy("llm")
    assert model.kv is not None
    doc = protocol.parse_generate(b'{"text_input": "%s", "max_tokens": 4}' % (b"x" * prompt_bytes))
    cost = cost_for(model, generate_facts(doc, model.kv))

    async def one() -> None:
        async with ctl.admit("llm", "normal", cost, "acme"):
            pass

    asyncio.run(one())


class FakeServer:
    """doctor's reader: Triton's metrics count what the sidecar let through; the sidecar's are its
    real exposition."""

    def __init__(self, ctl: AdmissionController) -> None:
        self.ctl = ctl
        self.success = 0

    def metrics(self, url: str) -> dict[Any, float]:
        if url == TRITON_METRICS:
            return parse_metrics(f'nv_inference_request_success{{model="llm",version="1"}} {self.success}\n')
        assert url == SIDECAR_METRICS
        return parse_metrics(self.ctl.metrics.exposition().decode())

    def index(self, http: str) -> list[dict[str, Any]]:
        return [{"name": "llm", "version": "1", "state": "READY"}]

    def config(self, http: str, model: str) -> dict[str, Any]:
        return CONFIG


def diagnose_traffic(lengths: list[int]) -> list[str]:
    ctl = controller()
    server = FakeServer(ctl)
    send(ctl, 100)  # traffic before the window is not the window's

    def window(seconds: float) -> None:
        for n in lengths:
            send(ctl, n)
        server.success += len(lengths)

    snaps = snapshot([Endpoint("triton:8000", [TRITON_METRICS, SIDECAR_METRICS])], 10.0, server,  # type: ignore[arg-type]
                     sleep=window, clock=iter(range(0, 100, 10)).__next__, every_s=10.0)
    (snap,) = snaps
    assert snap.models["llm"].prompt_tokens_buckets[-1][1] == len(lengths)  # one observation per prompt
    return [f.code for f in diagnose(snaps, Targets())]


def test_the_histogram_is_the_one_doctor_reads() -> None:
    assert PROMPT_HISTOGRAM == PROMPT_TOKENS_METRIC + "_bucket"
    assert list(PROMPT_TOKEN_BUCKETS) == sorted(PROMPT_TOKEN_BUCKETS)
    # power-of-two bounds: within one bucket doctor's interpolated P95 / P50 stays under its 4x
    assert all(hi == 2 * lo for lo, hi in itertools.pairwise(PROMPT_TOKEN_BUCKETS))


def test_wide_prompt_spread_calls_for_length_lanes() -> None:
    rng = random.Random(7)
    chat = [rng.randint(20, 60) for _ in range(60)]
    documents = [rng.randint(1500, 4000) for _ in range(40)]
    assert "DR103" in diagnose_traffic(chat + documents)


def test_narrow_prompt_spread_does_not() -> None:
    rng = random.Random(7)
    assert "DR103" not in diagnose_traffic([rng.randint(90, 200) for _ in range(100)])


def test_only_stated_prompts_of_admitted_llm_requests_are_observed() -> None:
    ctl = controller()
    model = ctl.state.model_policy("llm")
    assert model.kv is not None
    unknown = cost_for(model, None)  # a prompt the sidecar cannot read: charged a full context
    batch = cost_for(model, generate_facts({"text_input": ["ab", "abcd"]}, model.kv))
    assert unknown.prompt_lengths == () and batch.prompt_lengths == (2, 4)

    async def run() -> None:
        for cost in (unknown, batch):
            async with ctl.admit("llm", "normal", cost):
                pass
        async with ctl.admit("cls", "normal", cost_for(ctl.state.model_policy("cls"), None)):
            pass

    asyncio.run(run())
    samples = parse_metrics(ctl.metrics.exposition().decode())
    count = {dict(labels)["model"]: value for (name, labels), value in samples.items()
             if name == PROMPT_TOKENS_METRIC + "_count"}
    assert count == {"llm": 2.0}  # the two stated prompts; nothing for the unreadable one or the classic model
