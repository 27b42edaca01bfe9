"""The wrapper's errors: one tree, each class carrying the exit status and the log stage a user sees.

`WarmstartError` is the root. Whatever reaches the command line (`cli.dispatch`, `warmstart serve`)
becomes one `warmstart | STAGE | message` line and the class's exit status: the table is the classes
below, read in one place. Errors with no exit status (`exit_code = None`: the store's, a job's input)
are always handled where they are raised (a store that fails is a warning, bad input an answer to
the job); one that escapes is a bug and keeps its traceback.

Each concrete class keeps the builtin base it had (`ValueError`, `RuntimeError`) beside the tree, so
code that catches those still catches them. The modules that raise them re-export them under their
old names (`settings.SettingsError`, `model.ModelError`, `store.bundle.StoreError`, ...).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

EXIT_CONFIG = 2  # the configuration, the model, the hardware or the vLLM installation is not usable
EXIT_ENGINE = 3  # vLLM exited or never became ready (boot), or died while serving (serve's watchdog)


class WarmstartError(Exception):
    """The root of the wrapper's errors. `exit_code`: the process's status when it reaches the command
    line (None: handled where raised); `stage`: the log stage its line is written under."""

    exit_code: ClassVar[int | None] = None
    stage: ClassVar[str] = "error"
    one_line: ClassVar[bool] = True  # join the message's lines (a Hub error explains itself on several)

    def user_text(self, redact: Callable[[str], str] | None = None) -> str:
        """The message as the user reads it: redacted by `redact` (a `str -> str`), on one line unless
        the class says its lines matter (the settings' problems, vLLM's last log lines)."""
        text = str(self) if redact is None else redact(str(self))
        return " ".join(text.split()) if self.one_line else text


# --------------------------------------------------------------------------- configuration (exit 2)


class SettingsError(WarmstartError, ValueError):
    """Bad configuration. `problems` holds one line per offending variable."""

    exit_code = EXIT_CONFIG
    stage = "settings"
    one_line = False  # several problems: one per line

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        # One problem reads on one line (the log line a user sees first); several, one per line.
        lines = problems[0] if len(problems) == 1 else "\n  " + "\n  ".join(problems)
        super().__init__(f"invalid configuration: {lines}")


class ModelError(WarmstartError, RuntimeError):
    """The model cannot be resolved to a usable snapshot."""

    exit_code = EXIT_CONFIG


class HardwareError(WarmstartError, RuntimeError):
    """The machine looks like it has a GPU, but nothing could say which."""

    exit_code = EXIT_CONFIG


# --------------------------------------------------------------------------- the engine


class EngineNotFound(WarmstartError, RuntimeError):
    """No vLLM installation could be located (a configuration error: exit 2)."""

    exit_code = EXIT_CONFIG


class EngineFailed(WarmstartError, RuntimeError):
    """vLLM exited or did not become ready. `tail` holds its last log lines."""

    exit_code = EXIT_ENGINE
    stage = "engine"
    one_line = False  # vLLM's last log lines follow the message

    def __init__(self, message: str, tail: list[str] | None = None, returncode: int | None = None) -> None:
        self.tail = tail or []
        self.returncode = returncode
        text = message
        if self.tail:
            text += "\n--- last lines of vLLM's log ---\n" + "\n".join(self.tail)
        super().__init__(text)


# --------------------------------------------------------------------------- the stores (handled where raised)


class StoreError(WarmstartError, RuntimeError):
    """A generation or bundle in a store cannot be used. `bundle` names the bad bundle."""

    stage = "store"

    def __init__(self, message: str, bundle: str | None = None) -> None:
        super().__init__(message)
        self.bundle = bundle


class StoreUnavailable(StoreError):
    """The store could not be reached, or refused the request (credentials, permissions).
    Nothing in it is known to be bad: a restore starts cold, a publish is skipped."""


class DeadlinePassed(StoreUnavailable):
    """The operation's deadline passed: its thread stops here; nothing is known about the store."""


# --------------------------------------------------------------------------- a job's input (answered, never exits)


class InputError(WarmstartError, ValueError):
    """The job input is not something this worker serves; the message says why."""

    stage = "input"
