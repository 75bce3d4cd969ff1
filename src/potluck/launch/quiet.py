"""What of a worker's output the terminal is spared (pure): c10d's C++ stack traces.

When the job's store or a peer goes away, c10d logs a warning per broken connection
(``[W... TCPStore.cpp:106] [c10d] sendBytes failed ...``), each with a C++ stack trace
of 20-odd ``frame #N:`` lines. potluck says in one line what happened and what the
cohort does, so on the terminal these are left out; a worker's log file
(``--log-dir``) keeps every line.
"""

from __future__ import annotations

import re

_TRACE = re.compile(rb"^Exception raised from \S+ at \S+ \(most recent call first\):")
_FRAME = re.compile(rb"^(frame #\d+: |<omitting python frames>)")
_STORE_WARNING = re.compile(rb"^\[W\d{4} [\d:.]+ (TCPStore|socket|Utils)\.[ch]pp:\d+\] \[c10d\]")


class Quieter:
    """Told a worker's lines in order, says which the terminal shows."""

    def __init__(self) -> None:
        self._trace = False  # inside a C++ stack trace
        self.left_out = 0  # lines not shown

    def shown(self, line: bytes) -> bool:
        text = line.rstrip(b"\r\n")
        if self._trace:
            if _FRAME.match(text) or not text:
                self._trace = bool(text)  # (a blank line ends the trace)
                self.left_out += 1
                return False
            self._trace = False
        if _TRACE.match(text) or _STORE_WARNING.match(text):
            self._trace = True
            self.left_out += 1
            return False
        return True
