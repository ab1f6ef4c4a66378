"""Glue per task: data, model, metrics."""
