"""Example workflows and the example tools they use (loaded via STEPWISE_TOOL_MODULES)."""
