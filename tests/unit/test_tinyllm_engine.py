"""The tinyllm engine without Triton: config, block pool, paged attention, continuous batching."""

from __future__ import annotations

import importlib.util
import sys
import threading
import tracemalloc
from pathlib import Path

import numpy as np
import pytest

ENGINE_PATH = Path(__file__).resolve().parents[2] / "model_repository" / "tinyllm" / "1" / "tinyllm_engine.py"


def _load_engine():
    """Import the engine by path: its directory also holds model.py, which needs Triton."""
    if "tinyllm_engine" not in sys.modules:
        spec = importlib.util.spec_from_file_location("tinyllm_engine", ENGINE_PATH)
        module = importlib.util.module_from_spec(spec)
        sys.modules["tinyllm_engine"] = module
        spec.loader.exec_module(module)
    return sys.modules["tinyllm_engine"]


_engine = _load_engine()
BlockPool = _engine.BlockPool
CollectingSink = _engine.CollectingSink
Engine = _engine.Engine
EngineConfig = _engine.EngineConfig
KVCacheOOM = _engine.KVCacheOOM
StreamDecoder = _engine.StreamDecoder
TinyLLM = _engine.TinyLLM
decode = _engine.decode
encode = _engine.encode
generate_text = _engine.generate_text

CFG = EngineConfig()


@pytest.fixture(scope="module")
def net() -> TinyLLM:
    return TinyLLM(CFG)


# -- config ------------------------------------------------------------------------------------


def test_defaults_and_kv_bytes_per_token():
    assert (CFG.num_layers, CFG.hidden_size, CFG.num_heads, CFG.num_kv_heads) == (2, 64, 4, 2)
    assert (CFG.vocab_size, CFG.max_context, CFG.seed) == (256, 256, 11)
    assert (CFG.kv_block_tokens, CFG.kv_pool_blocks, CFG.max_num_seqs, CFG.default_max_tokens) == (16, 64, 8, 16)
    assert CFG.head_dim == 16
    assert CFG.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4 == 512
    assert CFG.kv_pool_bytes == 512 * 16 * 64


def test_from_triton_parameters():
    params = {
        "kv_pool_blocks": {"string_value": "4"},
        "max_num_seqs": {"string_value": " 2 "},
        "seed": {"string_value": ""},  # empty means default
        "FORCE_CPU_ONLY_INPUT_TENSORS": {"string_value": "no"},  # not ours: ignored
    }
    cfg = EngineConfig.from_parameters(params)
    assert (cfg.kv_pool_blocks, cfg.max_num_seqs, cfg.seed) == (4, 2, 11)
    assert EngineConfig.from_parameters(None) == CFG
    with pytest.raises(ValueError, match="num_heads must be an integer"):
        EngineConfig.from_parameters({"num_heads": {"string_value": "four"}})
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        EngineConfig(num_heads=4, num_kv_heads=3)
    with pytest.raises(ValueError, match="kv_pool_blocks must be >= 1"):
        EngineConfig(kv_pool_blocks=0)
    # head_dim: derived by default; a renderer may pass it (equal) or set it apart from hidden_size
    assert EngineConfig.from_parameters({"head_dim": {"string_value": "16"}}) == CFG
    wide = EngineConfig(head_dim=32)
    assert wide.kv_bytes_per_token == 2 * 2 * 2 * 32 * 4
    assert len(generate_text(wide, "wide heads", 5)) == 5
    with pytest.raises(ValueError, match="must be even"):
        EngineConfig(head_dim=15)


# -- tokenizer ---------------------------------------------------------------------------------


def test_byte_tokenizer_and_streaming_decoder():
    ids = encode("é日本!")
    assert list(ids) == list("é日本!".encode())
    dec = StreamDecoder()
    pieces = [dec.piece(int(t), final=(i == len(ids) - 1)) for i, t in enumerate(ids)]
    assert "" in pieces  # a token in the middle of a character carries no text yet
    assert "".join(pieces) == "é日本!" == decode(ids)
    dec = StreamDecoder()
    cut = [dec.piece(int(t), final=(i == 1)) for i, t in enumerate(encode("日")[:2])]
    assert "".join(cut) == "\ufffd"  # a truncated character is replaced, like decode()


# -- block pool --------------------------------------------------------------------------------


def test_block_pool_allocate_release():
    pool = BlockPool(EngineConfig(kv_pool_blocks=6))
    assert pool.k.shape == (2, 6, 16, 2, 16) and pool.k.dtype == np.float32
    assert pool.nbytes == 6 * 16 * 512
    a = pool.allocate(4)
    assert (pool.used, pool.free_count) == (4, 2)
    with pytest.raises(KVCacheOOM) as err:
        pool.allocate(3)
    assert str(err.value) == "out of memory: KV cache pool exhausted (needed 3 blocks, 2 free of 6)"
    assert (pool.used, pool.free_count) == (4, 2)  # a failed allocation takes nothing
    b = pool.allocate(2)
    assert len(set(a) | set(b)) == 6
    pool.release(a)
    assert (pool.used, pool.free_count) == (2, 4)
    with pytest.raises(RuntimeError, match="released twice"):
        pool.release(a[:1])


# -- the network -------------------------------------------------------------------------------


def _prefilled(net: TinyLLM, pool: BlockPool, prompts: list[str]):
    seqs = []
    for p in prompts:
        ids = encode(p)
        table = pool.allocate(CFG.blocks_for(len(ids) + 1))
        logits = net.prefill(ids, table, pool)
        seqs.append((table, len(ids), int(np.argmax(logits))))
    return seqs


def test_batched_decode_equals_one_at_a_time_bitwise(net):
    prompts = ["a", "the quick brown fox jumps", "x" * 47, "multi\nline prompt", "z" * 16]
    pool = BlockPool(CFG)
    seqs = _prefilled(net, pool, prompts)
    tokens = np.array([s[2] for s in seqs])
    positions = np.array([s[1] for s in seqs])
    tables = [s[0] for s in seqs]
    k0, v0 = pool.k.copy(), pool.v.copy()
    batched = net.decode(tokens, positions, tables, pool)
    for b in range(len(seqs)):
        pool.k[...], pool.v[...] = k0, v0
        alone = net.decode(tokens[b : b + 1], positions[b : b + 1], tables[b : b + 1], pool)
        assert np.array_equal(alone[0], batched[b]), f"sequence {b} differs between batch sizes"


def test_prefill_matches_token_by_token_decode(net):
    """The paged cache and rotary positions agree between the two paths (up to float rounding)."""
    ids = encode("paged attention reads K/V through the block table")
    pool = BlockPool(CFG)
    table = pool.allocate(CFG.blocks_for(len(ids)))
    via_prefill = net.prefill(ids, table, pool)
    pool2 = BlockPool(CFG)
    table2 = pool2.allocate(CFG.blocks_for(len(ids)))
    net.prefill(ids[:1], table2, pool2)
    for pos in range(1, len(ids)):
        logits = net.decode(ids[pos : pos + 1], np.array([pos]), [table2], pool2)
    assert np.allclose(logits[0], via_prefill, atol=1e-3)
    assert int(np.argmax(logits[0])) == int(np.argmax(via_prefill))


def test_prefill_attention_memory_grows_with_square_of_prompt():
    cfg = EngineConfig(max_context=1024)
    big = TinyLLM(cfg)

    def peak_bytes(n: int) -> int:
        pool = BlockPool(cfg)
        table = pool.allocate(cfg.blocks_for(n))
        ids = encode("q" * n)
        tracemalloc.start()
        try:
            big.prefill(ids, table, pool)
            return tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()

    small, large = peak_bytes(256), peak_bytes(1024)
    assert small >= cfg.num_heads * 256 * 256 * 4  # the [heads, P, P] float32 scores
    assert large >= cfg.num_heads * 1024 * 1024 * 4
    assert large > 8 * small  # 4x the prompt, ~16x the scores


# -- engine ------------------------------------------------------------------------------------


def test_greedy_generation_is_deterministic(net):
    first = generate_text(CFG, "Hello", 20)
    assert len(first) == 20
    assert generate_text(CFG, "Hello", 20) == first
    assert generate_text(CFG, "Hello", 20, model=net) == first
    assert generate_text(CFG, "Hello", 8) == first[:8]
    other_seed = EngineConfig(seed=12)
    assert generate_text(other_seed, "Hello", 20) != first


def test_continuous_batching_equals_sequential(net):
    prompts = [f"prompt {i} " * (i + 1) for i in range(8)]
    expected = [generate_text(CFG, p, 20, model=net) for p in prompts]
    engine = Engine(CFG, model=net)
    sinks = [CollectingSink() for _ in prompts]
    for p, sink in zip(prompts[:3], sinks[:3]):
        engine.submit(p, 20, sink)
    engine.step()
    engine.step()
    for p, sink in zip(prompts[3:], sinks[3:]):  # join a batch that is already decoding
        engine.submit(p, 20, sink)
    engine.run_until_idle()
    assert [s.text for s in sinks] == expected
    assert all(len(s.ids) == 20 and s.error_message is None for s in sinks)
    assert engine.pool.used == 0
    assert engine.generated_tokens_total == 8 * 20


def test_max_num_seqs_bounds_the_running_batch(net):
    cfg = EngineConfig(max_num_seqs=2)
    engine = Engine(cfg, model=net)
    sinks = [CollectingSink() for _ in range(5)]
    for i, sink in enumerate(sinks):
        engine.submit(f"req {i}", 6, sink)
    engine.step()
    stats = engine.stats()
    assert (stats.running_sequences, stats.waiting_sequences) == (2, 3)
    engine.run_until_idle()
    assert [s.text for s in sinks] == [generate_text(CFG, f"req {i}", 6, model=net) for i in range(5)]


def test_out_of_memory_at_admission_and_during_decode_frees_blocks(net):
    cfg = EngineConfig(kv_pool_blocks=4, kv_block_tokens=16)
    engine = Engine(cfg, model=net)
    too_long = CollectingSink()
    engine.submit("p" * 100, 4, too_long)
    grows = CollectingSink()
    engine.submit("q" * 40, 60, grows)
    engine.run_until_idle()
    assert too_long.error_kind == "oom" and too_long.ids == []
    assert too_long.error_message == "out of memory: KV cache pool exhausted (needed 7 blocks, 4 free of 4)"
    assert grows.error_kind == "oom"
    assert grows.error_message == "out of memory: KV cache pool exhausted (needed 1 blocks, 0 free of 4)"
    assert len(grows.ids) == 25  # prefill token + decodes at positions 40..63, then block 5 is missing
    assert engine.pool.used == 0 and engine.oom_errors_total == 2
    ok = CollectingSink()
    engine.submit("ok", 6, ok)
    engine.run_until_idle()
    assert ok.error_message is None and ok.text == generate_text(CFG, "ok", 6, model=net)


def test_rejections_and_empty_requests(net):
    engine = Engine(CFG, model=net)
    over = CollectingSink()
    assert not engine.submit("x" * 250, 10, over)
    assert over.error_kind == "invalid"
    assert "exceeds max_context" in over.error_message and "260 > max_context 256" in over.error_message
    empty = CollectingSink()
    assert not engine.submit("", 4, empty)
    assert empty.error_kind == "invalid"
    zero = CollectingSink()
    assert engine.submit("hi", 0, zero)
    assert zero.done.is_set() and zero.ids == [] and zero.error_message is None
    default = CollectingSink()
    engine.submit("hi", None, default)
    engine.run_until_idle()
    assert len(default.ids) == CFG.default_max_tokens


class _CancellingSink(CollectingSink):
    def __init__(self, after: int) -> None:
        super().__init__()
        self.after = after
        self.finished = False

    def cancelled(self) -> bool:
        return len(self.ids) >= self.after

    def finish(self) -> None:
        self.finished = True
        super().finish()


def test_cancelled_request_stops_and_frees_blocks(net):
    engine = Engine(CFG, model=net)
    sink = _CancellingSink(after=3)
    engine.submit("cancel me", 50, sink)
    engine.run_until_idle()
    assert sink.finished and len(sink.ids) == 3
    assert engine.pool.used == 0


def test_background_thread_serves_concurrent_submitters_and_stops(net):
    engine = Engine(CFG, model=net)
    seen = []
    engine.on_step = seen.append
    engine.start()
    try:
        sinks = [CollectingSink() for _ in range(6)]
        threads = [
            threading.Thread(target=engine.submit, args=(f"thread {i}", 12, s)) for i, s in enumerate(sinks)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        for s in sinks:
            assert s.done.wait(10)
        assert [s.text for s in sinks] == [generate_text(CFG, f"thread {i}", 12, model=net) for i in range(6)]
        assert seen and seen[-1].kv_blocks_used == 0 and seen[-1].kv_bytes_per_token == 512
    finally:
        engine.stop()
    late = CollectingSink()
    assert not engine.submit("late", 4, late)
    assert late.error_kind == "unavailable"


def test_stop_fails_requests_still_waiting():
    engine = Engine(CFG)  # never started: requests stay queued
    sink = CollectingSink()
    engine.submit("never served", 4, sink)
    engine.stop()
    assert sink.error_kind == "unavailable" and "stopped" in sink.error_message
