# The two commands of the README. Each bootstraps .venv and installs what it needs.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: book test test-fast smoke check-pages robustness bench lock clean

book: $(STAMP)  ## execute every chapter at its defaults and build _build/html
	$(BIN)/python -m iclnb book

test: $(STAMP)  ## run the test suite
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)  ## the tests that execute no chapter, start no process and open no browser (about a minute)
	$(BIN)/python -m pytest -q -m "not notebook and not multiprocess and not browser"

smoke: $(STAMP)  ## the whole book with tiny parameters (claims recorded, not enforced)
	$(BIN)/python -m iclnb book --smoke

check-pages: $(STAMP)  ## open the built book in headless Chromium (network off) and fail on a defect; screenshots
	$(BIN)/python -m iclnb check-pages

robustness: $(STAMP)  ## every chapter at seeds 0-4 (claims not enforced) -> book/robustness/NN_name.json; JOBS=N
	status=0; for ch in $$($(BIN)/python -m iclnb list | awk '{print $$1}'); do \
	  $(BIN)/python -m iclnb robustness $$ch --seeds 0 1 2 3 4 $(if $(JOBS),--jobs $(JOBS)) || status=1; \
	done; exit $$status

bench: $(STAMP)  ## training throughput against the naive reference, the engine against its code of e160d6c, step time against K and H
	$(BIN)/python benchmarks/bench_engine.py
	$(BIN)/python benchmarks/bench_ref.py
	$(BIN)/python benchmarks/bench_scaling.py

$(STAMP): pyproject.toml constraints.txt
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -c constraints.txt -e ".[book,dev]"
	touch $(STAMP)

lock: $(STAMP)  ## re-pin constraints.txt to what is installed (Python 3.11)
	{ sed -n '1,3p' constraints.txt; $(BIN)/python -m pip freeze --exclude-editable | grep -v '^iclnb' \
	  | sed -e 's/+cpu//' -e 's/$$/ ; python_version == "3.11"/'; } > constraints.new && mv constraints.new constraints.txt

clean:
	rm -rf _build book/chapters book/reproducibility.md book/verdicts.md
