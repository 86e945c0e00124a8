"""The loop detector: fed an answer's streamed pieces one at a time, says when it has become a loop.

The seed line's rules (its profile's DSV41_LOOP_*): four back-to-back copies of a stretch of at
least 32 tokens, 64 identical tokens in a row, eight identical decoded lines in a row. A live
token stream that repeats itself is healthy as far as the engine's watchdog is concerned (the
seed's VIS-04 ran to 714k tokens), so the only place to stop it is where the text is read.
"""

from __future__ import annotations

from sparkfleet.gateway.config import LoopAbort

_MAX_LINE = 16384  # a "line" longer than this is not compared whole (bounded memory on one-line answers)


class LoopDetector:
    """One answer's state. ``feed(piece)`` costs a tuple hash and a few dict lookups per piece."""

    __slots__ = (
        "_line",
        "_line_len",
        "_line_same",
        "_prev_line",
        "_prev_piece",
        "_same",
        "_seen",
        "_tail",
        "_windows",
        "rules",
    )

    def __init__(self, rules: LoopAbort) -> None:
        self.rules = rules
        self._tail: list[str] = []  # the last `ngram` pieces
        self._windows: list[int] = []  # per piece: the hash of the window ending there (0: none yet)
        self._seen: dict[int, int] = {}  # window hash -> where it last ended
        self._prev_piece: str | None = None
        self._same = 0
        self._line: list[str] = []  # the current line's pieces (joined only at its end)
        self._line_len = 0
        self._prev_line: str | None = None
        self._line_same = 0

    def feed(self, piece: str) -> str | None:
        """Take the next piece; a short reason once the answer is a loop, else None."""
        if not piece:
            return None
        rules = self.rules
        if rules.token_repeats:
            if piece == self._prev_piece:
                self._same += 1
                if self._same >= rules.token_repeats:
                    return f"{self._same} identical tokens in a row"
            else:
                self._prev_piece = piece
                self._same = 1
        if rules.ngram and rules.repeats:
            reason = self._ngram(piece)
            if reason:
                return reason
        if rules.line_repeats:
            return self._lines(piece)
        return None

    def _ngram(self, piece: str) -> str | None:
        """Whether the answer now ends with `repeats` copies of one stretch of >= `ngram` pieces.

        Each window of `ngram` pieces is hashed and remembered by where it ended. When the last
        window was seen before, P pieces ago, the candidate stretch is the smallest multiple L of
        P with L >= ngram; the answer is a loop when the same window also ended 2L, … (R-1)·L
        pieces ago (windows compared by hash)."""
        ngram, repeats = self.rules.ngram, self.rules.repeats
        tail = self._tail
        tail.append(piece)
        if len(tail) > ngram:
            del tail[0]
        elif len(tail) < ngram:
            self._windows.append(0)
            return None
        key = hash(tuple(tail))
        windows = self._windows
        n = len(windows)  # this window's position
        windows.append(key)
        last = self._seen.get(key)
        self._seen[key] = n
        if last is None:
            return None
        period = n - last
        stretch = period * -(-ngram // period)
        if n - (repeats - 1) * stretch < ngram - 1:
            return None
        if all(windows[n - k * stretch] == key for k in range(1, repeats)):
            return f"{repeats} copies of a {stretch}-token stretch"
        return None

    def _lines(self, piece: str) -> str | None:
        if "\n" not in piece:
            if self._line_len < _MAX_LINE:
                self._line.append(piece)
                self._line_len += len(piece)
            return None
        *done, rest = ("".join(self._line) + piece).split("\n")
        rest = rest[:_MAX_LINE]
        self._line, self._line_len = [rest], len(rest)
        for line in done:
            if not line.strip():
                continue  # blank lines neither count nor break a run
            if line == self._prev_line:
                self._line_same += 1
                if self._line_same >= self.rules.line_repeats:
                    return f"{self._line_same} identical lines in a row"
            else:
                self._prev_line = line
                self._line_same = 1
        return None
