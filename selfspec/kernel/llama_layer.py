"""A Llama decoder layer in two calls of the kernel (`llama_layer.c`) where all its products run on the int8 backend:
`attention_in` (input norm, the q / k / v products, rotary) and `attention_out` (attention in the kernel's fixed
order, the o product, the residual, the post-attention norm, the gate / up products, SiLU, the down product, the
residual). A decode step's Python then makes two calls a layer instead of ~20 tensor operations and four products
(SmolLM2: ~8 ms of a ~16 ms one-token forward on one thread), and each call is one parallel region, so two threads
split a layer's whole work rather than each product alone.

The norms, rotary and SiLU are the kernel's float operations, not PyTorch's: the layer computes the GGUF model as
llama.cpp does (whose int8 activations already part from the dequantized float32 model's), not bit for bit what
`transformers`' modules compute over the same products. Every row is computed alone by the same code, so drafting
stays exact against it: the engine takes it for every forward of a model it applies to (decode, verify, trees,
batches, early exit's partial forwards). Knows a layer's modules and the kernel's entry points; nothing about caches
or drafts."""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch

from selfspec.kernel import few_row_linear, int8
from selfspec.kernel.quantized import QuantizedLinear


@lru_cache(maxsize=None)
def _entry_points(isa: str | None):
    library = few_row_linear._kernel_library() if isa is None else few_row_linear._built_library(isa)[0]
    if library is None:
        raise RuntimeError(f"selfspec's kernel is unavailable: {few_row_linear.unavailable_reason()}")
    p, n, i, f = ctypes.c_void_p, ctypes.c_long, ctypes.c_int, ctypes.c_float
    attention_in, attention_out = library.llama_attention_in, library.llama_attention_out
    attention_in.argtypes = [i, n, n, n, p, p, f, i, p, i, p, i, p, n, n, n, p, p, p, p, p]
    attention_out.argtypes = [i, n, n, n, p, p, n, n, p, p, n, n, n, n, n, n, n, n, p, f, i, p, p, f, n, i, p, i, p,
                              i, p]
    attention_in.restype = attention_out.restype = ctypes.c_int
    return attention_in, attention_out


def _products(layer) -> tuple:
    """A decoder layer's seven products, in the order the kernel's calls take them."""
    attn, mlp = layer.self_attn, layer.mlp
    return attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj


def _check(status: int, call: str) -> None:
    if status:
        raise RuntimeError(f"the kernel's {call} failed ({status})")


class KernelLayer:
    """One decoder layer's weights as the kernel reads them (see the module). Build with `KernelLayer.of(...)`."""

    # the build ("avx2" / "avx512"; None: the one this CPU takes) and int8 path (`int8.INT8_PATHS`; None: the best
    # this CPU has) the calls take: tests run every one
    isa: str | None = None
    path: str | None = None

    def __init__(self, layer):
        attn, mlp = layer.self_attn, layer.mlp
        self.linears = _products(layer)
        self.input_norm, self.post_norm = layer.input_layernorm, layer.post_attention_layernorm
        self.heads = attn.q_proj.out_features // attn.head_dim
        self.kv_heads = attn.k_proj.out_features // attn.head_dim
        self.head_dim, self.scaling = attn.head_dim, float(attn.scaling)
        self.intermediate = mlp.gate_proj.out_features

    @classmethod
    def of(cls, layer) -> "KernelLayer | None":
        """The layer where the kernel takes it (every product a quantized layer without bias, of whole groups of eight
        output rows and whole blocks of input; float32 norms), else None. Each product may hold its own type (a
        Q4_K_M file mixes them). Whether they run on the int8 backend now is `active()`'s question, asked at every
        forward."""
        if few_row_linear._kernel_library() is None:
            return None
        for linear in _products(layer):
            if (type(linear) is not QuantizedLinear or linear.bias is not None or linear.out_features % int8.GROUP_ROWS
                    or linear.in_features % 32):
                return None
        norms = (layer.input_layernorm.weight, layer.post_attention_layernorm.weight)
        if any(w.dtype is not torch.float32 or not w.is_contiguous() for w in norms) or layer.self_attn.head_dim % 8:
            return None
        return cls(layer)

    def active(self) -> bool:
        """Whether every product of the layer runs on the int8 backend, its weights interleaved (the backend may be
        chosen after the forward was built)."""
        return all(linear._backend == "int8" and linear._weight.interleaved for linear in self.linears)

    def _path_code(self) -> int:
        return -1 if self.path is None else int8.INT8_PATHS.index(self.path)

    def attention_in(self, hidden: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """hidden [B, W, hidden] contiguous float32, cos / sin [B, W, head_dim] contiguous -> (q [B, H, W, D], k and v
        [B, Hkv, W, D]): the keys and values of these positions, for the cache."""
        B, W, width = hidden.shape
        D = self.head_dim
        q = hidden.new_empty((B, self.heads, W, D))
        k, v = hidden.new_empty((2, B, self.kv_heads, W, D))
        wq, wk, wv = (linear._weight for linear in self.linears[:3])  # (read now: a backend change replaces them)
        _check(_entry_points(self.isa)[0](
            self._path_code(), B, W, width, hidden.data_ptr(), self.input_norm.weight.data_ptr(),
            self.input_norm.variance_epsilon, wq.qtype, wq.blocks.data_ptr(), wk.qtype, wk.blocks.data_ptr(),
            wv.qtype, wv.blocks.data_ptr(), self.heads, self.kv_heads, D,
            cos.data_ptr(), sin.data_ptr(), q.data_ptr(), k.data_ptr(), v.data_ptr()), "llama_attention_in")
        return q, k, v

    def attention_out(self, hidden: torch.Tensor, q: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      visible: torch.Tensor | None) -> None:
        """The rest of the layer on hidden [B, W, hidden] (contiguous float32, updated in place), from q and the
        cache's keys / values [B, Hkv, L, D] (rows contiguous); visible [B, W, L] uint8 or None (causal)."""
        B, W, width = hidden.shape
        wo, wgate, wup, wdown = (linear._weight for linear in self.linears[3:])
        if key.stride(-1) != 1 or value.stride(-1) != 1:
            key, value = key.contiguous(), value.contiguous()
        _check(_entry_points(self.isa)[1](
            self._path_code(), B, W, width, hidden.data_ptr(), q.data_ptr(), self.heads, self.head_dim, key.data_ptr(),
            value.data_ptr(), self.kv_heads, key.shape[2], *key.stride()[:3], *value.stride()[:3],
            None if visible is None else visible.data_ptr(), self.scaling, wo.qtype, wo.blocks.data_ptr(),
            self.post_norm.weight.data_ptr(), self.post_norm.variance_epsilon, self.intermediate, wgate.qtype,
            wgate.blocks.data_ptr(), wup.qtype, wup.blocks.data_ptr(), wdown.qtype, wdown.blocks.data_ptr()),
            "llama_attention_out")
