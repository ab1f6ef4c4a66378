"""Kinds of data: for each, the keys every source of it has, the splits a source gives, and its built-in sources."""
