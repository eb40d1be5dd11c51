"""The Content-Security-Policy header: scripts from this server's files only, on every page and
answer; and no template carries an inline script the policy would refuse (the browser tests
check the pages themselves: tests/browser/conftest.py fails a page the policy refused)."""
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATES = sorted({*ROOT.glob("templates/**/*.html"), *ROOT.glob("*/templates/**/*.html")})


@pytest.mark.django_db
@pytest.mark.parametrize("path", ["/admin/login/", "/api/v1/health/", "/api/v1/docs/",
                                  "/no/such/page/"])
def test_every_answer_carries_the_policy(client, path):
    policy = client.get(path)["Content-Security-Policy"]
    directives = dict(d.strip().split(" ", 1) for d in policy.split(";"))
    assert directives["script-src"] == "'self'"
    assert directives["object-src"] == "'none'" and directives["frame-ancestors"] == "'none'"


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_template_has_an_inline_script_or_event_handler(template):
    text = template.read_text()
    for tag in re.findall(r"<script\b[^>]*>", text):
        assert "src=" in tag or 'type="application/json"' in tag, (template, tag)
    assert not re.search(r"\son[a-z]+\s*=", text), template
