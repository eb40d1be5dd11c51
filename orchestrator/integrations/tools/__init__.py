"""Typed tools: functions with a JSON Schema for their params, registered by name."""
