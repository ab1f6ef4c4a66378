"""Argument checks shared by the ``"grid"`` attention kinds (feature maps ``(B, C, H, W)``)."""

from __future__ import annotations

from ...errors import InputError

__all__ = ["grid_size", "check_map"]


def grid_size(size: int | tuple[int, int] | list[int] | None, *, optional: bool = False) -> tuple[int, int] | None:
    """``(H, W)`` from one int or a pair; ``None`` stays ``None`` when ``optional``."""
    if size is None and optional:
        return None
    pair = (size, size) if isinstance(size, int) else tuple(size) if isinstance(size, (tuple, list)) else ()
    if len(pair) != 2 or not all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in pair):
        allowed = "None, a positive integer" if optional else "a positive integer"
        raise InputError(f"size must be {allowed} or a pair (H, W) of them; got {size!r}")
    return pair  # type: ignore[return-value]


def check_map(x, embed_dim: int, size: tuple[int, int] | None) -> None:
    """``x`` must be ``(B, embed_dim, H, W)``, with ``(H, W) == size`` when ``size`` is given."""
    ok = x.dim() == 4 and x.shape[1] == embed_dim
    if ok and size is not None:
        ok = tuple(x.shape[2:]) == size
    if not ok:
        hw = "H, W" if size is None else f"{size[0]}, {size[1]}"
        raise InputError(f"x must have shape (B, {embed_dim}, {hw}) (channels embed_dim={embed_dim}, size={size}); "
                         f"got ({', '.join(map(str, x.shape))})")
