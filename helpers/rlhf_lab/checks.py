"""Argument validation shared by the library.

Every public entry point validates its inputs in plain Python *before* anything is traced, so a
bad value fails with a ``ValueError`` that names the argument and the allowed range instead of
turning into a silent NaN deep inside a compiled loop.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np


def finite_scalar(name: str, value: Any) -> float:
    """Return ``value`` as a Python float, or raise ``ValueError`` if it is not a finite real number."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a finite real number, got {value!r}") from None
    if arr.shape != ():
        raise ValueError(f"{name} must be a scalar, got an array of shape {arr.shape}")
    out = float(arr)
    if not math.isfinite(out):
        raise ValueError(f"{name} must be finite, got {out}")
    return out


def beta(value: Any, name: str = "beta") -> float:
    """KL coefficient: finite and strictly positive (beta > 0)."""
    out = finite_scalar(name, value)
    if out <= 0.0:
        raise ValueError(f"{name} (KL coefficient) must be > 0, got {out}")
    return out


def epsilon(value: Any, name: str = "epsilon") -> float:
    """Clip range: finite and inside the open interval (0, 1)."""
    out = finite_scalar(name, value)
    if not 0.0 < out < 1.0:
        raise ValueError(f"{name} (clip range) must lie in the open interval (0, 1), got {out}")
    return out


def learning_rate(value: Any, name: str = "learning_rate") -> float:
    """Step size: finite and strictly positive."""
    out = finite_scalar(name, value)
    if out <= 0.0:
        raise ValueError(f"{name} must be > 0, got {out}")
    return out


def positive_int(name: str, value: Any, minimum: int = 1) -> int:
    """An integer count >= ``minimum`` (bools and floats with a fraction are rejected)."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise ValueError(f"{name} must be an integer >= {minimum}, got {value!r}")
    value = int(value)
    if value < minimum:
        raise ValueError(f"{name} must be an integer >= {minimum}, got {value}")
    return value


def finite_vector(name: str, value: Any, size: int | None = None, ndim: int = 1) -> np.ndarray:
    """A finite float array with ``ndim`` dimensions (and ``size`` entries on the last axis, if given)."""
    try:
        arr = np.asarray(value, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an array of finite numbers, got {value!r}") from None
    if arr.ndim != ndim:
        raise ValueError(f"{name} must have {ndim} dimension(s), got shape {arr.shape}")
    if arr.size == 0:
        raise ValueError(f"{name} must not be empty")
    if size is not None and arr.shape[-1] != size:
        raise ValueError(
            f"{name} has {arr.shape[-1]} entries on its last axis but {size} were expected (mismatched shapes)"
        )
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} contains non-finite values (NaN or inf): {arr}")
    return arr


def same_shape(names: tuple[str, ...], *arrays: Any) -> None:
    """Raise ``ValueError`` unless all arrays have the same shape."""
    shapes = [np.shape(a) for a in arrays]
    if len(set(shapes)) > 1:
        desc = ", ".join(f"{n}{s}" for n, s in zip(names, shapes))
        raise ValueError(f"mismatched shapes: {desc}")
