"""The sweep plot: speedup and tokens per target forward against num_draft_tokens, per drafter. Needs matplotlib
(the `.[bench]` extra); without it `plot_sweep` returns False and the tables and JSON are all there is."""
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
