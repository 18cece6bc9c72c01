"""OpenAI's stop strings on streamed text: the answer ends just before the first stop string, which is not returned.

The engine stops at the token that completes a stop string and keeps that token (`transformers`' semantics, which
`SelfSpecModel.generate` follows); OpenAI's answer leaves the stop string and whatever that token held after it out.
While streaming, text that may be the start of a stop string is held back until the next piece shows it is not.
Works on text alone; knows nothing about tokens or the engine.
"""
from __future__ import annotations


class StopText:
    def __init__(self, stop_strings: tuple[str, ...] = ()):
        self.stop_strings = stop_strings
        self.text = ""  # everything pushed so far
        self.sent = 0  # characters of `text` handed out
        self.stopped = False  # a stop string was found: nothing more is handed out

    def push(self, piece: str) -> str:
        """Add a piece of the answer; return the text now safe to hand out (maybe empty)."""
        if self.stopped:
            return ""
        self.text += piece
        start = max(0, self.sent - max((len(s) for s in self.stop_strings), default=0))
        found = [i for i in (self.text.find(s, start) for s in self.stop_strings) if i >= 0]
        if found:
            self.stopped = True
            return self._hand_out(min(found))
        return self._hand_out(len(self.text) - self._held_back())

    def flush(self) -> str:
        """The answer is complete: return whatever was held back."""
        return "" if self.stopped else self._hand_out(len(self.text))

    def _held_back(self) -> int:
        """Length of the longest tail of `text` that is a proper prefix of a stop string (it may still complete one)."""
        longest = 0
        for stop in self.stop_strings:
            for size in range(min(len(stop) - 1, len(self.text)), longest, -1):
                if self.text.endswith(stop[:size]):
                    longest = size
                    break
        return longest

    def _hand_out(self, end: int) -> str:
        end = max(end, self.sent)
        piece, self.sent = self.text[self.sent : end], end
        return piece
