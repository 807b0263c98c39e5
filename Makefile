# Two entry points a fresh machine needs: `make demo` trains GCN on Cora through the
# compiler, `make test` runs the suite. Both create .venv and install into it first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench gpu-check clean

# `make gpu-check` (a machine with an NVIDIA GPU): its own venv, so the CPU pin above stays for demo/test.
# The venv sees the system's site-packages: a python that already holds a CUDA torch and triton keeps them;
# otherwise pip installs PyPI's Linux torch, the CUDA build, with its triton (network, or PIP_FIND_LINKS). Where that
# python is itself a venv (its site-packages are not the system's), name it: `make gpu-check GPU_VENV=/path/to/venv`.
GPU_VENV ?= .venv-gpu
GPU_BIN = $(GPU_VENV)/bin
GPU_RESULTS ?= benchmarks/RESULTS-gpu.md

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[test,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gnnc run examples/gcn.gnn --graph planetoid:cora --epochs 200 --lr 0.01 --weight-decay 5e-4 --seed 0

# The tests run on one pytest-xdist worker per usable CPU (tests/conftest.py says how many); worksteal evens out
# the long distributed tests at the end; the 40 slowest are listed, so a CI log says where its time went. A single file
# runs as before: python -m pytest tests/test_x.py
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist worksteal --durations=40

bench: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow
	$(BIN)/python benchmarks/run_all.py

# Stops at once, before installing anything, where no NVIDIA GPU is present (nvidia-smi lists none); the benchmarks
# run even when a GPU test fails (the results file records what ran), and the command then fails.
gpu-check:
	@nvidia-smi -L 2>/dev/null | grep -q '^GPU ' || \
		{ echo "make gpu-check: no CUDA device (nvidia-smi lists no NVIDIA GPU); run it on a machine with one" >&2; exit 2; }
	test -x $(GPU_BIN)/python || $(PY) -m venv --system-site-packages $(GPU_VENV)
	$(GPU_BIN)/python -m pip install -q --no-build-isolation -e '.[test,triton]'
	@$(GPU_BIN)/python -c "import sys, torch; torch.cuda.is_available() or sys.exit('make gpu-check: torch ' \
		+ torch.__version__ + ' in $(GPU_VENV) sees no CUDA device (a CPU build?): install its CUDA build there')"
	$(GPU_BIN)/python -m pytest -q -p no:cacheprovider -m gpu; tests=$$?; \
		$(GPU_BIN)/python benchmarks/gpu_check.py -o $(GPU_RESULTS) && exit $$tests

clean:
	rm -rf $(VENV) $(GPU_VENV) build *.egg-info
