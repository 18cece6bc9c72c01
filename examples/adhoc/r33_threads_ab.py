"""Round 33 (an AMD EPYC with AVX-512, 2 vCPUs): the few-row kernel split between torch's threads (OpenMP, the
runtime torch runs in) against the kernel of git revision OLD_REV (one thread), built from OLD_REV's source into a
temporary directory, at THREADS torch threads. Both route plain decoding's one-row products through their kernel.
SmolLM2 (held-out chat prompts) greedy, 128 tokens without EOS, paired and interleaved with plain generate at the
same thread count. WRAPPERS (default off,eagle): a comma list of off, eagle (the tree, default), chain (the EAGLE
head, tree_size=None), medusa (the shipped Medusa heads, default).
Usage: PYTHONPATH=examples/adhoc python examples/adhoc/r33_threads_ab.py THREADS OLD_REV PROMPTS ROUNDS [WRAPPERS]"""
import ctypes
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import torch
import transformers

from selfspec import few_row_linear as frl
from selfspec.engine import SelfSpecModel
from harness import greedy_against_generate, smollm2_chat  # examples/adhoc/harness.py

threads, old_rev, num_prompts, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
wrappers = (sys.argv[5] if len(sys.argv) > 5 else "off,eagle").split(",")
MAKE = {"off": lambda model: SelfSpecModel(model, drafter="none"),
        "eagle": lambda model: SelfSpecModel(model, heads="examples/smollm2/eagle"),
        "chain": lambda model: SelfSpecModel(model, heads="examples/smollm2/eagle", tree_size=None),
        "medusa": lambda model: SelfSpecModel(model, heads="examples/smollm2/heads")}
torch.set_num_threads(threads)
transformers.logging.set_verbosity_error()
directory = Path(tempfile.mkdtemp())
source = directory / "few_row_linear.c"
source.write_text(subprocess.run(["git", "show", f"{old_rev}:selfspec/kernels/few_row_linear.c"], check=True,
                                 capture_output=True, text=True).stdout)
library = directory / "old.so"
compiler = shutil.which("cc") or shutil.which("gcc")
subprocess.run([compiler, *frl.FLAGS, *frl.ISA_FLAGS[frl.kernel_isa()], str(source), "-o", str(library)], check=True)
old_kernel = ctypes.CDLL(str(library)).few_row_linear
old_kernel.argtypes = [ctypes.c_void_p, ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_long,
                       ctypes.c_void_p, ctypes.c_void_p]
old_kernel.restype = None

model, tokenizer, prompts = smollm2_chat(num_prompts, 128)
specs = {}
for name in wrappers:
    for which in ("new", "old"):
        spec = MAKE[name](model)
        if which == "old":
            spec.few_row_linears._kernel = old_kernel  # the model's layers (the drafter keeps its bfloat16 kernel)
        spec.few_row_linears.route_one_row(True)
        specs[f"{name} {which}"] = spec
print(f"{torch.get_num_threads()} torch threads; the new kernel splits a product between {frl.kernel_threads()}")
greedy_against_generate(model, tokenizer, specs, prompts, rounds, 128)
