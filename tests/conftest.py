"""Shared fixtures. Integration tests share ONE real tritonserver per session on the example repository.

Fixtures only: what test modules import (paths, `cli`, fakes, builders) lives in tests/helpers.py,
and what only the sidecar's tests read in tests/sidecar_rigs.py."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers import MODEL_REPOSITORY


@pytest.fixture(scope="session")
def triton_server() -> Iterator["object"]:
    """The embedded tritonserver serving the committed, rendered example repository."""
    from tritongen.server_flags import server_flags_from
    from tritongen.server import ServerOptions, TritonServer

    options = ServerOptions(repository=MODEL_REPOSITORY, extra_args=server_flags_from(MODEL_REPOSITORY))
    with TritonServer(options) as server:
        yield server
