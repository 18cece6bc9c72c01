"""The machine a benchmark ran on, recorded beside its numbers (timings mean little without it)."""
from __future__ import annotations

import os
import platform
import time

import torch


# what the kernels' run-time choices depend on (and bitsandbytes' 4-bit CPU path: avx512_bf16)
SIMD_FLAGS = ("avx2", "fma", "avx512f", "avx512_vnni", "avx_vnni", "avx512_bf16", "amx_tile", "amx_int8")


def machine_info(device: str, threads: int) -> dict:
    import transformers

    from selfspec.kernel.backends import backend_setting, measured_choices

    cpu = platform.processor() or platform.machine()
    flags: list[str] = []
    try:
        with open("/proc/cpuinfo") as f:
            info = f.read().splitlines()
        cpu = next((line.split(":", 1)[1].strip() for line in info if line.startswith("model name")), cpu)
        present = set(next((line.split(":", 1)[1].split() for line in info if line.startswith("flags")), []))
        flags = [flag for flag in SIMD_FLAGS if flag in present]
    except OSError:
        pass
    cuda = device.startswith("cuda")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu,
        "cpu": cpu,
        "cpu_flags": flags,  # the instruction sets the kernels choose their paths by
        "quantized_backend": backend_setting(),  # kept GGUF blocks' products (kernel/backends.py)
        "quantized_backends_measured": measured_choices(),  # what "auto" chose per GGUF type, and the timings
        "cpus": os.cpu_count(),
        "cpus_available": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "threads_requested": threads,
        "omp_num_threads_env": os.environ.get("OMP_NUM_THREADS"),
        "torch": torch.__version__,
        "cuda": torch.version.cuda if cuda else None,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_1min": os.getloadavg()[0],
    }
