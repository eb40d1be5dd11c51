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

.PHONY: run test test-stores install lint bench clean mutate mutate-results soak

# Mutation testing of the core (docs/testing.md): one module at a time, two mutants at once,
# each module stopped after MUTATE_BUDGET_S seconds. Results are kept in mutants/, so the next
# `make mutate` goes on where this one stopped. Not part of `make test`.
MUTATE_MODULES ?= orchestrator.scheduler orchestrator.states orchestrator.models \
	orchestrator.services.effects orchestrator.leases orchestrator.services.kinds.worker \
	orchestrator.services.kinds.agent \
	budgets.services audit.chain orchestrator.risk orchestrator.definitions.proposals \
	approvals.authority orchestrator.authz triggers.services orchestrator.egress orchestrator.live
MUTATE_BUDGET_S ?= 600
MUTATE_CHILDREN ?= 2

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
	rm -rf var/prometheus  # the metrics of processes that ended (docs/operations.md#metrics)
	$(BIN)/honcho start -f Procfile -p $(PORT)

test: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	$(BIN)/pytest -n 2 --dist loadfile -q -m "not ledger_prefix and not restarts_services and not fuzz and not soak"
	$(BIN)/pytest -p no:xdist -q -m ledger_prefix
	$(BIN)/pytest -p no:xdist -q -m fuzz
	$(BIN)/pytest -p no:xdist -q -m soak
	$(BIN)/pytest -p no:xdist -q -m restarts_services

# The engine's suite on each store (orchestrator/store/, docs/testing.md): the reference store on
# Django's public ORM API and the fast one must give the same rows and the same errors.
ENGINE_SUITE := tests/engine tests/integration tests/audit tests/budgets tests/store
STORES ?= reference fast
test-stores: install
	@for store in $(STORES); do \
		echo "== the engine's suite on the $$store store"; \
		STEPWISE_STORE=$$store $(BIN)/pytest -n 2 --dist loadfile -q \
			-m "not ledger_prefix and not restarts_services and not fuzz and not soak" $(ENGINE_SUITE) || exit 1; \
		STEPWISE_STORE=$$store $(BIN)/pytest -p no:xdist -q -m ledger_prefix tests/audit || exit 1; \
	done

lint: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports

# The soak (docs/failure-semantics.md): a mixed workload under random faults on its own
# PostgreSQL + Redis (never the shared servers), then every invariant checked.
SOAK_MINUTES ?= 10
SOAK_SEED ?= 1
soak: install
	$(BIN)/python manage.py stepwise_soak --minutes $(SOAK_MINUTES) --seed $(SOAK_SEED)

bench: install
	$(BIN)/python bench/run.py --backend embedded

mutate: install
	@for module in $(MUTATE_MODULES); do \
		echo "== mutmut: $$module (at most $(MUTATE_BUDGET_S) s)"; \
		timeout --signal=INT --kill-after=30 $(MUTATE_BUDGET_S) \
			$(BIN)/mutmut run --max-children $(MUTATE_CHILDREN) "$$module.*" || true; \
	done
	$(BIN)/mutmut results

mutate-results: install
	$(BIN)/mutmut results

clean:
	rm -rf var mutants
