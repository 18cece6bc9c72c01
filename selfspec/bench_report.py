"""The benchmark's arithmetic and output: runs -> per (method, mode) records (medians over rounds, min-max spread),
markdown tables, the sweep plot, and the machine's description. Knows nothing about models or decoding.
"""
from __future__ import annotations

import os
import platform
import statistics
import time
from dataclasses import dataclass

import torch

from selfspec.bench_methods import Method, Mode, Run

MEMORY_NOTE = (
    "memory = bytes of extra parameters (heads, adapter or draft model) + the run's largest KV cache(s): selfspec's "
    "measured peak cache storage; transformers' caches computed from their shapes at the final length (the draft "
    "model's or early exit's own cache included). The base model's weights, shared by all, are not counted. On CUDA "
    "`peak_device_bytes` in the JSON is torch's measured peak allocation during the run above what was allocated "
    "before it (cache + activations + extras' workspace)."
)


@dataclass(frozen=True)
class Entry:
    method: Method
    mode: Mode
    round: int
    prompt: int
    run: Run


def _per_round(entries: list[Entry]) -> dict[int, float]:
    """round -> tokens per second over that round's prompts (total tokens / total seconds)."""
    tokens, seconds = {}, {}
    for e in entries:
        tokens[e.round] = tokens.get(e.round, 0) + e.run.new_tokens
        seconds[e.round] = seconds.get(e.round, 0.0) + e.run.seconds
    return {r: tokens[r] / seconds[r] for r in tokens if seconds[r] > 0}


def _sum_lists(lists: list[list[int]]) -> list[int]:
    total = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for i, v in enumerate(x):
            total[i] += v
    return total


def summarize(entries: list[Entry], baseline: str, base_parameters: int, order: list[Method]) -> list[dict]:
    """One record per (method, mode), methods in `order`; speedups are paired by round against the `baseline`
    method's runs in the same mode (and the same prompts)."""
    groups: dict[tuple[str, str], list[Entry]] = {}
    for e in sorted(entries, key=lambda e: (e.round, e.prompt)):
        groups.setdefault((e.method.name, e.mode.name), []).append(e)
    modes = list(dict.fromkeys(e.mode.name for e in entries))
    methods = [m.name for m in order]
    records = []
    for mode in modes:
        base = groups.get((baseline, mode), [])
        base_rounds = _per_round(base)
        base_tokens = {(e.round, e.prompt): e.run.token_ids for e in base}
        for name in methods:
            group = groups.get((name, mode))
            if group:
                records.append(_record(group, base_rounds, base_tokens, base_parameters, name == baseline))
    return records


def _record(group: list[Entry], base_rounds, base_tokens, base_parameters: int, is_baseline: bool) -> dict:
    method, mode, runs = group[0].method, group[0].mode, [e.run for e in group]
    rounds = _per_round(group)
    speedups = [rounds[r] / base_rounds[r] for r in rounds if r in base_rounds]
    forwards = [r.target_forwards for r in runs]
    new_tokens = sum(r.new_tokens for r in runs)
    tokens_per_forward = new_tokens / sum(forwards) if None not in forwards and sum(forwards) else None
    drafted = _sum_lists([r.drafted_by_position for r in runs])
    accepted = _sum_lists([r.accepted_by_position for r in runs])
    speedup = statistics.median(speedups) if speedups else None
    identical = None
    if not mode.do_sample and not is_baseline and base_tokens:
        pairs = [(e.run.token_ids, base_tokens.get((e.round, e.prompt))) for e in group]
        identical = [sum(a == b for a, b in pairs if b is not None), sum(b is not None for _, b in pairs)]
    kv = max(r.kv_bytes for r in runs)
    peaks = [r.peak_device_bytes for r in runs if r.peak_device_bytes is not None]
    return {
        "method": method.name,
        "family": method.family,
        "drafter": method.drafter,
        "num_draft_tokens": method.num_draft_tokens,
        "mode": mode.name,
        "do_sample": mode.do_sample,
        "temperature": mode.temperature if mode.do_sample else None,
        "top_p": mode.top_p,
        "runs": len(runs),
        "rounds": len(rounds),
        "new_tokens": new_tokens,
        "seconds": round(sum(r.seconds for r in runs), 4),
        "tokens_per_second": _median(rounds.values()),
        "tokens_per_second_range": _range(rounds.values()),
        "speedup": speedup,
        "speedup_range": _range(speedups),
        "tokens_per_forward": tokens_per_forward,
        "efficiency": speedup / tokens_per_forward if speedup and tokens_per_forward else None,
        "acceptance": sum(accepted) / sum(drafted) if sum(drafted) else None,
        "acceptance_by_position": [a / d if d else None for a, d in zip(accepted, drafted)],
        "drafted_by_position": drafted,
        "extra_parameters": method.extra_parameters,
        "extra_parameters_fraction": method.extra_parameters / base_parameters,
        "kv_cache_bytes": kv,
        "memory_bytes": method.extra_parameter_bytes + kv,
        "peak_device_bytes": max(peaks) if peaks else None,
        "greedy_identical": identical,  # [same as the baseline's tokens, compared] for greedy runs
    }


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _range(values) -> list[float] | None:
    values = list(values)
    return [min(values), max(values)] if values else None


# -- text ---------------------------------------------------------------------------------------------------------


def _num(x, fmt="{:.2f}", suffix="") -> str:
    return "" if x is None else fmt.format(x) + suffix


def _spread(value, bounds, fmt="{:.2f}", suffix="") -> str:
    if value is None:
        return ""
    text = fmt.format(value) + suffix
    if bounds and bounds[0] != bounds[1]:
        text += f" ({fmt.format(bounds[0])}-{fmt.format(bounds[1])})"
    return text


def _size(num_bytes: int | None) -> str:
    if num_bytes is None:
        return ""
    return f"{num_bytes / 2**20:.2f} MiB" if num_bytes >= 2**20 else f"{num_bytes / 2**10:.0f} KiB"


def _params(count: int, fraction: float) -> str:
    if not count:
        return "0"
    text = f"{count / 1e6:.2f}M" if count >= 1e5 else f"{count / 1e3:.1f}k"
    return f"{text} ({100 * fraction:.1f}%)"


def _acceptance(values) -> str:
    return " ".join("-" if v is None else f"{v:.2f}" for v in values)


def main_table(records: list[dict]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in records):
        rows = [r for r in records if r["mode"] == mode]
        greedy = not rows[0]["do_sample"]
        lines += ["", f"### {mode}", "",
                  "| method | tokens/s | speedup | tokens/forward | efficiency | acceptance by position "
                  "| extra params | memory |" + (" same tokens as generate |" if greedy else ""),
                  "|---|---|---|---|---|---|---|---|" + ("---|" if greedy else "")]
        for r in rows:
            same = ""
            if greedy:
                same = " |" if r["greedy_identical"] is None else f" {r['greedy_identical'][0]}/{r['greedy_identical'][1]} |"
            lines.append(
                f"| {r['method']} | {_spread(r['tokens_per_second'], r['tokens_per_second_range'], '{:.1f}')} "
                f"| {_spread(r['speedup'], r['speedup_range'], suffix='x')} | {_num(r['tokens_per_forward'])} "
                f"| {_num(r['efficiency'])} | {_acceptance(r['acceptance_by_position'])} "
                f"| {_params(r['extra_parameters'], r['extra_parameters_fraction'])} | {_size(r['memory_bytes'])} |{same}"
            )
    return lines


def _sweep_rows(records: list[dict]) -> dict[str, dict]:
    """drafter -> {k: record}; the speculation-off record (drafter "none") is every drafter's k = 0."""
    off = [r for r in records if r["drafter"] == "none"]
    rows = {}
    for r in records:
        if r["drafter"] != "none":
            rows.setdefault(r["drafter"], {0: off[0]} if off else {})[r["num_draft_tokens"]] = r
    return rows


def sweep_table(records: list[dict]) -> list[str]:
    if not records:
        return []
    rows = _sweep_rows(records)
    ks = sorted({k for cells in rows.values() for k in cells})
    lines = ["", "### sweep: num_draft_tokens (greedy): speedup over generate / tokens per target forward "
                 "(k=0: speculation off)", "",
             "| drafter | " + " | ".join(f"k={k}" for k in ks) + " |", "|---|" + "---|" * len(ks)]
    for drafter, cells in rows.items():
        lines.append(f"| {drafter} | " + " | ".join(
            f"{_num(cells[k]['speedup'], suffix='x')} / {_num(cells[k]['tokens_per_forward'])}" if k in cells else ""
            for k in ks) + " |")
    return lines


def useless_table(records: list[dict]) -> list[str]:
    if not records:
        return []
    lines = ["", "### useless drafts (greedy): speed relative to selfspec with speculation off, same prompts "
                 "(target: >= 0.95x)", "",
             "| case | method | vs speculation off | tokens/forward | acceptance |", "|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['case']} | {r['method']} | {_spread(r['speedup'], r['speedup_range'], suffix='x')} "
                     f"| {_num(r['tokens_per_forward'])} | {_num(r['acceptance'])} |")
    return lines


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        f"## selfspec benchmark: {s['model']} ({report['base_parameters'] / 1e6:.2f}M parameters, {s['dtype']})",
        "",
        f"Machine: {m['device_name']}, {m['cpus_available']} CPUs available, torch {m['torch']} with "
        f"{m['torch_threads']} thread(s), transformers {m['transformers']}, Python {m['python']}; load average "
        f"{m['load_average_1min']:.1f} at the start. {s['num_prompts']} held-out prompts of about {s['prompt_chars']} "
        f"characters, {s['max_new_tokens']} new tokens, {s['repeats']} rounds, methods in a random order per round, "
        f"prompt and mode; medians over rounds (min-max in brackets). Speedup: over plain `model.generate` in the "
        f"same round and mode. Efficiency: speedup / tokens per target forward. {report['seconds']:.0f} s in all.",
    ]
    lines += main_table(report["records"])
    lines += sweep_table(report["sweep"])
    lines += useless_table(report["useless_drafts"])
    costs = {name: curve for name, curve in report.get("verify_cost", {}).items() if ":" not in name}
    if costs:
        lines += ["", "Verify cost that num_draft_tokens=\"auto\" measured and planned with (one forward verifying k = 0, "
                      "1, ... drafts, in one-token decodes): " + "; ".join(
                          f"{name} " + " ".join(f"{c:.2f}" for c in curve) for name, curve in costs.items())]
    lines += ["", MEMORY_NOTE]
    lines += [f"Note: {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def plot_sweep(records: list[dict], path: str, title: str = "") -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for drafter, cells in _sweep_rows(records).items():
        rows = [cells[k] for k in sorted(cells)]
        ks = [r["num_draft_tokens"] for r in rows]
        speedups = [r["speedup"] for r in rows]
        errors = [[s - r["speedup_range"][0] for s, r in zip(speedups, rows)],
                  [r["speedup_range"][1] - s for s, r in zip(speedups, rows)]]
        left.errorbar(ks, speedups, yerr=errors, marker="o", capsize=3, label=drafter)
        right.plot(ks, [r["tokens_per_forward"] for r in rows], marker="o", label=drafter)
    left.axhline(1.0, color="grey", linestyle="--", linewidth=1)
    left.set(xlabel="num_draft_tokens (0: speculation off)", ylabel="speedup over model.generate (greedy)")
    right.set(xlabel="num_draft_tokens", ylabel="tokens per target forward")
    for ax in (left, right):
        ax.xaxis.set_major_locator(matplotlib.ticker.MaxNLocator(integer=True))
        ax.legend()
        ax.grid(alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def machine_info(device: str, threads: int) -> dict:
    import transformers

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    available = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cuda = device.startswith("cuda")
    return {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %z"),
        "device": device,
        "device_name": torch.cuda.get_device_name(device) if cuda else cpu,
        "cpu": cpu,
        "cpus": os.cpu_count(),
        "cpus_available": available,
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
