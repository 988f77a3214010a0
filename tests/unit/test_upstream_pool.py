"""The sidecar's lean keep-alive client (sidecar/upstream_pool.py), its pure parts: the response
head parser and the dechunker. The client against raw TCP servers is tested in
tests/integration/test_upstream_pool_loopback.py (they listen on loopback ports)."""

from __future__ import annotations

import pytest

from sidecar.upstream_pool import UpstreamConnectionError, _dechunk, _parse_head


def test_head_parsing_and_dechunking() -> None:
    status, headers, length, chunked, keep = _parse_head(
        b"HTTP/1.1 429 Too Many\r\nContent-Length: 5\r\nTransfer-Encoding: chunked\r\nConnection: close")
    assert (status, length, chunked, keep) == (429, None, True, False)
    assert ("Content-Length", "5") in headers
    assert _parse_head(b"HTTP/1.0 200 OK\r\nConnection: keep-alive")[4] is True
    assert _parse_head(b"HTTP/1.0 200 OK")[4] is False
    with pytest.raises(UpstreamConnectionError):
        _parse_head(b"HTTP/1.1 200 OK\r\nContent-Length: ten")
    with pytest.raises(UpstreamConnectionError):
        _parse_head(b"HTTP/1.1 200 OK\r\nno colon here")
    assert _dechunk(bytearray(b"3\r\nabc\r\n0\r\n\r\n"), 0) == b"abc"
    assert _dechunk(bytearray(b"3\r\nabc\r\n0\r\n"), 0) is None  # the final empty line has not arrived
    assert _dechunk(bytearray(b"3\r\nab"), 0) is None
    with pytest.raises(UpstreamConnectionError):
        _dechunk(bytearray(b"zz\r\nabc\r\n"), 0)
