"""Attention variants, one file per kind; each registers itself with :mod:`attnlab.attention.registry`."""
