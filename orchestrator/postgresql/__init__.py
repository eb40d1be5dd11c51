"""Django's PostgreSQL engine, with the COMMIT sent behind the writes left for it
(`orchestrator.compiled.writes_behind`). `DATABASE_URL=postgres://...` selects it."""
