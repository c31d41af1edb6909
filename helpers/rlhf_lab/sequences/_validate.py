"""Argument checks for the small array functions, which also run inside compiled code.

Shapes are always known (also while tracing), so shape checks always run. Scalar hyperparameters
are checked when they are concrete Python/NumPy values; inside a compiled run they were already
validated by the configuration object before tracing.
"""
from __future__ import annotations

import jax
import numpy as np

from .. import checks


def _traced(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def same_shape(names: tuple, *arrays) -> None:
    """``ValueError`` naming every argument and its shape unless all shapes agree."""
    checks.same_shape(names, *arrays)


def ndim(name: str, x, n: int) -> None:
    if np.ndim(x) != n:
        raise ValueError(f"{name} must have {n} dimension(s), got shape {np.shape(x)}")


def beta(x, name: str = "beta"):
    if not _traced(x):
        checks.beta(x, name)


def epsilon(x, name: str = "epsilon"):
    if not _traced(x):
        checks.epsilon(x, name)


def unit_interval(name: str, x, what: str):
    if not _traced(x):
        v = checks.finite_scalar(name, x)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"{name} ({what}) must lie in [0, 1], got {v}")


def positive(name: str, x):
    if not _traced(x):
        v = checks.finite_scalar(name, x)
        if v <= 0:
            raise ValueError(f"{name} must be > 0, got {v}")
