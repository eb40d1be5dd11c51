"""The fast store's PostgreSQL engine: Django's, sending the writes the store holds
(`orchestrator.store.fast.compiled.writes_behind`) before any statement Django sends and with
the COMMIT. `STEPWISE_STORE=fast` on PostgreSQL selects it."""
