"""Train drafting heads (Medusa, EAGLE, exit adapter) on a frozen causal LM by self-distillation, and evaluate them.

    python -m training.heads --model smollm2 --chat --kind eagle --draft-vocab-size 8192 --out heads --time-budget 1800
    python -m training.heads --model examples/reference/model --data stdlib --out heads --time-budget 600
    accelerate launch -m training.heads --model MODEL --data corpus.jsonl --out heads --max-steps 5000

The base's final hidden states are computed ONCE (recorded while it writes its chat replies, or one no-grad forward
per text window, `training/features.py`); every step then trains on them, so a step costs the head and a draft-vocabulary
slice of the LM head, never the base. What a kind learns and how it is scored is its recipe (`training/recipes.py`).
--out receives loadable heads (`SelfSpecModel.from_pretrained(model, heads=out)`), `checkpoint/` for --resume,
train_log.json (tokens trained on, timings, evaluations) and eval.json. The same command runs on a CPU, one GPU, or
many through `accelerate launch`; --time-budget covers the whole run.
"""
from __future__ import annotations

import json
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from tqdm import tqdm

from heads import draft_vocab as draft_vocabulary
from selfspec.kernel.quantized import weight_count
from training import features as feature_data
from training import head_data
from training.flags import portable_record, settings_record
from training.head_settings import KINDS, HeadSettings, parse_args  # noqa: F401  (the command line's schema)
from training.recipes import Teacher, recipe_for
from training.schedule import warmup_cosine

CHECKPOINT_DIR = "checkpoint"  # accelerate's save_state: heads, optimizer, RNG, step
SETTINGS_NAME = "train_settings.json"
LOG_NAME = "train_log.json"
EVAL_RESERVE = 0.05  # share of --time-budget kept for the final evaluation and saving


class TrainState:
    """Where the run is; accelerate saves it with the checkpoint (`register_for_checkpointing`)."""

    def __init__(self):
        self.step, self.tokens_seen, self.train_seconds = 0, 0, 0.0

    def state_dict(self) -> dict:
        return {"step": self.step, "tokens_seen": self.tokens_seen, "train_seconds": self.train_seconds}

    def load_state_dict(self, state: dict) -> None:
        self.step, self.tokens_seen, self.train_seconds = state["step"], state["tokens_seen"], state["train_seconds"]


def load_base(settings: HeadSettings, device: torch.device):
    """The frozen base in eval mode (float32 on a CPU: see selfspec/loading.py)."""
    from selfspec.loading import load_model

    model = load_model(settings.model, device=device)
    model.requires_grad_(False)
    return model


def build_records(settings: HeadSettings, target, recipe, started: float, process_index: int = 0) -> tuple[list, list]:
    """(train records, held-out records) with the base's features, from --data / --chat / --self-generate; with the
    first layers' output too when the recipe trains an exit adapter."""
    exit_layer = getattr(recipe, "exit_layer", 0)
    needs_exit = exit_layer > 0
    records, heldout, text_rows = [], [], []
    chat_dirs = [d for d in settings.data if (Path(d) / "meta.json").is_file()]
    text_sources = tuple(d for d in settings.data if d not in chat_dirs)
    for directory in chat_dirs:
        records += _chat_records(directory, target)
    if settings.chat:
        from training.chat_data import ChatDataSettings, generate_records

        budget = settings.time_budget * settings.data_fraction - (time.time() - started) if settings.time_budget else 600
        chat = ChatDataSettings(model=settings.model, out=str(Path(settings.out) / "chat-data"), time_budget=budget,
                                seed=settings.seed + process_index,
                                feature_layers=tuple(str(l) for l in target.feature_layers))
        records += generate_records(chat, target.model)
    if text_sources or settings.self_generate:
        text_rows, heldout_rows = head_data.build_rows(settings, target.model, text_sources, process_index)
        heldout = feature_data.compute_records(target, heldout_rows, exit_layer, settings.batch_size)
        records += feature_data.compute_records(target, text_rows, exit_layer, settings.batch_size)
    if needs_exit and any("exit_hidden" not in r for r in records):  # chat data holds final features only
        records = feature_data.compute_records(target, [r["ids"] for r in records], exit_layer, 1)
    if not heldout:
        records, heldout = feature_data.split_records(records, settings.heldout_fraction)
    return records, heldout


def _chat_records(directory: str, target) -> list[dict]:
    from heads.checkpoint import BaseIdentity
    from training.chat_data import load_records, read_meta

    meta = read_meta(directory)
    recorded = BaseIdentity.from_dict(meta["base"])
    recorded.check_matches(BaseIdentity.of(target.model), f"the chat data in {directory!r}")
    layers = tuple(meta.get("feature_layers", ()))
    if layers != target.feature_layers:
        raise ValueError(f"the chat data in {directory!r} records feature layers {layers or '(none)'}, this run reads "
                         f"{target.feature_layers or '(none)'}: record it again with `python -m training.chat_data "
                         f"--feature-layers {' '.join(map(str, target.feature_layers)) or '...'}` or match --feature-layers")
    return load_records(directory)


def choose_draft_vocab(settings: HeadSettings, records: list[dict], vocab_size: int) -> torch.Tensor | None:
    """The --draft-vocab-size most frequent next tokens of the trained positions (the base's own outputs for --chat)."""
    if not settings.draft_vocab_size or settings.draft_vocab_size >= vocab_size:
        return None
    trained = (r["ids"][max(1, r["reply_start"]) :] for r in records)
    return draft_vocabulary.most_frequent(trained, vocab_size, settings.draft_vocab_size)


def run(settings: HeadSettings, progress_bar: bool = True, stop_after: int | None = None) -> dict:
    """Train (unless --eval-only) and evaluate; returns the final evaluation. stop_after (tests only) simulates an
    interrupted run: stop after that many optimizer steps, leaving only the checkpoints."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    from selfspec.target import TargetModel

    started = time.time()
    if settings.threads > 0:
        torch.set_num_threads(settings.threads)
    accelerator = Accelerator(mixed_precision=_mixed_precision(settings.mixed_precision))
    out = Path(settings.out)
    _check_resume(settings, out)
    model = load_base(settings, accelerator.device)
    target = TargetModel(model)
    if target.max_positions is not None and settings.seq_len > target.max_positions:
        raise ValueError(
            f"--seq-len {settings.seq_len} is longer than the model's context of {target.max_positions} positions "
            "(max_position_embeddings); lower --seq-len"
        )
    recipe = recipe_for(settings, target.num_layers)
    target.set_feature_layers(getattr(recipe, "feature_layers", ()))  # the records then carry them (EAGLE-3)
    records, heldout_records = build_records(settings, target, recipe, started, accelerator.process_index)
    data_seconds = time.time() - started
    train = feature_data.PositionStream(records, "the training data")
    eval_batches = feature_data.PositionStream(heldout_records, "the held-out data").fixed_batches(
        settings.eval_tokens, min(settings.seq_len, sum(len(r["ids"]) - 1 for r in heldout_records)), settings.batch_size)
    dtype = _train_dtype(model)
    eval_batches = [b.to(accelerator.device, dtype) for b in eval_batches]

    if settings.eval_only:
        if not (out / "config.json").is_file():
            raise FileNotFoundError(f"--eval-only: no heads in {settings.out!r}; train them first (drop --eval-only)")
        head = recipe.load_head(out, model).to(dtype)
        result = _evaluate(recipe, head, eval_batches, Teacher(target, getattr(head, "draft_vocab", None)))
        _write_eval(out, result, accelerator)
        return result

    if settings.init:  # warm start: the given heads (and their draft vocabulary) instead of fresh ones
        head = recipe.load_head(settings.init, model).to(dtype).train()
        draft_vocab = getattr(head, "draft_vocab", None)
    else:
        draft_vocab = choose_draft_vocab(settings, records, target.vocab_size)
        head = recipe.new_head(model, settings, draft_vocab).to(dtype)
        draft_vocab = getattr(head, "draft_vocab", draft_vocab)  # in the head's order ("eagle3" sorts its ids)
    teacher = Teacher(target, draft_vocab)
    num_params = sum(p.numel() for p in head.parameters())
    base_params = weight_count(model)  # weights kept as GGUF blocks are buffers, not parameters: counted too
    log = {
        "settings": settings_record(settings),
        "head_parameters": num_params,
        "base_parameters": base_params,
        "head_parameter_fraction": round(num_params / base_params, 4),
        "train_records": len(records),
        "train_positions_available": train.num_trained,
        "heldout_records": len(heldout_records),
        "data_seconds": round(data_seconds, 1),
    }
    if draft_vocab is not None:
        heldout_next = torch.cat([r["ids"][max(1, r["reply_start"]) :] for r in heldout_records])
        log["draft_vocab_size"] = len(draft_vocab)
        log["draft_vocab_heldout_coverage"] = round(draft_vocabulary.coverage(draft_vocab, heldout_next.long()), 4)
    if not settings.resume and accelerator.is_main_process:
        log["initial_eval"] = _evaluate(recipe, head, eval_batches, teacher)
    accelerator.print(
        f"{recipe.kind}: {num_params:,} trainable parameters ({100 * num_params / base_params:.1f}% of the base's "
        f"{base_params:,}); {train.num_trained:,} training positions from {len(records)} records; data "
        f"{data_seconds:.0f} s" + (f"; draft vocabulary {len(draft_vocab)} tokens covering "
                                   f"{log['draft_vocab_heldout_coverage']:.1%} of held-out next tokens" if draft_vocab is not None else ""),
        flush=True,
    )
    optimizer = torch.optim.AdamW(
        [p for p in head.parameters() if p.requires_grad], lr=settings.lr, betas=(0.9, 0.95), weight_decay=settings.weight_decay
    )
    head, optimizer = accelerator.prepare(head, optimizer)
    state = TrainState()
    accelerator.register_for_checkpointing(state)
    set_seed(settings.seed, device_specific=True)  # batch order; resume restores the RNG from the checkpoint
    if settings.resume:
        accelerator.load_state(str(out / CHECKPOINT_DIR))
        accelerator.print(f"resumed at step {state.step} ({state.train_seconds:.0f} s trained)")
    elif accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / SETTINGS_NAME).write_text(json.dumps(settings_record(settings), indent=2) + "\n")
        (out / LOG_NAME).write_text(json.dumps(log, indent=2) + "\n")  # a resumed run adds to it

    def save() -> None:
        accelerator.wait_for_everyone()
        accelerator.save_state(str(out / CHECKPOINT_DIR))
        if accelerator.is_main_process:
            accelerator.unwrap_model(head).save_pretrained(out)

    train_budget = settings.time_budget * (1 - EVAL_RESERVE) - (time.time() - started) if settings.time_budget else 0.0
    if settings.time_budget and train_budget <= 0:
        raise ValueError(f"--time-budget {settings.time_budget:.0f} s was spent before training (data took "
                         f"{data_seconds:.0f} s): raise it or lower --data-fraction")
    interrupted = train_loop(settings, accelerator, head, optimizer, state, recipe, teacher, train, save, progress_bar,
                             stop_after, train_budget, dtype)
    if interrupted:
        return {}
    save()
    log.update(steps=state.step, tokens_trained=state.tokens_seen, train_seconds=round(state.train_seconds, 1))
    result = _evaluate(recipe, accelerator.unwrap_model(head), eval_batches, teacher) if accelerator.is_main_process else {}
    log["wall_seconds"] = round(time.time() - started, 1)
    if accelerator.is_main_process:
        log["final_eval"] = result
        log_path = out / LOG_NAME
        if settings.resume and log_path.is_file():  # keep the first segment's initial evaluation
            log = {**json.loads(log_path.read_text()), **log}
        log_path.write_text(json.dumps(log, indent=2) + "\n")
        accelerator.print(f"trained on {state.tokens_seen:,} positions in {state.step} steps "
                          f"({state.train_seconds:.0f} s); whole run {log['wall_seconds']:.0f} s")
    _write_eval(out, result, accelerator)
    return result


def train_loop(settings, accelerator, head, optimizer, state, recipe, teacher, train, save, progress_bar, stop_after,
               train_budget, dtype) -> bool:
    """Optimizer steps until the budget is spent; True if stopped early by `stop_after`."""
    segment_started, trained_before = time.time(), state.train_seconds
    smoothed_loss, smoothed_top1 = None, None
    generator = torch.Generator()
    bar = tqdm(total=settings.max_steps or None, initial=state.step, unit="step", mininterval=2.0, desc="training",
               disable=not (progress_bar and accelerator.is_main_process))
    while True:
        state.train_seconds = trained_before + time.time() - segment_started
        progress = max(state.train_seconds / train_budget if train_budget > 0 else 0.0,
                       state.step / settings.max_steps if settings.max_steps > 0 else 0.0)
        if accelerator.num_processes > 1:  # the slowest clock decides, so processes stop together
            progress = accelerator.reduce(torch.tensor(progress, device=accelerator.device), "max").item()
        if progress >= 1.0:
            break
        lr = warmup_cosine(settings.lr, settings.warmup_steps, settings.min_lr_ratio, state.step, progress)
        for group in optimizer.param_groups:
            group["lr"] = lr
        generator.manual_seed((settings.seed * 1_000_003 + state.step) * 64 + accelerator.process_index)  # resumable
        for micro in range(settings.grad_accum):
            starts = train.window_starts(settings.batch_size, min(settings.seq_len, train.num_positions), generator)
            batch = train.batch(starts, min(settings.seq_len, train.num_positions)).to(accelerator.device, dtype)
            sync = nullcontext() if micro == settings.grad_accum - 1 else accelerator.no_sync(head)
            with sync, accelerator.autocast():
                loss, top1 = recipe.loss(head, batch, teacher)
                accelerator.backward(loss / settings.grad_accum)
        accelerator.clip_grad_norm_(head.parameters(), settings.grad_clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        state.step += 1
        state.tokens_seen += int(batch.trained.sum()) * settings.grad_accum * accelerator.num_processes
        smoothed_loss = _smooth(smoothed_loss, [loss.item()])
        smoothed_top1 = _smooth(smoothed_top1, top1)
        bar.update(1)
        elapsed = trained_before + time.time() - segment_started
        bar.set_postfix(loss=f"{smoothed_loss[0]:.3f}", top1="/".join(f"{a:.2f}" for a in smoothed_top1),
                        lr=f"{lr:.1e}", tok_s=f"{state.tokens_seen / max(elapsed, 1e-9):.0f}")
        if settings.save_every > 0 and state.step % settings.save_every == 0:
            state.train_seconds = elapsed
            save()
        if stop_after is not None and state.step >= stop_after:
            bar.close()
            return True
    bar.close()
    return False


def _smooth(previous: list[float] | None, values: list[float], keep: float = 0.95) -> list[float]:
    if previous is None:
        return list(values)
    return [keep * p + (1 - keep) * v for p, v in zip(previous, values)]


def _train_dtype(model) -> torch.dtype:
    """Heads train in float32 master weights (float64 kept for exact tests); autocast handles bf16/fp16."""
    dtype = model.get_output_embeddings().weight.dtype
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _mixed_precision(choice: str) -> str:
    if choice != "auto":
        return choice
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"


def _check_resume(settings: HeadSettings, out: Path) -> None:
    saved_path = out / SETTINGS_NAME
    if settings.resume:
        if not (out / CHECKPOINT_DIR).is_dir() or not saved_path.is_file():
            raise FileNotFoundError(f"--resume: no checkpoint in {out / CHECKPOINT_DIR}; start without --resume")
        saved = portable_record(json.loads(saved_path.read_text()))  # (a run written before paths were shortened)
        mine = settings_record(settings)
        ignored = {"resume", "eval_only", "threads"}
        differ = sorted(k for k in mine if k not in ignored and json.loads(json.dumps(mine[k])) != saved.get(k))
        if differ:
            raise ValueError(f"--resume continues the same run, but these settings differ from it: {', '.join(differ)}")
    elif not settings.eval_only and (out / CHECKPOINT_DIR).is_dir():
        raise FileExistsError(f"{out} already holds a run: pass --resume to continue it, or choose another --out")


def _evaluate(recipe, head, batches, teacher) -> dict:
    head = getattr(head, "module", head)
    head.eval()
    result = {"kind": recipe.kind, "heldout": recipe.evaluate(head, batches, teacher)}
    head.train()
    return result


def _write_eval(out: Path, result: dict, accelerator) -> None:
    if not accelerator.is_main_process:
        return
    out.mkdir(parents=True, exist_ok=True)
    (out / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    figures = result["heldout"]
    line = f"held-out: top-1 {figures['top1']}"
    if "mean_accepted_length" in figures:
        line += f", mean accepted length {figures['mean_accepted_length']} (teacher-forced)"
    print(line + f" ({figures['positions']:,} positions)", flush=True)


def main(argv: list[str] | None = None) -> None:
    run(parse_args(argv))


if __name__ == "__main__":
    main()
