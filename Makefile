# The two commands: `make run` and `make test`. Both need only Python 3.11+ and pip.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Tests use the local PostgreSQL; pytest-django creates and drops test_<name> itself.
TEST_DATABASE_URL ?= postgres://postgres@127.0.0.1:5432/relay

.PHONY: run test lint format docs docs-serve createsuperuser manage clean system-packages step-packages

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the requirements change. requirements.txt is what production needs;
# requirements-dev.txt adds the test and lint tools (it includes requirements.txt).
$(VENV)/.installed: requirements.txt requirements-dev.txt bridge_client/pyproject.toml | $(BIN)/python
	$(BIN)/pip install --quiet --disable-pip-version-check -r requirements-dev.txt
	$(BIN)/pip install --quiet --disable-pip-version-check -e ./bridge_client
	touch $@

# relay_sdk for `relaysh/core:latest-python` script steps, for the Python that runs them
# (Debian's python3.11, inside the sandbox): pinned, no dependency resolution, wheels for
# CPython 3.11 only. The virtualenv's pip fetches them, so `make run` needs no Debian pip.
.step-python/.installed: requirements-steps.txt | $(BIN)/python
	rm -rf .step-python
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
		--python-version 3.11 --implementation cp --target .step-python -r requirements-steps.txt
	touch $@

run: $(VENV)/.installed .step-python/.installed step-packages
	$(BIN)/python -m relay.embedded

# Prompts on a terminal; without one (a script, CI) it takes DJANGO_SUPERUSER_USERNAME,
# DJANGO_SUPERUSER_PASSWORD and DJANGO_SUPERUSER_EMAIL.
createsuperuser: $(VENV)/.installed
	$(BIN)/python -m relay.embedded createsuperuser

# make manage ARGS="create_user_token alice"  (prints a new API token on its last line)
manage: $(VENV)/.installed
	$(BIN)/python -m relay.embedded manage $(ARGS)

# Debian's puppet-agent, puppetserver, openssh-server, bubblewrap, jq: the tests run them for real.
system-packages:
	scripts/install-system-packages

# What script steps need (bubblewrap, socat, jq, curl, python3): installed as root or with
# passwordless sudo, otherwise one line says how; `make run` starts either way.
step-packages:
	scripts/install-system-packages steps

test: $(VENV)/.installed system-packages .step-python/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict
	DATABASE_URL=$${DATABASE_URL:-$(TEST_DATABASE_URL)} $(BIN)/pytest

# The documentation site (docs/, mkdocs.yml) into var/site/; --strict: a broken link fails
# (not with --quiet, which hides the warnings that --strict counts).
docs: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict

docs-serve: $(VENV)/.installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs serve --dev-addr 127.0.0.1:8001

lint: $(VENV)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

format: $(VENV)/.installed
	$(BIN)/ruff format .
	$(BIN)/ruff check --fix .

clean:
	rm -rf $(VENV) .step-python .pytest_cache .ruff_cache
