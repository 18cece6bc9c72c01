"""What heads are compared with: the frozen base's one forward per batch, the training losses, and the evaluation.

All the offsets live here. With T tokens in a window and the base's post-norm hidden state h_t at position t:
- the base's logits at t score token t+1; `greedy[t]` is its argmax;
- Medusa head k (0-based) reads h_t and guesses token t+2+k; its distillation target is the base's own
  distribution for that token, i.e. the base's logits at position t+1+k; its next-token label is input t+2+k;
- an exit adapter reads the output of the first L layers at t and guesses token t+1, like the full model.
Knows the public parts of a causal LM (through `selfspec.target.TargetModel`) and the head modules; knows nothing
about files, optimizers or devices.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from selfspec.target import TargetModel

FINAL_NORM_NAMES = ("norm", "ln_f", "final_layernorm", "final_layer_norm")


@dataclass
class Teacher:
    """The frozen base's view of one batch, computed once under no_grad."""

    hidden: torch.Tensor  # [batch, T, hidden] post-norm last hidden state (what the LM head and Medusa heads read)
    logits: torch.Tensor  # [batch, T, vocab] the base's logits: position t scores token t+1
    exit_hidden: torch.Tensor | None = None  # [batch, T, hidden] output of the first L layers (pre-norm)


def final_norm(target: TargetModel) -> torch.nn.Module:
    """The decoder's final norm (the module between the last layer and the LM head), found by its public name."""
    for name in FINAL_NORM_NAMES:
        module = getattr(target.decoder, name, None)
        if isinstance(module, torch.nn.Module):
            return module
    raise TypeError(
        f"cannot find the final norm of {type(target.decoder).__name__} (looked for {', '.join(FINAL_NORM_NAMES)}); "
        "exit adapters need it. Please open an issue naming the model."
    )


@torch.no_grad()
def run_base(target: TargetModel, input_ids: torch.Tensor, exit_layer: int = 0) -> Teacher:
    """[batch, T] ids -> Teacher. exit_layer L > 0 also keeps `hidden_states[L]` (the first L layers' output)."""
    out = target.decoder(input_ids=input_ids, output_hidden_states=exit_layer > 0, use_cache=False)
    hidden = out.last_hidden_state
    exit_hidden = out.hidden_states[exit_layer] if exit_layer > 0 else None
    return Teacher(hidden, target.logits(hidden), exit_hidden)


def head_loss_weights(num_heads: int, decay: float) -> list[float]:
    """Medusa's per-head weights decay^k: far heads are harder and matter less (a chain rarely reaches them)."""
    return [decay**k for k in range(num_heads)]


def medusa_head_logits(heads, teacher: Teacher, target: TargetModel) -> Callable[[int, int], torch.Tensor]:
    """A function (k, n) -> head k's logits [batch, n, vocab] at positions 0..n-1 of the batch.

    The heads run once (one call of their forward, as data-parallel wrappers require). With a shared LM head an
    identity projection makes that call return the heads' hidden states [batch, T, K, hidden], and each head is
    projected through the base LM head only at the positions that have a target: the [batch, T, K, vocab] tensor
    and its backward (the memory-bound bulk of a CPU step) never exist.
    """
    if heads_share_lm_head(heads):
        states = heads(teacher.hidden, lambda x: x)  # [batch, T, K, hidden]
        return lambda k, n: target.logits(states[:, :n, k])
    logits = heads(teacher.hidden, target.logits)  # [batch, T, K, vocab]
    return lambda k, n: logits[:, :n, k]


def heads_share_lm_head(heads) -> bool:
    return getattr(heads, "module", heads).config.share_lm_head  # through a DistributedDataParallel wrapper


def medusa_loss(
    head_logits: Callable[[int, int], torch.Tensor], teacher: Teacher, input_ids: torch.Tensor, weights: list[float],
    labels: str = "distill",
) -> tuple[torch.Tensor, list[float]]:
    """(weighted loss, per-head top-1 agreement with the base's greedy token) for one batch.

    head_logits(k, n): head k's logits [batch, n, vocab] at positions 0..n-1 (see `medusa_head_logits`).
    labels="distill": soft cross-entropy against the base's distribution (self-distillation); "next-token":
    cross-entropy against the text.
    """
    T = teacher.logits.shape[1]
    greedy = teacher.logits.argmax(-1)  # [batch, T]
    target_probs = torch.softmax(teacher.logits.float(), dim=-1) if labels == "distill" else None  # once, not per head
    loss, agreement = teacher.logits.new_zeros((), dtype=torch.float32), []
    for k, weight in enumerate(weights):
        n = T - 1 - k if labels == "distill" else T - 2 - k  # positions t with a target inside the window
        student = head_logits(k, n).float()  # [batch, n, vocab]
        if labels == "distill":
            loss_k = soft_cross_entropy(student, target_probs=target_probs[:, 1 + k : 1 + k + n])
        else:
            loss_k = F.cross_entropy(student.flatten(0, 1), input_ids[:, 2 + k : 2 + k + n].flatten())
        loss = loss + weight * loss_k
        agreement.append((student.detach().argmax(-1) == greedy[:, 1 + k : 1 + k + n]).float().mean().item())
    return loss, agreement


def exit_adapter_logits(adapter, target: TargetModel, norm: torch.nn.Module, exit_hidden: torch.Tensor) -> torch.Tensor:
    """lm_head(final_norm(adapter(h_L))): [batch, T, hidden] -> [batch, T, vocab]."""
    return target.logits(norm(adapter(exit_hidden)))


def exit_adapter_loss(
    exit_logits: torch.Tensor, teacher: Teacher, input_ids: torch.Tensor, labels: str = "distill"
) -> tuple[torch.Tensor, list[float]]:
    """(loss, [top-1 agreement]) of the exit's next-token guess against the full model (or the text)."""
    student = exit_logits.float()
    if labels == "distill":
        loss = soft_cross_entropy(student, teacher.logits)
    else:
        loss = F.cross_entropy(student[:, :-1].flatten(0, 1), input_ids[:, 1:].flatten())
    return loss, [(student.argmax(-1) == teacher.logits.argmax(-1)).float().mean().item()]


def soft_cross_entropy(
    student_logits: torch.Tensor, teacher_logits: torch.Tensor | None = None, target_probs: torch.Tensor | None = None
) -> torch.Tensor:
    """Mean over positions of -sum_v softmax(teacher)_v * log_softmax(student)_v (KL to the teacher + a constant).

    Written as logsumexp(student) - <target_probs, student> (the probabilities sum to 1): the same value, without
    materialising log_softmax over the vocabulary, which on a CPU makes the step memory-bound.
    """
    if target_probs is None:
        target_probs = torch.softmax(teacher_logits.float(), dim=-1)
    return (torch.logsumexp(student_logits, dim=-1) - torch.linalg.vecdot(target_probs, student_logits)).mean()


# -- evaluation ------------------------------------------------------------------------------------------------


@torch.no_grad()
def evaluate_medusa(heads, target: TargetModel, windows: torch.Tensor, batch_size: int = 8, start: int = 0) -> dict:
    """Per head top-1 / top-5 agreement with the base's greedy token at that offset, and the mean accepted length
    of a greedy chain of all heads, over positions t in [start, T - K) of each [N, T] window.

    Mean accepted length = expected tokens per verify step = 1 + sum_k P(heads 0..k all match at t), from exact
    per-position greedy matches. When the windows are the base's own greedy continuation from `start` on, this is
    exactly what greedy decoding with these heads would see; on other text it is the teacher-forced estimate.
    """
    num_heads = heads.num_heads
    device = target.device
    top1 = torch.zeros(num_heads, dtype=torch.float64)
    top5 = torch.zeros(num_heads, dtype=torch.float64)
    chain = torch.zeros(num_heads, dtype=torch.float64)  # [K] count of positions where heads 0..k all match
    positions = 0
    for batch in windows.split(batch_size):
        teacher = run_base(target, batch.to(device))
        T = batch.shape[1]
        if T - num_heads <= start:
            raise ValueError(f"windows of {T} tokens leave no position past {start} for {num_heads} heads")
        greedy = teacher.logits.argmax(-1)  # [b, T]
        logits = heads(teacher.hidden[:, start : T - num_heads], target.logits)  # [b, n, K, vocab]
        n = logits.shape[1]
        wanted = torch.stack([greedy[:, start + 1 + k : start + 1 + k + n] for k in range(num_heads)], dim=-1)  # [b, n, K]
        matches = logits.argmax(-1) == wanted  # [b, n, K]
        in_top5 = (logits.topk(min(5, logits.shape[-1]), dim=-1).indices == wanted[..., None]).any(-1)
        top1 += matches.double().sum((0, 1)).cpu()
        top5 += in_top5.double().sum((0, 1)).cpu()
        chain += matches.long().cumprod(-1).double().sum((0, 1)).cpu()
        positions += matches.shape[0] * n
    return {
        "positions": positions,
        "top1": _rounded(top1 / positions),
        "top5": _rounded(top5 / positions),
        "chain_acceptance": _rounded(chain / positions),  # [k]: P(heads 0..k all accepted)
        "mean_accepted_length": round(1.0 + float(chain.sum() / positions), 4),
    }


@torch.no_grad()
def evaluate_exit_adapter(
    adapter, target: TargetModel, windows: torch.Tensor, exit_layer: int, batch_size: int = 8, start: int = 0
) -> dict:
    """Top-1 / top-5 agreement of lm_head(norm(adapter(h_L))) with the base's greedy next token, and the same for
    plain early exit (no adapter) for comparison, over positions t >= start."""
    norm = final_norm(target)
    counts = torch.zeros(4, dtype=torch.float64)  # adapter top1, top5, plain top1, plain top5
    positions = 0
    for batch in windows.split(batch_size):
        teacher = run_base(target, batch.to(device=target.device), exit_layer)
        greedy = teacher.logits.argmax(-1)[:, start:]  # [b, n]
        h = teacher.exit_hidden[:, start:]
        for i, logits in enumerate((exit_adapter_logits(adapter, target, norm, h), target.logits(norm(h)))):
            counts[2 * i] += (logits.argmax(-1) == greedy).double().sum().cpu()
            counts[2 * i + 1] += (logits.topk(5, dim=-1).indices == greedy[..., None]).any(-1).double().sum().cpu()
        positions += greedy.numel()
    top1, top5, plain1, plain5 = (counts / positions).tolist()
    return {
        "positions": positions,
        "top1": [round(top1, 4)],
        "top5": [round(top5, 4)],
        "plain_early_exit_top1": round(plain1, 4),
        "plain_early_exit_top5": round(plain5, 4),
    }


def _rounded(values: torch.Tensor) -> list[float]:
    return [round(float(v), 4) for v in values]
