"""vLLM's format strings matched in a log line in time linear in the line's length (no backtracking).

logformats.py's tables hold vLLM's own printf-style format strings. Read as regexes, their `%s` become lazy
`(.*?)` groups, and Python's backtracking engine tries every length of each at every start: seconds to
minutes on one long line (issue 37). FormatMatcher reads them with a literal pre-filter and one forward scan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

# How much of a line the markers read. vLLM's longest lines are its engine config (3-8 KB on a GPU, longer with a
# compilation config); a line past this is still echoed whole, only its head is read. Matching is linear in
# what is read (FormatMatcher), so the cap bounds the cost of one line, never what a person sees.
MATCH_CAP = 1 << 17
# A message whose first words occur many times in one line is looked for at its first occurrences only.
MAX_STARTS = 16

CONVERSION = re.compile(r"%(?:\.\d+)?[sdf%]")
NUMBER = r"(-?[0-9][0-9,]*(?:\.[0-9]+)?)"
_NUMBER_AT = re.compile(NUMBER)


@dataclass(frozen=True)
class FormatMatch:
    """Where a message was found in a line, and its captures (the part of re.Match that callers read)."""

    span: tuple[int, int]
    captured: tuple[str, ...]

    def groups(self) -> tuple[str, ...]:
        return self.captured

    def start(self) -> int:
        return self.span[0]

    def end(self) -> int:
        return self.span[1]


def _pieces(fmt: str) -> tuple[tuple[str, str], ...]:
    """A printf-style format -> ("lit", text) / ("s", "") / ("num", "") pieces; `%%` is a literal `%`."""
    out: list[tuple[str, str]] = []
    pos = 0
    for m in CONVERSION.finditer(fmt):
        text = fmt[pos : m.start()] + ("%" if m.group() == "%%" else "")
        if text:
            if out and out[-1][0] == "lit":
                out[-1] = ("lit", out[-1][1] + text)
            else:
                out.append(("lit", text))
        if m.group() != "%%":
            out.append(("s" if m.group() == "%s" else "num", ""))
        pos = m.end()
    if fmt[pos:]:
        if out and out[-1][0] == "lit":
            out[-1] = ("lit", out[-1][1] + fmt[pos:])
        else:
            out.append(("lit", fmt[pos:]))
    return tuple(out)


class FormatMatcher:
    """A vLLM format string matched in time linear in the line's length.

    The regex a format string reads as (format_to_regex) has lazy `(.*?)` groups; Python's backtracking engine
    tries each of their lengths at each start, which costs seconds to minutes on one long line (issue 37:
    `jit_during_inference` took 61 s on a 6.3 KB config line). This matcher reads the same formats without
    backtracking: a literal pre-filter (the format's longest literal must be in the line), then a forward scan
    from each of the first MAX_STARTS occurrences of its first literal, where a `%s` reaches to the first
    occurrence of what follows it, as a lazy group does; a `%d`/`%f` reads a number. Only the first MATCH_CAP
    characters of a line are read. On every line of the corpus it captures what the regex captures
    (tests/vllm/test_linear_markers.py)."""

    def __init__(self, fmt: str, *, anchored: bool = False) -> None:
        # A leading `%s` is vLLM's optional `[tag] ` prefix: dropped (the message is searched for).
        if fmt.startswith("%s") and not fmt.startswith("%s "):
            fmt = fmt[2:]
        self.fmt = fmt
        self.anchored = anchored
        self.pieces = _pieces(fmt)
        literals = [text for kind, text in self.pieces if kind == "lit"]
        self.longest = max(literals, key=len) if literals else ""
        self.leading = bool(self.pieces) and self.pieces[0][0] != "lit"

    def search(self, line: str) -> FormatMatch | None:
        if len(line) > MATCH_CAP:
            line = line[:MATCH_CAP]
        if self.longest not in line:
            return None
        if self.leading:  # a leading `%s` reaches back to the line's start, as the regex's search does
            return self._match_from(line, 0)
        first = self.pieces[0][1]
        at = line.find(first)
        for _ in range(MAX_STARTS):
            if at < 0:
                return None
            found = self._match_from(line, at)
            if found is not None:
                return found
            at = line.find(first, at + 1)
        return None

    def _match_from(self, line: str, start: int) -> FormatMatch | None:
        pos = start
        groups: list[str] = []
        pending: list[int] = []  # `%s` groups waiting for what follows them: adjacent ones, the last takes the text

        def close(until: int) -> None:
            for i in pending:
                groups[i] = ""
            if pending:
                groups[pending[-1]] = line[pos:until]
            pending.clear()

        for kind, text in self.pieces:
            if kind == "s":
                pending.append(len(groups))
                groups.append("")
            elif kind == "lit":
                if pending:
                    at = line.find(text, pos)
                    if at < 0:
                        return None
                    close(at)
                    pos = at
                elif not line.startswith(text, pos):
                    return None
                pos += len(text)
            else:
                number = _NUMBER_AT.search(line, pos) if pending else _NUMBER_AT.match(line, pos)
                if number is None:
                    return None
                close(number.start())
                groups.append(number.group())
                pos = number.end()
        if pending:  # a `%s` that ends the message takes the rest of the line
            close(len(line))
            pos = len(line)
        elif self.anchored and line[pos:].strip():
            return None
        return FormatMatch((start, pos), tuple(groups))
