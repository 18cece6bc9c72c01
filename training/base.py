"""Train a small Llama from scratch on the stdlib corpus and save it as a standard transformers model.

    python -m training.base --out runs/reference-model --early-exit-loss 2 --early-exit-weight 0.3 \
        --time-budget 4500 --save-dtype float16

Knows about the corpus (training.corpus) and the public parts of a transformers LlamaForCausalLM
(`model.model.embed_tokens`, `.layers`, `.norm`, `.rotary_emb`, `model.lm_head`); copies no modeling
code. With --early-exit-loss L it also trains the output of the first L decoder layers, passed through
the model's OWN final norm and LM head, to predict the next token (LayerSkip-style), so that early
exit at layer L is a useful drafter for the full model. Nothing here decodes or speculates.

Determinism: with --time-budget 0 and --max-steps N the run is a pure function of its settings and
seed. With a time budget, the learning-rate schedule follows wall time (so it always decays fully
however busy the machine is), which makes weights depend on the machine's speed.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from training import corpus
from training.flags import parse_settings, settings_record
from training.schedule import warmup_cosine


@dataclass(frozen=True)
class BaseSettings:
    out: str
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    vocab_size: int = corpus.DEFAULT_VOCAB_SIZE
    max_position_embeddings: int = 1024
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 2e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 100
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    time_budget: float = 4500.0
    max_steps: int = 0
    eval_interval: float = 600.0
    eval_tokens: int = 32768
    heldout_fraction: float = corpus.DEFAULT_HELDOUT_FRACTION
    seed: int = 0
    threads: int = 1
    early_exit_loss: int = 0
    early_exit_weight: float = 0.3
    early_exit_rows: float = 0.5
    layer_dropout: float = 0.0
    save_dtype: str = "float16"
    tokenizer: str | None = None
    corpus_root: str | None = None

    def __post_init__(self):
        if self.time_budget <= 0 and self.max_steps <= 0:
            raise ValueError("set --time-budget or --max-steps (or both); otherwise training never stops")
        if not 0 <= self.early_exit_loss < self.num_layers:
            raise ValueError(f"--early-exit-loss must be in [0, {self.num_layers}) (0 = off)")
        if not 0.0 < self.early_exit_rows <= 1.0:
            raise ValueError("--early-exit-rows must be in (0, 1]")
        if not 0.0 <= self.layer_dropout < 1.0:
            raise ValueError("--layer-dropout must be in [0, 1)")
        if self.save_dtype not in ("float16", "bfloat16", "float32"):
            raise ValueError("--save-dtype must be float16, bfloat16 or float32")


_HELP = {
    "out": "directory to write the model, tokenizer and training_log.json into",
    "hidden_size": "256: the largest width that trains to a useful loss in ~1 CPU-hour",
    "num_layers": "6: deep enough that exiting early (e.g. after 2) is a real saving",
    "num_heads": "4: head_dim 64 at hidden 256, the usual head width",
    "num_kv_heads": "2: grouped-query attention halves the KV cache, as in current Llamas",
    "intermediate_size": "768: 3x hidden, the SwiGLU-equivalent of a 4x MLP",
    "vocab_size": "8192: a small byte-level BPE; its tied embedding is still ~1/3 of the parameters",
    "max_position_embeddings": "1024: room for prompt + generation in benchmarks, beyond --seq-len",
    "seq_len": "256: training window; longer costs attention time for little gain at this size",
    "batch_size": "16: 4096 tokens per step, ~2 s per step on one CPU thread",
    "lr": "2e-3: peak AdamW rate; small models tolerate a high rate",
    "min_lr_ratio": "0.1: cosine decays to 10%% of the peak rate, not to zero",
    "warmup_steps": "100: linear warm-up steps before the cosine decay",
    "weight_decay": "0.1: the usual AdamW decay on matrices (not norms)",
    "grad_clip": "1.0: clip the global gradient norm, guards the high learning rate",
    "time_budget": "4500 s: wall-clock budget; the schedule decays to it (0 = use --max-steps only)",
    "max_steps": "0: step budget (0 = none); with --time-budget 0 it makes the run deterministic",
    "eval_interval": "600 s: how often to measure held-out loss; each costs ~15 s on one thread",
    "eval_tokens": "32768: held-out tokens per evaluation (128 windows spread over all held-out files)",
    "heldout_fraction": "0.05: fraction of files held out, by a hash of their path",
    "seed": "0: seeds the initialisation, the batch order and layer dropout",
    "threads": "1: torch threads; the machine is shared and 2 spinning threads slow everyone 12x",
    "early_exit_loss": "0 = off; L > 0 adds the loss of the first L layers through the final norm + LM head",
    "early_exit_weight": "0.3: weight of the early-exit loss next to the full-model loss (weight 1); 0 = only evaluate the exit",
    "early_exit_rows": "0.5: fraction of each batch's sequences that also train the exit; the extra norm + "
    "LM head + softmax cost ~1/3 of a step on all rows, and half still gives 2048 exit tokens per step",
    "layer_dropout": "0.0: max probability of skipping a layer per step, rising linearly with depth",
    "save_dtype": "float16: halves the shipped file; load with dtype=torch.float32 to run on a CPU",
    "tokenizer": "reuse the tokenizer in this directory (e.g. the base model's) instead of training one",
    "corpus_root": "default: the running interpreter's stdlib; another dir of .py files for tests",
}


def parse_args(argv: list[str] | None = None) -> BaseSettings:
    return parse_settings(BaseSettings, _HELP, argv, __doc__.splitlines()[0])


def build_model(settings: BaseSettings, tokenizer):
    from transformers import LlamaConfig, LlamaForCausalLM

    eos = tokenizer.eos_token_id
    config = LlamaConfig(
        vocab_size=settings.vocab_size,
        hidden_size=settings.hidden_size,
        intermediate_size=settings.intermediate_size,
        num_hidden_layers=settings.num_layers,
        num_attention_heads=settings.num_heads,
        num_key_value_heads=settings.num_kv_heads,
        max_position_embeddings=settings.max_position_embeddings,
        tie_word_embeddings=True,  # the embedding is a third of the parameters; share it with the head
        bos_token_id=None,
        eos_token_id=eos,
        pad_token_id=eos,
        attn_implementation="sdpa",  # with attention_mask=None, sdpa runs causal (see forward_losses)
    )
    torch.manual_seed(settings.seed)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos
    model.generation_config.pad_token_id = eos
    return model


def layer_keep_probs(num_layers: int, layer_dropout: float) -> list[float]:
    """Probability of running each layer: 1 for layer 0, falling linearly to 1 - layer_dropout for the last."""
    if num_layers == 1:
        return [1.0]
    return [1.0 - layer_dropout * i / (num_layers - 1) for i in range(num_layers)]


def forward_losses(
    model,
    input_ids: torch.Tensor,
    exit_layer: int = 0,
    keep_layers: list[bool] | None = None,
    exit_rows: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(full-model loss, early-exit loss or None), mean next-token cross-entropy in nats.

    input_ids: [batch, seq_len + 1]; position t predicts token t + 1. The decoder layers are called
    as LlamaModel.forward calls them, with attention_mask=None so sdpa applies its own causal mask
    (no padding in training). exit_layer L > 0 also scores the hidden state after the first L layers
    through the model's own final norm and LM head, on the first exit_rows sequences (default all).
    keep_layers[i] False skips layer i (layer dropout).
    """
    inner = model.model
    inputs, targets = input_ids[:, :-1], input_ids[:, 1:]  # [batch, seq]
    hidden = inner.embed_tokens(inputs)  # [batch, seq, hidden]
    position_ids = torch.arange(inputs.shape[1], device=inputs.device).unsqueeze(0)  # [1, seq]
    position_embeddings = inner.rotary_emb(hidden, position_ids=position_ids)  # (cos, sin)
    exit_loss = None
    for index, layer in enumerate(inner.layers):
        if keep_layers is None or keep_layers[index]:
            hidden = layer(
                hidden, attention_mask=None, position_ids=position_ids, position_embeddings=position_embeddings
            )
        if index + 1 == exit_layer:
            exit_loss = _next_token_loss(model, hidden[:exit_rows], targets[:exit_rows])
    return _next_token_loss(model, hidden, targets), exit_loss


def _next_token_loss(model, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    logits = model.lm_head(model.model.norm(hidden))  # [batch, seq, vocab]
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


class TokenWindows:
    """Random [batch, seq_len + 1] windows of one token stream, in an order fixed by the seed."""

    def __init__(self, stream: list[int], seq_len: int, seed: int):
        self.tokens = torch.tensor(stream, dtype=torch.long)  # [num_tokens]
        self.seq_len = seq_len
        self.generator = torch.Generator().manual_seed(seed)
        if len(self.tokens) <= seq_len + 1:
            raise ValueError(f"corpus has {len(self.tokens)} tokens, fewer than one window of {seq_len + 1}")

    def batch(self, batch_size: int) -> torch.Tensor:
        starts = torch.randint(0, len(self.tokens) - self.seq_len - 1, (batch_size,), generator=self.generator)
        return torch.stack([self.tokens[s : s + self.seq_len + 1] for s in starts.tolist()])

    def fixed_batches(self, num_tokens: int, batch_size: int) -> list[torch.Tensor]:
        """Evenly spaced, non-overlapping windows covering ~num_tokens: the same every evaluation."""
        window = self.seq_len + 1
        count = max(1, min(num_tokens // self.seq_len, (len(self.tokens) - 1) // window))
        stride = (len(self.tokens) - window) // count
        windows = torch.stack([self.tokens[i * stride : i * stride + window] for i in range(count)])
        return list(windows.split(batch_size))


@torch.no_grad()
def evaluate(model, batches: list[torch.Tensor], exit_layer: int) -> dict[str, float]:
    """Held-out loss in nats/token of the full model and (if exit_layer) of the early exit."""
    model.eval()
    full, exit_, count = 0.0, 0.0, 0
    for batch in batches:
        full_loss, exit_loss = forward_losses(model, batch, exit_layer)
        full += full_loss.item() * batch.shape[0]
        exit_ += exit_loss.item() * batch.shape[0] if exit_loss is not None else 0.0
        count += batch.shape[0]
    model.train()
    result = {"heldout_loss": full / count}
    if exit_layer:
        result[f"heldout_loss_exit_layer_{exit_layer}"] = exit_ / count
    return result


def learning_rate(settings: BaseSettings, step: int, progress: float) -> float:
    return warmup_cosine(settings.lr, settings.warmup_steps, settings.min_lr_ratio, step, progress)


def make_optimizer(model, settings: BaseSettings) -> torch.optim.Optimizer:
    # Decay matrices only; norms' gains stay free. The tied embedding/LM head appears once.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    groups = [{"params": decay, "weight_decay": settings.weight_decay}, {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=settings.lr, betas=(0.9, 0.95), eps=1e-8)


def load_or_train_tokenizer(settings: BaseSettings, train_files):
    if settings.tokenizer:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(settings.tokenizer)
    else:
        tokenizer = corpus.train_tokenizer(train_files, settings.vocab_size)
    if len(tokenizer) > settings.vocab_size:
        raise ValueError(f"tokenizer has {len(tokenizer)} tokens, more than --vocab-size {settings.vocab_size}")
    return tokenizer


def train(settings: BaseSettings, progress_bar: bool = True) -> dict:
    """Train, save to settings.out, and return the training log (also written as training_log.json)."""
    from tqdm import tqdm

    torch.set_num_threads(settings.threads)
    started = time.time()
    root = Path(settings.corpus_root) if settings.corpus_root else None
    train_files, heldout_files = corpus.split_files(
        corpus.stdlib_files(root), settings.heldout_fraction, root
    )
    if not train_files or not heldout_files:
        raise ValueError(f"need train and held-out files, got {len(train_files)} and {len(heldout_files)}")
    tokenizer = load_or_train_tokenizer(settings, train_files)
    train_windows = TokenWindows(corpus.encode_files(tokenizer, train_files), settings.seq_len, settings.seed)
    heldout_stream = corpus.encode_files(tokenizer, heldout_files)
    eval_batches = TokenWindows(heldout_stream, settings.seq_len, settings.seed).fixed_batches(
        settings.eval_tokens, settings.batch_size
    )
    model = build_model(settings, tokenizer)
    model.train()
    optimizer = make_optimizer(model, settings)
    keep_probs = layer_keep_probs(settings.num_layers, settings.layer_dropout)
    dropout_generator = torch.Generator().manual_seed(settings.seed + 1)
    exit_rows = max(1, round(settings.early_exit_rows * settings.batch_size))
    # Weight 0 = measure the exit layer's held-out loss without training it (the no-early-exit baseline).
    train_exit_layer = settings.early_exit_loss if settings.early_exit_weight > 0 else 0
    num_params = sum(p.numel() for p in model.parameters())
    print(
        f"{num_params / 1e6:.2f}M parameters, {len(train_windows.tokens):,} train tokens in {len(train_files)} files, "
        f"{len(heldout_stream):,} held-out tokens in {len(heldout_files)} files, setup {time.time() - started:.1f} s",
        flush=True,
    )

    evaluations = []  # [{"step", "tokens_seen", "seconds", "heldout_loss", ...}]
    train_started = time.time()
    last_eval = train_started
    step, tokens_seen, smoothed = 0, 0, None
    bar = tqdm(total=settings.max_steps or None, disable=not progress_bar, mininterval=5.0, unit="step")
    while True:
        elapsed = time.time() - train_started
        progress = max(
            elapsed / settings.time_budget if settings.time_budget > 0 else 0.0,
            step / settings.max_steps if settings.max_steps > 0 else 0.0,
        )
        if progress >= 1.0:
            break
        lr = learning_rate(settings, step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        batch = train_windows.batch(settings.batch_size)  # [batch, seq_len + 1]
        keep = None
        if settings.layer_dropout > 0:
            draws = torch.rand(settings.num_layers, generator=dropout_generator).tolist()
            keep = [draw < p for draw, p in zip(draws, keep_probs)]
        full_loss, exit_loss = forward_losses(model, batch, train_exit_layer, keep, exit_rows)
        loss = full_loss if exit_loss is None else full_loss + settings.early_exit_weight * exit_loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), settings.grad_clip)
        optimizer.step()
        step += 1
        tokens_seen += batch.shape[0] * settings.seq_len
        smoothed = full_loss.item() if smoothed is None else 0.95 * smoothed + 0.05 * full_loss.item()
        bar.update(1)
        bar.set_postfix(
            loss=f"{smoothed:.3f}", tok_s=f"{tokens_seen / (time.time() - train_started):.0f}", lr=f"{lr:.1e}"
        )
        if time.time() - last_eval >= settings.eval_interval:
            evaluations.append(_evaluation(model, eval_batches, settings, step, tokens_seen, train_started))
            bar.write(json.dumps(evaluations[-1]))
            last_eval = time.time()
    bar.close()
    train_seconds = time.time() - train_started
    final = _evaluation(model, eval_batches, settings, step, tokens_seen, train_started)
    evaluations.append(final)
    print(json.dumps(final), flush=True)

    log = {
        "settings": settings_record(settings),
        "num_parameters": num_params,
        "steps": step,
        "tokens_seen": tokens_seen,
        "train_seconds": train_seconds,
        "tokens_per_second": tokens_seen / train_seconds if train_seconds > 0 else None,
        "wall_seconds": time.time() - started,
        "torch_threads": torch.get_num_threads(),
        "torch_version": torch.__version__,
        "train_files": len(train_files),
        "heldout_files": len(heldout_files),
        "train_tokens": len(train_windows.tokens),
        "heldout_tokens_evaluated": sum(b.numel() - b.shape[0] for b in eval_batches),
        **{k: v for k, v in final.items() if k.startswith("heldout_loss")},
        "evaluations": evaluations,
    }
    save(model, tokenizer, settings, log)
    return log


def _evaluation(model, eval_batches, settings, step, tokens_seen, train_started) -> dict:
    return {
        "step": step,
        "tokens_seen": tokens_seen,
        "seconds": round(time.time() - train_started, 1),
        **{k: round(v, 4) for k, v in evaluate(model, eval_batches, settings.early_exit_loss).items()},
    }


def save(model, tokenizer, settings: BaseSettings, log: dict) -> None:
    out = Path(settings.out)
    out.mkdir(parents=True, exist_ok=True)
    model.to(getattr(torch, settings.save_dtype)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / "training_log.json").write_text(json.dumps(log, indent=2) + "\n")


def main(argv: list[str] | None = None) -> None:
    settings = parse_args(argv)
    log = train(settings)
    print(f"saved to {settings.out}: held-out loss {log['heldout_loss']:.3f} nats/token after {log['tokens_seen']:,} tokens")


if __name__ == "__main__":
    main()
