"""Several prompts decoded together, each row exactly as if it were decoded alone.

One target forward per step serves every unfinished row. Each row keeps its own committed length (ragged rows in
one `RaggedCache`), pending token, draft length, drafter state, random generator and stop conditions; per row the
step is the single-sequence step of `engine.py` (propose, verify, accept, keep pending + accepted, feed back), with
the same verifier's rule, `draw`, stop conditions, draft-length policies and stats recorder. Greedy and seeded rows
are verified all at once on the device (`verdicts.py`, tested equal to the eager verifier) and read back once per
step; unseeded sampling verifies row by row with the eager verifier. A row that finishes leaves
the batch (its cache rows are dropped), so it costs no more compute. EAGLE drafts every row at once
(`drafters/eagle_batch.py`: one head forward per draft position, the head's own ragged cache following the batch's
rows); so does early exit (`drafters/early_exit_batch.py`: one pass of the first layers per draft position through
the batch's cache, whose work the verify forward then resumes after, as alone); Medusa runs its heads once for all
rows (`propose_rows`); n-gram and a user's drafter propose row by row.

How many tokens each row drafts: with num_draft_tokens="auto", one width for the whole batch (`BatchDraftLength`:
each row's acceptance, the padded forward's cost learned from the batch's timings), which changes how fast, never
what: greedy rows have no draws, seeded rows' draws are keyed by position (`seeded.py`), and unseeded sampling's
law does not depend on k. An int is every row's fixed k.

Why a row's output equals its output alone: its queries see exactly its own committed entries and block (the cache's
mask), at its own positions; seeded, its draws are keyed by (its seed, position) alone. Greedy rows are therefore
token-identical to decoding alone, sampled rows with a seed too (seed s: row i samples as seed s + i alone).

A list of one prompt decodes as one sequence (the engine's own loop: no ragged cache, nothing refused).

Not supported for two prompts or more: a user's drafter whose drafts share work (`Draft.prefilled_layers`), tree
drafts, cache layers other than full attention (sliding windows), `transformers` streamers (use `stream`), and a
draft-length policy object (it cannot serve several rows; pass an int or "auto").
"""
from __future__ import annotations

import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch.nn.utils.rnn import pad_sequence

from selfspec.attention_backends import ordered_now, prompt_attention
from selfspec.batch.cache import RaggedCache
from selfspec.cache import KVCache
from selfspec.draft_length.batch import BatchDraftLength
from selfspec.batch.output import BatchGenerateOutput, BatchTokenStream, total_stats
from selfspec.draft_length.policy import capped_choice, probe_asked, probe_in_shadow
from selfspec.drafters.base import Draft, DraftContext, check_drafts
from selfspec.drafters.eagle_batch import BatchEagleDrafter
from selfspec.drafters.early_exit_batch import BatchEarlyExitDrafter
from selfspec.inputs import check_lengths, is_chat
from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig, greedy_tokens
from selfspec.seeded import PositionNoise
from selfspec.stats import GenerationStats, StatsRecorder
from selfspec.stopping import StopCondition, StopStrings
from selfspec.verdicts import PAD, chain_verdicts, keyed_draws
from selfspec.verifier import Verdict
from selfspec.verify_step import score_probe, verify


BatchDrafter = BatchEagleDrafter | BatchEarlyExitDrafter  # proposes for every row at once


def is_prompt_batch(input_ids) -> bool:
    """A list (or tuple) of prompts: strings, id lists, chat conversations or [T] / [1, T] tensors. A single id list
    (of ints) and a single conversation (of dicts) stay one prompt, as they always were."""
    if not isinstance(input_ids, (list, tuple)) or not input_ids or is_chat(input_ids):
        return False
    first = input_ids[0]
    return isinstance(first, (str, list, tuple)) or (isinstance(first, torch.Tensor) and first.dim() >= 1)


@dataclass
class _Row:
    """One prompt's decoding state; `index` is its place in the input list (its place in the cache changes as
    finished rows leave)."""

    index: int
    prompt: torch.Tensor  # [T]
    buffer: torch.Tensor  # [T + max_new_tokens] committed ids, then the pending one
    stop: StopCondition
    policy: object  # draft length: choose() / observe(num_drafted, num_accepted, seconds=None)
    drafter: object
    sampler: Sampler  # greedy, keyed by the row's own seed, or rejection sampling on torch's global generator
    recorder: StatsRecorder
    num_tokens: int = 0  # committed ids in buffer (all in the cache)
    next_token: int = 0  # pending: chosen, not yet in the buffer or the cache
    asked: int = 0  # the drafts this step asks of the row's drafter
    unseen: list = field(default_factory=list)  # [num_new_i, hidden] states the drafter has not seen, oldest first
    probe_rng: random.Random = field(default_factory=lambda: random.Random(0))  # scores sampled probes, as alone


class _StepClock:
    """The batch reads the real clock when a piece of work starts, when it ends (and around a step's verify forward,
    for the planner); every row's recorder reads the latest instant, the same for all rows, so each row is charged
    the whole step it took part in (its latency)."""

    def __init__(self, clock):
        self.clock, self.now = clock, 0.0

    def tick(self) -> float:
        self.now = self.clock()
        return self.now

    def __call__(self) -> float:
        return self.now


def start_batch(spec, prompts_in, options) -> tuple[list[torch.Tensor], Iterator, list, GenerationStats]:
    """Check and encode everything before the first step (so `stream` fails at the call). Returns the [T_r] prompts
    in input order, the loop's pieces (not started), each row's stats and the batch's total (final at the end)."""
    if len(prompts_in) == 1:
        return _start_alone(spec, prompts_in[0], options)
    target = spec.target
    _check_batch_support(spec, options)
    prompts = [_row_prompt(spec, prompt, index, len(prompts_in)) for index, prompt in enumerate(prompts_in)]
    for prompt in prompts:
        check_lengths(prompt.shape[0], options.max_new_tokens, target.max_positions)
    drafters, batch_drafter = _row_drafters(spec.drafter, target, len(prompts))
    noises = _row_noises(options, len(prompts), target.device, target.vocab_size)
    clock = _StepClock(spec.clock)
    rows = [_new_row(spec, index, prompt, options, drafter, noise, clock)
            for index, (prompt, drafter, noise) in enumerate(zip(prompts, drafters, noises))]
    total = GenerationStats(drafter_parameter_bytes=spec.drafter_bytes())
    pieces = _decode_batch(target, rows, clock, total, _batch_planner(spec, options), batch_drafter)
    return prompts, spec.engine_steps(pieces), [row.recorder.stats for row in rows], total


def _row_prompt(spec, prompt_in, index: int, count: int) -> torch.Tensor:
    """One prompt of the list as the engine encodes it alone (`SelfSpecModel._prompt_ids`); its error names it."""
    try:
        return spec._prompt_ids(prompt_in)
    except (TypeError, ValueError) as err:
        if type(err) not in (TypeError, ValueError):
            raise
        raise type(err)(f"prompt {index} (of {count}): {err}") from None


def _start_alone(spec, prompt_in, options):
    """A list of one prompt decodes as one sequence (the engine's own loop), its pieces tagged as row 0: the same
    tokens (row 0 gets the generator a batch would give it), without the ragged cache's work (measured on the
    reference model: a batch of one ran at 0.80x of decoding its prompt alone)."""
    if isinstance(options.generator, (list, tuple)):  # one generator per prompt: this prompt's
        _row_noises(options, 1, spec.target.device)  # (checks the list)
        options = replace(options, generator=options.generator[0])
    prompt, pieces, stats = spec._start(prompt_in, options)
    return [prompt], ([(0, tokens)] if tokens else [] for tokens in pieces), [stats], stats


def generate_batch(spec, prompts_in, options, streamer=None) -> BatchGenerateOutput:
    if streamer is not None:
        raise ValueError("a transformers streamer follows one sequence; for several prompts iterate stream(...)")
    prompts, pieces, row_stats, total = start_batch(spec, prompts_in, options)
    new_tokens = [[] for _ in prompts]
    for step in pieces:
        for index, tokens in step:
            new_tokens[index] += tokens
    sequences = [torch.cat([p, p.new_tensor(t)]) for p, t in zip(prompts, new_tokens)]
    text = None
    if spec.tokenizer is not None:
        text = [spec.tokenizer.decode(t, skip_special_tokens=True) for t in new_tokens]
    return BatchGenerateOutput(sequences, total, row_stats, text)


def stream_batch(spec, prompts_in, options) -> BatchTokenStream:
    prompts, pieces, row_stats, total = start_batch(spec, prompts_in, options)
    return BatchTokenStream(prompts, pieces, total, row_stats, spec.tokenizer)


@torch.inference_mode()
def _decode_batch(target, rows: list[_Row], clock: _StepClock, total: GenerationStats, planner: BatchDraftLength | None,
                  batch_drafter: BatchDrafter | None, admit=None):
    """Prefill every row, then steps of propose -> one verify forward -> every row's verdict -> commit -> feed back,
    until every row stopped. Yields once per target forward [(row index, tokens it committed), ...]; a row that
    committed nothing emittable is left out. Fills `total` once, at the end. planner: the batch's draft width (None:
    each row's policy). batch_drafter: proposes for all rows at once (None: each row's drafter proposes).
    admit: None, or called before every step for rows that join (new `_Row`s; `joining.py`): their prompts are
    prefilled in a forward of their own (yielded as one), then they step with the others. A row whose stop condition
    is done when a step starts (someone ended it between steps) leaves without stepping."""
    all_rows = rows
    started = clock.tick()
    for row in rows:
        row.recorder.start()
    cache, emitted = _prefill(target, rows)
    rows = _drop_finished(rows, cache, batch_drafter)
    prefill_seconds, decode_seconds, forwards, peak = clock.tick() - started, 0.0, 1, cache.nbytes()
    for row in all_rows:
        row.recorder.prefilled(row.stop.num_emitted, peak // len(all_rows))
    yield emitted
    while rows:
        joining = admit() if admit is not None else []
        if joining:
            emitted = _join(target, cache, joining, clock, batch_drafter)
            rows, all_rows = rows + joining, all_rows + joining
            rows = _drop_finished(rows, cache, batch_drafter)  # (before the peak: rows done at their prefill leave)
            forwards, peak = forwards + 1, max(peak, cache.nbytes())
            yield emitted
        rows = _drop_finished(rows, cache, batch_drafter)  # (rows ended between steps)
        if not rows:
            break
        started = clock.tick()
        for row in rows:
            row.recorder.start()
        stepped = rows
        drafts, verdicts, probes, emitted, verify_seconds, full_forward = _step(target, cache, rows, clock,
                                                                                planner, batch_drafter)
        rows = _drop_finished(rows, cache, batch_drafter)
        step_seconds = clock.tick() - started
        decode_seconds += step_seconds
        if planner is not None:
            drafted, accepted = [d.num_draft_tokens for d in drafts], sum(v.num_accepted for v in verdicts)
            planner.observe(drafted, accepted, verify_seconds, step_seconds, full_forward)
        forwards, peak = forwards + 1, max(peak, cache.nbytes())
        share = cache.nbytes() // max(len(rows), 1)  # each row's part of the one cache
        for row, draft, verdict, probe in zip(stepped, drafts, verdicts, probes):
            # A probe scored in shadow: the row verified nothing; its drafter and policy learn the probe's outcome.
            drafted, accepted = (draft.num_draft_tokens, verdict.num_accepted) if probe is None else (1, int(probe))
            if probe is not None:
                row.recorder.probed(probe)
            row.recorder.stepped(draft.num_draft_tokens, verdict.num_accepted, row.stop.num_emitted, share)
            row.drafter.observe(drafted, accepted)
            # Under the batch's width the row's policy did not choose: it is told what its drafter was asked for,
            # so a drafter that declines (Medusa below its confidence floor) is priced as declining.
            asked = {} if planner is None else {"asked": row.asked}
            row.policy.observe(drafted, accepted, seconds=None, **asked)
        yield emitted
    total_stats(total, [row.recorder.stats for row in all_rows], forwards, prefill_seconds, decode_seconds, peak)
    if planner is not None:
        planner.cost_curve.save()  # for the next batch's planner, in this process and in later ones


def _new_row(spec, index: int, prompt: torch.Tensor, options, drafter, noise, clock) -> _Row:
    """Row `index`'s decoding state: its prompt [T], its stop conditions and budget from `options`, its drafter (the
    batch's), its keyed noise (None: unseeded or greedy)."""
    strings = None
    if options.stop_strings is not None:
        strings = StopStrings(options.stop_strings, spec.tokenizer, prompt.tolist())
    buffer = prompt.new_empty(prompt.shape[0] + options.max_new_tokens)
    buffer[: prompt.shape[0]] = prompt
    stop = StopCondition(options.max_new_tokens, spec._eos_ids(options.eos_token_id), strings)
    return _Row(index, prompt, buffer, stop, _row_policy(spec, options), drafter, Sampler(options.sampling, noise=noise),
                StatsRecorder(spec.drafter_bytes(drafter), clock))


def _prefill(target, rows: list[_Row]) -> tuple[RaggedCache, list[tuple[int, list[int]]]]:
    """The rows' prompts into a new cache, then each row's first token, drawn as plain decoding draws it -> (the
    cache, what the rows emitted). All prompts in one forward (right-padded; the cache's mask keeps each row to its
    own prompt); where the engine's attention is ordered (int8 products, `attention_backends.py`), each prompt alone,
    by the very call that prefills it when decoded alone, so that its entries are the same bits."""
    lengths = [row.prompt.shape[0] for row in rows]
    if ordered_now():
        cache, hidden_rows = RaggedCache(target.model, 0, target.device), []
        for row in rows:
            alone = KVCache(target.model)
            with prompt_attention():
                hidden_rows.append(target.forward(row.prompt, alone))  # [T_r, hidden]
            cache.join(RaggedCache.holding(target.model, alone.hf_cache, row.prompt.shape[0]))
        last_hidden = torch.stack([hidden[-1] for hidden in hidden_rows])  # [B, hidden]
    else:
        cache = RaggedCache(target.model, len(rows), target.device)
        hidden = _forward_block(target, cache, _pad([row.prompt for row in rows]))  # [B, T_max, hidden]
        cache.commit(torch.tensor(lengths))
        last = torch.tensor(lengths, device=hidden.device) - 1
        last_hidden = hidden[torch.arange(len(rows), device=hidden.device), last]
        hidden_rows = [hidden[r, :length] for r, length in enumerate(lengths)]
    # Every row's last position through the LM head at once (one read of its weights, not one per row).
    first_logits = target.logits(last_hidden)  # [B, vocab]
    emitted = []
    for r, (row, length) in enumerate(zip(rows, lengths)):
        row.unseen = [hidden_rows[r]]  # the drafter sees every prompt position
        first, _ = row.sampler.draw(first_logits[r : r + 1], length)  # [1]
        row.next_token, row.num_tokens = int(first[0]), length
        tokens = row.stop.admit([row.next_token])
        if tokens:
            emitted.append((row.index, tokens))
    return cache, emitted


def _join(target, cache: RaggedCache, joining: list[_Row], clock: _StepClock,
          batch_drafter: BatchDrafter | None) -> list[tuple[int, list[int]]]:
    """Rows joining a running batch: their prompts in one forward of their own cache, then their rows appended to
    the batch's cache (and the batched drafter's). Returns what they emitted (each row's first token)."""
    clock.tick()
    for row in joining:
        row.recorder.start()
    new_cache, emitted = _prefill(target, joining)
    clock.tick()
    for row in joining:
        row.recorder.prefilled(row.stop.num_emitted, new_cache.nbytes() // len(joining))
    cache.join(new_cache)
    if batch_drafter is not None:
        batch_drafter.join(len(joining))
    return emitted


def _step(target, cache: RaggedCache, rows: list[_Row], clock: _StepClock,
          planner: BatchDraftLength | None, batch_drafter: BatchDrafter | None):
    """One decode step for every row: each row's draft, one forward over the padded blocks [pending, *drafts], each
    row's verdict, its kept entries committed. Returns (drafts verified, verdicts, probes (per row: None, or whether
    its probe scored in shadow would have been accepted), emitted, the verify forward's seconds, whether it ran every
    layer (not after early exit's drafted layers))."""
    for row in rows:
        row.buffer[row.num_tokens], row.num_tokens = row.next_token, row.num_tokens + 1  # pending: not in the cache
    drafts = _propose(rows, _draft_lengths(rows, planner), target, cache, planner, batch_drafter)
    prefilled = _prefilled(drafts)  # early exit: (its layers, [B, passes, hidden] exit states), before probes empty
    # A probe (the planner's, or seeded, a row policy's) is scored in shadow, as decoding alone scores it: that row's
    # block is its pending token only; `drafts` then holds what each row verifies.
    probe_drafts = [d if probe_in_shadow(planner if planner is not None else row.policy, d) else None
                    for row, d in zip(rows, drafts)]
    drafts = [d if p is None else Draft.empty(d.tokens.device) for d, p in zip(drafts, probe_drafts)]
    blocks = [torch.cat([row.buffer[row.num_tokens - 1 : row.num_tokens], d.tokens]) for row, d in zip(rows, drafts)]
    verify_started = clock.tick()
    hidden_all = _forward_block(target, cache, _pad(blocks), prefilled)  # [B, 1 + max k_r, hidden]
    sizes = [block.shape[0] for block in blocks]  # k_r + 1
    verified = torch.cat([hidden_all[r, :n] for r, n in enumerate(sizes)])  # [sum(k_r + 1), hidden], no padding
    logits = target.logits(verified)  # [sum(k_r + 1), vocab]
    verify_seconds = clock.tick() - verify_started
    verdicts, probes, new_tokens = _verdicts(rows, drafts, probe_drafts, logits, sizes)
    cache.commit(torch.tensor([v.num_accepted + 1 for v in verdicts]))  # keep pending + accepted; drop the rest
    emitted = []
    for r, (row, draft, verdict, tokens) in enumerate(zip(rows, drafts, verdicts, new_tokens)):
        row.buffer[row.num_tokens : row.num_tokens + verdict.num_accepted] = draft.tokens[: verdict.num_accepted]
        row.num_tokens += verdict.num_accepted
        row.unseen.append(hidden_all[r, : verdict.num_accepted + 1])  # its last row predicts the next token
        row.next_token = verdict.next_token
        tokens = row.stop.admit(tokens)
        if tokens:
            emitted.append((row.index, tokens))
    return drafts, verdicts, probes, emitted, verify_seconds, prefilled is None


def _verdicts(rows: list[_Row], drafts: list[Draft], probe_drafts: list, logits: torch.Tensor, sizes: list[int]
              ) -> tuple[list[Verdict], list, list[list[int]]]:
    """Every row's verdict by its own sampler: rows verified by equality (greedy, keyed) all at once
    (`_chain_verdicts`), unseeded sampled rows one by one (`_sampled_verdicts`); in row order."""
    equal = [r for r, row in enumerate(rows) if row.sampler.by_equality]
    if len(equal) == len(rows):
        return _chain_verdicts(rows, drafts, probe_drafts, logits, sizes)
    blocks = logits.split(sizes)
    if not equal:
        return _sampled_verdicts(rows, drafts, probe_drafts, blocks)
    others = [r for r in range(len(rows)) if r not in equal]
    pick = lambda items, which: [items[r] for r in which]  # noqa: E731
    merged = [[None] * len(rows) for _ in range(3)]  # verdicts, probes, new tokens; in row order
    for which, results in ((equal, _chain_verdicts(pick(rows, equal), pick(drafts, equal), pick(probe_drafts, equal),
                                                   torch.cat(pick(blocks, equal)), pick(sizes, equal))),
                           (others, _sampled_verdicts(pick(rows, others), pick(drafts, others),
                                                      pick(probe_drafts, others), pick(blocks, others)))):
        for part, values in zip(merged, results):
            for r, value in zip(which, values):
                part[r] = value
    return tuple(merged)


def _chain_verdicts(rows: list[_Row], drafts: list[Draft], probe_drafts: list, logits: torch.Tensor, sizes: list[int]
                    ) -> tuple[list[Verdict], list, list[list[int]]]:
    """Greedy or seeded: every row's verdict from one batched call (`verdicts.chain_verdicts`) and ONE host read.
    logits: [sum(k_r + 1), vocab], row r's k_r + 1 places one after another (unpadded: a padded copy of the logits
    cost more than the verdicts). Returns (verdicts, probes: per row None or whether its probe scored in shadow would
    have been accepted (it equals the next token, as `verify_step.score_probe` scores it), each row's new tokens:
    accepted drafts, then the next token)."""
    device = logits.device
    configs = {row.sampler.config for row in rows}
    if all(row.sampler.mode == "greedy" for row in rows):
        target_tokens = greedy_tokens(logits)  # [sum(k_r + 1)] every place's argmax
    elif len(configs) == 1 and all(row.sampler.mode == "keyed" for row in rows):
        target_tokens = _keyed_places(rows, sizes, logits, configs.pop())
    else:  # rows of several settings: each row's places by its own
        target_tokens = torch.cat([greedy_tokens(block) if row.sampler.mode == "greedy"
                                   else _keyed_places([row], [size], block, row.sampler.config)
                                   for row, size, block in zip(rows, sizes, logits.split(sizes))])
    starts = [sum(sizes[:r]) for r in range(len(sizes))]
    places = torch.tensor([[start + min(i, size - 1) for i in range(max(sizes))] for start, size in zip(starts, sizes)],
                          device=device)  # [B, k + 1] each place's row of logits (a padded place repeats the last)
    draft_tokens = torch.full((len(rows), max(sizes) - 1), PAD, dtype=torch.long, device=device)  # [B, k]
    probe_tokens = torch.full((len(rows),), PAD, dtype=torch.long, device=device)  # [B]
    for r, (draft, probe) in enumerate(zip(drafts, probe_drafts)):  # device-side copies, no reads
        draft_tokens[r, : draft.num_draft_tokens] = draft.tokens
        if probe is not None:
            probe_tokens[r] = probe.tokens[0]
    num_drafts = torch.tensor([size - 1 for size in sizes], device=device)
    verdicts = chain_verdicts(draft_tokens, target_tokens[places], num_drafts)  # [B, k + 2]
    probe_hits = (probe_tokens == verdicts[:, 1]).long()  # a probe row drafted none: place 1 is its next token
    read = torch.cat([verdicts, probe_hits[:, None]], dim=1).tolist()  # the step's one host read
    return ([Verdict(v[0], v[v[0] + 1]) for v in read],
            [None if probe is None else bool(v[-1]) for v, probe in zip(read, probe_drafts)],
            [v[1 : v[0] + 2] for v in read])


def _keyed_places(rows: list[_Row], sizes: list[int], logits: torch.Tensor, config: SamplingConfig) -> torch.Tensor:
    """Every place's keyed draw at its row's sequence position (row r's first place decides num_tokens_r)."""
    gumbel = torch.stack([row.sampler.noise.gumbel(position) for row, size in zip(rows, sizes)
                          for position in range(row.num_tokens, row.num_tokens + size)])  # [sum(k_r + 1), vocab]
    return keyed_draws(logits, config, gumbel)


def _sampled_verdicts(rows: list[_Row], drafts: list[Draft], probe_drafts: list, target_logits: tuple
                      ) -> tuple[list[Verdict], list, list[list[int]]]:
    """Sampling without a seed: row by row with the eager verifier (`verify_step.verify`, `score_probe`), each row's
    generator (or torch's) drawn in row order. target_logits: per row [k_r + 1, vocab]. Returns as `_chain_verdicts`."""
    verdicts, probes, new_tokens = [], [], []
    for row, draft, probe, row_logits in zip(rows, drafts, probe_drafts, target_logits):
        if probe is None:
            verdict, accepted = verify(draft, row_logits, row.sampler, row.num_tokens), None
        else:
            verdict, accepted = score_probe(probe, row_logits, row.sampler, row.probe_rng.random(),
                                           row.num_tokens)
        verdicts.append(verdict)
        probes.append(accepted)
        new_tokens.append(draft.tokens[: verdict.num_accepted].tolist() + [verdict.next_token])
    return verdicts, probes, new_tokens


def _draft_lengths(rows: list[_Row], planner: BatchDraftLength | None) -> list[int]:
    """Each row's k this step: the batch's width, else its own policy's; never past its budget (a step emits at most
    k + 1), nor, under the batch's width, past what its drafter can propose (`max_draft_tokens`: Medusa's heads; the
    planner would otherwise price a width of 5 for 4 heads). The padded forward costs the same whatever a row shorter
    than the widest drafts, so every row drafts."""
    if planner is None:
        return [capped_choice(row.policy, row.stop.remaining - 1) for row in rows]
    caps = [min(row.stop.remaining - 1, getattr(row.drafter, "max_draft_tokens", row.stop.remaining)) for row in rows]
    width = planner.choose([(row.policy, cap) for row, cap in zip(rows, caps)])
    for row, cap in zip(rows, caps):
        row.asked = min(width, cap)
    return [row.asked for row in rows]


def _propose(rows: list[_Row], ks: list[int], target, cache: RaggedCache,
             planner: BatchDraftLength | None, batch_drafter: BatchDrafter | None) -> list[Draft]:
    """Each row's draft of up to k_r tokens: all rows in one batched proposal (a row asked for none catches up on its
    states all the same), else from the one drafter every row shares, for the rows asked (a row asked for none is not
    asked: its states wait), in one `propose_rows` call when the drafter has one (Medusa: one heads forward for all
    rows). A step where no row drafts asks no drafter (their states wait for the next proposal)."""
    asked = [r for r, k in enumerate(ks) if k > 0]
    if batch_drafter is not None and asked:
        # (a probe that prefilling drafts answer in shadow, as alone: early exit skips the probe token's pass)
        probe_asks = [probe_asked(planner if planner is not None else row.policy, k) for row, k in zip(rows, ks)]
        contexts = [_context(row, k, target, cache, probe) for row, k, probe in zip(rows, ks, probe_asks)]
        drafts = batch_drafter.propose(contexts)
        check_drafts(drafts, contexts, batch_drafter)
        return drafts
    drafts = [Draft.empty(row.buffer.device) for row in rows]
    if not asked:
        return drafts
    contexts = [_context(rows[r], ks[r], target) for r in asked]  # (no cache: they propose row by row)
    drafter = rows[0].drafter  # one drafter serves every row (`_row_drafters`)
    propose_rows = getattr(drafter, "propose_rows", None)
    proposed = propose_rows(contexts) if propose_rows is not None else [drafter.propose(c) for c in contexts]
    if len(proposed) != len(contexts):
        raise ValueError(f"{type(drafter).__name__}.propose_rows returned {len(proposed)} drafts for {len(contexts)} "
                         "contexts: return one Draft per context, in order")
    check_drafts(proposed, contexts, drafter)
    for r, draft in zip(asked, proposed):
        drafts[r] = _checked(draft)
    return drafts


def _context(row: _Row, k: int, target, cache: RaggedCache | None = None,
             probe: bool = False) -> DraftContext:
    """The row's draft context; it hands over every state the row's drafter has not seen. cache: the batch's (every
    row's), for a drafter proposing for all rows at once (early exit runs its first layers through it); None for one
    proposing row by row (a drafter of one sequence cannot read a ragged cache). probe: `DraftContext.probe`."""
    hidden_states = torch.cat(row.unseen) if len(row.unseen) > 1 else row.unseen[0]  # [num_new, hidden]
    row.unseen = []
    return DraftContext(row.buffer[: row.num_tokens], hidden_states[-1], hidden_states, k, row.sampler, target, cache,
                        probe=probe)


def _checked(draft: Draft) -> Draft:
    """The draft, if a batch can verify it (a chain that ran no part of the model)."""
    if draft.prefilled_layers or getattr(draft, "parents", None) is not None:  # (parents: tree drafts, if known)
        raise NotImplementedError(
            "a batch verifies chains of draft tokens only: drafts that ran part of the model (prefilled_layers) or "
            "trees of drafts (parents) cannot be verified for ragged rows; decode these prompts one by one"
        )
    return draft


def _forward_block(target, cache: RaggedCache, block_ids: torch.Tensor,
                   prefilled: tuple[int, torch.Tensor] | None = None) -> torch.Tensor:
    """[B, n] ids appended after every row's committed entries -> [B, n] final hidden states; row r's entry i sees
    only row r's committed prefix and its own entries 0..i, at position lengths[r] + i. prefilled: (L, [B, n,
    hidden]) when early exit's drafting already ran the first L layers over this very block (their output): only the
    rest run."""
    n = block_ids.shape[1]
    mask, positions = cache.block_mask(n, target.dtype), cache.block_positions(n)
    if prefilled is not None:
        exit_layer, exit_states = prefilled
        drafted = cache.hf_cache.layers[0].get_seq_length() - cache.width
        if exit_states.shape[1] != n or drafted != n:
            raise RuntimeError(f"early exit drafted blocks of {drafted} entries ({exit_states.shape[1]} exit states) "
                               f"in its layers, but the batch verifies {n}")
        return target.forward_block_from(exit_states, cache.hf_cache, exit_layer, mask, positions)
    return target.decode(block_ids, cache.hf_cache, mask, positions)


def _prefilled(drafts: list[Draft]) -> tuple[int, torch.Tensor] | None:
    """(L, [B, passes, hidden] every row's exit states, zero-padded) when the drafts ran the first L layers over
    every row's block (a batched early-exit proposal prefills every row or none), else None."""
    if not drafts[0].prefilled_layers:
        return None
    return drafts[0].prefilled_layers, pad_sequence([d.prefilled_hidden for d in drafts], batch_first=True)


def _pad(sequences: list[torch.Tensor]) -> torch.Tensor:
    """[n_r] id sequences -> [B, max n_r], right-padded with each row's first id (a valid id; the mask hides it)."""
    width = max(s.shape[0] for s in sequences)
    return torch.stack([torch.cat([s, s[:1].expand(width - s.shape[0])]) for s in sequences])


def _drop_finished(rows: list[_Row], cache: RaggedCache, batch_drafter: BatchDrafter | None) -> list[_Row]:
    """The rows still decoding; finished ones leave the cache (and the batched drafter's) so they cost no more
    compute."""
    alive = [r for r, row in enumerate(rows) if not row.stop.done]
    if len(alive) < len(rows):
        kept = torch.tensor(alive, dtype=torch.long)
        cache.select(kept)
        if batch_drafter is not None:
            batch_drafter.select(kept)
    return [rows[r] for r in alive]


def _check_batch_support(spec, options) -> None:
    """Refuse, with what to do instead, what a batch cannot decode exactly; probe the 4D mask once per model."""
    if spec.tree_size and spec.tree_size_requested != "auto":  # "auto" trees: the batch drafts chains
        raise NotImplementedError(
            f"tree drafts are verified one sequence at a time; this SelfSpecModel was wrapped with "
            f"tree_size={spec.tree_size_requested!r}: for several prompts use one with tree_size=\"auto\" (the "
            "default: chains for batches) or None"
        )
    k = options.num_draft_tokens
    if k != "auto" and (isinstance(k, bool) or not isinstance(k, int)):
        raise ValueError(
            f"several prompts need num_draft_tokens as an int or \"auto\" (each row gets its own policy); got {k!r}"
        )
    from selfspec.tree.forward import check_tree_support

    try:
        check_tree_support(spec.target)  # the same mechanism: a 4D mask and explicit position ids (once per model)
    except NotImplementedError as err:
        raise NotImplementedError(f"several prompts at once need it too: {err}") from err


def _row_drafters(drafter, target, num_rows: int) -> tuple[list, BatchDrafter | None]:
    """Each row's drafter, and the one that proposes for all rows at once (None: each row's proposes alone). EAGLE
    keeps per-sequence state (its head's cache), so its rows share one `BatchEagleDrafter` (one ragged head cache, one
    head forward per draft position for all rows; also each row's drafter for observe and the stats); early exit runs
    the model's first layers through the batch's cache, so its rows share one `BatchEarlyExitDrafter` (one pass per
    draft position for all rows); n-gram, Medusa, "none" and a user's drafter object keep nothing between proposals
    and serve every row, one at a time."""
    from selfspec.drafters.eagle import EagleDrafter
    from selfspec.drafters.early_exit import EarlyExitDrafter

    if isinstance(drafter, EagleDrafter):
        batch_drafter = BatchEagleDrafter(target, drafter, num_rows)
        return [batch_drafter] * num_rows, batch_drafter
    if isinstance(drafter, EarlyExitDrafter):  # runs the first layers through the batch's cache, for all rows at once
        batch_drafter = BatchEarlyExitDrafter(target, drafter)
        return [batch_drafter] * num_rows, batch_drafter
    return [drafter] * num_rows, None


def _row_noises(options, num_rows: int, device, vocab_size: int = 0) -> list:
    """Each row's keyed noise (`seeded.py`): seed s gives row i the noise of seed s + i, so row i samples as decoding
    it alone with seed s + i; a list of generators gives each row one seed drawn from its own, one generator gives
    one seed s drawn from it, and row i then gets s + i; without either, None (torch's global generator)."""
    generator, seed = options.generator, options.seed
    if isinstance(generator, (list, tuple)):
        if len(generator) != num_rows or not all(isinstance(g, torch.Generator) for g in generator):
            raise ValueError(f"generator: give one torch.Generator per prompt ({num_rows}), got {len(generator)} items")
        if seed is None:
            return [PositionNoise.from_generator(g, vocab_size, device) for g in generator]
    elif generator is not None and seed is None:
        seed = PositionNoise.from_generator(generator, vocab_size, device).seed
    if seed is None:
        return [None] * num_rows
    return [PositionNoise(seed + i, vocab_size, device) for i in range(num_rows)]


def _row_policy(spec, options):
    """Each row's own draft-length policy, as the single-sequence path builds it (under a batch planner, only its
    acceptance estimates are used). A batch's step time says nothing about one row's cost, so no policy learns from
    timings here (and the single-sequence verify-cost curve is read, never taught)."""
    return spec._draft_length_policy(options, learn_step_cost=False)


BATCH_PROBE_BUDGET = 0.02  # probes spend at most 2% of a batch's plain steps (`BatchDraftLength`'s probe_budget)


def _batch_planner(spec, options) -> BatchDraftLength | None:
    """"auto" without a seed: one width for the batch, priced by this wrapper's batch curve (`batch_verify_cost`:
    what earlier batches timed, else a line through the one-sequence curve), which this batch refines, and overruled
    by the rates its batches measured (`batch_rates`). None (each
    row's policy) for an int k."""
    if options.num_draft_tokens != "auto":
        return None
    return BatchDraftLength(cost_curve=spec.batch_verify_cost(), seen_shapes=spec._batch_shapes,
                            overhead=spec.batch_step_overhead(), rates=spec.batch_rates(), probe_budget=BATCH_PROBE_BUDGET)
