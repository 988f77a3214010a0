"""`tritongen deploy`'s pod scripts (assemble.sh, selfcheck.py, drain.py) run as the pod runs them:
shell and Python processes, against the session's real tritonserver. The manifests themselves are
checked without a process in tests/unit/test_k8s.py.

The example deployment is rendered with its profiles, i.e. into the committed example repository
(tests/unit/test_render.py holds it free of drift), which the session server serves: a ConfigMap
that assemble.sh turns into exactly that repository is one tritonserver loads.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.helpers import EXAMPLES, MODEL_REPOSITORY, example_render
from tritongen.k8s import DeployOptions, configmap_key, render_manifests
from tritongen.render import drift
from tritongen.specio import load_spec

pytestmark = pytest.mark.integration

SCRIPTS = ("assemble.sh", "selfcheck.py", "drain.py", "warmup.json")


def _unpack_configmap(tmp_path: Path) -> tuple[Any, Path, Path]:
    """The example's ConfigMap written out as the pod mounts it: (rendered, files, scripts)."""
    rendered = example_render()
    result = render_manifests(load_spec(EXAMPLES / "deployment.yaml").spec, rendered, DeployOptions(), "deployment.yaml")
    data = next(o for o in result.objects if o["kind"] == "ConfigMap")["data"]
    src, scripts = tmp_path / "configmap", tmp_path / "scripts"
    for path in rendered.files:
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        (src / path).write_text(data[configmap_key(path)])
    scripts.mkdir()
    for name in SCRIPTS:
        (scripts / name).write_text(data[name])
    return rendered, src, scripts


def test_pod_scripts_assemble_selfcheck_and_drain_on_a_real_server(triton_server, tmp_path: Path) -> None:
    """assemble.sh builds the repository the server loads from the ConfigMap files and the model
    store; the self-check passes on it (both models, the streaming one included) and fails for a
    missing model; the drain returns once the idle server has nothing pending."""
    rendered, src, scripts = _unpack_configmap(tmp_path)
    dst = tmp_path / "models"
    env = {"SRC": str(src), "DST": str(dst), "STORE": str(MODEL_REPOSITORY), "PATH": "/usr/bin:/bin"}
    assembled = subprocess.run(["sh", str(scripts / "assemble.sh")], env=env, capture_output=True, text=True)
    assert assembled.returncode == 0, assembled.stderr
    assert (dst / "ranker" / "1").is_symlink() and (dst / "ranker" / "config.pbtxt").is_file()
    assert drift(rendered, dst) == "", "assemble.sh must build the repository the server serves"

    def selfcheck(requests: Path, url: str, *extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(scripts / "selfcheck.py"), "--url", url, "--requests", str(requests),
                               *extra], capture_output=True, text=True, timeout=120)

    ok = selfcheck(scripts / "warmup.json", triton_server.http_url)
    assert ok.returncode == 0, ok.stderr
    assert "ranker answered" in ok.stdout and "tinyllm answered" in ok.stdout
    bogus = tmp_path / "bogus.json"
    bogus.write_text(json.dumps([{"model": "nosuch", "path": "/v2/models/nosuch/infer", "body": {"inputs": []}}]))
    failed = selfcheck(bogus, triton_server.http_url)
    assert failed.returncode == 1 and "nosuch: HTTP" in failed.stderr
    drained = subprocess.run([sys.executable, str(scripts / "drain.py"), "--delay", "0", "--timeout", "20",
                              "--interval", "0.2", "--metrics", triton_server.metrics_url],
                             capture_output=True, text=True, timeout=60)
    assert drained.returncode == 0 and "drain: done" in drained.stderr
    # No server at all: the self-check says not ready.
    down = selfcheck(scripts / "warmup.json", "127.0.0.1:1", "--timeout", "2")
    assert down.returncode == 1 and "not ready" in down.stderr
    # A model missing from the store: the init container fails with the reason.
    empty = tmp_path / "empty-store"
    empty.mkdir()
    missing = subprocess.run(["sh", str(scripts / "assemble.sh")], env={**env, "STORE": str(empty), "DST": str(tmp_path / "m2")},
                             capture_output=True, text=True)
    assert missing.returncode == 1 and "no version folder for model 'ranker'" in missing.stderr
