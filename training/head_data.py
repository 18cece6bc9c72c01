"""Data for head training: text from files, directories, .jsonl or the stdlib corpus, split train / held-out,
tokenized into fixed-length windows; or sequences the base model writes itself.

Knows about files, token ids and calling a causal LM to continue tokens; knows nothing about heads or losses.
"""
from __future__ import annotations

import glob as globlib
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import torch

from training import corpus
from selfspec.hf_compat import cache_arg

STDLIB = "stdlib"  # --data stdlib: training.corpus's files, split exactly as the base model's training split them


@dataclass(frozen=True)
class Document:
    name: str  # what the held-out split hashes: a path, or path:line for a .jsonl record
    text: str
    path: Path | None = None  # the file, for documents that are whole files


def read_documents(sources: tuple[str, ...], pattern: str) -> list[Document]:
    """Each source: a text file, a directory (files matching the glob `pattern`), a .jsonl file with a "text"
    field per line, or "stdlib". Raises on a missing path or when nothing non-empty is found."""
    documents: list[Document] = []
    for source in sources:
        if source == STDLIB:
            documents += [Document(str(p), corpus.read_text(p), p) for p in corpus.stdlib_files()]
            continue
        path = Path(source)
        if path.is_dir():
            files = sorted(p for p in (Path(f) for f in globlib.glob(str(path / pattern), recursive=True)) if p.is_file())
            if not files:
                raise ValueError(f"--data {source}: no files match --glob {pattern!r} in this directory")
            documents += [_file_document(p) for p in files]
        elif path.is_file():
            documents += _jsonl_documents(path) if path.suffix == ".jsonl" else [_file_document(path)]
        else:
            raise FileNotFoundError(f"--data {source}: no such file or directory")
    documents = [d for d in documents if d.text.strip()]
    if not documents:
        raise ValueError(f"no text in --data {' '.join(sources)}: every file or record found is empty")
    return documents


def _file_document(path: Path) -> Document:
    return Document(str(path), corpus.read_text(path), path)


def _jsonl_documents(path: Path) -> list[Document]:
    documents = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not a JSON line ({err.msg})") from None
            if not isinstance(record, dict) or not isinstance(record.get("text"), str):
                raise ValueError(f"{path}:{number}: each .jsonl line needs a string field \"text\"")
            documents.append(Document(f"{path}:{number}", record["text"]))
    return documents


def split_documents(documents: list[Document], heldout_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, held-out) by a hash of each document's name. Whole files go through `corpus.split_files`, the
    rule the base model was trained with, so `--data stdlib` holds out exactly the base's held-out files."""
    files = [d for d in documents if d.path is not None]
    train_paths, _ = corpus.split_files([d.path for d in files], heldout_fraction) if files else ([], [])
    train_paths = set(train_paths)
    train, heldout = [], []
    for document in documents:
        if document.path is not None:
            is_train = document.path in train_paths
        else:
            digest = hashlib.sha256(document.name.encode("utf-8")).digest()
            is_train = int.from_bytes(digest[:8], "big") / 2**64 >= heldout_fraction
        (train if is_train else heldout).append(document)
    return train, heldout


def encode(tokenizer, documents: list[Document]) -> torch.Tensor:
    """One [num_tokens] stream: document, eos, document, eos, ... (no eos when the tokenizer has none)."""
    eos = tokenizer.eos_token_id
    stream: list[int] = []
    # verbose=False: whole files exceed model_max_length by design; they are cut into windows later
    encodings = tokenizer([d.text for d in documents], add_special_tokens=False, verbose=False)["input_ids"]
    for ids in encodings:
        stream.extend(ids)
        if eos is not None:
            stream.append(eos)
    return torch.tensor(stream, dtype=torch.long)


class Windows:
    """Fixed-length training windows: random slices of one token stream, or the rows of [N, seq_len] sequences."""

    def __init__(self, tokens: torch.Tensor, seq_len: int, what: str = "the data"):
        self.tokens = tokens  # [num_tokens] a stream, or [N, seq_len] ready sequences
        self.seq_len = seq_len
        if tokens.dim() == 1 and len(tokens) < seq_len:
            raise ValueError(
                f"{what} has {len(tokens)} tokens, fewer than one window of --seq-len {seq_len}: add text or lower --seq-len"
            )
        if tokens.dim() == 2 and (len(tokens) == 0 or tokens.shape[1] != seq_len):
            raise ValueError(f"{what}: need at least one sequence of {seq_len} tokens, got shape {tuple(tokens.shape)}")

    @property
    def num_tokens(self) -> int:
        return self.tokens.numel()

    def batch(self, batch_size: int, generator: torch.Generator | None = None) -> torch.Tensor:
        """[batch_size, seq_len] drawn with torch's global RNG (seeded per process; saved and restored on resume)."""
        if self.tokens.dim() == 2:
            rows = torch.randint(0, len(self.tokens), (batch_size,), generator=generator)
            return self.tokens[rows]
        starts = torch.randint(0, len(self.tokens) - self.seq_len + 1, (batch_size,), generator=generator)
        return torch.stack([self.tokens[s : s + self.seq_len] for s in starts.tolist()])

    def fixed(self, num_tokens: int) -> torch.Tensor:
        """[count, seq_len] evenly spaced, non-overlapping windows covering ~num_tokens: the same every time."""
        available = len(self.tokens) if self.tokens.dim() == 2 else len(self.tokens) // self.seq_len
        count = max(1, min(num_tokens // self.seq_len, available))
        if self.tokens.dim() == 2:
            return self.tokens[torch.linspace(0, len(self.tokens) - 1, count).long()]
        stride = (len(self.tokens) - self.seq_len) // max(count - 1, 1)
        return torch.stack([self.tokens[i * stride : i * stride + self.seq_len] for i in range(count)])


def tail_split(tokens: torch.Tensor, heldout_fraction: float, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """When whole documents cannot be held out (one file, or all hash to one side): the last fraction of the
    stream, at least one window, is held out."""
    heldout = max(seq_len, int(len(tokens) * heldout_fraction))
    if len(tokens) - heldout < seq_len:
        raise ValueError(
            f"the data has {len(tokens)} tokens: too few for a training window and a held-out window of "
            f"--seq-len {seq_len}; add text, lower --seq-len, or pass --eval-data"
        )
    return tokens[:-heldout], tokens[-heldout:]


def build_rows(settings, model, sources: tuple[str, ...], process_index: int = 0) -> tuple[list, list]:
    """(train rows, held-out rows) of --seq-len ids from text `sources` / --eval-data / --self-generate; training
    rows are capped at --feature-tokens (each row gets base features once)."""
    train_tokens = heldout_tokens = None
    if sources:
        from selfspec.loading import load_tokenizer

        tokenizer = load_tokenizer(settings.tokenizer or settings.model)
        documents = read_documents(sources, settings.glob)
        if settings.eval_data:
            train_docs, heldout_docs = documents, read_documents(settings.eval_data, settings.glob)
        else:
            train_docs, heldout_docs = split_documents(documents, settings.heldout_fraction)
        if train_docs and heldout_docs:
            train_tokens = encode(tokenizer, train_docs)
            heldout_tokens = encode(tokenizer, heldout_docs)
        else:
            train_tokens, heldout_tokens = tail_split(
                encode(tokenizer, documents), settings.heldout_fraction, settings.seq_len
            )
        _check_vocab(train_tokens, model)
    max_rows = max(1, settings.feature_tokens // settings.seq_len)
    if settings.self_generate > 0:
        generator = torch.Generator().manual_seed(settings.seed * 1000 + process_index)
        train = list(self_generate(settings, model, settings.self_generate, train_tokens, generator))
        if heldout_tokens is None:  # no text at all: hold out sequences the base writes from another seed
            generator = torch.Generator().manual_seed(settings.seed * 1000 + 999_983)
            count = max(1, settings.eval_tokens // settings.seq_len)
            heldout_tokens = self_generate(settings, model, count, None, generator)
    else:
        windows = Windows(train_tokens, settings.seq_len, "the training split of --data")
        train = list(windows.fixed(max_rows * settings.seq_len))  # evenly spaced, non-overlapping
    heldout = Windows(heldout_tokens, settings.seq_len, "the held-out text")
    return train[:max_rows], list(heldout.fixed(settings.eval_tokens))


def self_generate(settings, model, count: int, text_tokens, generator) -> torch.Tensor:
    """[count, seq_len] continuations by the base of --prompt-len tokens of text (or of its bos/eos token)."""
    temperature = settings.self_generate_temperature
    if text_tokens is not None:
        prompts = Windows(text_tokens, settings.prompt_len).batch(count, generator)
        temperature = 0.0 if temperature is None else temperature
    else:
        temperature = 1.0 if temperature is None else temperature
        if temperature <= 0:
            raise ValueError(
                "greedy self-generation from nothing writes the same sequence every time: pass --data for prompts "
                "or set --self-generate-temperature > 0"
            )
        start = model.config.bos_token_id if model.config.bos_token_id is not None else model.config.eos_token_id
        if start is None:
            raise ValueError("the model names no bos or eos token to start generating from: pass --data for prompts")
        prompts = torch.full((count, 1), int(start), dtype=torch.long)
    return continue_tokens(model, prompts, settings.seq_len - prompts.shape[1], temperature, generator)


def _check_vocab(tokens: torch.Tensor, model) -> None:
    vocab = model.get_output_embeddings().weight.shape[0]
    if len(tokens) and int(tokens.max()) >= vocab:
        raise ValueError(f"the tokenizer produced id {int(tokens.max())}, outside the model's {vocab} tokens: "
                         "pass the model's own tokenizer with --tokenizer")


@torch.no_grad()
def continue_tokens(
    model, prompts: torch.Tensor, num_new: int, temperature: float = 0.0, generator: torch.Generator | None = None,
    batch_size: int = 64,
) -> torch.Tensor:
    """[N, P] prompts -> [N, P + num_new]: the base's own continuation, greedy (temperature 0) or sampled.

    A plain loop over a DynamicCache rather than `generate`, so nothing stops at eos or pads: each row is exactly
    what the model would write next, which is what the heads must learn to guess.
    """
    from transformers import DynamicCache

    device = model.get_output_embeddings().weight.device
    out = []
    for chunk in prompts.split(batch_size):
        ids = chunk.to(device)
        cache = DynamicCache(config=model.config)
        logits = model(input_ids=ids, **cache_arg(cache), use_cache=True, logits_to_keep=1).logits[:, -1]  # [n, vocab]
        pieces = [ids]
        for step in range(num_new):
            if temperature > 0:
                probs = torch.softmax(logits.float() / temperature, dim=-1)
                next_ids = torch.multinomial(probs.cpu(), 1, generator=generator).to(device)  # [n, 1]
            else:
                next_ids = logits.argmax(-1, keepdim=True)
            pieces.append(next_ids)
            if step + 1 < num_new:
                logits = model(input_ids=next_ids, **cache_arg(cache), use_cache=True).logits[:, -1]
        out.append(torch.cat(pieces, dim=1).cpu())
    return torch.cat(out)
