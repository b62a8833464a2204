"""User-facing errors.

Anything a user can fix (a bad config value, a missing file, an impossible
combination) is raised as :class:`UserError`. The CLI prints its message and
exits with code 2, without a traceback. Messages state the value, the
constraint and the fix.
"""

from __future__ import annotations


class UserError(Exception):
    """An error caused by input the user can change; the CLI exits with code 2."""

    exit_code = 2


class ConfigError(UserError):
    """A configuration value or combination is invalid."""


class CheckpointError(UserError):
    """A checkpoint is missing, corrupt or incompatible."""


class DataError(UserError):
    """A data path or sample is missing, unreadable or inconsistent."""


class DivergedError(UserError, FloatingPointError):
    """Training diverged: the loss became NaN or infinite. The CLI prints what to change and where the run's
    records are, and exits with code 1 (the run failed; how it was invoked was valid)."""

    exit_code = 1
