"""Linear layers and embeddings whose weights stay GGUF blocks (Q8_0, Q4_0, Q4_1) in memory, for float32 on a CPU.

A one-token decode on a CPU is bound by the bytes of weights it reads: dequantized to float32, a Q4_1 model streams
32 bits a weight where its file holds 5. Here the weight rows stay as the file's blocks (a uint8 buffer [out, bytes a
row]) and the few-row kernel (`few_row_linear.c`, its quantized entry points) dequantizes them in registers for
products over 1..MAX_ROWS rows; more rows (a prefill) dequantize a chunk of weight rows at a time into F.linear,
where BLAS's GEMM is the faster path. Every weight is the float32 value gguf's dequantizer (and so transformers'
GGUF loading) gives, so a layer's function is the dequantized layer's up to the order of float32 additions.

Two backends compute a layer's products over the blocks (`QuantizedLinear(backend=...)`, or
$SELFSPEC_QUANTIZED_BACKEND; `backends.py`): "float", as above, and "int8", llama.cpp's method (`int8.py`: activations
rounded to int8 per block of 32, integer dot products); "auto", the default, takes int8 where it measures clearly
faster on this machine.

`QuantizedWeight` stands where code reads a layer's `.weight` (shape, dtype, device; rows by indexing, dequantized
on demand; other tensor uses dequantize the whole weight, a rare cost). It knows nothing of GGUF files or models:
`selfspec/loading.py` builds these modules from a file's blocks.
"""
from __future__ import annotations

import ctypes
from functools import lru_cache

import torch
import torch.nn.functional as F

from selfspec.kernel import few_row_linear, int8
from selfspec.kernel.backends import resolve_backend
from selfspec.kernel.int8 import int8_linear

# GGML type ids (gguf.GGMLQuantizationType) -> bytes of one block of BLOCK_WEIGHTS weights along a row (the kernel's
# own table, tested equal). Q4_0, Q4_1, Q5_0, Q8_0: the file's blocks (gguf.GGML_QUANT_SIZES). Q4_K, Q6_K: a K-quant's
# weights re-blocked exactly into blocks of 32 (`reblock.reblocked`: float32 scales; not the file's super-blocks).
TYPES = {"Q4_0": 2, "Q4_1": 3, "Q5_0": 6, "Q8_0": 8, "Q4_K": 12, "Q6_K": 14}
BLOCK_BYTES = {2: 18, 3: 20, 6: 22, 8: 34, 12: 24, 14: 40}
# The scales opening a block: (how many, bytes each: 2 float16, 4 float32), d first (then Q4_1's and Q4_K's m,
# Q6_K's second half-block's d); Q5_0's 4 bytes of fifth bits follow its d.
BLOCK_SCALES = {2: (1, 2), 3: (2, 2), 6: (1, 2), 8: (1, 2), 12: (2, 4), 14: (2, 4)}
FIFTH_BITS = {6: 4}
BLOCK_WEIGHTS = 32
MAX_ROWS = few_row_linear.MAX_ROWS
# Weights dequantized at a time for products over more than MAX_ROWS rows (and whole-weight uses): 16 MB of float32.
CHUNK_WEIGHTS = 1 << 22


def header_fields(qtype: int) -> list[int]:
    """The bytes of each field opening a block of type `qtype`, in order (its scales, then Q5_0's fifth bits)."""
    count, size = BLOCK_SCALES[qtype]
    return [size] * count + ([FIFTH_BITS[qtype]] if qtype in FIFTH_BITS else [])


def unavailable_reason() -> str | None:
    """None when the quantized kernel is built and loaded here, else why not."""
    return few_row_linear.unavailable_reason()


@lru_cache(maxsize=1)
def _entry_points():
    """(quantized_linear, dequantize_rows, dequantize_interleaved_rows) of the kernel's library; raises where it is
    unavailable."""
    library = few_row_linear._kernel_library()
    if library is None:
        raise RuntimeError(f"selfspec's quantized kernel is unavailable: {unavailable_reason()}")
    linear, rows, grouped_rows = library.quantized_linear, library.dequantize_rows, library.dequantize_interleaved_rows
    linear.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                       ctypes.c_void_p]
    rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_void_p, ctypes.c_long, ctypes.c_long,
                     ctypes.c_void_p]
    grouped_rows.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p,
                             ctypes.c_long, ctypes.c_void_p]
    linear.restype = rows.restype = grouped_rows.restype = ctypes.c_int
    return linear, rows, grouped_rows


def random_weight(qtype: int | str, out_features: int, in_features: int, seed: int = 0) -> "QuantizedWeight":
    """A QuantizedWeight of random integers with finite scales (for timings and tests; not gguf's quantizer's)."""
    qtype = type_id(qtype)
    generator = torch.Generator().manual_seed(seed)
    blocks = torch.randint(0, 256, (out_features, in_features // BLOCK_WEIGHTS, BLOCK_BYTES[qtype]), dtype=torch.uint8,
                           generator=generator)
    count, size = BLOCK_SCALES[qtype]  # (the scales opening each block: finite values)
    scales = (torch.rand(out_features, in_features // BLOCK_WEIGHTS, count, generator=generator) * 0.02 - 0.005)
    blocks[..., :count * size] = scales.to(torch.float16 if size == 2 else torch.float32).view(torch.uint8)
    return QuantizedWeight(blocks.reshape(out_features, -1).contiguous(), qtype, in_features)


def type_id(qtype: int | str) -> int:
    """A GGML type id (2, 3, 6, 8, 12, 14) or name ("Q4_0", "Q4_1", "Q5_0", "Q8_0", "Q4_K", "Q6_K"), checked to be one
    the kernel reads."""
    qtype = TYPES.get(qtype, qtype) if isinstance(qtype, str) else int(qtype)
    if qtype not in BLOCK_BYTES:
        raise ValueError(f"GGUF type {qtype!r}: selfspec keeps only {tuple(TYPES)} quantized (the rest dequantize)")
    return qtype


class QuantizedWeight:
    """A weight [out_features, in_features] held as GGUF blocks: `blocks` uint8 [out_features, in_features / 32 *
    block bytes], row n the blocks of output n along the input dimension. Reads like the float32 weight it stands for
    where code asks for its shape, dtype or device, or indexes rows (`weight[ids]`, dequantized); any other tensor
    use (a torch function, a tensor method) gets the whole weight dequantized (`dequantize()`: 4 bytes a weight, for
    rare uses)."""

    dtype = torch.float32
    requires_grad = False
    is_cpu = True
    # whether `blocks` holds the rows interleaved for the int8 kernel (`int8.interleave`) instead of the file's layout
    interleaved = False

    def __init__(self, blocks: torch.Tensor, qtype: int | str, in_features: int):
        self.qtype = type_id(qtype)
        row_bytes = in_features // BLOCK_WEIGHTS * BLOCK_BYTES[self.qtype]
        if in_features % BLOCK_WEIGHTS or blocks.dtype != torch.uint8 or blocks.dim() != 2 \
                or blocks.shape[1] != row_bytes or not blocks.is_contiguous() or not blocks.is_cpu:
            raise ValueError(f"blocks {tuple(blocks.shape)} {blocks.dtype}: expected contiguous uint8 CPU rows of "
                             f"{row_bytes} bytes ({in_features} weights of {self.name}; in_features % 32 == 0)")
        self.blocks = blocks
        self.shape = torch.Size((blocks.shape[0], in_features))
        self.device = blocks.device

    @property
    def name(self) -> str:
        return next(name for name, code in TYPES.items() if code == self.qtype)

    def dim(self) -> int:
        return 2

    ndim = property(dim)

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def numel(self) -> int:
        return self.shape.numel()

    def detach(self) -> "QuantizedWeight":
        return self

    def set_interleaved(self, interleaved: bool) -> None:
        """Hold the rows in the int8 kernel's layout (True) or the file's (False), rewriting `blocks` in place (the
        same tensor, so modules holding it see the change; a permutation of the bytes, nothing rounded)."""
        if interleaved != self.interleaved:
            permute = int8.interleave if interleaved else int8.deinterleave
            self.blocks.copy_(permute(self.blocks, self.qtype))
            self.interleaved = interleaved

    def rows(self, ids: torch.Tensor | None = None, first: int = 0, count: int | None = None) -> torch.Tensor:
        """[len(ids), in_features] float32: the dequantized rows `ids` (int64 [n]), or rows first .. first + count - 1."""
        _, dequantize_rows, dequantize_interleaved_rows = _entry_points()
        n_rows, k_dim = self.shape
        if ids is not None:
            ids = ids.to(torch.long).contiguous()
            if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < n_rows):
                raise IndexError(f"row ids must lie in 0..{n_rows - 1}; got {int(ids.min())}..{int(ids.max())}")
            count = ids.numel()
        else:
            count = n_rows - first if count is None else count
            if not (0 <= first and first + count <= n_rows):
                raise IndexError(f"rows {first}..{first + count - 1} of {n_rows}")
        out = torch.empty(count, k_dim)
        if self.interleaved:  # (each block's file bytes put back in the kernel, then dequantized alike)
            ids = torch.arange(first, first + count) if ids is None else ids
            dequantize_interleaved_rows(self.qtype, self.blocks.data_ptr(), n_rows, k_dim, ids.data_ptr(), count,
                                        out.data_ptr())
        else:
            dequantize_rows(self.qtype, self.blocks.data_ptr(), k_dim, None if ids is None else ids.data_ptr(), first,
                            count, out.data_ptr())
        return out

    def dequantize(self) -> torch.Tensor:
        """The whole float32 weight [out_features, in_features] (what transformers' GGUF loading makes of it)."""
        return self.rows()

    def __getitem__(self, index) -> torch.Tensor:
        if isinstance(index, torch.Tensor) and index.dim() == 1 and not index.dtype.is_floating_point:
            if index.dtype is torch.bool:
                index = index.nonzero()[:, 0]
            return self.rows(index)
        return self.dequantize()[index]

    def __getattr__(self, name):  # (only for names not defined here: a tensor method, on the dequantized weight)
        if name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dequantize(), name)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        def plain(value):
            if isinstance(value, QuantizedWeight):
                return value.dequantize()
            if isinstance(value, (list, tuple)):
                return type(value)(plain(v) for v in value)
            return value
        return func(*plain(args), **plain(kwargs or {}))

    def __repr__(self) -> str:
        layout = ", interleaved" if self.interleaved else ""
        return f"QuantizedWeight({self.name}, shape={tuple(self.shape)}{layout})"


class QuantizedLinear(torch.nn.Module):
    """y = x W^T (+ bias) with W a `QuantizedWeight`: products over 1..MAX_ROWS float32 CPU rows through the kernel,
    anything else (more rows, another dtype, a gradient to record for x) through F.linear over dequantized chunks of
    weight rows. Not an nn.Linear, so `FewRowLinears` leaves it alone: its own forward is the kernel.
    backend: "float", "int8" (every float32 CPU product without a gradient through `int8_linear`, whatever its rows)
    or "auto" (`resolve_backend`); None: $SELFSPEC_QUANTIZED_BACKEND, default "auto"."""

    def __init__(self, weight: QuantizedWeight, bias: torch.Tensor | None = None, backend: str | None = None):
        super().__init__()
        self.in_features, self.out_features = weight.shape[1], weight.shape[0]
        self._weight = weight
        self.register_buffer("blocks", weight.blocks)  # (counted and moved with the model's buffers; never trained)
        self.backend = resolve_backend(backend, weight.qtype)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach().float().contiguous(),
                                                                 requires_grad=False)

    @property
    def backend(self) -> str:
        return self._backend

    @backend.setter
    def backend(self, backend: str) -> None:
        """"float" or "int8" (resolved): the weight's rows are laid out for it (int8: interleaved, in place)."""
        self._backend = backend
        self._weight.set_interleaved(backend == "int8")

    @property
    def weight(self) -> QuantizedWeight:
        return self._weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # (one opaque op in the graph: kernel/ops.py)
            from selfspec.kernel.ops import quantized_linear

            out = quantized_linear(x, self.blocks, self._weight.qtype, self.in_features, self._weight.interleaved)
        else:
            out = self.eager_product(x, self._weight, self._backend)
        return out if self.bias is None else out + self.bias.to(out.dtype)

    @staticmethod
    def eager_product(x: torch.Tensor, weight: QuantizedWeight, backend: str) -> torch.Tensor:
        """x W^T through `backend` ("float" or "int8"; its weight layout): the kernel where it takes x, else F.linear
        over dequantized chunks (a gradient to record for x, another dtype or device)."""
        rows, in_features = x.numel() // weight.shape[1], weight.shape[1]
        plain = kernel_takes(x, in_features)
        if plain and backend == "int8":
            return int8_linear(x, weight)
        if plain and rows <= MAX_ROWS and not weight.interleaved:
            linear = _entry_points()[0]
            x_rows = x.contiguous()
            out = x.new_empty((*x.shape[:-1], weight.shape[0]))
            linear(weight.qtype, x_rows.data_ptr(), rows, in_features, weight.blocks.data_ptr(), weight.shape[0],
                   out.data_ptr())
            return out
        return chunked_linear(x, weight)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, {self._weight.name}, "
                f"bias={self.bias is not None}, backend={self.backend}")


class QuantizedEmbedding(torch.nn.Module):
    """nn.Embedding's lookup over a `QuantizedWeight` (a tied LM head's blocks): each id's row dequantized."""

    def __init__(self, weight: QuantizedWeight, padding_idx: int | None = None):
        super().__init__()
        self.num_embeddings, self.embedding_dim = weight.shape
        self.padding_idx = padding_idx
        self._weight = weight
        self.register_buffer("blocks", weight.blocks)

    @property
    def weight(self) -> QuantizedWeight:
        return self._weight

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if torch.compiler.is_compiling():  # (one opaque op in the graph: kernel/ops.py)
            from selfspec.kernel.ops import quantized_rows

            weight = self._weight
            return quantized_rows(ids, self.blocks, weight.qtype, self.embedding_dim, weight.interleaved)
        rows = self._weight.rows(ids.reshape(-1))
        return rows.view(*ids.shape, self.embedding_dim)

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}, {self._weight.name}"


def kernel_takes(x: torch.Tensor, in_features: int) -> bool:
    """Whether the kernel's products take x as it is: some float32 CPU rows of `in_features`, no gradient to record."""
    return (x.numel() > 0 and x.dtype is torch.float32 and x.is_cpu and x.shape[-1] == in_features
            and not (torch.is_grad_enabled() and x.requires_grad))


def chunked_linear(x: torch.Tensor, weight: QuantizedWeight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """F.linear(x, weight.dequantize(), bias), dequantizing CHUNK_WEIGHTS weights at a time (autograd flows to x)."""
    step = max(1, CHUNK_WEIGHTS // weight.shape[1])
    parts = [F.linear(x, weight.rows(first=n, count=min(step, weight.shape[0] - n)).to(x.device, x.dtype))
             for n in range(0, weight.shape[0], step)]
    out = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
    return out if bias is None else out + bias.to(x.dtype)


def quantized_weights(model: torch.nn.Module) -> list[QuantizedWeight]:
    """The `QuantizedWeight`s of a model's quantized modules, each once (a tied LM head and embedding share one)."""
    found = {}
    for module in model.modules():
        if isinstance(module, (QuantizedLinear, QuantizedEmbedding)):
            found.setdefault(id(module.weight), module.weight)
    return list(found.values())


def weight_count(module: torch.nn.Module) -> int:
    """The weights of a module: its parameters' elements plus those its quantized weights stand for (a bitsandbytes
    4-bit weight packs two in a byte: counted by the shape it stands for; torchao's report theirs)."""
    return sum(_logical_numel(p) for p in module.parameters()) + sum(w.numel() for w in quantized_weights(module))


def _logical_numel(parameter: torch.Tensor) -> int:
    quant_state = getattr(parameter, "quant_state", None)  # (bitsandbytes' Params4bit: [n, 1] packed bytes)
    shape = getattr(quant_state, "shape", None)
    return shape.numel() if isinstance(shape, torch.Size) else parameter.numel()


def resident_bytes(model: torch.nn.Module) -> int:
    """Bytes of a model's parameters and buffers, each tensor's storage once: its weights' memory, quantized or not
    (a tensor subclass such as torchao's quantized weights by the plain tensors it holds)."""
    storages = {}
    for tensor in [*model.parameters(), *model.buffers()]:
        for plain in _plain_tensors(tensor):
            storage = plain.untyped_storage()
            storages[storage.data_ptr()] = storage.nbytes()
    return sum(storages.values())


def _plain_tensors(tensor: torch.Tensor) -> list[torch.Tensor]:
    """A tensor's own data: itself, or for a traceable wrapper subclass (torchao) its inner tensors, recursively."""
    if type(tensor) in (torch.Tensor, torch.nn.Parameter) or not hasattr(tensor, "__tensor_flatten__"):
        return [tensor]
    names, _ = tensor.__tensor_flatten__()
    return [plain for name in names for plain in _plain_tensors(getattr(tensor, name))]
