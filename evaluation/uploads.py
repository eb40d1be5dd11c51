"""Reading a file of cases: JSON lines or CSV, into the case objects the services take.

JSON lines: one case object a line (`{"key", "input", "expected", "risk_tier", "tags"}`), blank
lines ignored. CSV: a header naming the columns `key, input, expected, risk_tier, tags`, `input`
and `expected` as JSON text, `tags` comma separated. Both are read with the standard library,
bounded (`limits`), and all or nothing: every bad line is reported, by its line number, and
nothing is returned. Whether a case fits the workflow is the services' check; a problem found
there is reported at the same "line N" path: each case comes with the line it starts on.

Pure: bytes in, cases or `InputInvalid` out.
"""
import csv
import io

from orchestrator.engine.definitions import DefinitionInvalid
from orchestrator.engine.definitions.loader import parse_json_text
from orchestrator.engine.errors import InputInvalid

from .limits import MAX_CASES_PER_CHANGE, MAX_UPLOAD_BYTES

FORMATS = {"jsonl": ("application/jsonl", "application/x-ndjson", "application/json-lines"),
           "csv": ("text/csv",)}
CSV_COLUMNS = ("key", "input", "expected", "risk_tier", "tags")
FIELDS = frozenset(CSV_COLUMNS)


def format_of(content_type: str, filename: str = "") -> str | None:
    """"jsonl" or "csv" from a media type, else from a file name's extension; None if neither."""
    media = (content_type or "").split(";")[0].strip().lower()
    for name, types in FORMATS.items():
        if media in types:
            return name
    lowered = filename.lower()
    if lowered.endswith((".jsonl", ".ndjson")):
        return "jsonl"
    if lowered.endswith(".csv"):
        return "csv"
    return None


def line_path(line: int) -> str:
    return f"line {line}"


def parse_cases(data: bytes, fmt: str) -> list[tuple[int, dict]]:
    """The cases of a file, each as (the line it starts on, the case). Raises InputInvalid listing
    every problem (a file too large, not UTF-8, a line that does not parse, too many cases)."""
    if len(data) > MAX_UPLOAD_BYTES:
        raise InputInvalid("the file is too large", [{"path": "", "message":
                           f"the file is larger than {MAX_UPLOAD_BYTES:,} bytes"}])
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise InputInvalid("the file is not UTF-8", [{"path": "", "message":
                           f"the file is not UTF-8 text (byte {exc.start})"}]) from None
    cases, problems = (_jsonl if fmt == "jsonl" else _csv)(text)
    if not problems and not cases:
        problems.append({"path": "", "message": "the file holds no case"})
    if len(cases) > MAX_CASES_PER_CHANGE:
        problems.append({"path": "", "message": f"the file holds {len(cases):,} cases; at most "
                         f"{MAX_CASES_PER_CHANGE:,} are added at once"})
    if problems:
        raise InputInvalid("the file has bad lines", problems)
    return cases


def _jsonl(text: str) -> tuple[list[tuple[int, dict]], list[dict]]:
    cases, problems = [], []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            case = parse_json_text(line, what="JSON")
        except DefinitionInvalid as exc:
            problems.append({"path": line_path(number), "message": exc.problems[0].message})
            continue
        if not isinstance(case, dict):
            problems.append({"path": line_path(number), "message": "a line must be one JSON object"})
            continue
        cases.append((number, case))
    return cases, problems


def _csv(text: str) -> tuple[list[tuple[int, dict]], list[dict]]:
    reader = csv.DictReader(io.StringIO(text, newline=""), strict=True)
    cases, problems = [], []
    try:
        header = reader.fieldnames or []
        missing = [c for c in ("key", "input", "expected", "risk_tier") if c not in header]
        unknown = [c for c in header if c not in FIELDS]
        if missing or unknown:
            detail = "; ".join(filter(None, [missing and f"missing {', '.join(missing)}",
                                             unknown and f"unknown {', '.join(unknown)}"]))
            return [], [{"path": line_path(1), "message": f"the header must name the columns "
                         f"{', '.join(CSV_COLUMNS)} ({detail})"}]
        start = reader.line_num + 1
        for row in reader:
            number, start = start, reader.line_num + 1
            if None in row or any(value is None for value in row.values()):
                problems.append({"path": line_path(number), "message":
                                 f"the row has {'more' if None in row else 'fewer'} cells than the header"})
                continue
            case: dict = {"key": row["key"], "risk_tier": row["risk_tier"]}
            for column in ("input", "expected"):
                try:
                    case[column] = parse_json_text(row[column], what=f"JSON in column {column}")
                except DefinitionInvalid as exc:
                    problems.append({"path": f"{line_path(number)}.{column}", "message": exc.problems[0].message})
            case["tags"] = [t.strip() for t in (row.get("tags") or "").split(",") if t.strip()]
            cases.append((number, case))
    except csv.Error as exc:
        problems.append({"path": line_path(reader.line_num), "message": f"not CSV: {exc}"})
    return cases, problems
