"""How large a dataset and what is put into it may be (docs/limits.md, "Evaluation datasets").

Checked before anything is parsed further or written; every refusal is a problem with a path.
"""
MAX_UPLOAD_BYTES = 2 * 1024 * 1024  # one JSON lines or CSV file
MAX_CASES_PER_CHANGE = 1000  # cases added (or removed) by one change
MAX_CASES_PER_VERSION = 10_000  # cases in one version of a dataset
MAX_KEY_CHARS = 200
MAX_TAGS = 20
MAX_TAG_CHARS = 50
MAX_EXPECTED_BYTES = 1024 * 1024  # an expected outcome's canonical JSON (inputs: the run input limit)
MAX_EXPECTED_DEPTH = 64
MAX_LABELS = 50
MAX_SCORERS = 20  # code scorers a case names
MAX_RUBRIC_CHARS = 4000  # a rubric's text
MAX_GRADED_CHARS = 20_000  # of a graded output (and of the case input) shown to the grading model
