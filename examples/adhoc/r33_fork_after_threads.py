"""Round 33: a process that ran parallel work on two OpenMP threads forks, and the child runs parallel work on two
threads again, with a 20 s limit: WORK "torch" (torch's own parallel operations) or "kernel" (selfspec's few-row
kernel, split between the threads since round 33); "kernel-one" sets one thread in the child first. GNU OpenMP is not
fork-safe: the child hangs in both, as torch's own operations do; with one thread in the child it runs.
Usage: python examples/adhoc/r33_fork_after_threads.py"""
import os
import signal
import sys

import torch

from selfspec import few_row_linear as frl

x, weight = torch.randn(2, 576), torch.randn(1536, 576)
big = torch.randn(4_000_000)
WORK = {"torch": lambda: (big.exp().sum(), torch.mm(torch.randn(512, 512), torch.randn(512, 512))),
        "kernel": lambda: frl.few_row_linear(x, weight)}

for name in ("torch", "kernel", "kernel-one"):
    torch.set_num_threads(2)
    work = WORK[name.split("-")[0]]
    work()
    pid = os.fork()
    if pid == 0:
        if name == "kernel-one":
            torch.set_num_threads(1)
        work()
        os._exit(0)
    signal.signal(signal.SIGALRM, lambda *_: os.kill(pid, signal.SIGKILL))
    signal.alarm(20)
    _, status = os.waitpid(pid, 0)
    signal.alarm(0)
    print(f"{name}: the child {'ran' if os.WIFEXITED(status) else 'hung (killed after 20 s)'}", flush=True)
sys.exit(0)
