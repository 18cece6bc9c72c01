"""The machine a benchmark ran on, recorded beside its numbers (timings mean little without it)."""
from __future__ import annotations

import os
import platform
import time

import torch


def machine_info(device: str, threads: int) -> dict:
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    cuda = device.startswith("cuda")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu,
        "cpu": cpu,
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
