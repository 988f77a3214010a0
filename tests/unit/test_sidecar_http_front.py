"""The lean HTTP front's pure parts (sidecar/http_front.py, sidecar/upstream_pool.py): the head
parser that decides what the front serves, and the framing that finds a response's end. The front
before the real HttpProxy and a fake Triton is tested in
tests/integration/test_sidecar_http_front_loopback.py (it listens on a loopback port)."""

from __future__ import annotations

import random

from sidecar.http_front import _Head
from sidecar.upstream_pool import ResponseFraming as _Framing


def test_the_head_parser_routes_only_what_the_front_serves() -> None:
    plain = _Head(b"POST /v2/models/m/infer HTTP/1.1\r\nContent-Length: 3\r\nX-A: b")
    assert plain.plain and plain.length == 3 and ("X-A", "b") in plain.headers and not plain.close
    for header in (b"Transfer-Encoding: chunked", b"Expect: 100-continue", b"Upgrade: h2c", b"Content-Encoding: gzip"):
        assert not _Head(b"POST /x HTTP/1.1\r\n" + header).plain
    assert _Head(b"POST /x HTTP/1.1\r\nContent-Encoding: identity").plain
    assert not _Head(b"POST /x HTTP/1.0").plain
    assert _Head(b"POST /x HTTP/1.1\r\nConnection: close").close
    for bad in (b"POST /x", b"POST /x HTTP/1.1\r\nno colon", b"POST /x HTTP/1.1\r\n folded: x",
                b"POST /x HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2", b"POST /x HTTP/1.1\r\nContent-Length: -1"):
        try:
            _Head(bad)
        except ValueError:
            continue
        raise AssertionError(f"{bad!r} was accepted")


def _feed_in_pieces(framing: _Framing, data: bytes, rng: random.Random, head_request: bool = False) -> int:
    """Feeds `data` in random pieces; returns how many bytes were fed when the framing said done."""
    i = 0
    while i < len(data) and not framing.done:
        step = rng.randint(1, 7)
        framing.feed(data[i:i + step], head_request)
        i += step
    return min(i, len(data))


def test_the_framing_finds_each_response_end_however_it_arrives() -> None:
    rng = random.Random(7)
    chunked = (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
               b"5\r\nhello\r\n1a;ext=1\r\n" + b"z" * 26 + b"\r\n0\r\nX-Trailer: t\r\n\r\n")
    sized = b"HTTP/1.1 200 OK\r\nContent-Length: 11\r\n\r\nhello world"
    for _ in range(50):
        framing = _Framing()
        assert _feed_in_pieces(framing, chunked, rng) == len(chunked) and framing.done and not framing.close_after
        framing = _Framing()
        assert _feed_in_pieces(framing, sized, rng) == len(sized) and framing.done
    framing = _Framing()
    framing.feed(b"HTTP/1.1 204 No Content\r\n\r\n", False)
    assert framing.done
    framing = _Framing()
    framing.feed(b"HTTP/1.1 200 OK\r\nContent-Length: 5\r\n\r\n", True)  # a HEAD: no body follows
    assert framing.done
    framing = _Framing()
    framing.feed(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\n\r\nuntil the close", False)
    assert not framing.done and framing.until_close and framing.close_after
    framing = _Framing()
    framing.feed(b"HTTP/1.1 413 Payload Too Large\r\nConnection: close\r\nContent-Length: 2\r\n\r\nno", False)
    assert framing.done and framing.close_after
