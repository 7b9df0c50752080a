"""The suite's warning filter: a warning fails the test that raised it, unless pyproject.toml names it."""

from __future__ import annotations

import warnings

import pytest


def test_an_unnamed_warning_fails_the_test():
    """A DeprecationWarning nobody named is an error in this suite (filterwarnings = error)."""
    with pytest.raises(DeprecationWarning, match="an unnamed deprecation"):
        warnings.warn("an unnamed deprecation", DeprecationWarning, stacklevel=1)


def test_a_named_warning_is_let_through():
    """The one named exception (torch.jit.script's deprecation, raised by the frameworks' imports)
    passes: without its line in pyproject.toml this warning would raise."""
    warnings.warn(
        "`torch.jit.script` is deprecated. Please switch to `torch.compile`", DeprecationWarning, stacklevel=1
    )
