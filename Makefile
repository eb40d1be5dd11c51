# Stepwise: `make run` starts everything, `make test` runs the whole suite.
# With nothing configured both use the embedded default (SQLite under var/, a filesystem
# broker). Set DATABASE_URL, CELERY_BROKER_URL and REDIS_URL to use PostgreSQL and Redis.
# Development secrets are generated into var/secrets/ on the first run and reused
# (docs/security.md); production (STEPWISE_ENV=production) never generates them.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
PORT ?= 8000
export PORT
# Where links in notifications point (honcho gives each process a PORT of its own).
STEPWISE_BASE_URL ?= http://127.0.0.1:$(PORT)
export STEPWISE_BASE_URL
# The orders-digest example publishes to the local RabbitMQ as its default guest account; the
# connection takes the password from the environment (docs/tools.md).
STEPWISE_EXAMPLE_RABBITMQ_PASSWORD ?= guest
export STEPWISE_EXAMPLE_RABBITMQ_PASSWORD

.PHONY: run test install lint bench clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -e '.[dev]'
	touch $@

install: $(BIN)/.installed

run: install
	$(BIN)/python manage.py migrate --noinput -v0
	$(BIN)/python manage.py collectstatic --noinput -v0
	$(BIN)/python manage.py stepwise_bootstrap --port $(PORT)
	$(BIN)/honcho start -f Procfile -p $(PORT)

test: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/pytest -n 2 --dist loadfile -q -m "not ledger_prefix and not restarts_services and not fuzz"
	$(BIN)/pytest -p no:xdist -q -m ledger_prefix
	$(BIN)/pytest -p no:xdist -q -m fuzz
	$(BIN)/pytest -p no:xdist -q -m restarts_services

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

bench: install
	$(BIN)/python bench/run.py --backend embedded

clean:
	rm -rf var
