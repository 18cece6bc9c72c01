"""SelfSpecModel: one causal LM drafting for itself, and the decode loop (propose, verify, accept, roll back).

The loop is the only place that knows the order of things; the verifier, the cache, the sampling transforms and
each drafter live in their own modules.
"""
from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from selfspec.drafters import make_drafter
from selfspec.draft_length import VerifyCost, draft_length_policy, measure_verify_cost
from selfspec.drafters.base import Draft, DraftContext, Drafter
from selfspec.sampling import SamplingConfig, greedy_tokens, logits_to_probs, sample_from
from selfspec.stats import GenerationStats
from selfspec.stopping import StopCondition, StopStrings
from selfspec.streaming import TokenStream, engine_time_only, feed_streamer
from selfspec.target import TargetModel
from selfspec.verifier import Verdict, verify_greedy, verify_sampled


@dataclass
class GenerateOutput:
    sequences: torch.LongTensor  # [1, prompt + new], like `transformers`' generate
    stats: GenerationStats
    text: str | None = None  # the completion, when a tokenizer is known


class SelfSpecModel:
    """Wrap an already loaded `transformers` causal LM; `generate` returns exactly what the model alone would.

    drafter: "medusa" (needs `heads`), "ngram", "early_exit", "none" (speculation off), or an object with
    `propose(context) -> Draft` and `observe(num_drafted, num_accepted)`. Default: "medusa" when heads are
    given, else "ngram". drafter_options go to the drafter (e.g. max_ngram_size=3, exit_layer=2).
    """

    def __init__(self, model, drafter: str | Drafter | None = None, heads=None, tokenizer=None, **drafter_options):
        self.model = model
        self.target = TargetModel(model)
        self.tokenizer = tokenizer
        self.heads = _load_heads(heads, model) if heads is not None else None
        self.drafter = make_drafter(drafter, self.heads, self.target, drafter_options)
        self._verify_cost: VerifyCost | None = None

    @classmethod
    def from_pretrained(cls, name_or_path, heads=None, drafter=None, device=None, drafter_options=None, **model_kwargs):
        """Load the base with AutoModelForCausalLM (dtype, device_map, ... passed through) and its tokenizer."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(name_or_path, **model_kwargs)
        if device is not None:
            model = model.to(device)
        try:
            tokenizer = AutoTokenizer.from_pretrained(name_or_path)
        except (OSError, ValueError):  # a model directory without tokenizer files
            tokenizer = None
        return cls(model, drafter=drafter, heads=heads, tokenizer=tokenizer, **(drafter_options or {}))

    def verify_cost(self) -> VerifyCost:
        """This model's cost of verifying k drafts relative to decoding one token, on its device; measured on first
        use (a few dozen timed forwards) for num_draft_tokens="auto", then kept."""
        if self._verify_cost is None:
            self._verify_cost = measure_verify_cost(self.target)
        return self._verify_cost

    def generate(
        self,
        input_ids,
        max_new_tokens: int = 128,
        do_sample: bool = False,
        temperature: float = 1.0,
        top_k: int | None = None,
        top_p: float | None = None,
        num_draft_tokens: int | str = 4,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: str | list[str] | None = None,
        streamer=None,
    ) -> GenerateOutput:
        """Decode one prompt; arguments mean what they mean in `transformers`' `generate`.

        input_ids: a string, a list of ids, a [T] or [1, T] tensor, or chat messages `[{"role": ..., "content": ...}]`
        (formatted with the tokenizer's chat template and its generation prompt).
        eos_token_id: one id or several; default: the model's generation config.
        stop_strings: stop at the token that completes one of these strings, keeping that token (as `generate` does).
        streamer: a `transformers` streamer (`TextStreamer`, `TextIteratorStreamer`): gets the prompt, then each
        step's accepted tokens, then `end()`.
        """
        prompt, steps, stats = self._start(
            input_ids, max_new_tokens, SamplingConfig(do_sample, temperature, top_k, top_p), num_draft_tokens,
            seed, generator, eos_token_id, stop_strings,
        )
        new_tokens = []
        for tokens in feed_streamer(prompt, steps, streamer):
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
        num_draft_tokens: int | str = 4,
        seed: int | None = None,
        generator: torch.Generator | None = None,
        eos_token_id: int | list[int] | None = None,
        stop_strings: str | list[str] | None = None,
    ) -> TokenStream:
        """`generate`'s arguments; returns an iterator of `StreamPiece(token_ids, text)`, one per decode step, as
        soon as the verifier accepts them. The tokens are exactly those `generate` returns; `text` (when a tokenizer
        is known) is the newly stable text, and all pieces' text joins to `generate`'s `text`. The returned stream
        also carries `stats`, `token_ids` and `text` so far.

            for piece in model.stream("def main():", max_new_tokens=64):
                print(piece.text, end="", flush=True)
        """
        prompt, steps, stats = self._start(
            input_ids, max_new_tokens, SamplingConfig(do_sample, temperature, top_k, top_p), num_draft_tokens,
            seed, generator, eos_token_id, stop_strings,
        )
        return TokenStream(prompt, steps, stats, self.tokenizer)

    def _start(self, input_ids, max_new_tokens, sampling, num_draft_tokens, seed, generator, eos_token_id, stop_strings):
        """Check and encode everything before the first step (so `stream` fails at the call, not mid-iteration);
        returns the [T] prompt, the decode loop's steps (not started) and the stats it will fill."""
        prompt = self._prompt_ids(input_ids)
        _check_lengths(prompt.shape[0], max_new_tokens, self.target.max_positions)
        strings = StopStrings(stop_strings, self.tokenizer, prompt.tolist()) if stop_strings is not None else None
        stop = StopCondition(max_new_tokens, self._eos_ids(eos_token_id), strings)
        stats = GenerationStats(heads_bytes=_parameter_bytes(self.heads))
        steps = self._decode(prompt, sampling, num_draft_tokens, seed, generator, stop, stats)
        return prompt, engine_time_only(steps, stats), stats

    @torch.inference_mode()
    def _decode(self, prompt, sampling, num_draft_tokens, seed, generator, stop, stats):
        """Prefill, then propose -> verify -> accept -> roll back -> feed back; yields each step's new tokens."""
        draft_length = draft_length_policy(num_draft_tokens, self.verify_cost)
        if generator is None and seed is not None:
            generator = torch.Generator(device=self.target.device).manual_seed(seed)
        target, cache = self.target, self.target.new_cache()
        buffer = prompt.new_empty(prompt.shape[0] + stop.max_new_tokens)  # [tokens]: committed ids, then the pending one
        buffer[: prompt.shape[0]] = prompt
        started = time.perf_counter()
        hidden = target.forward(prompt, cache)[-1]  # [hidden] state that predicts the first new token
        next_token = _choose(target.logits(hidden[None]), sampling, generator)
        stats.target_forwards, num_tokens = 1, prompt.shape[0]
        stats.prefill_seconds = time.perf_counter() - started
        while not stop.done:
            yield self._emit(stop, [next_token], stats, cache)
            buffer[num_tokens], num_tokens = next_token, num_tokens + 1  # pending: in the sequence, not the cache
            if stop.done:
                break
            k = min(draft_length.choose(), stop.remaining - 1)  # a step emits at most k + 1 tokens
            draft = self._propose(buffer[:num_tokens], hidden, k, sampling, generator, cache)
            verify_ids = torch.cat([buffer[num_tokens - 1 : num_tokens], draft.tokens])  # [k + 1]
            # [k + 1, hidden]; an early-exit draft already ran the first layers over verify_ids: resume after them
            hidden_all = target.forward(verify_ids, cache, draft.prefilled_layers, draft.prefilled_hidden)
            verdict = _verify(draft, target.logits(hidden_all), sampling, generator)
            cache.rollback(num_tokens + verdict.num_accepted)  # keep pending + accepted; drop rejected drafts
            accepted = draft.tokens[: verdict.num_accepted]
            buffer[num_tokens : num_tokens + verdict.num_accepted] = accepted
            num_tokens += verdict.num_accepted
            hidden, next_token = hidden_all[verdict.num_accepted], verdict.next_token
            self.drafter.observe(draft.num_draft_tokens, verdict.num_accepted)
            draft_length.observe(draft.num_draft_tokens, verdict.num_accepted)
            stats.record_step(draft.num_draft_tokens, verdict.num_accepted)
            yield self._emit(stop, accepted.tolist(), stats, cache)
        stats.decode_seconds = time.perf_counter() - started - stats.prefill_seconds

    @staticmethod
    def _emit(stop: StopCondition, tokens: list[int], stats: GenerationStats, cache) -> list[int]:
        emitted = stop.admit(tokens)
        stats.new_tokens = stop.num_emitted
        # Rollback slices the cache's tensors (views), so right after it they still hold the verify step's storage.
        stats.peak_cache_bytes = max(stats.peak_cache_bytes, cache.nbytes())
        return emitted

    def _propose(self, token_ids, hidden, num_draft_tokens, sampling, generator, cache) -> Draft:
        if num_draft_tokens <= 0:
            return Draft.empty(token_ids.device)
        context = DraftContext(token_ids, hidden, num_draft_tokens, sampling, generator, self.target, cache)
        return self.drafter.propose(context)

    def _prompt_ids(self, input_ids) -> torch.Tensor:
        """str | list[int] | [T] | [1, T] | chat messages -> [T] long on the model's device."""
        if _is_chat(input_ids):
            input_ids = _apply_chat_template(self.tokenizer, input_ids)
        elif isinstance(input_ids, str):
            if self.tokenizer is None:
                raise ValueError("a string prompt needs a tokenizer: pass tokenizer=... or use from_pretrained")
            input_ids = self.tokenizer(input_ids, return_tensors="pt").input_ids
        ids = torch.as_tensor(input_ids, dtype=torch.long)
        if ids.dim() == 2:
            if ids.shape[0] != 1:
                raise ValueError(
                    f"selfspec decodes one sequence at a time; got a batch of {ids.shape[0]}. Call generate per prompt."
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
        if eos_token_id is None:  # like `generate`: fall back to the model's generation config
            generation_config = getattr(self.model, "generation_config", None)
            eos_token_id = getattr(generation_config, "eos_token_id", None)
        if eos_token_id is None:
            return []
        return [int(eos_token_id)] if isinstance(eos_token_id, int) else [int(t) for t in eos_token_id]


def _choose(logits: torch.Tensor, sampling: SamplingConfig, generator) -> int:
    """[1, vocab] target logits -> the next token, as plain decoding would choose it."""
    if sampling.greedy:
        return int(greedy_tokens(logits)[0])
    return int(sample_from(logits_to_probs(logits, sampling), generator)[0])


def _verify(draft: Draft, target_logits: torch.Tensor, sampling: SamplingConfig, generator) -> Verdict:
    if sampling.greedy:
        return verify_greedy(draft.tokens, target_logits)
    return verify_sampled(draft.tokens, draft.probs, logits_to_probs(target_logits, sampling), generator)


def _check_lengths(prompt_len: int, max_new_tokens: int, max_positions: int | None) -> None:
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 0:
        raise ValueError(f"max_new_tokens must be an integer >= 0, got {max_new_tokens!r}")
    if max_positions is not None and prompt_len + max_new_tokens > max_positions:
        raise ValueError(
            f"prompt ({prompt_len} tokens) + max_new_tokens ({max_new_tokens}) exceeds the model's context window "
            f"of {max_positions} positions; shorten the prompt or lower max_new_tokens"
        )


def _is_chat(input_ids) -> bool:
    return isinstance(input_ids, (list, tuple)) and len(input_ids) > 0 and isinstance(input_ids[0], dict)


def _apply_chat_template(tokenizer, messages) -> list[int]:
    """[{"role", "content"}, ...] -> ids of the conversation plus the assistant's generation prompt."""
    if tokenizer is None:
        raise ValueError("chat messages need a tokenizer: pass tokenizer=... to SelfSpecModel or use from_pretrained")
    if getattr(tokenizer, "chat_template", None) is None:
        raise ValueError(
            f"the tokenizer ({type(tokenizer).__name__}) has no chat template, so chat messages cannot be formatted: "
            "set tokenizer.chat_template, or pass the prompt as text or token ids"
        )
    return list(tokenizer.apply_chat_template(list(messages), add_generation_prompt=True, tokenize=True, return_dict=False))


def _parameter_bytes(module) -> int:
    return 0 if module is None else sum(p.numel() * p.element_size() for p in module.parameters())


def _load_heads(heads, model):
    from heads import MedusaHeads

    if isinstance(heads, (str, os.PathLike)):
        return MedusaHeads.from_pretrained(heads, model=model)
    if isinstance(heads, MedusaHeads):
        heads.check_base(model)
        weight = model.get_output_embeddings().weight
        return heads.to(device=weight.device, dtype=weight.dtype)  # follow the model, as from_pretrained heads do
    raise TypeError(f"heads must be a MedusaHeads module or a directory, got {type(heads).__name__}")
