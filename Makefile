# Long Context from Scratch: the commands. README.md names the two that matter:
#   make test   every check: generated modules current, unit tests, every chapter executed by Quarto as
#               it renders the book (HTML and EPUB, EPUBCheck), the pages read in Chromium
#   make book   the book in _book/, executed and rendered by Quarto (which must be on PATH)

PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
BOOK   := $(PY) -m booktools
ENV_STAMP := $(VENV)/.installed
# MathJax and the Source Sans Pro font come from the npm registry (pinned in web/package-lock.json) and
# are copied into _book/, so the book's pages load nothing from the network.
WEB_STAMP := web/node_modules/.installed
PORT ?= 8000

.DEFAULT_GOAL := help
.PHONY: help env tangle notebooks check book serve preview test test-fast lint bench bench-quick experiment clean distclean

help:
	@echo "make test        run every check (first run creates .venv and installs the pins)"
	@echo "make test-fast   every test that starts no Quarto, Jupyter kernel, compiler, npm tool or worker process (under 30 s)"
	@echo "make book        Quarto executes every chapter and renders the book into _book/ (HTML, EPUB)"
	@echo "make serve       serve _book/ at http://127.0.0.1:8000/ (PORT=...)"
	@echo "make tangle      regenerate code/chNN/ from the chapters' '# @save' cells"
	@echo "make notebooks   notebooks/chNN-*.ipynb for Jupyter, with the outputs of make book's execution"
	@echo "make check       book integrity: references, labels, captions, generated code current"
	@echo "make lint        ruff on code/ (the generated modules' style), tools/, tests/, benchmarks/, experiments/"
	@echo "make bench       the measured benchmarks and the ceilings study (10 to 15 minutes on 2 quiet cores)"
	@echo "make bench-quick a smoke run of the benchmarks (about 3 minutes)"
	@echo "make experiment  the trained-model runs of Chapters 4, 6 and 7, saved to experiments/results/ (about half an hour on 2 idle cores)"
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
	@command -v npm >/dev/null || { echo "make: npm (Node.js) is needed once, to install MathJax and the font into web/node_modules"; exit 2; }
	npm ci --prefix web --no-audit --no-fund --loglevel=error
	@touch $@

tangle: $(ENV_STAMP)
	$(BOOK) tangle

# The reader's notebooks: the chapters as `make book` had Quarto execute them (_build/executed/),
# finished into notebooks/ with their outputs and inline values, no Quarto syntax, and a first cell
# that installs longctx outside the repository.
notebooks: book
	$(BOOK) notebooks

# The tangle says whether code/ is current (and why a saved cell cannot be saved); check, the rest.
check: $(ENV_STAMP)
	$(BOOK) tangle --check
	$(BOOK) check

# Quarto executes every chapter (Jupyter, the venv's kernel; a failing cell fails the build) and renders
# the HTML and the EPUB; it works in _build/quarto/, a copy of the chapters, so it writes nothing into the
# source tree and never thaws an old _freeze/. Quarto is a declared dependency: without it, one line says
# where to get it.
book: tangle $(WEB_STAMP)
	@command -v quarto >/dev/null || { echo "make book needs Quarto on PATH: install it from https://quarto.org/docs/get-started/ and run make book again."; exit 2; }
	PATH="$(CURDIR)/$(VENV)/bin:$$PATH" $(BOOK) quarto
	@echo "The book: $(CURDIR)/_book/index.html (read it through 'make serve': search and page contents need http)"

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
	else echo "make preview needs Quarto (https://quarto.org/docs/get-started/)."; exit 2; fi

test: $(ENV_STAMP) $(WEB_STAMP)
	$(PY) -m pytest

# The edit-test loop: every test not marked `slow` (those execute the chapters, render the book, train a
# model, run a benchmark, or start pyright from web/node_modules), so it needs no npm. One torch thread:
# the fast tests' tensors are tiny, and a second thread only spins (on 2 cores it doubles the CPU time).
test-fast: $(ENV_STAMP)
	OMP_NUM_THREADS=1 $(PY) -m pytest -m "not slow" -q

# code/ has its own settings (code/ruff.toml): isort with longctx first-party, Google docstrings.
lint: $(ENV_STAMP)
	$(PY) -m ruff check code tools tests benchmarks experiments

bench: $(ENV_STAMP)
	$(PY) -m benchmarks
	$(PY) -m benchmarks.ceilings
	$(PY) -m benchmarks.serving

bench-quick: $(ENV_STAMP)
	$(PY) -m benchmarks --quick
	$(PY) -m benchmarks.ceilings --quick
	$(PY) -m benchmarks.serving --quick

# Chapter 4's selective copying (5 seeds x 3 mixers, about a minute) and Chapter 6's extension study
# (3 seeds x 2 rotary bases, and 3 long controls, about 15 minutes), then Chapter 7's cache policies
# (3 seeds of a 4-layer model, 4 to 8 minutes by the machine); each job a process of one torch thread, two at a
# time (Chapter 7's three at once, one per seed); nice, because the machine may be shared.
experiment: $(ENV_STAMP)
	nice -n 5 $(PY) -m experiments copying
	nice -n 5 $(PY) -m experiments extension
	nice -n 5 $(PY) -m experiments forgetting --jobs 2
	nice -n 5 $(PY) -m experiments speculative

clean:
	rm -rf _book _build _freeze notebooks .quarto .pytest_cache .ruff_cache .hypothesis tests/artifacts
	find . -name __pycache__ -type d -not -path "./$(VENV)/*" -prune -exec rm -rf {} +
	find . -name "*.quarto_ipynb" -not -path "./$(VENV)/*" -delete

distclean: clean
	rm -rf $(VENV) web/node_modules build
