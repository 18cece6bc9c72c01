"""llama.cpp as a contestant (`--llama-cpp`): plain decoding of the same GGUF file through llama-cpp-python, fed the
same token ids (the chat template applied by the benchmark, not by llama.cpp), for the same number of new tokens on
the same number of threads. Imported only when the flag is given. Knows nothing about schedules or reports.

Timed like every other method: wall clock around the whole call, prefill included (the context is reset before each
run, so no prompt prefix is reused from the previous one).
"""
from __future__ import annotations

from pathlib import Path

import torch

from selfspec.bench.methods import Method, Mode, Run, Timer
from selfspec.loading import resolve_model_path

INSTALL = 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python'
NAME = "llama.cpp"
CONTEXT = 1024  # positions: a held-out chat prompt (under 100 tokens) plus any sensible --max-new-tokens


def import_llama():
    """llama_cpp.Llama, or a one-line exit saying how to install it."""
    try:
        from llama_cpp import Llama
    except ImportError as err:
        raise SystemExit(f"selfspec.bench: --llama-cpp needs the llama-cpp-python package ({err}); install it with "
                         f"`{INSTALL}` (builds llama.cpp from source in minutes)") from None
    return Llama


def gguf_path(model: str) -> str:
    """The GGUF file llama.cpp reads: --model FILE.gguf or smollm2; a clear exit for anything else."""
    path = resolve_model_path(model)
    if not (Path(path).is_file() and Path(path).suffix.lower() == ".gguf"):
        raise SystemExit(f"selfspec.bench: --llama-cpp runs llama.cpp on the model's GGUF file, but {model} is not "
                         "one; pass --model FILE.gguf or --model smollm2, or leave --llama-cpp out")
    return path


def check(model: str) -> None:
    """Fail before anything loads: the package is missing or the model is not a GGUF file."""
    import_llama()
    gguf_path(model)


def llama_cpp_method(model: str, max_new_tokens: int, eos_token_id, threads: int, seed: int = 0) -> Method:
    """llama.cpp's own sampler: greedy at temperature 0; otherwise temperature and top-p alone (top-k, min-p,
    typical-p and the repetition penalty, which its API turns on by default, are switched off, as in the other
    methods' modes)."""
    llama = import_llama()(model_path=gguf_path(model), n_ctx=CONTEXT, n_threads=threads, n_threads_batch=threads,
                           seed=seed, verbose=False)
    stops = set(eos_token_id if isinstance(eos_token_id, list) else [] if eos_token_id is None else [eos_token_id])
    plain = dict(top_k=0, min_p=0.0, typical_p=1.0, repeat_penalty=1.0, frequency_penalty=0.0, presence_penalty=0.0)

    def run(prompt: torch.Tensor, mode: Mode, seed: int, max_new_tokens: int = max_new_tokens) -> Run:
        if mode.selfspec_only:
            raise ValueError("llama.cpp has no seed= that selfspec's seeded tokens could match: run it unseeded")
        options = {**plain, "temp": mode.temperature, "top_p": mode.top_p or 1.0} if mode.do_sample else {
            **plain, "temp": 0.0}
        llama.set_seed(seed % 2**32)
        llama.reset()  # no prefix reuse: every run pays its prefill, as the other methods do
        tokens = []
        with Timer(prompt.device) as timer:
            for token in llama.generate(prompt[0].tolist(), **options):
                tokens.append(int(token))
                if token in stops or len(tokens) == max_new_tokens:
                    break
        return Run(len(tokens), timer.seconds, tokens, len(tokens))  # one forward per token (the first: the prefill)

    return Method(NAME, "llama.cpp", run)
