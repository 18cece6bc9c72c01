"""OpenAI's stop strings on streamed text: the answer ends before the first stop string, however the pieces split it,
and text that may begin one is held back only until the next piece shows it does not."""
from __future__ import annotations

import pytest

from selfspec.serve.stop_text import StopText

CASES = [
    # (stop strings, pieces, text handed out, whether a stop string was found)
    ((), ["ab", "cd"], "abcd", False),
    (("END",), ["hello ", "E", "N", "D tail"], "hello ", True),
    (("END",), ["hello EN", "d"], "hello ENd", False),  # held back "EN", then released
    (("END",), ["xEND"], "x", True),
    (("END",), ["END"], "", True),
    (("a\n", "bb"), ["xb", "b a\n"], "x", True),  # the earliest of several wins
    (("bb", "a\n"), ["xa", "\nbb"], "x", True),
    (("ab",), ["a", "a", "b"], "a", True),  # a held-back "a" that turns out not to start the match
    (("ab",), ["xa"], "xa", False),  # the end flushes what was held back
    (("日本",), ["テ日", "本語"], "テ", True),
]


@pytest.mark.parametrize("stops, pieces, expected, stopped", CASES)
def test_the_text_ends_before_the_first_stop_string(stops, pieces, expected, stopped):
    stop = StopText(stops)
    handed = "".join(stop.push(piece) for piece in pieces) + stop.flush()
    assert handed == expected
    assert stop.stopped == stopped


@pytest.mark.parametrize("stops, pieces, expected, stopped", CASES)
def test_nothing_is_handed_out_that_a_stop_string_could_still_claim(stops, pieces, expected, stopped):
    stop = StopText(stops)
    handed = ""
    for piece in pieces:
        handed += stop.push(piece)
        assert expected.startswith(handed)  # never text that a later piece reveals as part of a stop string


def test_after_a_stop_nothing_more_comes_out():
    stop = StopText(("x",))
    assert stop.push("abxcd") == "ab"
    assert stop.push("more") == "" and stop.flush() == ""
