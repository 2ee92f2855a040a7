"""Shared metrics over the model: nesting and self time, intervals, steps, per-op aggregates."""
