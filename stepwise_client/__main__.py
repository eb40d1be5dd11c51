"""`python -m stepwise_client save module:attr [--team slug]`: save a workflow written in Python
through the REST API (STEPWISE_URL, default http://127.0.0.1:8000, and STEPWISE_TOKEN)."""
from __future__ import annotations

import argparse
import os
import sys

from .builder import load_definition
from .client import Stepwise, StepwiseError


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m stepwise_client")
    commands = parser.add_subparsers(dest="command", required=True)
    save = commands.add_parser("save", help="save the workflow a Python module defines")
    save.add_argument("reference", help="module:attribute, or path/to/file.py:attribute")
    save.add_argument("--team", help="the team's slug (needed if you belong to several)")
    args = parser.parse_args(argv)
    sys.path.insert(0, os.getcwd())  # `examples.python.support:workflow` from a checkout
    definition = load_definition(args.reference)
    url = os.environ.get("STEPWISE_URL", "http://127.0.0.1:8000")
    with Stepwise(url, token=os.environ["STEPWISE_TOKEN"]) as stepwise:
        try:
            version = stepwise.save_workflow(definition, team=args.team)
        except StepwiseError as error:
            for problem in error.errors:
                print(f"{problem.get('path') or '<root>'}: {problem.get('message')}", file=sys.stderr)
            return 1
    print(f"workflow {definition['name']} v{version.get('number')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
