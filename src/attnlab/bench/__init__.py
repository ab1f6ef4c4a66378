"""Measurements of attention kinds: scaling with length, quality on fixed budgets, design studies."""
