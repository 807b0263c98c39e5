# Two entry points a fresh machine needs: `make demo` trains GCN on Cora through the
# compiler, `make test` runs the suite. Both create .venv and install into it first.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test bench clean

$(STAMP): pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -c constraints.txt -e '.[test,plot]'
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/gnnc run examples/gcn.gnn --graph planetoid:cora --epochs 200 --lr 0.01 --weight-decay 5e-4 --seed 0

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -m slow
	$(BIN)/python benchmarks/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
