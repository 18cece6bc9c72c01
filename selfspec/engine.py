"""SelfSpecModel: one causal LM drafting for itself, and the decode loop (propose, verify, accept, roll back, feed back).

The loop is the only place that knows the order of things; the verifier, the cache, the sampling transforms, the
draft-length policy, the verify-cost curve, the stats recorder and each drafter live in their own modules.
"""
from __future__ import annotations

import contextlib
import numbers
import random
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import torch

from selfspec.attention_backends import engine_attention, prompt_attention
from selfspec.draft_length.batch import MeasuredRates
from selfspec.draft_length.policy import (
    MAX_DRAFT_TOKENS, AdaptiveDraftLength, StepOverhead, capped_choice, draft_length_policy, probe_asked,
    probe_in_shadow,
)
from selfspec.drafters import CALL_ARGUMENTS, drafter_modules, drafter_parameter_bytes, drafters_taking, make_drafter
from selfspec.drafters.base import Draft, DraftContext, Drafter, check_drafts
from selfspec.kernel.backends import rounds_activations
from selfspec.kernel.few_row_linear import FewRowLinears, resolve_draft_dtype, resolve_few_row_kernel
from selfspec.inputs import (
    apply_chat_template, check_id_dtype, check_lengths, check_prompt_form, check_tokenizer, is_chat, unpadded_prompts,
)
from selfspec.sampler import Sampler
from selfspec.sampling import SamplingConfig
from selfspec.stats import GenerationStats, StatsRecorder
from selfspec.stopping import StopCondition, StopStrings, eos_ids
from selfspec.streaming import TokenStream, feed_streamer
from selfspec.target import TargetModel
from selfspec.tree.forward import choose_tree_size, resolve_min_node_probability
from selfspec.verifier import Verdict
from selfspec.draft_length.verify_cost import (
    LearnedVerifyCost, kept_one_row, learned_batch_verify_cost, learned_verify_cost,
)
from selfspec.verify_step import verify_chain, verify_in_shadow, verify_tree

# "auto": the number of draft tokens is chosen each step from the drafts' recent acceptance and this device's cost of
# verifying them, so it falls to 0 (plain decoding through the engine) when drafts do not pay and comes back when they
# do. A fixed k pays the full verify cost even for useless drafts (0.63-0.69x of speculation off on this project's
# CPU with random drafts), which no default may do.
DEFAULT_NUM_DRAFT_TOKENS = "auto"
# new tokens a generation's cache is allocated for at its start (a choice: past it, the buffers grow 64 tokens at a time
# as before, so a large max_new_tokens that EOS cuts short does not hold memory it never uses)
RESERVED_NEW_TOKENS = 1024
SEED_RANGE = (-2**63, 2**64 - 1)  # what torch's manual_seed takes


@dataclass(frozen=True)
class DecodeOptions:
    """One generation's settings, checked: what `generate`'s keyword arguments become before the first step."""

    max_new_tokens: int = 128
    sampling: SamplingConfig = SamplingConfig()
    num_draft_tokens: int | str | object = DEFAULT_NUM_DRAFT_TOKENS  # an int, "auto", or a policy (choose/observe)
    seed: int | None = None
    generator: torch.Generator | None = None
    eos_token_id: int | list[int] | None = None  # None: the model's generation config
    stop_strings: str | list[str] | None = None

    def __post_init__(self):
        seed = self.seed
        if seed is not None:
            integer = isinstance(seed, numbers.Integral) and not isinstance(seed, bool)
            if not integer or not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
                raise ValueError(f"seed must be an integer in [-2**63, 2**64 - 1] (torch's seeds), got {seed!r}")
            object.__setattr__(self, "seed", int(seed))  # (a numpy integer: torch's manual_seed takes Python ints)
        generator = self.generator
        several = isinstance(generator, (list, tuple)) and all(isinstance(g, torch.Generator) for g in generator)
        if not (generator is None or isinstance(generator, torch.Generator) or several):
            raise ValueError(f"generator must be a torch.Generator (for several prompts, a list of one per prompt), "
                             f"got {generator!r}; for a seed pass seed=... instead")


@dataclass
class GenerateOutput:
    sequences: torch.LongTensor  # [1, prompt + new], like `transformers`' generate
    stats: GenerationStats
    text: str | None = None  # the completion, when a tokenizer is known


class SelfSpecModel:
    """Wrap an already loaded `transformers` causal LM; `generate` returns exactly what the model alone would.

    drafter: "medusa" or "eagle" (need `heads`), "ngram", "early_exit", "none" (speculation off), or an object with
    `propose(context) -> Draft` and `observe(num_drafted, num_accepted)`. Default: the heads' own kind when heads
    are given (MedusaHeads / EagleHead or their directory), else "ngram". heads and drafter_options (e.g.
    max_ngram_size=3, exit_layer=2, adapter=DIR) go to the drafter, which loads and places them.
    tree_size: verify a tree of up to this many draft tokens per step instead of a chain. "auto" (default): a tree
    where trees were measured to pay and can be verified, chains elsewhere (`tree_forward.choose_tree_size`; why is in
    `chain_reason`): on a CPU with the few-row kernel trees of 10 nodes (chains where the weights are kept as quantized
    GGUF blocks: trees measured slower there), each of cumulative draft probability above 0.02
    (`min_node_probability`; each verified node costs ~0.03 decodes there), on an accelerator the node budget of
    its prior verify cost (47 on an H200: the N most probable nodes), for the EAGLE drafter; chains on a CPU without the
    kernel, for drafters whose trees were not measured to pay (Medusa, n-gram, early exit, a user's drafter without
    `auto_trees = True`) and for models whose attention ignores a custom 4D mask or whose tree probe fails. An int N: trees of N nodes for the Medusa and EAGLE drafters (others keep
    proposing chains), refused at wrap time (with what to do) for early exit and models without a custom-mask path;
    None or 0: chains. Batches of prompts decode chains ("auto"; an explicit N is refused there). The
    draft-length policy's k then caps the tree's depth: the stats and the verify-cost curve see a tree step as N
    drafted tokens (the nodes verified), the "auto" policy as a draft as deep as the tree, each with the accepted
    path's length accepted, so "auto" learns per-depth acceptance and the curve the real cost of verifying N; "auto"
    prices a tree k levels deep as the nodes such trees verified (at first the most such a tree holds, the drafter's
    `max_tree_nodes`), so on a CPU a tree must earn its nodes.
    few_row_kernel: "auto" (default), "on" or "off": whether a float32 model on a CPU runs its products over 2-32
    rows (verify forwards, batches) through selfspec's streaming kernel (selfspec/kernel/few_row_linear.py; "auto": where
    it builds, an x86 CPU with AVX2 and a C compiler). One-row products (plain decoding's steps) run through it
    too where it measures clearly faster than F.linear for them (measured once per machine and model, kept in the
    cache directory: `verify_cost.kept_one_row`).
    draft_dtype: "auto" (default), "int8", "bfloat16" or None: the dtype the drafter's own layers (heads, the draft
    vocabulary's LM head rows; never the model's layers) stream their weights in, where the few-row kernel runs
    ("auto": int8, Q8_0 blocks through the int8 kernel, where the model's own products are int8; bfloat16 where the
    kernel runs otherwise; else the model's own; None: the model's own). Drafts need not match the model's
    arithmetic, only be what the verifier is told they are, so this changes no output (`few_row_linear.py`).
    `clock` (seconds; default time.perf_counter) times the engine's work for the stats and the "auto" policy.
    """

    clock: Callable[[], float] = staticmethod(time.perf_counter)

    def __init__(self, model, drafter: str | Drafter | None = None, heads=None, tokenizer=None,
                 tree_size: int | str | None = "auto", few_row_kernel: str | bool = "auto", draft_dtype="auto",
                 **drafter_options):
        self.model = model
        self.target = TargetModel(model)
        check_tokenizer(tokenizer, self.target.vocab_size)
        self.tokenizer = tokenizer
        self.drafter = make_drafter(drafter, self.target, heads, drafter_options)
        self.target.set_feature_layers(getattr(self.drafter, "feature_layers", ()))  # e.g. an EAGLE-3 head's
        dtype = self.target.dtype
        self.few_row_kernel = resolve_few_row_kernel(few_row_kernel, self.target.device, dtype)
        # torch.int8, torch.bfloat16 or None
        self.draft_dtype = resolve_draft_dtype(draft_dtype, self.few_row_kernel, rounds_activations(model))
        self.few_row_linears = (FewRowLinears(model, draft_modules=drafter_modules(self.drafter, self.target),
                                              draft_dtype=self.draft_dtype)
                                if self.few_row_kernel else None)
        if self.few_row_linears is not None:  # plain decoding's one-row products too, where the kernel is faster here
            self.few_row_linears.route_one_row(kept_one_row(self.target, self.few_row_linears.one_row_pays))
        self._verify_cost: LearnedVerifyCost | None = None
        self._batch_verify_cost: LearnedVerifyCost | None = None
        self._batch_shapes: set[tuple[int, int]] = set()  # (rows, 1 + width) blocks a batch's forward already ran
        self._batch_overhead = StepOverhead(decay=0.9)  # a batch step's cost beyond its forward (`batch_step_overhead`)
        self._batch_rates = MeasuredRates()  # what batch steps of each (rows, width) emitted per second
        self._timed_shapes: set[int] = set()  # draft sizes whose verify forward ran once: later ones are measurements
        # nodes per step (0: chains); why "auto" chose chains (None when it did not, or for an explicit size)
        with self.few_row_linears or contextlib.nullcontext():  # (the tree probe's forwards run as verify forwards do)
            self.tree_size, self.chain_reason = choose_tree_size(tree_size, self.drafter, self.target,
                                                                 self.few_row_kernel)
        self.tree_size_requested = tree_size  # batches decode chains; only an explicit size is refused there
        # a node of a tree must be at least this probable under the drafter (`DraftContext.min_node_probability`)
        self.min_node_probability = (resolve_min_node_probability(tree_size, self.target.device, self.few_row_kernel)
                                     if self.tree_size else 0.0)

    @property
    def ordered_attention(self) -> bool:
        """Whether decode and verify forwards take the kernel's attention in one fixed order: where the model's products
        round activations to int8 (`attention_backends.py`), so that drafting stays exact over them."""
        return rounds_activations(self.model)

    @property
    def heads(self):
        """The heads the drafter owns: MedusaHeads or an EagleHead (None for other drafters)."""
        return getattr(self.drafter, "heads", None) or getattr(self.drafter, "head", None)

    def drafter_bytes(self, drafter=None) -> int:
        """Memory the drafter (this wrapper's, or `drafter`, one of a batch's rows) adds to the model: its parameters
        (`drafters.drafter_parameter_bytes`) and the bfloat16 copies of its weights `draft_dtype` streams."""
        copies = self.few_row_linears.draft_copy_bytes if self.few_row_linears is not None else 0
        return drafter_parameter_bytes(drafter or self.drafter, self.target) + copies

    @classmethod
    def from_pretrained(cls, name_or_path, heads=None, drafter=None, device=None, drafter_options=None, dtype=None,
                        tree_size="auto", few_row_kernel="auto", draft_dtype="auto", quantized="auto",
                        quantized_backend=None, **model_kwargs):
        """Load the base (a directory, a hub id, a .gguf file, or "smollm2") and its tokenizer; dtype, device_map, ...
        pass through to AutoModelForCausalLM. Without a dtype, a half-precision checkpoint on a CPU runs in float32
        (selfspec/loading.py); an explicit dtype always wins. quantized (a .gguf file): "auto" (default) keeps its
        Q8_0 / Q4_0 / Q4_1 linears and LM head as the file's blocks where the model is float32 on a CPU and selfspec's
        kernel builds (about the file's size in memory, the same function up to float32 addition order), else
        dequantizes; "keep" the same or an error; "dequantize" transformers' float32 weights. quantized_backend: how
        kept blocks multiply: "auto" (default: int8 products, llama.cpp's method, where they measure faster here),
        "float" (the dequantized model's function) or "int8" (`selfspec/loading.py`)."""
        from selfspec.loading import load_model, load_tokenizer

        _check_from_pretrained_keywords(model_kwargs, drafter_options)  # before loading: transformers would say less
        model = load_model(name_or_path, dtype=dtype, device=device, quantized=quantized,
                           quantized_backend=quantized_backend, **model_kwargs)
        tokenizer = load_tokenizer(name_or_path)
        return cls(model, drafter=drafter, heads=heads, tokenizer=tokenizer, tree_size=tree_size,
                   few_row_kernel=few_row_kernel, draft_dtype=draft_dtype, **(drafter_options or {}))

    def verify_cost(self) -> LearnedVerifyCost:
        """This model's cost curve of verifying k drafts (in one-token decodes) on its device, as "auto" plans with
        it: the curve a previous process kept in the cache directory (verify_cost.cache_dir()), else a cautious
        prior, refined from every timed verify forward and kept again after each generation (a tree wrapper keeps
        its own: a tree's masked forward costs more). Never measured up front, so the first call pays no measuring
        pause."""
        if self._verify_cost is None:
            self._verify_cost = learned_verify_cost(self.target, tree=bool(self.tree_size),
                                                    few_row_kernel=self._kernel_route(),
                                                    max_tokens=self.tree_size or MAX_DRAFT_TOKENS)
        return self._verify_cost

    def batch_verify_cost(self) -> LearnedVerifyCost:
        """The cost curve batches of several prompts plan their draft width with: the padded forward's tokens - 1 ->
        its cost in one-row decodes (`verify_cost.learned_batch_verify_cost`); kept in the cache directory apart
        from `verify_cost()`, started from it when nothing was kept, refined by every batch and kept after each."""
        if self._batch_verify_cost is None:  # batches verify chains: started from the chain curve in a tree wrapper too
            chains = self.verify_cost() if not self.tree_size else learned_verify_cost(
                self.target, few_row_kernel=self._kernel_route())
            self._batch_verify_cost = learned_batch_verify_cost(self.target, chains.snapshot(),
                                                                few_row_kernel=self._kernel_route())
        return self._batch_verify_cost

    def _kernel_route(self) -> bool | str:
        """What the kernel takes of the model's products, as the cost curves' key tells it: False (nothing), True (2-32
        rows) or "one row" (1-32 rows: plain decoding's steps too, so a decode, the curve's unit, is faster)."""
        if self.few_row_linears is not None and self.few_row_linears.one_row:
            return "one row"
        return self.few_row_kernel

    def batch_step_overhead(self) -> StepOverhead:
        """What a batch's step costs beyond its verify forward (per step, and per drafted token: the drafter, each row's
        verification), in one-row decodes: learned from every batch's timed steps and shared by this wrapper's batches,
        as their cost curve is (in memory only: it depends on the prompts' lengths and the process as much as on the
        device)."""
        return self._batch_overhead

    def batch_rates(self) -> MeasuredRates:
        """Tokens per second this wrapper's timed batch steps emitted per (rows, width), which overrule the planner's
        model where they disagree; shared by its batches (in memory only), as the step overhead is."""
        return self._batch_rates

    def generate(
        self,
        input_ids,
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_draft_tokens: int | str = DEFAULT_NUM_DRAFT_TOKENS,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: str | list[str] | None = None,
        streamer=None,
        attention_mask=None,
    ) -> GenerateOutput:
        """Decode one prompt; arguments mean what they mean in `transformers`' `generate`.

        input_ids: a string, a list of ids, a [T] or [1, T] tensor, or chat messages `[{"role": ..., "content": ...}]`
        (formatted with the tokenizer's chat template and its generation prompt).
        num_draft_tokens: "auto" (default: chosen each step, 0 when drafts do not pay), an int (0 = plain
        decoding), or a policy object with choose() and observe(num_drafted, num_accepted, seconds=...).
        seed: sample with every draw keyed by (seed, position): the tokens are those of `drafter="none"` with this
        seed, whatever the drafter, draft length, tree or batch (a batch's row i uses seed + i). generator: a
        torch.Generator that gives one such seed per call. Neither: rejection sampling on torch's global generator.
        eos_token_id: one id or several; default: the model's generation config.
        stop_strings: stop at the token that completes one of these strings, keeping that token (as `generate` does).
        streamer: a `transformers` streamer (`TextStreamer`, `TextIteratorStreamer`): gets the prompt, then each
        piece of accepted tokens, then `end()`.
        attention_mask: with [B, T] or [T] ids, what the tokenizer returned beside them (`generate(**tokenizer(texts,
        padding=True, return_tensors="pt"))`): each row's padding, left or right, is dropped and B > 1 rows are
        decoded as a batch (`sequences` then holds each row's prompt and new tokens, without padding).
        """
        if attention_mask is not None:
            input_ids = unpadded_prompts(input_ids, attention_mask)
        options = DecodeOptions(
            max_new_tokens, SamplingConfig(do_sample, temperature, top_k, top_p), num_draft_tokens, seed, generator,
            eos_token_id, stop_strings,
        )
        from selfspec.batch.decode import generate_batch, is_prompt_batch

        if is_prompt_batch(input_ids):  # several prompts: decoded together, each as if alone (selfspec/batch/decode.py)
            return generate_batch(self, input_ids, options, streamer)
        prompt, pieces, stats = self._start(input_ids, options)
        new_tokens = []
        for tokens in feed_streamer(prompt, pieces, streamer):
            new_tokens += tokens
        sequences = torch.cat([prompt, prompt.new_tensor(new_tokens)])[None]
        text = self.tokenizer.decode(new_tokens, skip_special_tokens=True) if self.tokenizer is not None else None
        return GenerateOutput(sequences, stats, text)

    def stream(
        self,
        input_ids,
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_draft_tokens: int | str = DEFAULT_NUM_DRAFT_TOKENS,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: str | list[str] | None = None,
        attention_mask=None,
    ) -> TokenStream:
        """`generate`'s arguments; returns an iterator of `StreamPiece(token_ids, text)`, one per target forward, as
        soon as the verifier accepts them: the prefill's first token is a piece of its own, then each decode step
        gives one piece (its accepted drafts and its recovered or bonus token). The tokens are exactly those
        `generate` returns; `text` (when a tokenizer is known) is the newly stable text, and all pieces' text joins
        to `generate`'s `text`. The returned stream also carries `stats`, `token_ids` and `text` so far.

            for piece in model.stream("def main():", max_new_tokens=64):
                print(piece.text, end="", flush=True)
        """
        if attention_mask is not None:
            input_ids = unpadded_prompts(input_ids, attention_mask)
        options = DecodeOptions(
            max_new_tokens, SamplingConfig(do_sample, temperature, top_k, top_p), num_draft_tokens, seed, generator,
            eos_token_id, stop_strings,
        )
        from selfspec.batch.decode import is_prompt_batch, stream_batch

        if is_prompt_batch(input_ids):  # several prompts: decoded together, each as if alone (selfspec/batch/decode.py)
            return stream_batch(self, input_ids, options)
        prompt, pieces, stats = self._start(input_ids, options)
        return TokenStream(prompt, pieces, stats, self.tokenizer)

    def _start(self, input_ids, options: DecodeOptions):
        """Check and encode everything before the first step (so `stream` fails at the call, not mid-iteration);
        returns the [T] prompt, the decode loop's pieces (not started) and the stats its recorder will fill."""
        if isinstance(options.generator, (list, tuple)):
            raise ValueError(f"generator: a list ({len(options.generator)} generators) gives one to each of several "
                             "prompts; for one prompt pass one torch.Generator")
        prompt = self._prompt_ids(input_ids)
        check_lengths(prompt.shape[0], options.max_new_tokens, self.target.max_positions)
        policy = self._draft_length_policy(options)
        strings = None
        if options.stop_strings is not None:
            strings = StopStrings(options.stop_strings, self.tokenizer, prompt.tolist())
        stop = StopCondition(options.max_new_tokens, self._eos_ids(options.eos_token_id), strings)
        # With a seed (or a generator, which gives one seed per call) every draw is keyed by position (seeded.py)
        sampler = Sampler.for_request(options.sampling, options.seed, options.generator, self.target.vocab_size,
                                      self.target.device)
        recorder = StatsRecorder(self.drafter_bytes(), self.clock)
        pieces = self._decode(prompt, sampler, policy, stop, recorder)
        return prompt, self.engine_steps(pieces), recorder.stats

    def engine_steps(self, pieces):
        """The decode loop's pieces, each step run with the engine's kernel choices: its attention paths (CUDA without
        cuDNN's kernel; on CPU grouped key/value heads read in place), few-row products through selfspec's kernel where
        enabled (the caller's code between steps sees none of them)."""
        if self.few_row_linears is not None:
            pieces = self.few_row_linears.routing(pieces)
        return engine_attention(pieces, self.target.device, ordered=self.ordered_attention)

    def _draft_length_policy(self, options: DecodeOptions, learn_step_cost: bool = True):
        """One sequence's draft-length policy (batches build one per row here too). It may plan from timings whatever
        the sampling: with a seed the tokens do not depend on how many drafts a step verified (seeded.py)."""
        pricing = {"draft_cost": getattr(self.drafter, "draft_cost", 0.0)}  # a drafter's estimate, decodes per token
        if getattr(self.drafter, "max_draft_tokens", None):  # (Medusa: one token per head; priced past it before)
            pricing["max_draft_tokens"] = min(MAX_DRAFT_TOKENS, self.drafter.max_draft_tokens)
        if self.tree_size and hasattr(self.drafter, "max_tree_nodes"):  # a tree k deep verifies up to its node budget
            pricing["verified_tokens"] = lambda depth: self.drafter.max_tree_nodes(depth, self.tree_size)
        return draft_length_policy(options.num_draft_tokens, self.verify_cost, learn_step_cost=learn_step_cost,
                                   **pricing)

    @torch.inference_mode()
    def _decode(self, prompt, sampler: Sampler, policy, stop: StopCondition, recorder: StatsRecorder):
        """Prefill, then propose -> verify -> accept -> roll back -> feed back; yields once per target forward the
        tokens it commits (the prefill's first token, then each step's accepted drafts + recovered/bonus token)."""
        target, cache, clock = self.target, self.target.new_cache(), recorder.clock
        # the cache's buffers allocated once for the prompt, its new tokens (up to RESERVED_NEW_TOKENS) and the widest
        # verify block: written by position, never copied while decoding
        widest = (self.tree_size or MAX_DRAFT_TOKENS) + 1
        cache.reserve(prompt.shape[0] + min(stop.max_new_tokens, RESERVED_NEW_TOKENS) + widest)
        buffer = prompt.new_empty(prompt.shape[0] + stop.max_new_tokens)  # [tokens]: committed ids, then the pending one
        buffer[: prompt.shape[0]] = prompt
        probe_rng = random.Random(0)  # scores sampled probes in shadow; never the user's generator
        recorder.start()
        with prompt_attention():
            hidden = target.forward(prompt, cache)  # [T, hidden]; the last row predicts the first new token
        unseen = [hidden]  # [num_new_i, hidden] pieces of final states the drafter has not seen yet, oldest first
        first, _ = sampler.draw(target.logits(hidden[-1:]), prompt.shape[0])  # [1], as plain decoding
        next_token, num_tokens = int(first[0]), prompt.shape[0]
        emitted = stop.admit([next_token])
        recorder.prefilled(stop.num_emitted, cache.nbytes())
        if emitted:
            yield emitted
        while not stop.done:
            recorder.start()
            buffer[num_tokens], num_tokens = next_token, num_tokens + 1  # pending: in the sequence, not the cache
            k = capped_choice(policy, stop.remaining - 1)  # a step emits at most k + 1 tokens
            draft, unseen = self._propose(buffer[:num_tokens], unseen, k, sampler, cache,
                                          probe_asked(policy, k))
            verify_started = clock()
            # The cache ends holding pending + accepted; kept_hidden [num_accepted + 1, hidden] are their final states.
            verdict, accepted, kept_hidden, probe = self._verify_step(
                policy, draft, buffer, num_tokens, cache, sampler, probe_rng)
            verify_seconds = clock() - verify_started
            buffer[num_tokens : num_tokens + verdict.num_accepted] = accepted
            num_tokens += verdict.num_accepted
            unseen.append(kept_hidden)  # one state per committed position, in order; the last predicts the next token
            next_token = verdict.next_token
            emitted = stop.admit(accepted.tolist() + [next_token])
            # Rollback slices the cache's tensors (views): right after it they still hold the verify step's storage.
            # A probe scored in shadow: the step verified nothing, and after an early-exit probe's layers it was not a
            # full forward either (prefilled_layers kept, so the cost curve does not learn it as one).
            if probe is not None:
                recorder.probed(probe)
                draft = Draft(draft.tokens[:0], prefilled_layers=draft.prefilled_layers)
            depth = draft.depth  # positions the step could accept: a chain's length, a tree's deepest level
            seconds = recorder.stepped(draft.num_draft_tokens, verdict.num_accepted, stop.num_emitted, cache.nbytes(),
                                       depth)
            self._observe(policy, draft, depth, verdict, seconds, verify_seconds, probe)
            yield emitted
        if self._verify_cost is not None:
            self._verify_cost.save()

    def _propose(self, token_ids, unseen, num_draft_tokens, sampler: Sampler, cache,
                 probe: bool = False) -> tuple[Draft, list]:
        """The drafter's proposal and the states it has still not seen (none once it was asked; at k = 0 it is not
        asked, and they wait for its next proposal: a list, so waiting costs no copying).
        probe: `DraftContext.probe`."""
        if num_draft_tokens <= 0:
            return Draft.empty(token_ids.device), unseen
        hidden_states = torch.cat(unseen) if len(unseen) > 1 else unseen[0]  # [num_new, hidden]
        context = DraftContext(
            token_ids, hidden_states[-1], hidden_states, num_draft_tokens, sampler, self.target, cache,
            self.tree_size, probe, self.min_node_probability,
        )
        draft = self.drafter.propose(context)
        check_drafts([draft], [context], self.drafter)
        return draft, []

    def _verify_step(self, policy, draft: Draft, buffer, num_tokens: int, cache, sampler: Sampler, probe_rng):
        """Verify the draft after the pending token buffer[num_tokens - 1] in one target forward and cut the cache to
        pending + accepted -> (verdict, [num_accepted] accepted tokens, [num_accepted + 1, hidden] their states,
        probe): probe is None, or for a probe scored in shadow (`probe_in_shadow`) whether the verifier would have
        accepted it (the step itself is then plain decoding's)."""
        pending = buffer[num_tokens - 1 : num_tokens]  # [1]
        if probe_in_shadow(policy, draft):  # a probe: plain decoding's step, the probe scored against it
            return verify_in_shadow(self.target, pending, draft, num_tokens, cache, sampler,
                                    probe_rng.random())
        if draft.parents is None:
            return *verify_chain(self.target, pending, draft, num_tokens, cache, sampler), None
        if not self.tree_size:
            raise ValueError(
                "the drafter proposed a tree (Draft.parents) but this SelfSpecModel was wrapped without tree_size, so "
                "the model was not checked for tree drafts: pass tree_size=... to SelfSpecModel"
            )
        return *verify_tree(self.target, pending, draft.tree(), num_tokens, cache, sampler), None

    def _observe(self, policy, draft: Draft, depth: int, verdict: Verdict, seconds: float,
                 verify_seconds: float, probe: bool | None = None) -> None:
        """Feed a step's outcome back to the drafter, the draft-length policy and the verify-cost curve. probe: the
        outcome of a probe scored in shadow (`draft` is then what the step verified: nothing); the drafter and the
        policy learn it as a one-token draft's, and the step's time, a plain decode's, teaches neither."""
        # The first forward of each draft size is a warm-up, not a measurement: on a GPU it loads and selects kernels
        # (reference model on an H200: bfloat16 70-1200 ms, float32 up to 87 ms, against 8 and 5 ms after).
        first_of_shape = draft.num_draft_tokens not in self._timed_shapes
        self._timed_shapes.add(draft.num_draft_tokens)
        if probe is not None:
            self.drafter.observe(1, int(probe))
            policy.observe(1, int(probe), seconds=None)
        else:
            self.drafter.observe(draft.num_draft_tokens, verdict.num_accepted)
            # The policy learns acceptance by draft position (a tree's depth) and a tree's nodes per depth; the cost
            # curve, tokens verified (nodes).
            learns_nodes = draft.parents is not None and isinstance(policy, AdaptiveDraftLength)
            verified = {"verified": draft.num_draft_tokens} if learns_nodes else {}
            policy.observe(depth, verdict.num_accepted, seconds=None if first_of_shape else seconds, **verified)
        if self._verify_cost is not None and draft.prefilled_layers == 0 and not first_of_shape:
            self._verify_cost.observe(draft.num_draft_tokens, verify_seconds)  # a full forward verified these drafts

    def _prompt_ids(self, input_ids) -> torch.Tensor:
        """str | list[int] | [T] | [1, T] | chat messages -> [T] long on the model's device."""
        check_prompt_form(input_ids)
        if is_chat(input_ids):
            input_ids = apply_chat_template(self.tokenizer, input_ids)
        elif isinstance(input_ids, str):
            if self.tokenizer is None:
                raise ValueError("a string prompt needs a tokenizer: pass tokenizer=... or use from_pretrained")
            input_ids = self.tokenizer(input_ids, return_tensors="pt").input_ids
        ids = torch.as_tensor(input_ids)
        check_id_dtype(ids)
        ids = ids.to(torch.long)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(
                    f"got a [{ids.shape[0]}, T] tensor: a padded batch is ambiguous (which ids are padding?). Pass its "
                    "attention_mask too (generate(**tokenizer(texts, padding=True, return_tensors='pt'))), or several "
                    "prompts as a list (of strings, id lists or 1-D tensors): generate([p1, p2, ...])"
                )
            ids = ids[0]
        if ids.dim() != 1 or ids.shape[0] == 0:
            raise ValueError(f"input_ids must be a non-empty [T] or [1, T] tensor of token ids, got shape {tuple(ids.shape)}")
        if int(ids.min()) < 0 or int(ids.max()) >= self.target.vocab_size:
            raise ValueError(
                f"input_ids hold ids outside the model's vocabulary [0, {self.target.vocab_size}): "
                "was the prompt encoded with another model's tokenizer?"
            )
        return ids.to(self.target.device)

    def _eos_ids(self, eos_token_id) -> list[int]:
        """The user's EOS ids, checked (`stopping.eos_ids`); else the model's generation config's, as they are."""
        if eos_token_id is None:  # like `generate`: fall back to the model's generation config
            generation_config = getattr(self.model, "generation_config", None)
            eos_token_id = getattr(generation_config, "eos_token_id", None)
            if eos_token_id is None:
                return []
            return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]
        return eos_ids(eos_token_id, self.target.vocab_size)


def _check_from_pretrained_keywords(model_kwargs: dict, drafter_options) -> None:
    """from_pretrained passes keywords it does not know to transformers, whose error (an unexpected keyword of the
    model's __init__) names neither the mistake nor the fix: refuse a drafter's option, a generate() argument, a
    tokenizer, and drafter_options that is not a mapping, saying where each belongs."""
    if drafter_options is not None and not isinstance(drafter_options, Mapping):
        raise TypeError(f"drafter_options must be a dict of the drafter's options (e.g. drafter_options="
                        f"{{'max_ngram_size': 3}}), got {type(drafter_options).__name__}")
    if "tokenizer" in model_kwargs:
        raise ValueError("from_pretrained loads the tokenizer saved with the model; to use another, load the model and "
                         "wrap it: SelfSpecModel(model, tokenizer=...)")
    for name in model_kwargs:
        drafters = drafters_taking(name)
        if drafters:
            raise ValueError(f"from_pretrained got {name}, an option of drafter={' / '.join(map(repr, drafters))}: "
                             f"pass it in drafter_options: SelfSpecModel.from_pretrained(path, drafter_options="
                             f"{{{name!r}: ...}})")
        if name in CALL_ARGUMENTS:
            raise ValueError(f"from_pretrained got {name}, an argument of generate() and stream(), not of loading: "
                             f"spec.generate(prompt, {name}=...)")
