"""Train Medusa heads or an exit adapter on a frozen causal LM by self-distillation, and evaluate them.

    python -m training.heads --model /work/runs/reference-model --data stdlib --out examples/reference/heads \
        --num-heads 4 --num-layers 1 --time-budget 720
    python -m training.heads --model MODEL --data notes/ --glob '**/*.md' --out heads/ --max-steps 2000
    accelerate launch -m training.heads --model MODEL --data corpus.jsonl --out heads/ --max-steps 5000
    python -m training.heads --model MODEL --data stdlib --out examples/reference/heads --eval-only

The base runs once per batch without gradients; the heads train on its post-norm hidden states towards its own
distributions at the shifted positions (see training/head_recipe.py for every offset). --out receives loadable
heads (`MedusaHeads.from_pretrained(out)` / `ExitAdapter.from_pretrained(out)`, and
`SelfSpecModel.from_pretrained(model, heads=out)`), `checkpoint/` for --resume, train_log.json and eval.json.
The same command runs on a CPU, one GPU, or many through `accelerate launch`.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import math
import time
import types
import typing
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from training import corpus, head_data, head_recipe

CHECKPOINT_DIR = "checkpoint"  # accelerate's save_state: heads, optimizer, RNG, step
SETTINGS_NAME = "train_settings.json"
LOG_NAME = "train_log.json"
KINDS = ("medusa", "exit-adapter")


@dataclass(frozen=True)
class HeadSettings:
    model: str
    out: str
    data: tuple[str, ...] = ()
    kind: typing.Literal["medusa", "exit-adapter"] = "medusa"
    num_heads: int = 4
    num_layers: int = 1
    share_lm_head: bool = True
    exit_layer: int = 0
    glob: str = "**/*.txt"
    eval_data: tuple[str, ...] = ()
    heldout_fraction: float = corpus.DEFAULT_HELDOUT_FRACTION
    tokenizer: str = ""
    seq_len: int = 256
    batch_size: int = 8
    grad_accum: int = 1
    lr: float = 1e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 20
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    head_loss_decay: float = 0.8
    labels: typing.Literal["distill", "next-token"] = "distill"
    max_steps: int = 0
    time_budget: float = 600.0
    save_every: int = 100
    self_generate: int = 0
    self_generate_temperature: float | None = None
    prompt_len: int = 32
    eval_tokens: int = 32768
    eval_continuations: int = 16
    seed: int = 0
    resume: bool = False
    eval_only: bool = False
    threads: int = 1
    mixed_precision: typing.Literal["auto", "no", "bf16", "fp16"] = "auto"

    def __post_init__(self):
        if not self.eval_only and self.time_budget <= 0 and self.max_steps <= 0:
            raise ValueError("set --time-budget or --max-steps (or both); otherwise training never stops")
        if not self.data and self.self_generate <= 0:
            raise ValueError("no training text: pass --data PATH... or --self-generate N (sequences written by the base)")
        if self.num_heads < 1 or self.num_layers < 1:
            raise ValueError("--num-heads and --num-layers must be >= 1")
        if self.seq_len < self.num_heads + 3:
            raise ValueError(f"--seq-len {self.seq_len} is too short for {self.num_heads} heads")
        if not 0 < self.prompt_len < self.seq_len:
            raise ValueError(f"--prompt-len ({self.prompt_len}) must be at least 1 and shorter than --seq-len ({self.seq_len})")
        if self.batch_size < 1 or self.grad_accum < 1:
            raise ValueError("--batch-size and --grad-accum must be >= 1")
        if not 0.0 < self.heldout_fraction < 1.0:
            raise ValueError("--heldout-fraction must be in (0, 1)")
        if self.exit_layer < 0:
            raise ValueError("--exit-layer must be >= 1 (or 0 for half the model's layers)")
        if self.resume and self.eval_only:
            raise ValueError("--resume and --eval-only exclude each other")


_HELP = {
    "model": "the base model directory (or hub id): any transformers causal LM; it stays frozen",
    "out": "directory for the heads (config.json, model.safetensors), checkpoint/, train_log.json and eval.json",
    "data": "text files, directories (see --glob), .jsonl files with a \"text\" field, or 'stdlib' (the Python "
    "standard library corpus of training/corpus.py, split like the base's). Optional with --self-generate",
    "kind": "medusa: K heads guessing tokens t+2..t+1+K; exit-adapter: a block that makes an early exit at "
    "--exit-layer guess like the full model",
    "num_heads": "4: Medusa's usual count; on a CPU verify cost grows with drafts, so few heads pay",
    "num_layers": "1: residual blocks per head (or in the adapter); one is what published Medusa heads use",
    "share_lm_head": "shared by default: every head projects through the base LM head, adding H*H+H parameters per "
    "head instead of also V*H (for a small model that is more than the base itself)",
    "exit_layer": "0 = half the model's layers: the exit adapter reads the output of the first L layers",
    "glob": "**/*.txt: which files of a --data directory are text; pass '**/*.py' for Python source",
    "eval_data": "held-out text in the same forms as --data; default: held out from --data by a hash of each "
    "file's path (the rule training/corpus.py uses), or the stream's tail when that leaves a side empty",
    "heldout_fraction": "0.05: fraction of --data files held out for evaluation (the base corpus's fraction)",
    "tokenizer": "default: the --model directory's tokenizer",
    "seq_len": "256: tokens per training window; must fit the model's context (max_position_embeddings)",
    "batch_size": "8: windows per micro-batch; 2048 tokens of 256 keeps a CPU step around a second for a small model",
    "grad_accum": "1: micro-batches per optimizer step (raise it to grow the batch without memory)",
    "lr": "1e-3: peak AdamW rate; Medusa trains its heads at 1e-3",
    "min_lr_ratio": "0.1: cosine decays to 10%% of the peak rate, not to zero",
    "warmup_steps": "20: linear warm-up steps before the cosine decay; zero-initialised heads need little",
    "weight_decay": "0.0: heads start at the identity and are small; decay would only pull them back",
    "grad_clip": "1.0: clip the global gradient norm",
    "head_loss_decay": "0.8: head k's loss is weighted 0.8^k, as in Medusa",
    "labels": "distill: soft cross-entropy against the base's own distributions (what the verifier accepts); "
    "next-token: plain cross-entropy against the text",
    "max_steps": "0 = no step limit; the schedule then follows --time-budget. With --time-budget 0 the run is "
    "deterministic",
    "time_budget": "600 s of training (excluding setup and evaluation); 0 = use --max-steps only",
    "save_every": "100: optimizer steps between checkpoints (heads and checkpoint/); 0 = only at the end",
    "self_generate": "0 = off; N > 0 trains on N sequences of --seq-len the base writes itself, continuing "
    "--prompt-len tokens of the training text (or starting from its eos/bos token when there is no --data)",
    "self_generate_temperature": "default: 0 (greedy continuations: what greedy decoding will ask of the heads) "
    "when --data gives prompts, 1.0 (sampled) when there is no --data (greedy from one start token would repeat "
    "one sequence); > 0 samples at that temperature",
    "prompt_len": "32: prompt tokens for --self-generate and for the greedy-continuation evaluation",
    "eval_tokens": "32768: held-out tokens evaluated (evenly spaced windows of --seq-len)",
    "eval_continuations": "16: also evaluate on the base's greedy continuations of this many held-out prompts, "
    "where the mean accepted length is exact for greedy decoding; 0 = off",
    "seed": "0: seeds batch order and self-generation (each process adds its index)",
    "resume": "continue the run in --out from checkpoint/ (optimizer, schedule, step, RNG); settings must match",
    "eval_only": "only evaluate the heads already in --out and write eval.json",
    "threads": "1: torch threads; a shared CPU with spinning threads is far slower (0 = torch's default)",
    "mixed_precision": "auto = bf16 on a GPU that supports it, none on a CPU (bf16 is no faster there)",
}


def parse_args(argv: list[str] | None = None) -> HeadSettings:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="\n".join(__doc__.splitlines()[1:9]),
    )
    hints = typing.get_type_hints(HeadSettings)
    for field in dataclasses.fields(HeadSettings):
        flag = "--" + field.name.replace("_", "-")
        kind = hints[field.name]
        if typing.get_origin(kind) in (typing.Union, types.UnionType):  # `float | None`: a float flag, default None
            kind = next(arg for arg in typing.get_args(kind) if arg is not type(None))
        options: dict = {"help": _HELP[field.name]}
        if field.default is dataclasses.MISSING:
            options["required"] = True
        else:
            options["default"] = field.default
        if kind is bool:
            action = argparse.BooleanOptionalAction if field.default else "store_true"
            parser.add_argument(flag, action=action, **options)
        elif typing.get_origin(kind) is tuple:
            parser.add_argument(flag, nargs="+", metavar="PATH", **options)
        elif typing.get_origin(kind) is typing.Literal:
            parser.add_argument(flag, choices=typing.get_args(kind), **options)
        else:
            parser.add_argument(flag, type=kind, **options)
    args = vars(parser.parse_args(argv))
    try:
        return HeadSettings(**{k: tuple(v) if isinstance(v, list) else v for k, v in args.items()})
    except ValueError as err:
        parser.error(str(err))


def learning_rate(settings: HeadSettings, step: int, progress: float) -> float:
    """Linear warm-up for warmup_steps, then cosine from lr to lr * min_lr_ratio as progress goes 0 -> 1."""
    if step < settings.warmup_steps:
        return settings.lr * (step + 1) / settings.warmup_steps
    cosine = 0.5 * (1.0 + math.cos(math.pi * min(progress, 1.0)))
    return settings.lr * (settings.min_lr_ratio + (1.0 - settings.min_lr_ratio) * cosine)


class TrainState:
    """Where the run is; accelerate saves it with the checkpoint (`register_for_checkpointing`)."""

    def __init__(self):
        self.step, self.tokens_seen, self.train_seconds = 0, 0, 0.0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens_seen, self.train_seconds = state["step"], state["tokens_seen"], state["train_seconds"]


# -- setup -----------------------------------------------------------------------------------------------------


def load_base(settings: HeadSettings, device: torch.device):
    """The frozen base in eval mode: float32 on a CPU (published fp16 weights run slowly and coarsely there)."""
    from transformers import AutoModelForCausalLM

    dtype = torch.float32 if device.type == "cpu" else "auto"
    model = AutoModelForCausalLM.from_pretrained(settings.model, dtype=dtype).to(device).eval()
    model.requires_grad_(False)
    return model


def check_settings_against(settings: HeadSettings, target) -> int:
    """Validate what needs the model; return the exit layer (resolving 0 = half)."""
    if target.max_positions is not None and settings.seq_len > target.max_positions:
        raise ValueError(
            f"--seq-len {settings.seq_len} is longer than the model's context of {target.max_positions} positions "
            "(max_position_embeddings); lower --seq-len"
        )
    if settings.kind != "exit-adapter":
        return 0
    num_layers = target.model.config.num_hidden_layers
    exit_layer = settings.exit_layer or num_layers // 2
    if not 1 <= exit_layer < num_layers:
        raise ValueError(f"--exit-layer must be in [1, {num_layers - 1}] for this model, got {exit_layer}")
    return exit_layer


def new_heads(settings: HeadSettings, model, exit_layer: int):
    from heads import ExitAdapter, MedusaHeads

    if settings.kind == "medusa":
        heads = MedusaHeads.for_model(model, settings.num_heads, settings.num_layers, settings.share_lm_head)
    else:
        heads = ExitAdapter.for_model(model, exit_layer, settings.num_layers)
    return heads.to(_train_dtype(model))


def load_heads(settings: HeadSettings, model):
    from heads import ExitAdapter, MedusaHeads

    loader = MedusaHeads if settings.kind == "medusa" else ExitAdapter
    if not (Path(settings.out) / "config.json").is_file():
        raise FileNotFoundError(f"--eval-only: no heads in {settings.out!r}; train them first (drop --eval-only)")
    return loader.from_pretrained(settings.out, model=model).to(_train_dtype(model))


def _train_dtype(model) -> torch.dtype:
    """Heads train in float32 master weights (float64 kept for exact tests); autocast handles bf16/fp16."""
    dtype = model.get_output_embeddings().weight.dtype
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _mixed_precision(choice: str) -> str:
    if choice != "auto":
        return choice
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


# -- the run ---------------------------------------------------------------------------------------------------


def run(settings: HeadSettings, progress_bar: bool = True, stop_after: int | None = None) -> dict:
    """Train (unless --eval-only) and evaluate; returns the evaluation. stop_after (tests only) simulates an
    interrupted run: stop after that many optimizer steps, leaving only the checkpoints."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from selfspec.target import TargetModel

    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    started = time.time()
    accelerator = Accelerator(mixed_precision=_mixed_precision(settings.mixed_precision))
    out = Path(settings.out)
    model = load_base(settings, accelerator.device)
    target = TargetModel(model)
    exit_layer = check_settings_against(settings, target)
    _check_resume(settings, out)
    data_started = time.time()
    train_windows, heldout = head_data.build_data(settings, model, accelerator.process_index)
    data_seconds = time.time() - data_started  # reading, tokenizing, and --self-generate's generation
    eval_windows = heldout.fixed(settings.eval_tokens)  # [N, seq_len]
    continuations = None
    if settings.eval_continuations > 0:
        prompts = eval_windows[: settings.eval_continuations, : settings.prompt_len]
        continuations = head_data.continue_tokens(model, prompts, settings.seq_len - settings.prompt_len)

    def evaluate(heads) -> dict:
        return _evaluate(settings, heads, target, exit_layer, eval_windows, continuations)

    if settings.eval_only:
        heads = load_heads(settings, model)
        result = evaluate(heads) if accelerator.is_main_process else {}
        _write_eval(settings, out, result, accelerator)
        return result

    heads = new_heads(settings, model, exit_layer)
    num_params = sum(p.numel() for p in heads.parameters())
    base_params = sum(p.numel() for p in model.parameters())
    log = {
        "settings": dataclasses.asdict(settings),
        "head_parameters": num_params,
        "base_parameters": base_params,
        "head_parameter_fraction": round(num_params / base_params, 4),
        "train_tokens_available": train_windows.num_tokens,
        "heldout_windows": len(eval_windows),
        "data_seconds": round(data_seconds, 1),
        "setup_seconds": round(time.time() - started, 1),
    }
    if not settings.resume and accelerator.is_main_process:
        log["initial_eval"] = evaluate(heads)
    accelerator.print(
        f"{settings.kind}: {num_params:,} trainable parameters ({100 * num_params / base_params:.1f}% of the base's "
        f"{base_params:,}); {train_windows.num_tokens:,} training tokens; setup {log['setup_seconds']} s", flush=True
    )
    optimizer = torch.optim.AdamW(heads.parameters(), lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay)
    heads, optimizer = accelerator.prepare(heads, optimizer)
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    set_seed(settings.seed, device_specific=True)  # batch order; resume restores the RNG from the checkpoint
    if settings.resume:
        accelerator.load_state(str(out / CHECKPOINT_DIR))
        accelerator.print(f"resumed at step {state.step} ({state.train_seconds:.0f} s trained)")
    elif accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / SETTINGS_NAME).write_text(json.dumps(dataclasses.asdict(settings), indent=2) + "\n")
        (out / LOG_NAME).write_text(json.dumps(log, indent=2) + "\n")  # a resumed run adds to it

    def save() -> None:
        accelerator.wait_for_everyone()
        accelerator.save_state(str(out / CHECKPOINT_DIR))
        if accelerator.is_main_process:
            accelerator.unwrap_model(heads).save_pretrained(out)

    interrupted = train_loop(settings, accelerator, heads, optimizer, state, target, train_windows, exit_layer,
                             save, progress_bar, stop_after)
    if interrupted:
        return {}
    save()
    log.update(steps=state.step, tokens_seen=state.tokens_seen, train_seconds=round(state.train_seconds, 1))
    result = evaluate(accelerator.unwrap_model(heads)) if accelerator.is_main_process else {}
    log["wall_seconds"] = round(time.time() - started, 1)
    if accelerator.is_main_process:
        log["final_eval"] = result
        log_path = out / LOG_NAME
        if settings.resume and log_path.is_file():  # keep the first segment's initial evaluation
            log = {**json.loads(log_path.read_text()), **log}
        log_path.write_text(json.dumps(log, indent=2) + "\n")
    _write_eval(settings, out, result, accelerator)
    return result


def train_loop(settings, accelerator, heads, optimizer, state, target, windows, exit_layer, save, progress_bar,
               stop_after) -> bool:
    """Optimizer steps until the budget is spent; True if stopped early by `stop_after`."""
    from tqdm import tqdm

    weights = head_recipe.head_loss_weights(settings.num_heads, settings.head_loss_decay)
    norm = head_recipe.final_norm(target) if settings.kind == "exit-adapter" else None
    segment_started, trained_before = time.time(), state.train_seconds
    smoothed_loss, smoothed_agreement = None, None
    bar = tqdm(total=settings.max_steps or None, initial=state.step, unit="step", mininterval=2.0,
               disable=not (progress_bar and accelerator.is_main_process))
    while True:
        state.train_seconds = trained_before + time.time() - segment_started
        progress = _progress(settings, state, accelerator)
        if progress >= 1.0:
            break
        lr = learning_rate(settings, state.step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        for micro in range(settings.grad_accum):
            batch = windows.batch(settings.batch_size).to(accelerator.device)  # [batch, seq_len]
            sync = nullcontext() if micro == settings.grad_accum - 1 else accelerator.no_sync(heads)
            with sync, accelerator.autocast():
                teacher = head_recipe.run_base(target, batch, exit_layer)
                if settings.kind == "medusa":
                    head_logits = head_recipe.medusa_head_logits(heads, teacher, target)
                    loss, agreement = head_recipe.medusa_loss(head_logits, teacher, batch, weights, settings.labels)
                else:
                    exit_logits = head_recipe.exit_adapter_logits(heads, target, norm, teacher.exit_hidden)
                    loss, agreement = head_recipe.exit_adapter_loss(exit_logits, teacher, batch, settings.labels)
                accelerator.backward(loss / settings.grad_accum)
        accelerator.clip_grad_norm_(heads.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.tokens_seen += batch.numel() * settings.grad_accum * accelerator.num_processes
        smoothed_loss = _smooth(smoothed_loss, [loss.item()])
        smoothed_agreement = _smooth(smoothed_agreement, agreement)
        bar.update(1)
        bar.set_postfix(loss=f"{smoothed_loss[0]:.3f}", top1="/".join(f"{a:.2f}" for a in smoothed_agreement),
                        lr=f"{lr:.1e}")
        if settings.save_every > 0 and state.step % settings.save_every == 0:
            state.train_seconds = trained_before + time.time() - segment_started
            save()
        if stop_after is not None and state.step >= stop_after:
            bar.close()
            return True
    bar.close()
    return False


def _progress(settings: HeadSettings, state: TrainState, accelerator) -> float:
    """Fraction of the budget spent; processes agree on it (the slowest clock decides) so they stop together."""
    progress = max(
        state.train_seconds / settings.time_budget if settings.time_budget > 0 else 0.0,
        state.step / settings.max_steps if settings.max_steps > 0 else 0.0,
    )
    if accelerator.num_processes > 1:
        progress = accelerator.reduce(torch.tensor(progress, device=accelerator.device), "max").item()
    return progress


def _smooth(previous: list[float] | None, values: list[float], keep: float = 0.95) -> list[float]:
    if previous is None:
        return list(values)
    return [keep * p + (1 - keep) * v for p, v in zip(previous, values)]


def _check_resume(settings: HeadSettings, out: Path) -> None:
    saved_path = out / SETTINGS_NAME
    if settings.resume:
        if not (out / CHECKPOINT_DIR).is_dir() or not saved_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint in {out / CHECKPOINT_DIR}; start without --resume")
        saved = json.loads(saved_path.read_text())
        mine = dataclasses.asdict(settings)
        ignored = {"resume", "eval_only", "threads"}
        differ = sorted(k for k in mine if k not in ignored and json.loads(json.dumps(mine[k])) != saved.get(k))
        if differ:
            raise ValueError(f"--resume continues the same run, but these settings differ from it: {', '.join(differ)}")
    elif not settings.eval_only and (out / CHECKPOINT_DIR).is_dir():
        raise FileExistsError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")


def _evaluate(settings, heads, target, exit_layer, eval_windows, continuations) -> dict:
    heads = heads.eval()
    if settings.kind == "medusa":
        def measure(windows, start):
            return head_recipe.evaluate_medusa(heads, target, windows, settings.batch_size, start)
    else:
        def measure(windows, start):
            return head_recipe.evaluate_exit_adapter(heads, target, windows, exit_layer, settings.batch_size, start)
    result = {"kind": settings.kind, "heldout_text": measure(eval_windows, 0)}
    if continuations is not None:
        result["greedy_continuations"] = measure(continuations, settings.prompt_len - 1)
    heads.train()
    return result


def _write_eval(settings: HeadSettings, out: Path, result: dict, accelerator) -> None:
    if not accelerator.is_main_process:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    for name, figures in result.items():
        if isinstance(figures, dict):
            line = f"{name}: top-1 {figures['top1']} top-5 {figures['top5']}"
            if "mean_accepted_length" in figures:
                line += f", mean accepted length {figures['mean_accepted_length']}"
            print(line + f" ({figures['positions']:,} positions)", flush=True)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
