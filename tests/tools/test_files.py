"""File tools on the local filesystem (a sandboxed root) and on S3-compatible storage (a real
local S3 server: moto in server mode, a separate process)."""
import os

import boto3
import pytest

from orchestrator.engine.retry import StepError
from orchestrator.integrations.tools.registry import ToolContext, get_tool
from tests.support.integrations import closed_port

from .conftest import call, fails


@pytest.fixture
def root(connections, tmp_path):
    root = tmp_path / "root"
    root.mkdir()
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("not yours")
    connections(box={"kind": "files", "root": str(root), "writes": True, "max_bytes": 1000,
                     "max_entries": 5},
                shelf={"kind": "files", "root": str(root)})
    return root


def test_write_read_list_and_delete_under_the_root(root):
    out = call("files.write", {"connection": "box", "path": "reports/2026/a.md", "content": "# A"})
    assert out["bytes"] == 3 and len(out["sha256"]) == 64
    assert (root / "reports/2026/a.md").read_text() == "# A"
    call("files.write", {"connection": "box", "path": "reports/b.bin", "content": "AAEC",
                         "encoding": "base64"})
    assert call("files.read", {"connection": "shelf", "path": "reports/2026/a.md"})["content"] == "# A"
    assert call("files.read", {"connection": "shelf", "path": "reports/b.bin",
                               "encoding": "base64"})["content"] == "AAEC"
    listed = call("files.list", {"connection": "shelf", "path": "reports", "recursive": True})
    assert [(e["path"], e["type"]) for e in listed["entries"]] == [
        ("reports/2026", "directory"), ("reports/b.bin", "file"), ("reports/2026/a.md", "file")]
    assert [e["path"] for e in call("files.list", {"connection": "shelf", "path": "reports",
                                                   "pattern": "*.bin"})["entries"]] == ["reports/b.bin"]
    assert call("files.delete", {"connection": "box", "path": "reports/b.bin"})["deleted"] is True
    # Deleting again changes nothing: a retried delete succeeds.
    assert call("files.delete", {"connection": "box", "path": "reports/b.bin"})["deleted"] is False
    fails("permanent", "files.delete", {"connection": "box", "path": "reports/b.bin",
                                        "missing_ok": False})


def test_a_write_replaces_the_file_atomically_and_leaves_no_temporary_file(root):
    call("files.write", {"connection": "box", "path": "a.txt", "content": "old"})
    inode = os.stat(root / "a.txt").st_ino
    call("files.write", {"connection": "box", "path": "a.txt", "content": "new"})
    assert (root / "a.txt").read_text() == "new"
    assert os.stat(root / "a.txt").st_ino != inode  # a new file renamed over the old one
    assert sorted(p.name for p in root.iterdir()) == ["a.txt"]


def test_a_write_with_an_older_fencing_token_than_the_last_writer_of_its_key_is_refused(root):
    """A worker resumed after its claim was superseded renames nothing over the newer
    attempt's file; another key (another step) may overwrite it whatever its token."""
    write = get_tool("files.write").fn

    def ctx(key: str, token: int) -> ToolContext:
        return ToolContext(run_id="r", step_name="step", attempt=token, idempotency_key=key,
                           side_effect=True, team_lookup=lambda: "support", fencing_token=token)

    write({"connection": "box", "path": "a.txt", "content": "attempt 2"}, ctx("r:step:default", 2))
    with pytest.raises(StepError) as refused:
        write({"connection": "box", "path": "a.txt", "content": "attempt 1"}, ctx("r:step:default", 1))
    assert refused.value.error_class == "stale"
    assert (root / "a.txt").read_text() == "attempt 2"
    write({"connection": "box", "path": "a.txt", "content": "attempt 3"}, ctx("r:step:default", 3))
    write({"connection": "box", "path": "a.txt", "content": "other"}, ctx("r:other:default", 1))
    assert (root / "a.txt").read_text() == "other"
    assert [e["path"] for e in call("files.list", {"connection": "box"})["entries"]] == ["a.txt"]


def test_if_exists_fail_refuses_other_content_but_accepts_its_own_repeat(root):
    params = {"connection": "box", "path": "once.txt", "content": "v1", "if_exists": "fail"}
    call("files.write", params)
    call("files.write", params)  # the same effect repeated after a crash: fine
    fails("permanent", "files.write", {**params, "content": "v2"})
    assert (root / "once.txt").read_text() == "v1"


@pytest.mark.parametrize("path", ["../outside/secret.txt", "/etc/passwd", "a/../../outside/secret.txt",
                                  "./a.txt", "a//b.txt", "a\\..\\b"])
def test_a_path_that_could_leave_the_root_is_refused(root, path):
    with pytest.raises(Exception) as caught:
        call("files.read", {"connection": "shelf", "path": path})
    assert caught.value.error_class in ("validation", "policy"), caught.value


def test_symlinks_under_the_root_are_never_followed(root, tmp_path):
    (root / "escape").symlink_to(tmp_path / "outside", target_is_directory=True)
    (root / "link.txt").symlink_to(tmp_path / "outside" / "secret.txt")
    fails("policy", "files.read", {"connection": "shelf", "path": "escape/secret.txt"})
    fails("policy", "files.read", {"connection": "shelf", "path": "link.txt"})
    fails("policy", "files.write", {"connection": "box", "path": "escape/new.txt", "content": "x"})
    assert not (tmp_path / "outside" / "new.txt").exists()
    # Writing over a symlink replaces the link, never the file it points to.
    call("files.write", {"connection": "box", "path": "link.txt", "content": "mine"})
    assert (tmp_path / "outside" / "secret.txt").read_text() == "not yours"
    assert [e["path"] for e in call("files.list", {"connection": "shelf"})["entries"]] == ["link.txt"]


def test_size_limits_and_read_only_connections(root):
    fails("permanent", "files.write", {"connection": "box", "path": "big.txt", "content": "x" * 1001})
    (root / "big.txt").write_text("x" * 1001)
    fails("permanent", "files.read", {"connection": "box", "path": "big.txt"})
    fails("policy", "files.write", {"connection": "shelf", "path": "a.txt", "content": "x"})
    fails("policy", "files.delete", {"connection": "shelf", "path": "big.txt"})
    assert (root / "big.txt").exists()
    fails("permanent", "files.read", {"connection": "shelf", "path": "missing.txt"})
    for i in range(7):
        (root / f"f{i}").write_text("")
    listed = call("files.list", {"connection": "box"})
    assert len(listed["entries"]) == 5 and listed["truncated"] is True


# --- S3-compatible storage: a real local server ------------------------------------------------

@pytest.fixture
def bucket(s3_server, connections, monkeypatch):
    monkeypatch.setenv("INTEGRATIONS_S3_KEY", "test")
    monkeypatch.setenv("INTEGRATIONS_S3_SECRET", "test")
    client = boto3.client("s3", endpoint_url=s3_server, region_name="us-east-1",
                          aws_access_key_id="test", aws_secret_access_key="test")
    client.create_bucket(Bucket="integrations")
    creds = {"access_key_id": {"env": "INTEGRATIONS_S3_KEY"},
             "secret_access_key": {"env": "INTEGRATIONS_S3_SECRET"}}
    connections(s3={"kind": "files", "backend": "s3", "bucket": "integrations", "prefix": "team-a",
                    "endpoint_url": s3_server, "writes": True, "max_bytes": 1000, **creds},
                s3_down={"kind": "files", "backend": "s3", "bucket": "integrations",
                         "endpoint_url": f"http://127.0.0.1:{closed_port()}", "timeout_s": 2, **creds},
                s3_other={"kind": "files", "backend": "s3", "bucket": "no-such-bucket",
                          "endpoint_url": s3_server, **creds})
    return client


def test_s3_write_read_list_delete_under_the_prefix(bucket):
    call("files.write", {"connection": "s3", "path": "digests/eu.md", "content": "# EU"})
    assert bucket.get_object(Bucket="integrations", Key="team-a/digests/eu.md")["Body"].read() == b"# EU"
    assert call("files.read", {"connection": "s3", "path": "digests/eu.md"})["content"] == "# EU"
    listed = call("files.list", {"connection": "s3", "recursive": True})
    assert [(e["path"], e["bytes"]) for e in listed["entries"]] == [("digests/eu.md", 4)]
    top = call("files.list", {"connection": "s3"})
    assert [(e["path"], e["type"]) for e in top["entries"]] == [("digests", "directory")]
    assert call("files.delete", {"connection": "s3", "path": "digests/eu.md"})["deleted"] is True
    assert call("files.delete", {"connection": "s3", "path": "digests/eu.md"})["deleted"] is False


def test_s3_failures_are_classified(bucket):
    fails("permanent", "files.read", {"connection": "s3", "path": "missing.md"})
    fails("permanent", "files.write", {"connection": "s3", "path": "big", "content": "x" * 1001})
    fails("transient", "files.read", {"connection": "s3_down", "path": "a.md"})
    fails("permanent", "files.read", {"connection": "s3_other", "path": "a.md"})
    # A path out of the prefix never reaches the server: refused by the params schema, and
    # by the tool itself should a caller skip the schema.
    fails("validation", "files.read", {"connection": "s3", "path": "../team-b/a.md"})
    with pytest.raises(StepError) as caught:
        get_tool("files.read").fn({"connection": "s3", "path": "a/../../team-b/a.md"},
                                  ToolContext("r", "s", 1, "r:s:default", team_lookup=lambda: "t"))
    assert caught.value.error_class == "policy"
