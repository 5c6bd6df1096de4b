# Long Context from Scratch: the commands. README.md names the two that matter:
#   make test   every check: generated modules current, unit tests, every chapter executed, the book
#               rendered by Quarto (HTML and EPUB, EPUBCheck) and read in Chromium
#   make book   the book in _book/, rendered by Quarto (without Quarto: the executed notebooks/)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BOOK   := $(PY) -m booktools
ENV_STAMP := $(VENV)/.installed
# Quarto: on PATH, or in the venv from `pip install quarto-cli`. A failed install is remembered here so
# that it is tried once per environment, not on every build.
QUARTO_FAILED := $(VENV)/.quarto-install-failed
# MathJax and the Source Sans Pro font come from the npm registry (pinned in web/package-lock.json) and
# are copied into _book/, so the book's pages load nothing from the network.
WEB_STAMP := web/node_modules/.installed
PORT ?= 8000

.DEFAULT_GOAL := help
.PHONY: help env tangle notebooks execute check book serve preview test test-fast lint bench bench-quick experiment clean distclean

help:
	@echo "make test        run every check (first run creates .venv and installs the pins)"
	@echo "make test-fast   every test that neither executes the chapters nor renders the book"
	@echo "make book        build the book into _book/ and print the page to open"
	@echo "make serve       serve _book/ at http://127.0.0.1:8000/ (PORT=...)"
	@echo "make tangle      regenerate code/chNN/ from the chapters' '# @save' cells"
	@echo "make notebooks   executed notebooks/chNN-*.ipynb for Jupyter, outputs included"
	@echo "make execute     run every chapter as a notebook into _build/executed/"
	@echo "make check       book integrity: references, labels, captions, generated code current"
	@echo "make lint        ruff on code/ (the generated modules' style), tools/, tests/, benchmarks/, experiments/"
	@echo "make bench       the measured benchmarks (4 to 8 minutes on 2 quiet cores)"
	@echo "make bench-quick a smoke run of the benchmarks (about 3 minutes)"
	@echo "make experiment  the trained-model runs of Chapters 4, 6 and 7, saved to experiments/results/ (20 to 24 minutes on 2 idle cores)"
	@echo "make preview     Quarto's live preview, where Quarto is installed"
	@echo "make clean       remove built output (keeps .venv); make distclean also removes .venv"

# The environment: created on first use, reinstalled only when the pins or the package metadata change.
# The package goes in as setuptools' strict editable install: a tree of links in build/ named by a plain
# .pth path, which editors and type checkers (pyright) follow; code/ and data/ stay where they are.
env: $(ENV_STAMP)
$(ENV_STAMP): requirements.txt pyproject.toml tools/pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@echo "Installing the pinned packages into $(VENV) (first time: a few minutes)"
	$(PY) -m pip install --quiet --disable-pip-version-check -r requirements.txt
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e . --config-settings editable_mode=strict
	$(PY) -m pip install --quiet --disable-pip-version-check --no-deps -e tools
	@touch $@

$(WEB_STAMP): web/package.json web/package-lock.json
	@command -v npm >/dev/null || { echo "make: npm (Node.js) is needed once, to install MathJax and Mermaid into web/node_modules"; exit 2; }
	npm ci --prefix web --no-audit --no-fund --loglevel=error
	@touch $@

tangle: $(ENV_STAMP)
	$(BOOK) tangle

# The reader's notebooks: every chapter executed, then finished into notebooks/ with its outputs and
# inline values, no Quarto syntax, and a first cell that installs longctx outside the repository.
notebooks: execute
	$(BOOK) notebooks

execute: tangle
	$(BOOK) execute --jobs 2

check: $(ENV_STAMP)
	$(BOOK) check

# Quarto renders the chapters `execute` has just run (each chapter runs once; Quarto writes nothing
# into the source tree: it works in _build/quarto/). Quarto from PATH, else `pip install quarto-cli`
# into .venv (tried once per environment); without either: the executed notebooks/ and a line saying
# how to get Quarto.
book: execute
	@q=$$(command -v quarto || { test -x $(VENV)/bin/quarto && echo $(VENV)/bin/quarto; } || true); \
	if [ -z "$$q" ] && [ ! -e $(QUARTO_FAILED) ]; then \
	  echo "Quarto not found; trying 'pip install quarto-cli' once for this environment"; \
	  if $(PY) -m pip install --quiet --disable-pip-version-check quarto-cli >/dev/null 2>&1 && $(VENV)/bin/quarto --version >/dev/null 2>&1; \
	  then q=$(VENV)/bin/quarto; else touch $(QUARTO_FAILED); fi; \
	fi; \
	if [ -n "$$q" ]; then \
	  $(MAKE) --no-print-directory $(WEB_STAMP) && PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(BOOK) quarto && \
	  echo "The book: $(CURDIR)/_book/index.html (read it through 'make serve': search and page contents need http)"; \
	else \
	  $(BOOK) notebooks --quiet && \
	  echo "No Quarto here, so no _book/: the executed chapters are in notebooks/. For the book, install Quarto (https://quarto.org/docs/get-started/) and run make book again."; \
	fi

# Serve _book/ on this machine only: the Quarto edition's search and page contents need http, not file://.
serve:
	@test -f _book/index.html || { echo "make serve: no _book/index.html yet; run 'make book' first"; exit 2; }
	@echo "Serving _book/ at http://127.0.0.1:$(PORT)/ (Ctrl-C stops it)"
	$(PY) -m http.server --directory _book --bind 127.0.0.1 $(PORT)

# Quarto's live preview executes the chapters itself; Debian's Chromium draws the EPUB's diagrams.
preview: $(ENV_STAMP)
	@q=$$(command -v quarto || { test -x $(VENV)/bin/quarto && echo $(VENV)/bin/quarto; } || true); \
	if [ -n "$$q" ]; then \
	  c=$$(command -v google-chrome || command -v chromium-browser || command -v chromium || true); \
	  PATH="$(CURDIR)/$(VENV)/bin:$$PATH" QUARTO_PYTHON="$(CURDIR)/$(PY)" TQDM_DISABLE=1 \
	  QUARTO_CHROMIUM="$${QUARTO_CHROMIUM:-$$c}" $$q preview --to html; \
	else echo "make preview needs Quarto (https://quarto.org/docs/get-started/, or 'pip install quarto-cli')."; exit 2; fi

test: $(ENV_STAMP) $(WEB_STAMP)
	$(PY) -m pytest

# The edit-test loop: every test not marked `slow` (those execute the chapters, render the book, train a
# model or run a benchmark). One torch thread: the fast tests' tensors are tiny, and a second thread only
# spins (on 2 cores it doubles the CPU time). web/node_modules holds pyright, which a packaging test runs.
test-fast: $(ENV_STAMP) $(WEB_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" -q

# code/ has its own settings (code/ruff.toml): isort with longctx first-party, Google docstrings.
lint: $(ENV_STAMP)
	$(PY) -m ruff check code tools tests benchmarks experiments

bench: $(ENV_STAMP)
	$(PY) -m benchmarks

bench-quick: $(ENV_STAMP)
	$(PY) -m benchmarks --quick

# Chapter 4's selective copying (5 seeds x 3 mixers, about a minute) and Chapter 6's extension study
# (3 seeds x 2 rotary bases, and 3 long controls, about 15 minutes), then Chapter 7's cache policies
# (3 seeds of a 4-layer model, 4 to 8 minutes by the machine); each job a process of one torch thread, two at a
# time (Chapter 7's three at once, one per seed); nice, because the machine may be shared.
experiment: $(ENV_STAMP)
	nice -n 5 $(PY) -m experiments copying
	nice -n 5 $(PY) -m experiments extension
	nice -n 5 $(PY) -m experiments forgetting --jobs 3

clean:
	rm -rf _book _build _freeze notebooks .quarto .pytest_cache .ruff_cache .hypothesis tests/artifacts
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
	find . -name "*.quarto_ipynb" -not -path "./$(VENV)/*" -delete

distclean: clean
	rm -rf $(VENV) web/node_modules build
