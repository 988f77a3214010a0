# The two commands: `make demo` (the main job end to end on the embedded Triton) and `make test`.
# Both create .venv on a fresh machine; nvidia-pytriton (the tritonserver binary) comes from PyPI.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.tritongen-installed

.PHONY: demo test venv clean

venv: $(STAMP)

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	@touch $(STAMP)

test: $(STAMP)
	$(PY) -m pytest -q

demo: $(STAMP)
	$(VENV)/bin/tritongen demo

clean:
	rm -rf $(VENV) .pytest_cache
