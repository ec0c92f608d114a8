"""Errors that stop the agent before it serves: each one line, naming the flag and the value.

``durable-agent`` prints the message (no traceback) and exits 2 for both kinds; see cli.py.
A leaf module: every part of the agent may raise these.
"""

from __future__ import annotations


class SettingError(ValueError):
    """A flag's or an environment variable's value cannot be used."""


class StartupError(RuntimeError):
    """The settings are valid, but the machine does not let the agent start with them: a
    data directory it cannot create or write, a port another process holds."""
