"""Several prompts at once: every row's output is exactly that prompt decoded alone (greedy: the same tokens, also as
`model.generate`; sampled with a seed per row: the same tokens as alone with that row's seed, and the model's law),
for n-gram, Medusa, EAGLE and early-exit drafts, rows of different lengths, rows that stop early; clear errors
otherwise (early exit's own batch tests: test_early_exit_batch.py)."""
import pytest
import torch

from heads import MedusaHeads
from selfspec import SelfSpecModel
from selfspec.batch.decode import is_prompt_batch
from selfspec.drafters.base import Draft, DraftContext
from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig
from tests.selfspec.scripted_time import scripted_batch_clock
from tests.conftest import random_prompt, repetitive_prompt, tiny_model
from tests.selfspec.exactness import exact_continuation_law, law_pvalue
from tests.selfspec.exercised import assert_exercised, greedy_sequences, scrambled_model, sharpened, trained_heads
from tests.selfspec.drafters.test_eagle import sharp, trained_head


def prompts_of_different_lengths():
    """[T] prompts of 9, 20, 4 and 13 tokens, two of them repetitive (n-gram drafts find matches there)."""
    return [random_prompt(9, seed=1)[0], repetitive_prompt(20, seed=2)[0], random_prompt(4, seed=3)[0],
            repetitive_prompt(13, period=4, seed=4)[0]]


def engine(family, drafter):
    if drafter == "eagle":
        model = sharp(tiny_model(family))
        return SelfSpecModel(model, heads=trained_head(model, steps=40))
    if drafter == "medusa":  # heads that are right often and wrong often; every head consulted
        model = scrambled_model(family)  # layers that matter: a wrong mask or wrong positions change its tokens
        prompts = [p[None] for p in prompts_of_different_lengths()]
        heads = trained_heads(model, greedy_sequences(model, prompts, 40))
        return SelfSpecModel(model, heads=heads, min_draft_confidence=0.0)
    if drafter == "early_exit":
        return SelfSpecModel(early_exit_model(family), drafter=drafter, exit_layer=2)
    return SelfSpecModel(tiny_model(family), drafter=drafter)  # soon repeats itself: n-gram drafts are accepted


def early_exit_model(family="llama"):
    """Four layers that matter, confident enough that the first two draft right often (and wrong often)."""
    return sharpened(scrambled_model(family, num_layers=4, seed=1), 4.0)


def alone(spec, prompt, **options):
    return spec.generate(prompt, **options).sequences[0]


@pytest.mark.parametrize("family", ["llama", "qwen2"])
@pytest.mark.parametrize("drafter", ["ngram", "medusa", "eagle", "early_exit"])
def test_greedy_rows_equal_each_prompt_alone_and_generate(family, drafter):
    spec = engine(family, drafter)
    prompts = prompts_of_different_lengths()
    options = dict(max_new_tokens=30, num_draft_tokens=3, eos_token_id=[])
    out = spec.generate(prompts, **options)
    assert len(out.sequences) == len(prompts) and len(out.row_stats) == len(prompts)
    expected = greedy_sequences(spec.model, [p[None] for p in prompts], 30)
    for prompt, got, plain in zip(prompts, out.sequences, expected):
        assert torch.equal(got, alone(spec, prompt, **options))
        assert torch.equal(got, plain)
    assert_exercised(out.row_stats, what=f"{drafter} {family} batch")
    assert out.stats.new_tokens == 4 * 30 == sum(s.new_tokens for s in out.row_stats)
    assert (out.stats.drafted, out.stats.accepted) == (sum(s.drafted for s in out.row_stats),
                                                       sum(s.accepted for s in out.row_stats))
    # one forward per step for all rows: fewer than the rows' forwards together
    assert out.stats.target_forwards == max(s.target_forwards for s in out.row_stats)


def test_gpt2_and_auto_draft_length(monkeypatch):
    """num_draft_tokens="auto" (the batch's width) on a scripted device where verifying is nearly free, so how much
    it drafts does not depend on how busy the machine running the test is."""
    spec = engine("gpt2", "ngram")
    scripted_batch_clock(spec, monkeypatch, lambda num_tokens: 0.01 * (1 + 0.001 * num_tokens))
    prompts = prompts_of_different_lengths()
    out = spec.generate(prompts, max_new_tokens=25, eos_token_id=[])  # num_draft_tokens="auto": the batch's width
    for prompt, got in zip(prompts, out.sequences):
        assert torch.equal(got, alone(spec, prompt, max_new_tokens=25, num_draft_tokens=3, eos_token_id=[]))
    assert_exercised(out.row_stats, what="gpt2 auto")


def row_zero_stops_early(spec, prompts, num_draft_tokens: int):
    """Decode `prompts` as a batch with an EOS that row 0 generates early (within its first 12 tokens) and some other
    row never does -> (the options used, the output); checks row 0 stopped there and another row ran to 30."""
    free = spec.generate(prompts, max_new_tokens=30, num_draft_tokens=num_draft_tokens, eos_token_id=[]).sequences
    continuations = [s[p.shape[0]:].tolist() for s, p in zip(free, prompts)]
    eos = next(t for t in continuations[0][2:12] if any(t not in c for c in continuations[1:]))
    options = dict(max_new_tokens=30, num_draft_tokens=num_draft_tokens, eos_token_id=eos)
    out = spec.generate(prompts, **options)
    lengths = [s.shape[0] - p.shape[0] for s, p in zip(out.sequences, prompts)]
    assert lengths[0] < 12 and out.sequences[0][-1] == eos and max(lengths) == 30
    return options, out


def test_a_row_stopping_at_eos_leaves_while_the_others_go_on():
    spec = engine("llama", "ngram")
    prompts = prompts_of_different_lengths()
    options, out = row_zero_stops_early(spec, prompts, num_draft_tokens=4)
    eos = options["eos_token_id"]
    expected = greedy_sequences_with_eos(spec.model, prompts, 30, eos)
    for prompt, got, plain in zip(prompts, out.sequences, expected):
        assert torch.equal(got, alone(spec, prompt, **options))
        assert torch.equal(got, plain)
    forwards = [s.target_forwards for s in out.row_stats]
    assert forwards[0] < max(forwards) == out.stats.target_forwards  # the finished row took no further part
    assert_exercised(out.row_stats)


def greedy_sequences_with_eos(model, prompts, num_new, eos):
    return [model.generate(p[None], max_new_tokens=num_new, do_sample=False, eos_token_id=eos, pad_token_id=2,
                           attention_mask=torch.ones_like(p[None]))[0] for p in prompts]


def test_max_new_tokens_is_exact_for_every_row():
    spec = engine("llama", "ngram")
    prompts = prompts_of_different_lengths()
    stats = []
    for max_new_tokens in (0, 1, 2, 5, 9, 17):
        options = dict(max_new_tokens=max_new_tokens, num_draft_tokens=8, eos_token_id=[])
        out = spec.generate(prompts, **options)
        for prompt, got in zip(prompts, out.sequences):
            assert got.shape[0] == prompt.shape[0] + max_new_tokens
            assert torch.equal(got, alone(spec, prompt, **options))
        stats += out.row_stats
    assert_exercised(stats)


@pytest.mark.parametrize("drafter", ["ngram", "medusa", "eagle", "early_exit"])
def test_sampled_rows_equal_each_prompt_alone_with_its_seed(drafter):
    """seed=s: row i draws from a generator seeded s + i, so its tokens are those of the prompt alone with seed s + i
    (every draw the same: first token, drafts, acceptances, recovered and bonus tokens)."""
    spec = engine("llama", drafter)
    prompts = prompts_of_different_lengths()
    sampling = dict(do_sample=True, temperature=0.8, top_k=20, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[])
    out = spec.generate(prompts, seed=7, **sampling)
    for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
        assert torch.equal(got, alone(spec, prompt, seed=7 + i, **sampling)), i
    assert_exercised(out.row_stats, what=f"sampled {drafter}")
    # the same with a generator per row, and with "auto" (planned from timings: seeded tokens do not depend on k)
    generators = [torch.Generator().manual_seed(100 + i) for i in range(len(prompts))]
    auto = {**sampling, "num_draft_tokens": "auto"}
    out = spec.generate(prompts, generator=generators, **auto)
    for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
        assert torch.equal(got, alone(spec, prompt, generator=torch.Generator().manual_seed(100 + i), **auto)), i


def test_medusa_heads_run_once_per_step_for_all_rows():
    """Medusa drafts every row from one heads forward per step (`propose_rows`), rows still equal alone, greedy and
    sampled with a seed per row. Catches (planted): the batch asking the drafter row by row (4 forwards a step)."""
    spec = engine("llama", "medusa")
    prompts = prompts_of_different_lengths()
    calls = []
    hook = spec.drafter.heads.register_forward_hook(lambda module, args, output: calls.append(output.shape))
    try:
        for options in (dict(), dict(do_sample=True, temperature=0.8, seed=5)):
            options.update(max_new_tokens=20, num_draft_tokens=2, eos_token_id=[])
            calls.clear()
            out = spec.generate(prompts, **options)
            steps = out.stats.target_forwards - 1  # the prefill drafts nothing, nor a step with 1 token left per row
            assert steps - 2 <= len(calls) <= steps and calls[0][0] == len(prompts)
            for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
                seed = {"seed": options["seed"] + i} if "seed" in options else {}
                assert torch.equal(got, alone(spec, prompt, **{**options, **seed})), i
            assert_exercised(out.row_stats, what=f"medusa batch {options}")
    finally:
        hook.remove()


def test_medusa_greedy_rows_at_once_equal_each_rows_own_draft():
    """Greedy rows are drafted from one argmax and one softmax over all rows (`MedusaDrafter._greedy_chains`); each
    row's draft equals what `_draft` draws for it from the same logits, at a confidence floor equal to one head's
    confidence (kept: the floor is "below it, stop") and with rows asked for 0 .. 4 drafts; each row's length is
    also checked against the rule written out here, since both paths share `_sure_heads`. Catches (planted): the floor
    compared with <= in `_sure_heads`, sure heads counted past the first unsure one, a row's own k ignored, the rows'
    counts taken in another order."""
    spec = engine("llama", "medusa")
    drafter, target = spec.drafter, spec.target
    generator = torch.Generator().manual_seed(3)
    hidden = torch.randn(6, spec.model.config.hidden_size, dtype=spec.model.dtype, generator=generator)
    ks = [4, 3, 0, 4, 2, 1]
    contexts = [DraftContext(torch.tensor([1, 2]), h, h[None], k, Sampler(SamplingConfig()), target, None)
                for h, k in zip(hidden, ks)]
    with torch.no_grad():
        logits = drafter.heads(hidden, target.logits, max(ks))  # [rows, heads, vocab], as propose_rows runs them
    confidence = logits.float().softmax(dim=-1).amax(dim=-1)  # [rows, heads]
    cuts = set()
    try:
        for floor in (0.0, float(confidence.flatten().sort().values[11]), 1.0):
            drafter.min_draft_confidence = floor
            got = drafter.propose_rows(contexts)
            alone = [drafter._draft(row[:k], c) if k else Draft.empty("cpu") for row, k, c in zip(logits, ks, contexts)]
            assert [d.tokens.tolist() for d in got] == [d.tokens.tolist() for d in alone], floor
            sure = [int((row >= floor).long().cumprod(0).sum()) for row in confidence]  # heads before the first unsure
            assert [d.num_draft_tokens for d in got] == [min(k, n) for k, n in zip(ks, sure)], floor
            assert all(d.probs is None for d in got)
            cuts |= {(k, d.num_draft_tokens) for k, d in zip(ks, got)}
    finally:
        drafter.min_draft_confidence = 0.0
    assert any(0 < n < k for k, n in cuts) and any(n == k > 0 for k, n in cuts)  # chains cut mid-way, and kept whole


def test_sampled_rows_follow_the_model_law():
    """On a 4-token vocabulary: 1,200 rows of one prompt (batches of 40, a seed per row), compared with the exact law
    of a 3-token continuation."""
    model = tiny_model("llama", seed=0, vocab_size=4, hidden=16, num_layers=1)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    spec = SelfSpecModel(model, drafter="ngram")
    prompt = torch.tensor([3, 1, 2, 3, 1, 2])
    sampling = SamplingConfig(True, 0.9)
    samples, stats = [], []
    for batch in range(30):
        out = spec.generate([prompt] * 40, max_new_tokens=3, do_sample=True, temperature=0.9, num_draft_tokens=2,
                            seed=batch * 40, eos_token_id=[])
        samples += [tuple(s[prompt.shape[0]:].tolist()) for s in out.sequences]
        stats += out.row_stats
    assert_exercised(stats, what="batched law")
    law = exact_continuation_law(model, prompt[None], 3, sampling)
    assert law_pvalue(samples, law) > 1e-3


def test_stream_gives_each_rows_tokens_and_text():
    spec = engine("llama", "ngram")
    prompts = prompts_of_different_lengths()
    options = dict(max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
    stream = spec.stream(prompts, **options)
    tokens = [[] for _ in prompts]
    for piece in stream:
        assert piece.text is None  # no tokenizer
        tokens[piece.row] += piece.token_ids
    out = spec.generate(prompts, **options)
    for prompt, got, streamed, kept in zip(prompts, out.sequences, tokens, stream.token_ids):
        assert got[prompt.shape[0]:].tolist() == streamed == kept
    assert stream.stats.new_tokens == 80 and len(stream.row_stats) == 4


def test_a_list_of_one_prompt_decodes_as_one_sequence(monkeypatch):
    """No ragged cache for a batch of one: the single-sequence loop, the same tokens (greedy, and sampled with the
    seed row 0 would get), its stats as the row's and the total. Catches (planted): the shortcut removed (the spy
    sees a RaggedCache); row 0 given seed + 1."""
    import selfspec.batch.decode

    made = []
    real = selfspec.batch.decode.RaggedCache
    monkeypatch.setattr(selfspec.batch.decode, "RaggedCache", lambda *a, **kw: made.append(1) or real(*a, **kw))
    spec = engine("llama", "ngram")
    greedy = dict(max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
    stats = []
    for prompt in prompts_of_different_lengths():
        out = spec.generate([prompt], **greedy)
        assert torch.equal(out.sequences[0], alone(spec, prompt, **greedy))
        assert out.row_stats[0] is out.stats and out.stats.new_tokens == 20
        stats += out.row_stats
    assert_exercised(stats, what="batches of one")
    sampled = dict(do_sample=True, temperature=0.8, max_new_tokens=20, num_draft_tokens=3, eos_token_id=[])
    out = spec.generate([prompt], seed=5, **sampled)
    assert torch.equal(out.sequences[0], alone(spec, prompt, seed=5, **sampled))
    pieces = list(spec.stream([prompt], **greedy))
    assert {piece.row for piece in pieces} == {0} and sum(len(piece.token_ids) for piece in pieces) == 20
    assert not made
    assert len(spec.generate([prompt, prompt], **greedy).sequences) == 2 and made  # two prompts: the batched loop


def test_what_counts_as_several_prompts():
    assert is_prompt_batch(["a", "b"]) and is_prompt_batch([[3, 4], [5]]) and is_prompt_batch((torch.tensor([3]),))
    assert is_prompt_batch([[{"role": "user", "content": "hi"}], [{"role": "user", "content": "yo"}]])
    assert not is_prompt_batch([3, 4, 5])  # one id list
    assert not is_prompt_batch([{"role": "user", "content": "hi"}])  # one conversation
    assert not is_prompt_batch(torch.tensor([[3, 4]])) and not is_prompt_batch("a") and not is_prompt_batch([])


def test_unsupported_cases_fail_clearly():
    model = tiny_model("llama")
    prompts = [random_prompt(5)[0], random_prompt(7)[0]]
    with pytest.raises(NotImplementedError, match="prefilled_layers"):  # a drafter of one sequence's cache
        SelfSpecModel(model, drafter=_PrefillingDrafter()).generate(prompts, max_new_tokens=4, num_draft_tokens=1)
    spec = SelfSpecModel(model, drafter="ngram")
    with pytest.raises(ValueError, match="num_draft_tokens"):
        spec.generate(prompts, num_draft_tokens=_FixedPolicy())
    with pytest.raises(ValueError, match="streamer"):
        spec.generate(prompts, streamer=object())
    with pytest.raises(ValueError, match="one torch.Generator per prompt"):
        spec.generate(prompts, do_sample=True, generator=[torch.Generator()])
    with pytest.raises(ValueError, match="non-empty"):
        spec.generate([prompts[0], torch.tensor([], dtype=torch.long)])
    with pytest.raises(ValueError, match="context window"):
        spec.generate(prompts, max_new_tokens=600)
    sliding = tiny_model("mistral")
    sliding.config.sliding_window = 4
    sliding.config.layer_types = ["sliding_attention"] * sliding.config.num_hidden_layers
    with pytest.raises(NotImplementedError, match="several prompts"):
        SelfSpecModel(sliding, drafter="ngram").generate(prompts, max_new_tokens=4)


class _PrefillingDrafter:
    """Claims its drafts ran the model's first layer (as early exit's do alone): a batch cannot resume after them."""

    def propose(self, context):
        hidden = context.hidden_states[-1:].repeat(2, 1)
        return Draft(context.token_ids[-1:], prefilled_layers=1, prefilled_hidden=hidden)

    def observe(self, num_drafted, num_accepted):
        pass


class _FixedPolicy:
    def choose(self):
        return 2

    def observe(self, num_drafted, num_accepted, seconds=None):
        pass


def test_one_prompt_still_takes_the_single_sequence_path():
    spec = SelfSpecModel(tiny_model("llama"), drafter="ngram")
    out = spec.generate([5, 6, 7, 5, 6], max_new_tokens=6, eos_token_id=[])
    assert out.sequences.shape == (1, 11)  # a [1, T] tensor, as before


def test_text_prompts_conversations_stop_strings_and_streamed_text():
    """Strings and chat conversations as rows; each row's text, stop string and streamed text equal it alone."""
    from tests.selfspec.tiny_text import tiny_text_model, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    spec = SelfSpecModel(tiny_text_model(), drafter="ngram", tokenizer=tokenizer)
    prompts = ["Café au lait, crème", "def main():\n", [{"role": "user", "content": "The quick brown fox"}]]
    free = spec.generate(prompts, max_new_tokens=24, num_draft_tokens=3, eos_token_id=[])
    stop = next(c for c in free.text[1][3:] if c.isascii() and c.isalnum())  # row 1 reaches it early (others may)
    options = dict(max_new_tokens=24, num_draft_tokens=3, eos_token_id=[], stop_strings=[stop])
    out = spec.generate(prompts, **options)
    stream = spec.stream(prompts, **options)
    texts = ["", "", ""]
    for piece in stream:
        texts[piece.row] += piece.text
    for i, prompt in enumerate(prompts):
        single = spec.generate(prompt, **options)
        assert torch.equal(out.sequences[i], single.sequences[0]) and out.text[i] == single.text == texts[i]
    assert len(out.text[1]) < len(free.text[1])
    assert_exercised(free.row_stats, rejected=False)


def test_tree_drafts_are_refused_for_batches():
    model = tiny_model("llama")
    prompts = [random_prompt(5)[0], random_prompt(7)[0]]
    heads = MedusaHeads.for_model(model, num_heads=2)
    with pytest.raises(NotImplementedError, match="tree_size=4.*\"auto\""):
        SelfSpecModel(model, heads=heads, tree_size=4).generate(prompts, max_new_tokens=4)


def test_a_wrapper_drafting_auto_trees_decodes_batches_as_chains(monkeypatch):
    """The default, tree_size="auto", drafts trees for one prompt where they pay; a batch from the same wrapper
    drafts chains (not refused), each row generate's tokens. Catches (planted): the refusal kept for "auto"."""
    from tests.selfspec.tree.test_tree_engine import kernel_cpu

    kernel_cpu(monkeypatch)  # "auto" as on a CPU with the few-row kernel, on a float64 model
    model = sharp(tiny_model("llama"))
    prompts = [random_prompt(5, seed=1)[0], random_prompt(7, seed=2)[0]]
    spec = SelfSpecModel(model, heads=trained_head(model))
    assert spec.tree_size == 10
    out = spec.generate(prompts, max_new_tokens=16, num_draft_tokens=2, eos_token_id=[])
    for prompt, sequence in zip(prompts, out.sequences):
        plain = model.generate(prompt[None], max_new_tokens=16, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert torch.equal(sequence, plain[0])
    assert_exercised(out.row_stats, rejected=False)


def test_a_batch_width_is_capped_by_what_the_drafter_can_propose():
    """Under the batch's width each row is asked at most its drafter's `max_draft_tokens` (Medusa: one per head) and
    its budget, and the planner prices those caps (not a width of 5 for 4 heads).
    Catches (planted): caps from the budget only."""
    from types import SimpleNamespace

    from selfspec.batch.decode import _draft_lengths

    class Planner:
        def choose(self, rows):
            self.caps = [cap for _, cap in rows]
            return 8

    medusa = SimpleNamespace(max_draft_tokens=4)
    rows = [SimpleNamespace(policy=None, stop=SimpleNamespace(remaining=r), drafter=d, asked=0)
            for r, d in [(100, medusa), (3, medusa), (100, object())]]
    planner = Planner()
    assert _draft_lengths(rows, planner) == [4, 2, 8]
    assert planner.caps == [4, 2, 99]


HOST_READS = ("tolist", "item", "numpy", "__bool__", "__int__", "__float__", "__index__")


@pytest.mark.parametrize("mode", ["greedy", "seeded", "unseeded"])
def test_greedy_and_seeded_steps_verify_every_row_at_once_with_one_host_read(mode, monkeypatch):
    """The path the exactness tests above rely on: greedy and seeded steps take every row's verdict from one batched
    call (`_chain_verdicts`) that reads tensors on the host once (each of HOST_READS on a tensor counted while it
    runs), and never the eager verifier; unseeded sampling verifies row by row (`_sampled_verdicts`). Rows still
    equal alone. Catches (planted): a batched verdict that accepts every real draft (rows differ from alone)."""
    import selfspec.batch.decode as decode

    counting, reads, calls = [False], [], {"batched": 0, "eager": 0}
    for name in HOST_READS:
        original = getattr(torch.Tensor, name)

        def counted(self, *args, _original=original, _name=name, **kwargs):
            if counting[0]:
                reads.append(_name)
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)

    def batched(*args):
        calls["batched"] += 1
        counting[0], before = True, len(reads)
        try:
            return real_batched(*args)
        finally:
            counting[0] = False
            assert len(reads) - before == 1, reads[before:]

    def eager(*args):
        calls["eager"] += 1
        return real_eager(*args)

    real_batched, real_eager = decode._chain_verdicts, decode._sampled_verdicts
    monkeypatch.setattr(decode, "_chain_verdicts", batched)
    monkeypatch.setattr(decode, "_sampled_verdicts", eager)
    spec = engine("llama", "medusa")
    prompts = prompts_of_different_lengths()
    options = dict(max_new_tokens=16, num_draft_tokens=3, eos_token_id=[])
    if mode != "greedy":
        options.update(do_sample=True, temperature=0.8, top_k=20)
    if mode == "seeded":
        options.update(seed=3)
    out = spec.generate(prompts, **options)
    steps = out.stats.target_forwards - 1  # (the prefill verifies nothing)
    assert calls == ({"batched": 0, "eager": steps} if mode == "unseeded" else {"batched": steps, "eager": 0})
    if mode == "unseeded":
        return
    assert_exercised(out.row_stats, what=f"{mode} batch")
    for i, (prompt, got) in enumerate(zip(prompts, out.sequences)):
        assert torch.equal(got, alone(spec, prompt, **{**options, **({"seed": 3 + i} if mode == "seeded" else {})}))

    def accept_every_draft(draft_tokens, target_tokens, num_drafts):
        real = torch.arange(draft_tokens.shape[1]) < num_drafts[:, None]
        target_tokens = target_tokens.clone()
        target_tokens[:, :-1] = torch.where(real, draft_tokens, target_tokens[:, :-1])
        return chain_verdicts(draft_tokens, target_tokens, num_drafts)

    from selfspec.verdicts import chain_verdicts

    monkeypatch.setattr(decode, "chain_verdicts", accept_every_draft)
    planted = spec.generate(prompts, **options)
    assert any(not torch.equal(a, b) for a, b in zip(planted.sequences, out.sequences))
