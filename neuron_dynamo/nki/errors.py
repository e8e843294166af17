"""Errors of the NKI interpreter, located at the kernel's own source line.

A rule violation is only useful if it points at the kernel line that broke the rule, not at the interpreter's
internals: `kernel_site()` walks the Python stack to the innermost frame outside this package (the kernel, or a
helper function it called) and `NkiValidationError` puts that file and line first in its message.
"""

from __future__ import annotations

import os
import sys

from neuron_dynamo.errors import NeuronDynamoError

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_LOCATE = object()  # default `site`: find the kernel line on the stack


class NkiError(NeuronDynamoError):
    """Base class of the interpreter's deliberate errors."""


class NkiValidationError(NkiError):
    """A kernel broke a rule that real Trainium hardware or the NKI compiler enforces.

    `rule` is a short stable identifier (tests and callers match on it); `site` is `(file, line)` of the kernel
    source that broke it (found on the stack unless given), or None when the error is not tied to a kernel line.
    """

    def __init__(self, rule: str, message: str, site: tuple[str, int] | None | object = _LOCATE) -> None:
        self.rule = rule
        self.site = kernel_site() if site is _LOCATE else site
        where = f"{self.site[0]}:{self.site[1]}: " if self.site else ""
        super().__init__(f"{where}[{rule}] {message}")


class NkiTargetError(NkiError):
    """NEURON_PLATFORM_TARGET_OVERRIDE names no known Trainium generation."""


def kernel_site(skip: int = 1) -> tuple[str, int] | None:
    """(file, line) of the innermost frame that is not interpreter code, i.e. the kernel line being executed."""
    frame = sys._getframe(skip)
    while frame is not None:
        filename = frame.f_code.co_filename
        if not filename.startswith(_PACKAGE_DIR):
            return filename, frame.f_lineno
        frame = frame.f_back
    return None
