"""The audit ledger outlives each test's rows (it is append-only), so a test reads only the
entries it made: a module imports `ledger_before` (an autouse fixture that marks where the
ledger stood as the test began) and reads `new_entries()`."""
import pytest

from audit.models import AuditEntry

_before = 0


@pytest.fixture(autouse=True)
def ledger_before():
    global _before
    _before = AuditEntry.objects.order_by("-id").values_list("id", flat=True).first() or 0


def new_entries():
    """The ledger's entries written since the current test began."""
    return AuditEntry.objects.filter(id__gt=_before)
