# Two entry points (see README): `make serve` builds and serves the docs site, `make test` runs the
# linter and formatter check (`make lint`: ruff, configured in pyproject.toml), then the test suite
# on CPU (Triton kernels through the interpreter), one pytest-xdist worker per core, each test file
# on one worker (fixtures such as the built site are made once). Both create/refresh .venv as needed.
# The exact versions below are the ones that work on the project's CPU machines; pyproject.toml keeps
# ranges for users who bring their own (CUDA) torch.

PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

PINNED := triton==3.9.0 numpy==2.4.6 pytest==9.2.0 hypothesis==6.170.17 pytest-timeout==2.4.0 \
	jsonschema==4.26.0 nbformat==5.11.1 nbclient==0.11.0 ipykernel==7.4.0 matplotlib==3.11.2 \
	mkdocs==1.6.1 mkdocs-material==9.8.2 mkdocs-jupyter==0.26.3 'mkdocstrings[python]==1.0.8' \
	mkdocstrings-python==2.0.11 playwright==1.65.2 jupytext==1.19.6 django-static-mathjax==3.2.2.1 \
	transformers==5.23.0 ruff==0.16.9 pytest-xdist==3.8.0

.PHONY: serve test lint docs venv browser clean

venv: $(STAMP)

# torch==2.13.0 first: on these machines it is a CPU wheel on disk; anything else pulls a CUDA build.
$(STAMP): pyproject.toml Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check torch==2.13.0
	$(PY) -m pip install -q --disable-pip-version-check $(PINNED)
	$(PY) -m pip install -q --disable-pip-version-check --no-deps -e .
	touch $(STAMP)

docs: $(STAMP)
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

serve: docs
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:8000

# The docs browser test drives Debian's Chromium (Playwright for Python, no browser download).
browser:
	@test -x /usr/bin/chromium || { SUDO=$$( [ "$$(id -u)" = 0 ] || echo sudo ); \
		$$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq \
		--no-install-recommends chromium >/dev/null; }

# The linter and the formatter (configured in pyproject.toml) run before the tests: fail fast.
lint: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

test: $(STAMP) lint browser
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n auto --dist loadfile

clean:
	rm -rf site .cache
