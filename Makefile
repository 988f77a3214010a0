# The two commands: `make demo` (the main job end to end on the embedded Triton) and `make test`.
# Both create .venv on a fresh machine; nvidia-pytriton (the tritonserver binary) comes from PyPI.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tritongen-installed

.PHONY: demo test venv clean bench bench-fidelity bench-sidecar bench-profile bench-simulator bench-fixed-vs-tuned bench-check-conformance bench-llm-fidelity bench-llm-guard bench-vs-model-analyzer bench-instance-scaling bench-admission bench-native-admission

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[test]'
	@touch $(STAMP)

# Unit tests are pure and CPU-bound: two workers. Integration tests measure a live server: one at a time.
test: $(STAMP)
	$(PY) -m pytest -q -n 2 tests/unit
	$(PY) -m pytest -q tests/integration

demo: $(STAMP)
	$(VENV)/bin/tritongen demo

# Benchmarks give figures, not verdicts: each prints its table and writes it to bench/results/NAME.md
# (date, machine, commit). Run them one at a time on a quiet host; `make bench` runs them all (~12 min, and ~33 more for bench-vs-model-analyzer).
TRITON_SERVER_REPO ?= /tmp/triton-server

bench: bench-simulator bench-profile bench-fidelity bench-llm-fidelity bench-llm-guard bench-sidecar bench-fixed-vs-tuned bench-check-conformance bench-vs-model-analyzer bench-instance-scaling bench-admission

bench-fidelity: $(STAMP)
	$(PY) bench/bench_sim_fidelity.py

bench-sidecar: $(STAMP)
	$(PY) bench/bench_sidecar.py
	$(PY) bench/bench_sidecar.py --pinned --models identity

bench-check-conformance: $(STAMP)
	$(PY) bench/bench_check_conformance.py --server-repo $(TRITON_SERVER_REPO)

bench-profile: $(STAMP)
	$(PY) bench/bench_profile.py

bench-simulator: $(STAMP)
	$(PY) bench/bench_simulator_speed.py

bench-fixed-vs-tuned: $(STAMP)
	$(PY) bench/bench_fixed_vs_tuned.py

bench-llm-fidelity: $(STAMP)
	$(PY) bench/bench_llm_fidelity.py

bench-instance-scaling: $(STAMP)
	$(PY) bench/bench_instance_scaling.py

bench-llm-guard: $(STAMP)
	$(PY) bench/bench_llm_guard.py $(BENCH_ARGS)

bench-admission: $(STAMP)
	$(PY) bench/bench_admission.py

# Evidence for a design question (a native data path): admission in nginx's Lua next to nginx and the
# sidecar. Needs nginx-light and libnginx-mod-http-lua from Debian; without them it says so. ~4 min.
bench-native-admission: $(STAMP)
	$(PY) bench/bench_native_admission.py

# Installs triton-model-analyzer (numpy pinned; else bench/.ma-venv) and perf_analyzer (bench/.perf-analyzer)
# when missing; without them it says why and takes no figures. ~33 min; BENCH_ARGS=--quick for a smoke run.
bench-vs-model-analyzer: $(STAMP)
	$(PY) bench/bench_vs_model_analyzer.py $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache
