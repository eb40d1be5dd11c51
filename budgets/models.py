"""Budgets keep no tables of their own yet: prices live in the model registry (settings) and
spend is accumulated on runs, steps and attempts (orchestrator.models)."""
