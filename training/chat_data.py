"""Self-distillation data for a chat model: the base answers prompts through its own chat template, and the
hidden states it computed while answering are kept, so training never runs the base again.

    python -m training.chat_data --model smollm2 --out runs/smollm2-data --time-budget 1500

    python -m training.chat_data --model smollm2 --out runs/smollm2-data3 --feature-layers auto   # EAGLE-3 data
    python -m training.chat_data --model smollm2 --out runs/d4 --feature-layers auto --draft-head examples/smollm2/eagle
    python -m training.chat_data --model smollm2 --out runs/d5 --prompt-set self --draft-head examples/smollm2/eagle

A data directory holds shards `shard_00000.pt` ... each a list of records {"ids": [T] int32 (prompt + reply),
"hidden": [T - 1, H] float16 final post-norm hidden states at positions 0 .. T-2 (position t predicts t+1; with
--feature-layers [T - 1, (1 + n) H]: the final state, then hidden_states[l] for each feature layer l, recorded by one
more forward over prompt + reply),
"reply_start": index of the first reply token, "greedy": bool} and `meta.json` (the base's identity, counts).
Batched `generate` with left padding writes the replies; a forward hook on the decoder's final norm records
the hidden states each step computes anyway. Knows nothing about heads or losses.
"""
from __future__ import annotations

import dataclasses
import itertools
import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from training import prompts as prompt_sets
from training.flags import parse_settings
from training.self_prompts import write_user_turns

META_NAME = "meta.json"
SELF_WRITTEN = "self"  # --prompt-set self: the base writes the user turns (training/self_prompts.py)


@dataclass(frozen=True)
class ChatDataSettings:
    model: str
    out: str
    time_budget: float = 1500.0  # seconds for the whole run, model loading included
    max_new_tokens: int = 192  # SmolLM2's replies often run longer; 192 keeps a batch's tail short
    batch_size: int = 32  # batched greedy decoding: ~280 tokens/s on 2 threads for SmolLM2 (FACTS.md)
    sampled_every: int = 3  # every third batch is sampled (T=0.7, top-p 0.9), the rest greedy
    threads: int = 0  # 0: every core; 1 when other processes share the CPU (spinning OpenMP threads stall each other)
    seed: int = 0
    first_prompt: int = 0  # skip this many prompts of the shuffled order (to extend a dataset with new prompts)
    prompt_set: str = "topics"  # training/prompts.py: "topics", "everyday" or "questions"; "self": the base writes them
    feature_layers: tuple[str, ...] = ()  # "auto" or hidden_states indices recorded beside the final state (EAGLE-3)
    draft_head: str = ""  # an EAGLE head directory: selfspec's batched generate writes the replies, drafting with it
    # a .gguf base's weights: "dequantize" (float32: batches of 32 rows run as matrix products, about 2x faster here
    # than blocks dequantized per forward) or selfspec.loading's "auto" / "keep" (the file's blocks, a sixth of the memory)
    quantized: str = "dequantize"


_HELP = {
    "model": "the base: a directory, a .gguf file or 'smollm2'; needs a tokenizer with a chat template",
    "out": "directory for shard_*.pt (written as each batch completes) and meta.json",
    "time_budget": "1500 s for the whole run, model loading included; it stops before a batch that would not fit",
    "max_new_tokens": "192: reply tokens at most (SmolLM2's replies often run longer; a cap keeps batches short)",
    "batch_size": "32: replies written together (batched generate, left-padded)",
    "sampled_every": "3: every third batch samples (T=0.7, top-p 0.9), the rest are greedy; 0 = all greedy",
    "threads": "0 = every core; 1 when other processes share the CPU (spinning OpenMP threads stall each other)",
    "seed": "0: the prompts' shuffled order and the sampled batches",
    "first_prompt": "0: skip this many prompts of the shuffled order (to extend a dataset with new prompts)",
    "feature_layers": "none: the final state only; 'auto' (EAGLE-3's layers 2, L//2, L-3) or indices: their "
                      "hidden_states too, after the final state in each record's 'hidden' (one more forward per batch)",
    "draft_head": "none: transformers' batched generate writes the replies; an EAGLE head directory: selfspec's "
                  "batched generate does, drafting with that head (greedy replies are exactly the base's; sampled ones "
                  "follow its law), then one forward over prompt + reply records the features",
    "quantized": "dequantize: a .gguf base runs on float32 weights (batched replies are matrix products: SmolLM2 at 32 "
                 "rows on one thread, drafting with its EAGLE head, wrote ~50 reply tokens/s against 28 on the file's "
                 "blocks); auto / keep: the blocks (a sixth of the memory)",
    "prompt_set": "topics: training/prompts.py's set of prompts (topics; everyday: practical how-to and advice; "
                  "questions: requests as people type them); self: user turns the base writes itself, sampled from its "
                  "chat template's opening of a user turn (training/self_prompts.py), new ones for every batch",
}


def parse_args(argv=None) -> ChatDataSettings:
    return parse_settings(ChatDataSettings, _HELP, argv, __doc__.split("\n\n")[0])


class FinalNormRecorder:
    """Forward hook on the decoder's final norm: keeps each call's output ([B, T, H]) on the CPU."""

    def __init__(self, norm: torch.nn.Module):
        self.outputs: list[torch.Tensor] = []
        self._handle = norm.register_forward_hook(lambda module, args, output: self.outputs.append(output.detach().cpu()))

    def take(self) -> torch.Tensor:
        """[B, T_total, H]: every recorded call concatenated along time; clears the record."""
        out, self.outputs = torch.cat(self.outputs, dim=1), []
        return out

    def remove(self) -> None:
        self._handle.remove()


def chat_prompt_ids(tokenizer, prompt: str) -> list[int]:
    """The prompt as one user turn through the tokenizer's chat template, with the generation prompt."""
    ids = tokenizer.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=True)
    return list(ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids)


@torch.no_grad()
def answer_batch(model, tokenizer, norm, batch: list[list[int]], max_new_tokens: int, greedy: bool, seed: int) -> list[dict]:
    """Left-pad the prompts, generate, and cut each row to prompt + reply (through its EOS) with its hidden states."""
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.generation_config.eos_token_id
    width = max(len(ids) for ids in batch)
    input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids in batch])
    attention_mask = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids in batch])
    recorder = FinalNormRecorder(norm)
    try:
        torch.manual_seed(seed)
        sequences = model.generate(
            input_ids=input_ids, attention_mask=attention_mask, max_new_tokens=max_new_tokens, do_sample=not greedy,
            temperature=None if greedy else 0.7, top_p=None if greedy else 0.9, top_k=None, pad_token_id=pad,
        )
        hidden = recorder.take()  # [B, width + steps - 1, H]: the last generated token is never fed back
    finally:
        recorder.remove()
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    records = []
    for row, prompt in enumerate(batch):
        reply = sequences[row, width:].tolist()
        end = next((i + 1 for i, token in enumerate(reply) if token in eos), len(reply))
        reply = reply[:end]
        ids = prompt + reply
        start = width - len(prompt)
        states = hidden[row, start : start + len(ids) - 1]
        records.append({"ids": torch.tensor(ids, dtype=torch.int32), "hidden": states.to(torch.float16).clone(),
                        "reply_start": len(prompt), "greedy": greedy})
    return records


@torch.no_grad()
def record_features(target, records: list[dict], batch_size: int = 8) -> None:
    """Replace each record's "hidden" by [T - 1, (1 + n) H] float16 rows of the target's final state and feature
    layers, from one forward over prompt + reply (right-padded: a causal row never reads what follows it)."""
    for first in range(0, len(records), batch_size):
        chunk = records[first : first + batch_size]
        width = max(len(r["ids"]) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            ids[i, : len(r["ids"])] = r["ids"].long()
        out = target.decoder(input_ids=ids.to(target.device), use_cache=False, **target.decoder_options)
        states = target.states(out).cpu()
        for i, r in enumerate(chunk):
            # clamped: SmolLM2's massive activations (~2e4 in middle layers) come near float16's 65504
            r["hidden"] = states[i, : len(r["ids"]) - 1].clamp(-65000, 65000).to(torch.float16).clone()


def answer_batch_drafted(spec, batch: list[list[int]], max_new_tokens: int, greedy: bool, seed: int, eos):
    """Replies to the prompts from `spec` (a SelfSpecModel: its batched generate), cut through their EOS -> (records
    without "hidden", left for `record_features`; the batch's GenerationStats)."""
    torch.manual_seed(seed)
    options = {} if greedy else {"do_sample": True, "temperature": 0.7, "top_p": 0.9}
    out = spec.generate([torch.tensor(ids) for ids in batch], max_new_tokens=max_new_tokens, eos_token_id=sorted(eos),
                        **options)
    records = []
    for prompt, sequence in zip(batch, out.sequences):
        reply = sequence[len(prompt) :].tolist()
        end = next((i + 1 for i, token in enumerate(reply) if token in eos), len(reply))
        records.append({"ids": torch.tensor(prompt + reply[:end], dtype=torch.int32), "reply_start": len(prompt),
                        "greedy": greedy})
    return records, out.stats


def generate_records(settings: ChatDataSettings, model, progress: bool = True) -> list[dict]:
    """Answer training prompts until `settings.time_budget` seconds pass; each batch is saved as a shard under
    `settings.out` as it completes (a time limit keeps what finished). Returns all records."""
    from heads.checkpoint import BaseIdentity
    from selfspec.loading import load_tokenizer

    started = time.perf_counter()
    tokenizer = load_tokenizer(settings.model)
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise ValueError(f"{settings.model} has no tokenizer with a chat template: chat data needs one (use --data TEXT)")
    from selfspec.target import TargetModel

    target = TargetModel(model)
    norm = target.parts.norm  # the module whose output the LM head reads
    if settings.feature_layers:
        from training.recipes import resolve_feature_layers

        target.set_feature_layers(resolve_feature_layers(settings.feature_layers, target.num_layers))
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    self_written = settings.prompt_set == SELF_WRITTEN
    prompts = [] if self_written else prompt_sets.train_prompts(settings.seed, settings.prompt_set)[settings.first_prompt :]
    seen: set[str] = set()
    spec = None
    if settings.draft_head:
        from selfspec import SelfSpecModel

        spec = SelfSpecModel(model, heads=settings.draft_head)
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    meta = {"settings": asdict(settings), "base": asdict(BaseIdentity.of(model)), "shards": [], "records": 0,
            "tokens": 0, "reply_tokens": 0, "seconds": 0.0, "feature_layers": list(target.feature_layers)}
    records = []
    bar = tqdm(total=int(settings.time_budget), desc="self-generating replies", unit="s", disable=not progress)
    for number in itertools.count():
        if time.perf_counter() - started > settings.time_budget * 0.92:  # a batch takes ~1 min: stop while it fits
            break
        if self_written:  # some written turns are dropped (unclosed, repeated, held out): write a third more
            texts = write_user_turns(model, tokenizer, settings.batch_size * 4 // 3, settings.seed * 1_000_003 + number,
                                     seen)[: settings.batch_size]
        else:
            texts = prompts[number * settings.batch_size : (number + 1) * settings.batch_size]
        if not texts:
            break
        batch = [chat_prompt_ids(tokenizer, p) for p in texts]
        greedy = settings.sampled_every <= 0 or number % settings.sampled_every != settings.sampled_every - 1
        if spec is not None:
            batch_records, stats = answer_batch_drafted(spec, batch, settings.max_new_tokens, greedy,
                                                        settings.seed + number, eos)
            meta["tokens_per_forward"] = round(stats.new_tokens / max(stats.target_forwards, 1), 3)  # the last batch's
        else:
            batch_records = answer_batch(model, tokenizer, norm, batch, settings.max_new_tokens, greedy,
                                         settings.seed + number)
        if target.feature_layers or spec is not None:
            record_features(target, batch_records)
        records += batch_records
        name = f"shard_{number:05d}.pt"
        torch.save(batch_records, out / name)
        meta["shards"].append(name)
        meta["records"] += len(batch_records)
        meta["tokens"] += sum(len(r["ids"]) for r in batch_records)
        meta["reply_tokens"] += sum(len(r["ids"]) - r["reply_start"] for r in batch_records)
        meta["seconds"] = round(time.perf_counter() - started, 1)
        (out / META_NAME).write_text(json.dumps(meta, indent=2))
        bar.update(int(time.perf_counter() - started) - bar.n)
        bar.set_postfix(replies=meta["records"], reply_tokens=meta["reply_tokens"],
                        tok_s=f"{meta['reply_tokens'] / max(meta['seconds'], 1e-9):.0f}")
    bar.close()
    print(f"chat_data: {meta['records']} replies, {meta['reply_tokens']} reply tokens ({meta['tokens']} with prompts) "
          f"in {meta['seconds']:.0f}s -> {out}", flush=True)
    return records


def run(settings: ChatDataSettings) -> list[dict]:
    from selfspec.loading import load_model

    started = time.perf_counter()
    if settings.threads:
        torch.set_num_threads(settings.threads)
    model = load_model(settings.model, quantized=settings.quantized)
    remaining = dataclasses.replace(settings, time_budget=settings.time_budget - (time.perf_counter() - started))
    return generate_records(remaining, model)


def read_meta(directory: str | Path) -> dict:
    return json.loads((Path(directory) / META_NAME).read_text())


def load_records(directory: str | Path) -> list[dict]:
    directory = Path(directory)
    meta = read_meta(directory)
    records = []
    for name in meta["shards"]:
        records += torch.load(directory / name)
    return records


def main(argv=None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
