"""Django's PostgreSQL engine; a transaction's COMMIT goes in one pipeline with the writes a
`writes_behind` block left for it (the ledger's entries of a step), instead of after them in a
round trip of its own. Nothing else differs."""
from django.db.backends.postgresql import base

from orchestrator import compiled


class DatabaseWrapper(base.DatabaseWrapper):
    # Read by `writes_behind`: writes may be left for this engine's COMMIT, which sends them.
    commits_behind = True

    def _commit(self):
        if not compiled.commit_behind(self):
            super()._commit()

    def _rollback(self):
        compiled.forget_behind(self)
        super()._rollback()

    def _close(self):
        compiled.forget_behind(self)
        super()._close()
