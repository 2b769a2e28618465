# The two commands of the README's quick start are `make book` and `make test`.
# Both create .venv on first use and reinstall when pyproject.toml changes.

PYTHON ?= python3
VENV   ?= .venv
PY     := $(VENV)/bin/python
STAMP  := $(VENV)/.installed
JOBS   ?= 2

export TF_CPP_MIN_LOG_LEVEL ?= 3
export PYTHONHASHSEED ?= 0

.PHONY: help install book book-zh locales font book-all test test-fast lint exercises notebooks clean grade release

help:
	@echo "make book       build the HTML book into _build/html, executing every notebook"
	@echo "                (again: re-executes only changed pages, or every page after a change in companion/)"
	@echo "                then the Chinese edition into _build/html/zh_CN, reusing those outputs"
	@echo "make book-zh    the Chinese edition alone (after an English build)"
	@echo "make locales    after an English change: update the Chinese catalogues in locales/"
	@echo "make font       after new Chinese text: regenerate the bundled CJK font subset (after make book)"
	@echo "make book-all   rebuild every page and re-execute every notebook (after a change in companion/)"
	@echo "make test       run every test: unit, parity, nbval over chapters and solutions (COURSE_SEED=1)"
	@echo "make exercises  regenerate exercises/ (and exercises/zh_CN/) from solutions/"
	@echo "make grade      grade your exercises/ (TRACK=torch or TRACK=keras for one framework)"
	@echo "make notebooks  write .ipynb copies of every MyST notebook (for classic Jupyter)"
	@echo "make release DEST=DIR  write the student release (no solutions, no tests) into a new folder"
	@echo "make lint       ruff"

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 10) else "Python 3.10 or newer is needed")'
	test -d $(VENV) || $(PYTHON) -m venv $(VENV)
	# Prefer the CPU build of torch where the machine has it; fall back to the project's range.
	$(PY) -m pip install -q "torch==2.13.0" || echo "torch 2.13.0 not available: using the range in pyproject.toml"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

install: $(STAMP)

# Sphinx re-reads only the pages that changed. A change in companion/ can change any notebook's outputs, and so can
# another COURSE_SEED than the last build's (the stamp holds it): then every page is rebuilt and re-executed.
# The Chinese edition (_build/html/zh_CN) follows: the same pages through locales/zh_CN's catalogues, with the
# outputs the English build just computed (book/_ext/edition.py; it executes nothing and fails if it would have to).
# Both read $(JOBS) pages at a time, the longest chapters first (book/_ext/page_order.py). The English build's
# kernels are forks of one process that has imported PyTorch and Keras once (book/_ext/warm_kernels.py).
BOOK_STAMP := _build/.book-built
EN_WARNINGS := _build/.english-warnings
book: $(STAMP)
	@mkdir -p _build; all=$$(test -f $(BOOK_STAMP) && test "$$(cat $(BOOK_STAMP))" = "seed $${COURSE_SEED:-0}" \
	       && test -z "$$(find companion -name '*.py' -newer $(BOOK_STAMP))" || echo --all); \
	$(PY) book/_ext/edition.py html en $$all --jobs $(JOBS) 2> $(EN_WARNINGS); status=$$?; \
	cat $(EN_WARNINGS) >&2; test $$status = 0 && \
	{ test -z "$$(ls -A _build/html/reports 2>/dev/null)" || { echo "cell errors: see _build/html/reports"; exit 1; }; } && \
	echo "seed $${COURSE_SEED:-0}" > $(BOOK_STAMP) && \
	$(MAKE) --no-print-directory book-zh BOOK_ALL=$$all

# The Chinese edition alone, after an English build (`make book` runs it). BOOK_ALL=--all re-reads every page.
book-zh: $(STAMP)
	$(PY) book/_ext/edition.py html zh_CN $(BOOK_ALL) --jobs $(JOBS) --english-warnings $(EN_WARNINGS)

# After an English change: re-extract the messages of every page and exercise notebook and update the catalogues
# (new messages empty, changed ones fuzzy, removed ones obsolete); the translators then fill them in.
locales: $(STAMP)
	$(PY) book/_ext/edition.py gettext _build/gettext/pot
	$(VENV)/bin/sphinx-intl update -p _build/gettext/pot -l zh_CN -d locales
	$(PY) -m companion.instructor.exercise_translation update zh_CN
	$(PY) -m companion.instructor.exercise_translation write zh_CN

# The bundled CJK font (book/_static/fonts/course-cjk.woff2) holds only the characters the pages use: after new Chinese
# text (translations) lands, run `make book font` (needs the Debian package fonts-noto-cjk).
font: $(STAMP)
	$(PY) book/_ext/cjk_font.py

# MathJax comes from the PyPI package sphinx-mathjax-offline (in the [book] extra), so the book needs no CDN.
book-all: $(STAMP)
	mkdir -p _build
	$(PY) book/_ext/edition.py html en --all --jobs $(JOBS) 2> $(EN_WARNINGS); status=$$?; \
	cat $(EN_WARNINGS) >&2; test $$status = 0
	@test -z "$$(ls -A _build/html/reports 2>/dev/null)" || (echo "cell errors: see _build/html/reports" && exit 1)
	$(MAKE) --no-print-directory book-zh BOOK_ALL=--all

# The book runs every page with COURSE_SEED=0 (unset); the tests run the notebooks with COURSE_SEED=1, so a build
# and a test run together check two seeds. `COURSE_SEED=5 make test` picks another.
TEST_SEED ?= $(or $(COURSE_SEED),1)
test: $(STAMP)
	COURSE_SEED=$(TEST_SEED) $(PY) -m pytest -n $(JOBS) --dist loadscope --nbval-lax --nbval-cell-timeout=900

lint: $(STAMP)
	$(VENV)/bin/ruff check .

exercises: $(STAMP)
	$(PY) -m companion.instructor.exercises solutions exercises
	$(PY) -m companion.instructor.exercise_translation write zh_CN

grade: $(STAMP)
	$(PY) -m companion.grade exercises $(if $(TRACK),--track $(TRACK))

# The student edition: chapters, exercises, companion, book, grading workflow; no solutions/, no tests/, no
# companion/instructor/.
release: $(STAMP)
	@test -n "$(DEST)" || (echo "usage: make release DEST=../course-student (a new or empty folder)" && exit 2)
	$(PY) -m companion.instructor.release "$(DEST)"

notebooks: $(STAMP)
	$(VENV)/bin/jupytext --to ipynb notebooks/*.md solutions/*.md exercises/*.md

clean:
	rm -rf _build notebooks/*.ipynb solutions/*.ipynb exercises/*.ipynb
