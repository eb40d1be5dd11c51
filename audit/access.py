"""Who may read the audit ledger: members of the `auditors` group, and superusers.

The ledger spans every team, so being staff is not enough (docs/permissions.md). It is read in
the admin, which only lets staff accounts in; an auditor account is a staff account in the
`auditors` group that needs no other permission. Nobody may add, change or delete entries,
whatever their permissions (the database refuses it anyway).
"""
AUDITORS_GROUP = "auditors"


def can_read_ledger(user) -> bool:
    if not (user and user.is_active and user.is_authenticated):
        return False
    if user.is_superuser:
        return True
    return user.groups.filter(name=AUDITORS_GROUP).exists()
