"""The base's outputs, computed once: records of token ids with the base's final hidden states, and the stream of
training positions built from them.

A record is {"ids": [T] (prompt + text), "hidden": [T - 1, H] post-norm hidden states at positions 0..T-2 (position t
predicts token t+1; [T - 1, (1 + n) H] with the target's n feature layers after them, `TargetModel.set_feature_layers`), "reply_start": first id whose prediction is trained on, optional "exit_hidden": [T - 1, H] the
first L layers' output}. Chat data (`training/chat_data.py`) records hidden states while the base writes; text
windows get them from one no-grad forward each here. Everything a head learns from (its inputs, the base's
distribution over a draft vocabulary) is a function of these tensors, so training never runs the base again.
Knows about the base's decoder and tensors; nothing about heads or losses.
"""
from __future__ import annotations

import time
import zlib
from dataclasses import dataclass

import torch
from tqdm import tqdm


@torch.no_grad()
def compute_records(target, rows: list[torch.Tensor], exit_layer: int = 0, batch_size: int = 8,
                    progress: bool = True) -> list[dict]:
    """[T] id rows (equal lengths batch together) -> records, running the frozen base once per batch."""
    records, started, done = [], time.perf_counter(), 0
    bar = tqdm(total=sum(len(r) for r in rows), desc="base features", unit="tok", disable=not progress, mininterval=2)
    for first in range(0, len(rows), batch_size):
        chunk = rows[first : first + batch_size]
        width = min(len(r) for r in chunk)
        ids = torch.stack([r[:width] for r in chunk]).long().to(target.device)
        out = target.decoder(input_ids=ids, output_hidden_states=exit_layer > 0 or bool(target.feature_layers),
                             use_cache=False)
        states = target.states(out)  # [B, T, H], or [B, T, (1 + n) H] with the target's feature layers
        for i in range(len(chunk)):
            record = {"ids": ids[i].cpu().to(torch.int32), "hidden": states[i, :-1].cpu(), "reply_start": 1}
            if exit_layer > 0:
                record["exit_hidden"] = out.hidden_states[exit_layer][i, :-1].cpu()
            records.append(record)
        done += ids.numel()
        bar.update(ids.numel())
        bar.set_postfix(tok_s=f"{done / (time.perf_counter() - started):.0f}")
    bar.close()
    return records


def split_records(records: list[dict], heldout_fraction: float) -> tuple[list[dict], list[dict]]:
    """(train, held-out) by a hash of each record's ids, so a record's side never depends on the others."""
    train, heldout = [], []
    for record in records:
        score = zlib.crc32(record["ids"].numpy().tobytes()) / 2**32
        (heldout if score < heldout_fraction else train).append(record)
    if not train or not heldout:  # too few records for a hash split: hold out the last one
        train, heldout = records[:-1], records[-1:]
    return train, heldout


@dataclass
class Batch:
    """Windows of consecutive training positions; position t's target is at t+1 of the same record."""

    features: torch.Tensor  # [B, L, H] h_t, the base's post-norm hidden state
    next_ids: torch.Tensor  # [B, L] x_{t+1}, the token after position t
    record: torch.Tensor  # [B, L] which record position t belongs to (a window may cross records)
    trained: torch.Tensor  # [B, L] position t's next token is in a reply / text (not the chat prompt)
    exit_features: torch.Tensor | None = None  # [B, L, H] the first L layers' output at t

    def same_record(self, offset: int) -> torch.Tensor:
        """[B, L - offset]: position t and t + offset lie in one record (so a target `offset` ahead exists)."""
        return self.record[:, offset:] == self.record[:, : self.record.shape[1] - offset]

    def to(self, device, dtype) -> "Batch":
        exit_features = None if self.exit_features is None else self.exit_features.to(device, dtype)
        return Batch(self.features.to(device, dtype), self.next_ids.to(device), self.record.to(device),
                     self.trained.to(device), exit_features)


class PositionStream:
    """All records' positions laid end to end; `batch` draws random windows of `seq_len` positions."""

    def __init__(self, records: list[dict], what: str = "the data"):
        if not records:
            raise ValueError(f"{what} holds no records")
        self.features = torch.cat([r["hidden"] for r in records])  # [N, H] kept in its stored dtype (float16 for chat data)
        self.next_ids = torch.cat([r["ids"][1:].long() for r in records])  # [N]
        self.record = torch.cat([torch.full((len(r["ids"]) - 1,), i, dtype=torch.int32) for i, r in enumerate(records)])
        self.trained = torch.cat([torch.arange(1, len(r["ids"])) >= r["reply_start"] for r in records])
        has_exit = all("exit_hidden" in r for r in records)
        self.exit_features = torch.cat([r["exit_hidden"] for r in records]) if has_exit else None
        self.what = what

    @property
    def num_positions(self) -> int:
        return self.features.shape[0]

    @property
    def num_trained(self) -> int:
        return int(self.trained.sum())

    def window_starts(self, count: int, seq_len: int, generator: torch.Generator | None = None) -> torch.Tensor:
        if self.num_positions < seq_len:
            raise ValueError(f"{self.what} has {self.num_positions} positions: fewer than one window of --seq-len {seq_len}")
        return torch.randint(0, self.num_positions - seq_len + 1, (count,), generator=generator)

    def batch(self, starts: torch.Tensor, seq_len: int) -> Batch:
        index = starts[:, None] + torch.arange(seq_len)  # [B, L]
        exit_features = None if self.exit_features is None else self.exit_features[index]
        return Batch(self.features[index], self.next_ids[index], self.record[index], self.trained[index], exit_features)

    def fixed_batches(self, num_positions: int, seq_len: int, batch_size: int) -> list[Batch]:
        """Evenly spaced, non-overlapping windows covering up to `num_positions` (the same ones every evaluation)."""
        count = max(1, min(num_positions, self.num_positions) // seq_len)
        starts = torch.linspace(0, self.num_positions - seq_len, count).long()
        return [self.batch(chunk, seq_len) for chunk in starts.split(batch_size)]
