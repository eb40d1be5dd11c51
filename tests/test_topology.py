"""The deployment described is the deployment tested (docs/operations.md#the-processes).

`docker-compose.yml` is the only multi-machine description and no container runtime runs here,
so the file is checked instead of started: against the Compose Specification's JSON schema
(`tests/support/compose-spec.json`, schema/compose-spec.json of github.com/compose-spec/compose-spec
at 170098ba07d9, Apache-2.0), and against the code: every command it and the Procfile give names
a process the code has, with options that process accepts, and the two start the same
processes, which between them consume every queue the engine sends to.
"""
import json
import re
import shlex
from io import StringIO
from pathlib import Path

import jsonschema
import pytest
import yaml
from django.conf import settings
from django.core.management import call_command, get_commands

from orchestrator.operations.queues import known_queues

ROOT = Path(__file__).resolve().parents[1]
SCHEMA = json.loads((ROOT / "tests/support/compose-spec.json").read_text())
# Services that are not Stepwise's processes: its servers, and the one-off migration.
NOT_OURS = {"postgres", "redis", "migrate"}
QUEUES_OF = re.compile(r"\$\((?:python )?manage\.py stepwise_queues ([^)]*)\)")


def compose() -> dict:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def procfile() -> dict[str, str]:
    lines = (ROOT / "Procfile").read_text().splitlines()
    return dict(line.split(": ", 1) for line in lines if line and not line.startswith("#"))


def argv_of(command: str | list[str]) -> list[str]:
    """A process's arguments as its shell would pass them: `sh -c` unwrapped, Compose's `$$`
    and the Procfile's `.venv/bin/` read as the shell sees them, and the queue list that
    `stepwise_queues` prints put in place of the command substitution."""
    if isinstance(command, list):
        if command[:2] != ["sh", "-c"]:
            return command
        command = command[2].replace("$$", "$")
    command = command.replace(".venv/bin/", "")

    def queues(found: re.Match) -> str:
        out = StringIO()
        call_command("stepwise_queues", *shlex.split(found.group(1)), stdout=out)
        return out.getvalue().strip()
    return shlex.split(QUEUES_OF.sub(queues, command))


def process_of(argv: list[str]) -> tuple[str, frozenset[str]]:
    """(what the process is, the queues it consumes): `web`, `worker`, `beat` or the
    management command it runs."""
    if argv[0] == "uvicorn":
        assert argv[1] == "orchestrator.asgi:application", argv
        return "web", frozenset()
    if argv[0] == "celery":
        assert argv[1:3] == ["-A", "orchestrator"], argv
        kind = argv[3]
        queues = argv[argv.index("-Q") + 1].split(",") if "-Q" in argv else []
        return kind, frozenset(queues)
    assert argv[:2] == ["python", "manage.py"], argv
    assert argv[2] in get_commands(), f"manage.py has no command {argv[2]!r}"
    return argv[2], frozenset()


def compose_processes() -> dict[str, list[str]]:
    return {name: argv_of(service["command"]) for name, service in compose()["services"].items()
            if name not in NOT_OURS}


def procfile_processes() -> dict[str, list[str]]:
    return {name: argv_of(command) for name, command in procfile().items()}


def sent_to() -> set[str]:
    """Every queue the engine, beat and the ledger's tasks send to."""
    beat = {entry["options"]["queue"] for entry in settings.CELERY_BEAT_SCHEDULE.values()
            if "queue" in entry.get("options", {})}
    return {*known_queues(), *beat, "audit", settings.CELERY_TASK_DEFAULT_QUEUE}


def test_docker_compose_is_valid_under_the_compose_specification():
    jsonschema.Draft7Validator.check_schema(SCHEMA)
    errors = [f"{'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(compose())]
    assert not errors, "\n".join(errors)


@pytest.mark.parametrize("spoil, where", [
    (lambda c: c["services"]["web"].update(ports="8000:8000"), "services.web.ports"),
    (lambda c: c["services"]["beat"].update(deploy={"replica": 2}), "services.beat.deploy"),
    (lambda c: c["services"]["web"].update(restart_policy="always"), "services.web"),
], ids=["ports-not-a-list", "misspelt-replicas", "unknown-key"])
def test_the_schema_refuses_what_compose_would(spoil, where):
    spoilt = compose()
    spoil(spoilt)
    found = ['.'.join(map(str, e.absolute_path))
             for e in jsonschema.Draft7Validator(SCHEMA).iter_errors(spoilt)]
    assert where in found, found


def test_the_procfile_and_compose_start_the_same_processes():
    def kinds(processes):
        return {process_of(argv)[0] for argv in processes.values()}
    assert kinds(compose_processes()) == kinds(procfile_processes()) == {
        "web", "worker", "beat", "stepwise_consume"}


@pytest.mark.parametrize("described", [compose_processes, procfile_processes],
                         ids=["docker-compose", "Procfile"])
def test_every_queue_the_engine_sends_to_has_a_worker_and_none_is_served_twice(described):
    consumed = [queue for argv in described().values() for queue in process_of(argv)[1]]
    assert set(consumed) == sent_to(), {"unserved": sent_to() - set(consumed),
                                        "no sender": set(consumed) - sent_to()}
    assert len(consumed) == len(set(consumed)), "a queue two kinds of worker consume"


@pytest.mark.parametrize("described", [compose_processes, procfile_processes],
                         ids=["docker-compose", "Procfile"])
def test_each_celery_process_takes_the_options_it_is_given(described):
    from celery.app.utils import find_app
    from celery.bin.beat import beat
    from celery.bin.worker import worker

    from orchestrator.celery import app

    assert find_app("orchestrator") is app  # what `celery -A orchestrator` loads
    accepted = {"worker": worker, "beat": beat}
    for name, argv in described().items():
        kind, _ = process_of(argv)
        if kind not in accepted:
            continue
        options = {opt for param in accepted[kind].params for opt in param.opts}
        given = [arg.split("=")[0] for arg in argv[4:] if arg.startswith("-")]
        assert set(given) <= options, (name, set(given) - options)


def test_the_image_installs_what_compose_runs():
    dependencies = (ROOT / "pyproject.toml").read_text()
    for program in ("uvicorn", "celery"):
        assert re.search(rf'^\s*"{program}\[?[^"]*"', dependencies, re.M), program
    assert "RUN pip install" in (ROOT / "Dockerfile").read_text()
