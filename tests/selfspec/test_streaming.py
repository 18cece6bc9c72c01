"""Streaming: `stream` yields exactly the tokens `generate` returns, text pieces only once stable (partial UTF-8
pieces held back), and `generate(streamer=...)` drives `transformers`' streamers as their own `generate` does."""
from __future__ import annotations

import inspect
import threading

import pytest
import torch
from transformers import TextIteratorStreamer, TextStreamer

from selfspec import SelfSpecModel
from selfspec.streaming import TextDecoder
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exercised import assert_exercised, greedy_sequences, scrambled_model, sharpened, trained_heads
from tests.selfspec.scripted_time import scripted_engine_clock
from tests.selfspec.test_dtypes import successor_model
from tests.selfspec.tiny_text import tiny_text_model, tiny_tokenizer


def collect(stream):
    pieces = list(stream)
    return [t for p in pieces for t in p.token_ids], pieces


def test_stream_has_generates_arguments():
    generate = inspect.signature(SelfSpecModel.generate).parameters
    stream = inspect.signature(SelfSpecModel.stream).parameters
    assert [p for p in generate if p != "streamer"] == list(stream)
    assert all(generate[name].default == stream[name].default for name in stream)


@pytest.mark.parametrize("drafter", ["ngram", "none", "medusa"])
@pytest.mark.parametrize("do_sample", [False, True])
def test_streamed_tokens_are_generates_tokens(drafter, do_sample):
    # Models on which each drafter is right sometimes and wrong sometimes: heads on a scrambled model (trained on its
    # first 12 tokens only); n-gram drafts copy a tiny random model's cycles when greedy, and when sampling the
    # cycles of a successor model, which has sharp but not certain distributions.
    if drafter == "medusa":
        model = sharpened(scrambled_model("llama", seed=4), 6.0)
    elif do_sample:
        model = sharpened(successor_model(torch.float64), 0.2)
    else:
        model = tiny_model()
    prompt = repetitive_prompt(30)
    if drafter == "medusa":  # heads that agree with the model sometimes, consulted whatever their confidence
        heads = trained_heads(model, greedy_sequences(model, [prompt], 12), num_heads=3)
        engine = SelfSpecModel(model, heads=heads, min_draft_confidence=0.0)
    else:
        engine = SelfSpecModel(model, drafter=drafter)
    kwargs = dict(max_new_tokens=25, do_sample=do_sample, top_k=20, seed=2, eos_token_id=[], num_draft_tokens=3)
    out = engine.generate(prompt, **kwargs)
    if drafter == "none":
        assert out.stats.drafted == 0
    else:
        assert_exercised(out.stats)  # steps of several tokens, some cut short by a rejection
    stream = engine.stream(prompt, **kwargs)
    tokens, pieces = collect(stream)
    assert tokens == out.sequences[0, prompt.shape[1] :].tolist() == stream.token_ids
    assert all(p.text is None for p in pieces) and stream.text is None  # no tokenizer, no text
    assert stream.stats.new_tokens == out.stats.new_tokens == 25
    assert stream.stats.target_forwards == out.stats.target_forwards


def test_stream_pieces_arrive_while_decoding():
    engine = SelfSpecModel(tiny_model(), drafter="ngram")
    stream = iter(engine.stream(random_prompt(), max_new_tokens=50))
    first = next(stream)
    assert len(first.token_ids) == 1  # the prefill's token comes before any further forward
    assert engine.stream(random_prompt(), max_new_tokens=50).stats.target_forwards == 0  # lazy until iterated


def test_stream_text_is_stable_and_joins_to_generates_text():
    tokenizer = tiny_tokenizer()
    for seed in range(3):  # random byte-level models emit partial and invalid UTF-8 byte pieces
        engine = SelfSpecModel(tiny_text_model(seed=seed), drafter="ngram", tokenizer=tokenizer)
        prompt = tokenizer("Prices: 5€, 3£, 10¥ — naïve façade. Prices: 5€", return_tensors="pt").input_ids
        out = engine.generate(prompt, max_new_tokens=40)
        stream = engine.stream(prompt, max_new_tokens=40)
        tokens, pieces = collect(stream)
        assert tokens == out.sequences[0, prompt.shape[1] :].tolist()
        assert "".join(p.text for p in pieces) == stream.text == out.text
        so_far = ""
        for piece in pieces:  # each piece extends the text; the text so far is a prefix of the final text
            so_far += piece.text
            assert out.text.startswith(so_far)


def test_text_decoder_holds_back_partial_characters():
    tokenizer = tiny_tokenizer()
    text = "Café 日本語 naïve 5€ end"
    ids = tokenizer(text).input_ids
    assert any("\ufffd" in tokenizer.decode([t]) for t in ids)  # some tokens are partial UTF-8 pieces
    decoder = TextDecoder(tokenizer)
    pieces = [decoder.push([t]) for t in ids] + [decoder.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    assert "".join(pieces[:-1]) == text  # nothing was left for the flush but held-back spaces


def test_text_decoder_holds_back_a_trailing_space_until_the_next_token():
    tokenizer = tiny_tokenizer()
    ids = tokenizer("the end").input_ids
    decoder = TextDecoder(tokenizer)
    assert decoder.push(tokenizer("the ").input_ids) == "the"
    assert decoder.push(tokenizer("end").input_ids) == " end"
    assert decoder.flush() == ""
    assert len(ids) >= 2


# -- transformers' streamers -----------------------------------------------------------------------------

class RecordingStreamer:
    def __init__(self):
        self.puts, self.ended = [], 0

    def put(self, value):
        self.puts.append(value.clone())

    def end(self):
        self.ended += 1


def test_generate_drives_a_streamer_like_transformers():
    model, prompt = tiny_model(), repetitive_prompt(30)
    engine = SelfSpecModel(model, drafter="ngram")
    ours, theirs = RecordingStreamer(), RecordingStreamer()
    # A fixed draft length: under "auto" whether n-gram drafts are asked for at all follows the wall clock.
    out = engine.generate(prompt, max_new_tokens=20, num_draft_tokens=3, streamer=ours)
    model.generate(prompt, max_new_tokens=20, do_sample=False, streamer=theirs)
    # First put: the prompt as [1, T] on the CPU, as `generate` does; then new ids; then one end().
    assert ours.puts[0].shape == theirs.puts[0].shape == prompt.shape and torch.equal(ours.puts[0], prompt)
    assert torch.cat(ours.puts[1:]).tolist() == torch.cat(theirs.puts[1:]).tolist()
    assert torch.cat(ours.puts[1:]).tolist() == out.sequences[0, prompt.shape[1] :].tolist()
    assert all(p.dim() == 1 and p.device.type == "cpu" for p in ours.puts[1:])
    assert ours.ended == theirs.ended == 1
    assert any(p.numel() > 1 for p in ours.puts[1:])  # a step's accepted tokens go in one put


@pytest.fixture
def text_engine():
    tokenizer = tiny_tokenizer()
    model = tiny_text_model(seed=2)
    prompt = tokenizer("Café au lait, crème brûlée. Café au", return_tensors="pt").input_ids
    return model, SelfSpecModel(model, drafter="ngram", tokenizer=tokenizer), tokenizer, prompt


def test_text_streamer_prints_what_it_prints_for_transformers(text_engine, capsys):
    model, engine, tokenizer, prompt = text_engine
    out = engine.generate(prompt, max_new_tokens=30, streamer=TextStreamer(tokenizer, skip_special_tokens=True))
    ours = capsys.readouterr().out
    model.generate(prompt, max_new_tokens=30, do_sample=False, streamer=TextStreamer(tokenizer, skip_special_tokens=True))
    theirs = capsys.readouterr().out
    assert ours == theirs
    assert out.text in ours


def test_text_iterator_streamer_in_a_thread(text_engine):
    _, engine, tokenizer, prompt = text_engine
    streamer = TextIteratorStreamer(tokenizer, skip_prompt=True, timeout=60, skip_special_tokens=True)
    result = {}
    thread = threading.Thread(target=lambda: result.update(out=engine.generate(prompt, max_new_tokens=30, streamer=streamer)))
    thread.start()
    text = "".join(streamer)
    thread.join()
    assert text == result["out"].text


def test_stream_checks_arguments_at_the_call():
    engine = SelfSpecModel(tiny_model(), drafter="ngram")
    with pytest.raises(ValueError, match="tokenizer"):
        engine.stream("a string prompt without a tokenizer")
    with pytest.raises(ValueError, match="max_new_tokens"):
        engine.stream(random_prompt(), max_new_tokens=-1)


def test_time_spent_by_the_consumer_is_not_the_engines():
    """With a scripted clock: each target forward takes 1 s, the consumer pauses 10 s after every piece. The stats
    count exactly the forwards' seconds (prefill + steps), none of the pauses.
    Catches (planted): a step's timer not restarted after the yield (the consumer's pause counted)."""
    engine = SelfSpecModel(tiny_model(), drafter="ngram")
    clock, forwards = scripted_engine_clock(engine, lambda num_tokens: 1.0)
    stream = engine.stream(repetitive_prompt(20), max_new_tokens=12, num_draft_tokens=3, eos_token_id=[])
    pieces = 0
    for _ in stream:
        clock.advance(10.0)  # a slow terminal or UI
        pieces += 1
    stats = stream.stats
    assert stats.new_tokens == 12 and pieces > 1 and stats.drafted > 0
    assert len(forwards) == stats.target_forwards
    assert stats.prefill_seconds == 1.0
    assert stats.seconds == stats.target_forwards * 1.0  # not a second of the 10 s pauses
    assert clock() == stats.seconds + 10.0 * pieces


def test_a_stream_abandoned_part_way_leaves_the_engine_as_it_was():
    """Stop iterating a stream after two pieces (closing it, as `break` in a for loop does), and interleave another
    stream: every generation on the same engine still equals plain greedy decoding, and the abandoned stream's
    stats count exactly what it produced.
    Catches (planted): one KV cache kept by the target and reset at the start of each generation (an abandoned
    or interleaved generation then decodes on another's cache)."""
    model = tiny_model(seed=5)
    engine = SelfSpecModel(model, drafter="ngram")
    prompt = repetitive_prompt(20, seed=6)
    expected = model.generate(
        prompt, max_new_tokens=30, do_sample=False, eos_token_id=None, pad_token_id=2, attention_mask=torch.ones_like(prompt)
    )[0, prompt.shape[1]:].tolist()
    kwargs = dict(max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])

    abandoned = engine.stream(prompt, **kwargs)
    pieces = iter(abandoned)
    taken = [next(pieces).token_ids, next(pieces).token_ids]
    pieces.close()  # what `break` does to a for loop's iterator
    assert abandoned.token_ids == taken[0] + taken[1] == expected[: len(abandoned.token_ids)]
    assert abandoned.stats.new_tokens == len(abandoned.token_ids) and abandoned.stats.target_forwards == 2

    first, second = engine.stream(prompt, **kwargs), engine.stream(random_prompt(7, seed=8), **kwargs)
    first_pieces = iter(first)
    next(first_pieces)
    second_tokens = [t for piece in second for t in piece.token_ids]  # a whole generation in between
    rest = [t for piece in first_pieces for t in piece.token_ids]
    assert first.token_ids == expected and len(rest) < len(expected)
    assert engine.generate(prompt, **kwargs).sequences[0, prompt.shape[1]:].tolist() == expected
    other = engine.generate(random_prompt(7, seed=8), **kwargs).sequences[0, 7:].tolist()
    assert second_tokens == other
    assert first.stats.drafted > 0 and first.stats.accepted > 0  # steps of several tokens were interrupted
