"""File tools: `files.read`, `files.write`, `files.list`, `files.delete` under the root of a
named `files` connection - a local directory, or a bucket (and prefix) of S3-compatible object
storage through boto3.

The sandbox: a path is relative to the connection's root and may not be absolute, contain `..`,
`.` or empty segments, a backslash or a NUL (refused by the params schema, and again here). On
the local filesystem every directory on the way is opened relative to the one before it with
O_NOFOLLOW, and so is the file: a symlink anywhere under the root is refused, even one swapped
in between a check and the open, so nothing outside the root is ever read or written.

Limits: `max_bytes` per file read or written (default 10 MiB), `max_entries` per listing.
Writes are atomic: a temporary file in the same directory, flushed and fsynced, renamed over
the target (S3's PUT is atomic by itself), so a reader never sees half a file and a worker dying
mid-write leaves the old content. Writing and deleting need `writes: true` on the connection.

Repeating a write with the same content, or a delete, changes nothing further: both tools
`dedupe_by_key` in the sense the effect ledger needs (an uncertain attempt may be repeated).
"""
import base64
import errno
import fcntl
import fnmatch
import hashlib
import json
import os
import secrets
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

from botocore.exceptions import BotoCoreError, ClientError, ConnectTimeoutError, ReadTimeoutError

from orchestrator.engine.retry import StepError

from ..connections import Connection
from .named import CONNECTION_PARAM, connection_for, deadline_s, failure
from .registry import ToolContext, tool

DEFAULT_MAX_BYTES = 10 * 1024 * 1024
DEFAULT_MAX_ENTRIES = 1000
# Relative, and no segment is "." or ".." (empty segments are refused at run time).
PATH_PATTERN = r"^(?!/)(?!.*(^|/)\.\.?(/|$))[^\\\x00]+$"
_PATH = {"type": "string", "minLength": 1, "maxLength": 1024, "pattern": PATH_PATTERN,
         "description": "Relative to the connection's root; no '..', no leading '/'."}
_ENCODING = {"type": "string", "enum": ["utf-8", "base64"], "default": "utf-8"}

READ_PARAMS = {"type": "object", "additionalProperties": False, "required": ["connection", "path"],
               "properties": {"connection": CONNECTION_PARAM, "path": _PATH,
                              "encoding": _ENCODING}}
WRITE_PARAMS = {
    "type": "object", "additionalProperties": False,
    "required": ["connection", "path", "content"],
    "properties": {"connection": CONNECTION_PARAM, "path": _PATH,
                   "content": {"type": "string"}, "encoding": _ENCODING,
                   "if_exists": {"type": "string", "enum": ["overwrite", "fail"],
                                 "default": "overwrite",
                                 "description": "fail: refuse to replace different content."}},
}
LIST_PARAMS = {
    "type": "object", "additionalProperties": False, "required": ["connection"],
    "properties": {"connection": CONNECTION_PARAM,
                   "path": {**_PATH, "description": "A directory (prefix) under the root; "
                                                   "the root if absent."},
                   "pattern": {"type": "string", "maxLength": 200,
                               "description": "A glob the names must match, e.g. *.csv"},
                   "recursive": {"type": "boolean", "default": False}},
}
DELETE_PARAMS = {"type": "object", "additionalProperties": False,
                 "required": ["connection", "path"],
                 "properties": {"connection": CONNECTION_PARAM, "path": _PATH,
                                "missing_ok": {"type": "boolean", "default": True}}}
_FILE = {"type": "object", "required": ["path", "bytes", "sha256"],
         "properties": {"path": {"type": "string"}, "bytes": {"type": "integer"},
                        "sha256": {"type": "string"}}}
READ_OUTPUT = {**_FILE, "required": ["path", "bytes", "sha256", "content", "encoding"],
               "properties": {**_FILE["properties"], "content": {"type": "string"},
                              "encoding": {"type": "string"}}}
LIST_OUTPUT = {"type": "object", "required": ["entries", "truncated"], "properties": {
    "entries": {"type": "array", "items": {"type": "object", "required": ["path", "type"],
                "properties": {"path": {"type": "string"},
                               "type": {"enum": ["file", "directory"]},
                               "bytes": {"type": "integer"},
                               "modified": {"type": "string"}}}},
    "truncated": {"type": "boolean"}}}
DELETE_OUTPUT = {"type": "object", "required": ["path", "deleted"],
                 "properties": {"path": {"type": "string"}, "deleted": {"type": "boolean"}}}


def segments(path: str) -> list[str]:
    """The path's segments. Raises StepError("policy") for a path that could leave the root."""
    if (not isinstance(path, str) or not path or path.startswith("/") or "\\" in path
            or "\x00" in path):
        raise StepError("policy", f"path {path!r} must be relative to the connection's root")
    parts = path.split("/")
    if path.endswith("/"):
        parts = parts[:-1]
    if any(part in ("", ".", "..") for part in parts):
        raise StepError("policy", f"path {path!r} may not contain '..', '.' or empty segments")
    return parts


def _max_bytes(connection: Connection) -> int:
    return int(connection.get("max_bytes") or DEFAULT_MAX_BYTES)


def _content_bytes(params: dict) -> bytes:
    if params.get("encoding", "utf-8") == "base64":
        try:
            return base64.b64decode(params["content"], validate=True)
        except ValueError:
            raise StepError("validation", "content is not valid base64") from None
    return params["content"].encode("utf-8")


def _as_text(data: bytes, encoding: str) -> str:
    if encoding == "base64":
        return base64.b64encode(data).decode()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise StepError("permanent", "the file is not UTF-8 text; read it with "
                                     "encoding: base64") from None


def _writable(connection: Connection, name: str) -> None:
    if not connection.get("writes"):
        raise StepError("policy", f"connection '{connection.name}' is read-only; {name} needs "
                                  "one with writes: true")


# --- the local filesystem ---------------------------------------------------------------------

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


def _os_failure(connection: Connection, exc: OSError, path: str) -> StepError:
    if exc.errno == errno.ELOOP or exc.errno == errno.ENOTDIR:
        return StepError("policy", f"path {path!r} goes through a symlink or a file; refused")
    if exc.errno == errno.ENOENT:
        return StepError("permanent", f"{path!r} does not exist")
    if exc.errno in (errno.EACCES, errno.EPERM):
        return StepError("auth", f"permission denied for {path!r}")
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EAGAIN, errno.EBUSY):
        return failure(connection, "transient", exc)
    return failure(connection, "permanent", exc)


@contextmanager
def _directory(connection: Connection, parts: list[str], *, create: bool) -> Iterator[int]:
    """A descriptor of the directory holding `parts[-1]`, reached from the root one segment at
    a time without following a symlink (created on the way if `create`)."""
    root = str(connection.get("root"))
    if create:
        os.makedirs(root, exist_ok=True)
    fd = os.open(root, _DIR_FLAGS & ~os.O_NOFOLLOW)  # the root itself is the operator's choice
    try:
        for part in parts[:-1]:
            try:
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise
                try:
                    os.mkdir(part, 0o750, dir_fd=fd)
                except FileExistsError:
                    pass
                child = os.open(part, _DIR_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = child
        yield fd
    finally:
        os.close(fd)


def _local_read(connection: Connection, parts: list[str], path: str) -> bytes:
    limit = _max_bytes(connection)
    with _directory(connection, parts, create=False) as dir_fd:
        fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC, dir_fd=dir_fd)
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode):
                raise StepError("permanent", f"{path!r} is not a file")
            if info.st_size > limit:
                raise StepError("permanent", f"{path!r} is {info.st_size} bytes; the limit is "
                                             f"{limit} (max_bytes)")
            data = handle.read(limit + 1)
    if len(data) > limit:
        raise StepError("permanent", f"{path!r} is over the limit of {limit} bytes (max_bytes)")
    return data


@contextmanager
def _fence(dir_fd: int, name: str, key: str, token: int) -> Iterator[None]:
    """Fencing of a local write: under an exclusive lock on `.<name>.fence`, refuse (StepError
    "stale") when the last writer of `key` held a newer token than `token`; else record
    (key, token) and let the caller rename its file into place while the lock is held."""
    fd = os.open(f".{name}.fence", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o640,
                 dir_fd=dir_fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        try:
            seen = json.loads(os.pread(fd, 4096, 0) or b"{}")
        except ValueError:
            seen = {}
        if seen.get("key") == key and int(seen.get("token", 0)) > token:
            raise StepError("stale", f"a newer attempt (token {seen['token']}) wrote this file; "
                                     f"attempt token {token} is refused")
        record = json.dumps({"key": key, "token": token}).encode()
        os.ftruncate(fd, 0)
        os.pwrite(fd, record, 0)
        yield
    finally:
        os.close(fd)  # releases the lock


def _local_write(connection: Connection, parts: list[str], path: str, data: bytes,
                 if_exists: str, *, key: str = "", token: int = 0) -> None:
    with _directory(connection, parts, create=True) as dir_fd:
        name = parts[-1]
        if if_exists == "fail":
            try:
                current = _local_read(connection, parts, path)
            except FileNotFoundError:
                pass
            else:
                if current != data:  # the same content is this effect's own earlier write
                    raise StepError("permanent", f"{path!r} exists with other content "
                                                 "(if_exists: fail)")
                return
        temp = f".{name}.{secrets.token_hex(6)}.tmp"
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC,
                     0o640, dir_fd=dir_fd)
        try:
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            # rename() replaces a symlink named `name` rather than following it.
            if token:
                with _fence(dir_fd, name, key, token):
                    os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
            else:
                os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            try:
                os.unlink(temp, dir_fd=dir_fd)
            except OSError:
                pass
            raise
        os.fsync(dir_fd)


def _local_list(connection: Connection, parts: list[str], path: str, pattern: str | None,
                recursive: bool) -> tuple[list[dict], bool]:
    limit = int(connection.get("max_entries") or DEFAULT_MAX_ENTRIES)
    entries: list[dict] = []
    with _directory(connection, [*parts, "."], create=False) as top:
        stack = [(os.dup(top), "/".join(parts))]
        try:
            while stack:
                fd, prefix = stack.pop()
                try:
                    for entry in sorted(os.scandir(fd), key=lambda e: e.name):
                        if entry.name.startswith(".") and entry.name.endswith((".tmp", ".fence")):
                            continue  # a write in progress, or a file's fencing record
                        rel = f"{prefix}/{entry.name}" if prefix else entry.name
                        if entry.is_symlink():
                            continue  # never reported, never followed
                        is_dir = entry.is_dir(follow_symlinks=False)
                        if not pattern or fnmatch.fnmatchcase(entry.name, pattern):
                            info = entry.stat(follow_symlinks=False)
                            entries.append({
                                "path": rel, "type": "directory" if is_dir else "file",
                                "bytes": 0 if is_dir else info.st_size,
                                "modified": datetime.fromtimestamp(info.st_mtime, UTC).isoformat()})
                            if len(entries) > limit:
                                return entries[:limit], True
                        if recursive and is_dir:
                            stack.append((os.open(entry.name, _DIR_FLAGS, dir_fd=fd), rel))
                finally:
                    os.close(fd)
        finally:
            for fd, _ in stack:
                os.close(fd)
    return entries, False


def _local_delete(connection: Connection, parts: list[str]) -> bool:
    with _directory(connection, parts, create=False) as dir_fd:
        info = os.stat(parts[-1], dir_fd=dir_fd, follow_symlinks=False)
        if stat.S_ISDIR(info.st_mode):
            raise StepError("permanent", "files.delete removes files, not directories")
        os.unlink(parts[-1], dir_fd=dir_fd)  # a symlink itself is removed, never its target
    return True


# --- S3-compatible object storage -------------------------------------------------------------

def _s3(connection: Connection, seconds: float):
    # Imported here: boto3 is a large part of a process's start, and most never call S3.
    import boto3
    from botocore.config import Config

    config = Config(connect_timeout=min(seconds, 10), read_timeout=seconds,
                    retries={"max_attempts": 1, "mode": "standard"})
    return boto3.session.Session().client(
        "s3", endpoint_url=connection.get("endpoint_url"),
        region_name=connection.get("region") or "us-east-1",
        aws_access_key_id=connection.secret("access_key_id"),
        aws_secret_access_key=connection.secret("secret_access_key"), config=config)


def _s3_key(connection: Connection, parts: list[str]) -> str:
    prefix = str(connection.get("prefix") or "").strip("/")
    return "/".join([prefix, *parts]) if prefix else "/".join(parts)


def _s3_failure(connection: Connection, exc: Exception, path: str) -> StepError:
    if isinstance(exc, ReadTimeoutError | ConnectTimeoutError):
        return failure(connection, "timeout", exc)
    if isinstance(exc, ClientError):
        code = exc.response.get("Error", {}).get("Code", "")
        status = exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        if code in ("NoSuchKey", "404", "NotFound"):
            return StepError("permanent", f"{path!r} does not exist")
        if code in ("SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded",
                    "TooManyRequests") or status == 429:
            return failure(connection, "rate_limit", exc)
        if code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch") or status == 403:
            return failure(connection, "auth", exc)
        if status >= 500:
            return failure(connection, "transient", exc)
        return failure(connection, "permanent", exc)
    return failure(connection, "transient", exc)  # could not connect, connection reset, ...


# --- the tools --------------------------------------------------------------------------------

def check_writes(params: dict, connection) -> list[tuple[tuple, str]]:
    if connection is not None and not connection.get("writes"):
        return [(("connection",), f"connection '{connection.name}' is read-only; writing and "
                                  "deleting need one with writes: true")]
    return []


def _run(connection: Connection, path: str, local, remote):
    """Call the backend's function, turning its failures into classified StepErrors."""
    try:
        if connection.get("backend", "local") == "s3":
            return remote()
        return local()
    except StepError:
        raise
    except OSError as exc:
        raise _os_failure(connection, exc, path) from exc
    except (ClientError, BotoCoreError) as exc:
        raise _s3_failure(connection, exc, path) from exc


@tool("files.read", params_schema=READ_PARAMS, output_schema=READ_OUTPUT, connection="files",
      description="Read a file under a named connection's root (size-limited).")
def files_read(params: dict, ctx: ToolContext) -> dict:
    connection = connection_for(params, ctx, "files")
    path = params["path"]
    parts = segments(path)
    limit = _max_bytes(connection)

    def remote():
        client = _s3(connection, deadline_s(connection, params, ctx))
        response = client.get_object(Bucket=connection.get("bucket"),
                                     Key=_s3_key(connection, parts))
        if response.get("ContentLength", 0) > limit:
            raise StepError("permanent", f"{path!r} is {response['ContentLength']} bytes; the "
                                         f"limit is {limit} (max_bytes)")
        return response["Body"].read(limit + 1)

    data = _run(connection, path, lambda: _local_read(connection, parts, path), remote)
    if len(data) > limit:
        raise StepError("permanent", f"{path!r} is over the limit of {limit} bytes (max_bytes)")
    encoding = params.get("encoding", "utf-8")
    return {"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest(),
            "content": _as_text(data, encoding), "encoding": encoding}


@tool("files.write", params_schema=WRITE_PARAMS, output_schema=_FILE, connection="files",
      side_effect=True, dedupes_by_key=True, check=check_writes,
      description="Write a file atomically under a named connection's root.")
def files_write(params: dict, ctx: ToolContext) -> dict:
    connection = connection_for(params, ctx, "files")
    _writable(connection, "files.write")
    path = params["path"]
    parts = segments(path)
    data = _content_bytes(params)
    limit = _max_bytes(connection)
    if len(data) > limit:
        raise StepError("permanent", f"content is {len(data)} bytes; the limit is {limit} "
                                     "(max_bytes)")
    if_exists = params.get("if_exists", "overwrite")

    def remote():
        client = _s3(connection, deadline_s(connection, params, ctx))
        key = _s3_key(connection, parts)
        if if_exists == "fail":
            try:
                current = client.get_object(Bucket=connection.get("bucket"), Key=key)["Body"].read()
            except ClientError as exc:
                if exc.response.get("Error", {}).get("Code") not in ("NoSuchKey", "404"):
                    raise
            else:
                if current != data:
                    raise StepError("permanent", f"{path!r} exists with other content "
                                                 "(if_exists: fail)")
                return
        client.put_object(Bucket=connection.get("bucket"), Key=key, Body=data,
                          Metadata={"stepwise-idempotency-key": ctx.idempotency_key[:200],
                                    "stepwise-fencing-token": str(ctx.fencing_token)})

    _run(connection, path, lambda: _local_write(connection, parts, path, data, if_exists,
                                                key=ctx.idempotency_key, token=ctx.fencing_token),
         remote)
    return {"path": path, "bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}


@tool("files.list", params_schema=LIST_PARAMS, output_schema=LIST_OUTPUT, connection="files",
      description="List files under a named connection's root (or a directory in it).")
def files_list(params: dict, ctx: ToolContext) -> dict:
    connection = connection_for(params, ctx, "files")
    path = params.get("path") or ""
    parts = segments(path) if path else []
    pattern, recursive = params.get("pattern"), params.get("recursive", False)
    limit = int(connection.get("max_entries") or DEFAULT_MAX_ENTRIES)

    def remote():
        client = _s3(connection, deadline_s(connection, params, ctx))
        base = _s3_key(connection, parts)
        prefix = f"{base}/" if base else ""
        root = _s3_key(connection, [])
        strip = len(f"{root}/") if root else 0
        arguments = {"Bucket": connection.get("bucket"), "Prefix": prefix}
        if not recursive:
            arguments["Delimiter"] = "/"
        entries: list[dict] = []
        for page in client.get_paginator("list_objects_v2").paginate(**arguments):
            for common in page.get("CommonPrefixes", []):
                rel = common["Prefix"][strip:].rstrip("/")
                if not pattern or fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern):
                    entries.append({"path": rel, "type": "directory", "bytes": 0})
            for item in page.get("Contents", []):
                rel = item["Key"][strip:]
                if not pattern or fnmatch.fnmatchcase(rel.rsplit("/", 1)[-1], pattern):
                    entries.append({"path": rel, "type": "file", "bytes": item["Size"],
                                    "modified": item["LastModified"].isoformat()})
            if len(entries) > limit:
                return entries[:limit], True
        return entries, False

    entries, truncated = _run(connection, path or ".",
                              lambda: _local_list(connection, parts, path, pattern, recursive),
                              remote)
    return {"entries": entries, "truncated": truncated}


@tool("files.delete", params_schema=DELETE_PARAMS, output_schema=DELETE_OUTPUT,
      connection="files", side_effect=True, dedupes_by_key=True, check=check_writes,
      description="Delete a file under a named connection's root.")
def files_delete(params: dict, ctx: ToolContext) -> dict:
    connection = connection_for(params, ctx, "files")
    _writable(connection, "files.delete")
    path = params["path"]
    parts = segments(path)

    def remote():
        client = _s3(connection, deadline_s(connection, params, ctx))
        key = _s3_key(connection, parts)
        try:
            client.head_object(Bucket=connection.get("bucket"), Key=key)
        except ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("NoSuchKey", "404", "NotFound"):
                return False
            raise
        client.delete_object(Bucket=connection.get("bucket"), Key=key)
        return True

    try:
        deleted = _run(connection, path, lambda: _local_delete(connection, parts), remote)
    except StepError as exc:
        if params.get("missing_ok", True) and exc.message.endswith("does not exist"):
            return {"path": path, "deleted": False}
        raise
    if deleted is False and not params.get("missing_ok", True):
        raise StepError("permanent", f"{path!r} does not exist")
    return {"path": path, "deleted": bool(deleted)}
