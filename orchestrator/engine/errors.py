"""Errors the services raise to their callers; entry points turn them into answers
(the API into 4xx responses, the admin into messages)."""


class ServiceError(Exception):
    """Base class; `problems` is a list of {"path", "message"}."""

    def __init__(self, message: str, problems: list[dict] | None = None):
        super().__init__(message)
        self.problems = problems or [{"path": "", "message": message}]


class InputInvalid(ServiceError):
    """The run input does not satisfy the workflow's input_schema. No run was created."""


class IdempotencyConflict(ServiceError):
    """The Idempotency-Key was used before with a different request body."""


class NotAllowed(ServiceError):
    """The object is not in a state that allows this operation."""


class Forbidden(ServiceError):
    """The actor may not perform this operation (docs/permissions.md)."""


class BudgetExceeded(ServiceError):
    """A team's or a workflow's budget refuses a new run (a concurrent-run cap reached, a day's
    or month's limit spent), or an operator's action would cross a run's budget. `detail` names
    the level and the figures; `retry_after_s` says when asking again may succeed."""

    def __init__(self, message: str, *, detail: dict, retry_after_s: int | None = None):
        super().__init__(message)
        self.detail = detail
        self.retry_after_s = retry_after_s
