"""The plots: the main table's speedups over speculation off per method and mode (`plot_table`), and the sweep's
speedup and tokens per target forward against num_draft_tokens, per drafter (`plot_sweep`). Need matplotlib (the
`.[bench]` extra); without it both return False and the tables and JSON are all there is."""
from __future__ import annotations

import importlib.util


def sweep_rows(records: list[dict]) -> dict[str, dict]:
    """drafter -> {k: record}; the speculation-off record (drafter "none") is every drafter's k = 0."""
    off = [r for r in records if r["drafter"] == "none"]
    rows = {}
    for r in records:
        if r["drafter"] != "none":
            rows.setdefault(r["drafter"], {0: off[0]} if off else {})[r["num_draft_tokens"]] = r
    return rows


def plot_sweep(records: list[dict], path, title: str = "") -> bool:
    """Write the PNG; False (nothing written) when matplotlib is not installed or there is no sweep."""
    if not records or importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    for drafter, cells in sweep_rows(records).items():
        ks = sorted(cells)
        rows = [cells[k] for k in ks]
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
    return True


def plot_table(records: list[dict], path, title: str = "") -> bool:
    """Horizontal bars: each method's median speedup over speculation off (min-max as error bars), one bar per mode.
    False (nothing written) without matplotlib or records."""
    if not records or importlib.util.find_spec("matplotlib") is None:
        return False
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    methods = list(dict.fromkeys(r["method"] for r in records))
    modes = list(dict.fromkeys(r["mode"] for r in records))
    height = 0.8 / len(modes)
    fig, ax = plt.subplots(figsize=(9, 1.0 + 0.45 * len(methods) * max(1, len(modes) / 2)))
    for i, mode in enumerate(modes):
        by_method = {r["method"]: r for r in records if r["mode"] == mode and r.get("vs_speculation_off") is not None}
        ys = [m for m in range(len(methods)) if methods[m] in by_method]
        rows = [by_method[methods[m]] for m in ys]
        values = [r["vs_speculation_off"] for r in rows]
        spans = [r["vs_speculation_off_range"] or [v, v] for r, v in zip(rows, values)]
        errors = [[v - lo for v, (lo, _) in zip(values, spans)], [hi - v for v, (_, hi) in zip(values, spans)]]
        ax.barh([y + (i - (len(modes) - 1) / 2) * height for y in ys], values, height, xerr=errors, capsize=2,
                label=mode)
    ax.axvline(1.0, color="grey", linestyle="--", linewidth=1)
    ax.set_yticks(range(len(methods)), methods, fontsize=8)
    ax.invert_yaxis()
    ax.set(xlabel="speedup over selfspec with speculation off (tokens/s, prefill included)")
    ax.legend(fontsize=8, loc="lower left", bbox_to_anchor=(0, 1.0), ncol=len(modes), frameon=False)
    ax.grid(alpha=0.3, axis="x")
    fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return True
