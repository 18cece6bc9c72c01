"""The training corpus: Python standard library source, split by file, and its byte-level BPE tokenizer.

Knows about files, text and token ids; knows nothing about models or training loops.

What is in the corpus and why:
- Every ``.py`` file under ``sysconfig.get_paths()["stdlib"]`` (the interpreter running this code).
- EXCLUDED: ``site-packages`` (third-party code, differs per machine, so the corpus would not be
  reproducible) and all test code: directories named ``test``, ``tests`` or ``idle_test`` (``test/``,
  ``idlelib/idle_test``, ``lib2to3/tests``, ``unittest/test``, ...) and files named ``test_*.py`` or
  ``*_test.py``. About 60 % of the stdlib's bytes are its own tests; a small model trained on them
  spends its capacity on ``self.assertEqual(...)`` and writes it all day. Without them the corpus is
  about 11 MB of ordinary library code in ~730 files (CPython 3.11: 692 train, 41 held out, 2.9M
  training tokens with the 8192-token tokenizer).
- EXCLUDED: ``pydoc_data/topics.py``, one ~0.7 MB string literal of English documentation, not code.

Train / held-out is split BY FILE with a hash of the file's path relative to the stdlib root, so the
split is the same on every machine and run, and no held-out file (nor any part of one) is trained on,
including by the tokenizer. Prompts for benchmarks come from held-out files only.
"""

from __future__ import annotations

import hashlib
import os
import random
import sysconfig
from pathlib import Path

EOS_TOKEN = "<|endoftext|>"  # end of a document; also separates documents in the training stream
DEFAULT_VOCAB_SIZE = 8192
DEFAULT_HELDOUT_FRACTION = 0.05

_TEST_DIRS = frozenset({"test", "tests", "idle_test"})
_EXCLUDED_FILES = frozenset({"pydoc_data/topics.py"})


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def is_test_path(rel_path: str) -> bool:
    """True for test code: under a test directory, or a file named test_*.py / *_test.py."""
    parts = rel_path.split("/")
    name = parts[-1]
    return (
        any(part in _TEST_DIRS for part in parts[:-1])
        or name.startswith("test_")
        or name.endswith("_test.py")
    )


def stdlib_files(root: Path | None = None) -> list[Path]:
    """All corpus files (see the module docstring for what is excluded), sorted by relative path."""
    root = Path(root) if root is not None else stdlib_root()
    files = []
    for path in root.rglob("*.py"):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] == "site-packages" or "__pycache__" in rel:
            continue
        if is_test_path(rel) or rel in _EXCLUDED_FILES or not path.is_file():
            continue
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _heldout_score(rel_path: str) -> float:
    """A number in [0, 1) fixed by the path alone (sha256, so no PYTHONHASHSEED dependence)."""
    digest = hashlib.sha256(rel_path.encode("utf-8")).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def split_files(
    files: list[Path], heldout_fraction: float = DEFAULT_HELDOUT_FRACTION, root: Path | None = None
) -> tuple[list[Path], list[Path]]:
    """(train, heldout): a file is held out when the hash of its path relative to root is < fraction.

    Paths outside root (e.g. a test's temporary corpus) are hashed by their path relative to their
    common parent, so the split never depends on where a checkout or temp dir happens to live.
    """
    root = Path(root) if root is not None else stdlib_root()
    outside = [p for p in files if not p.is_relative_to(root)]
    fallback_root = _common_parent(outside) if outside else root
    train, heldout = [], []
    for path in files:
        rel = path.relative_to(root if path.is_relative_to(root) else fallback_root).as_posix()
        (heldout if _heldout_score(rel) < heldout_fraction else train).append(path)
    return train, heldout


def _common_parent(files: list[Path]) -> Path:
    return Path(os.path.commonpath([str(p.parent) for p in files]))


def read_text(path: Path) -> str:
    # A few stdlib files are Latin-1 or contain stray bytes; replacing them keeps byte-level BPE honest.
    return path.read_text(encoding="utf-8", errors="replace")


def heldout_prompts(
    n: int,
    prompt_chars: int = 400,
    seed: int = 0,
    heldout_fraction: float = DEFAULT_HELDOUT_FRACTION,
    root: Path | None = None,
) -> list[str]:
    """n deterministic code prompts from held-out files, each starting at a `def `/`class ` line.

    Each prompt is about prompt_chars characters, cut back to the end of a line so it does not stop
    mid-identifier. Candidates are every top-level or nested def/class line whose remaining file text
    is long enough; the same (n, prompt_chars, seed) always gives the same list.
    """
    files = stdlib_files(root)
    _, heldout = split_files(files, heldout_fraction, root)
    candidates = []  # [(file index, char offset of the def/class line)]
    texts = [read_text(p) for p in heldout]
    for file_index, text in enumerate(texts):
        offset = 0
        for line in text.splitlines(keepends=True):
            stripped = line.lstrip()
            if (stripped.startswith("def ") or stripped.startswith("class ")) and len(text) - offset >= prompt_chars:
                candidates.append((file_index, offset))
            offset += len(line)
    if len(candidates) < n:
        raise ValueError(f"only {len(candidates)} held-out prompts of {prompt_chars} chars, asked for {n}")
    chosen = random.Random(seed).sample(candidates, n)
    prompts = []
    for file_index, offset in chosen:
        piece = texts[file_index][offset : offset + prompt_chars]
        cut = piece.rfind("\n")
        prompts.append(piece[: cut + 1] if cut > prompt_chars // 2 else piece)
    return prompts


def train_tokenizer(files: list[Path], vocab_size: int = DEFAULT_VOCAB_SIZE):
    """A byte-level BPE (GPT-2 style, no prefix space) trained on files, as a PreTrainedTokenizerFast.

    `<|endoftext|>` is id 0 and is the eos, pad and document separator. Save it with save_pretrained;
    AutoTokenizer.from_pretrained(dir) then loads it.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is ever unknown
        show_progress=False,
    )
    tokenizer.train_from_iterator((read_text(p) for p in files), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        eos_token=EOS_TOKEN,
        pad_token=EOS_TOKEN,
        model_max_length=1024,
    )


def encode_files(tokenizer, files: list[Path]) -> list[int]:
    """One token stream: file, eos, file, eos, ... (the order of files, which callers keep sorted)."""
    eos = tokenizer.convert_tokens_to_ids(EOS_TOKEN)
    backend = tokenizer.backend_tokenizer  # the raw `tokenizers` object: batch encoding in Rust
    stream: list[int] = []
    texts = [read_text(p) for p in files]
    for encoding in backend.encode_batch(texts, add_special_tokens=False):
        stream.extend(encoding.ids)
        stream.append(eos)
    return stream
