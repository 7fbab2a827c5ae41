"""Argument checks shared by the package, with the Vietnamese messages readers see."""

from __future__ import annotations

from typing import Any, Iterable


def one_of(name: str, value: Any, allowed: Iterable) -> None:
    """``value`` must be one of ``allowed``."""
    allowed = tuple(allowed)
    if value not in allowed:
        raise ValueError(f"{name}={value!r} không hợp lệ; chỉ nhận một trong {allowed}.")


def int_at_least(name: str, value: Any, minimum: int = 1) -> None:
    """``value`` must be an ``int`` (not a ``bool``) no smaller than ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"{name} phải là số nguyên >= {minimum}, nhận được {value!r}.")


def non_negative(name: str, value: Any) -> None:
    """``value`` must be a real number >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise ValueError(f"{name} phải là số không âm, nhận được {value!r}.")
