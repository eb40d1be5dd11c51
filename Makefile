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

.PHONY: run test test-stores install lint bench clean mutate mutate-results soak fuzz

# Mutation testing of the core (docs/testing.md): one module at a time, two mutants at once,
# each module stopped after MUTATE_BUDGET_S seconds. Results are kept in mutants/, so the next
# `make mutate` goes on where this one stopped. Not part of `make test`.
MUTATE_MODULES ?= orchestrator.engine.scheduler orchestrator.engine.states orchestrator.models \
	orchestrator.engine.services.effects orchestrator.engine.leases \
	orchestrator.engine.services.kinds.worker orchestrator.engine.services.kinds.agent \
	budgets.services audit.chain orchestrator.engine.risk orchestrator.engine.definitions.proposals \
	approvals.authority orchestrator.engine.authz triggers.services \
	orchestrator.integrations.egress orchestrator.web.live orchestrator.store
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

# The suite (docs/testing.md): the tests that need an empty audit ledger and the API fuzzer in a
# session of their own (its database and broker are not the parallel session's), beside the
# parallel session of everything else, the short soak included, in TEST_WORKERS processes (more
# than the cores: most tests wait on worker processes, servers and browsers). The fault suite
# restarts the broker and the database: on PostgreSQL or Redis it runs alone afterwards; on the
# embedded default its broker folder and SQLite file are its session's own, so it joins the
# session beside. The fuzzer, the soak and the fault suite run short forms by default
# (STEPWISE_FUZZ_EXAMPLES, STEPWISE_SOAK_TEST_MINUTES, STEPWISE_FAULT_ITERATIONS); CI sets longer.
TEST_WORKERS ?= 3
SHARED_SERVERS := $(strip $(DATABASE_URL)$(CELERY_BROKER_URL))
ALONE := ledger_prefix or fuzz$(if $(SHARED_SERVERS),, or restarts_services)
# Every test session, worker, web server and command the tests start imports the project: its
# bytecode is compiled once here and kept (also where PYTHONDONTWRITEBYTECODE is set), and pytest
# keeps the test modules it rewrote, instead of each process compiling them again.
PACKAGES := orchestrator approvals audit budgets triggers notifications alerts evaluation \
	retention examples soak bench stepwise_client
test: export PYTHONDONTWRITEBYTECODE :=
test: install
	$(BIN)/ruff check .
	$(BIN)/lint-imports
	@$(BIN)/python -m compileall -q -j 0 $(PACKAGES) manage.py
	@mkdir -p var
	@$(BIN)/pytest -p no:xdist -p no:cacheprovider -q -m "$(ALONE)" \
		> var/test-alone.log 2>&1 & alone=$$!; trap 'kill $$alone 2>/dev/null' INT TERM; \
	$(BIN)/pytest -n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder -q \
		-m "not ledger_prefix and not fuzz and not restarts_services"; parallel=$$?; \
	wait $$alone; own=$$?; \
	echo "== $(ALONE) (var/test-alone.log)"; cat var/test-alone.log; \
	[ $$parallel -eq 0 ] && [ $$own -eq 0 ]
ifneq ($(SHARED_SERVERS),)
	$(BIN)/pytest -p no:xdist -q -m restarts_services
endif

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

# The API fuzzer at the budget CI runs (tests/api/test_openapi_fuzz.py, docs/security.md);
# `make test` runs it at a small one, with the coverage phase as the owner only.
FUZZ_EXAMPLES ?= 15
fuzz: install
	STEPWISE_FUZZ_EXAMPLES=$(FUZZ_EXAMPLES) STEPWISE_FUZZ_COVERAGE=all \
		$(BIN)/pytest -p no:xdist -q -m fuzz

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
