"""Reading pinned definitions. Versions are immutable, so each process caches them."""
from functools import lru_cache

from ..models import Run, WorkflowVersion
from ..scheduler import Graph, graph_of


@lru_cache(maxsize=512)
def _load(version_id: int, digest: str) -> tuple[dict, Graph]:
    normalized = WorkflowVersion.objects.values_list("normalized", flat=True).get(id=version_id)
    return normalized, graph_of(normalized)


def definition_of(run: Run) -> tuple[dict, Graph]:
    """The normalized definition and DAG a run is pinned to.

    The cache key carries the digest, so a reused id (test databases) can never serve a stale
    definition. `run.version` should be loaded with `runs_with_version()`.
    """
    return _load(run.version_id, run.version.digest)


def runs_with_version():
    """Runs joined to their version's small fields (not the definition JSON)."""
    return Run.objects.select_related("version", "version__workflow").defer(
        "version__definition", "version__normalized"
    )
