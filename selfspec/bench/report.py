"""The benchmark's output: markdown tables from the report dict, and writing results.md, results.json and sweep.png.
Knows nothing about models or decoding.
"""
from __future__ import annotations

import json
from pathlib import Path

from selfspec.bench.plot import plot_sweep, sweep_rows

TARGET_USELESS = 0.95  # issue 12.4: drafts that cannot help may cost at most 5 %


def _num(x, fmt="{:.2f}", suffix="") -> str:
    return "" if x is None else fmt.format(x) + suffix


def _spread(value, bounds, fmt="{:.2f}", suffix="") -> str:
    if value is None:
        return ""
    text = fmt.format(value) + suffix
    if bounds and bounds[0] != bounds[1]:
        text += f" ({fmt.format(bounds[0])}-{fmt.format(bounds[1])})"
    return text


def _params(count: int, fraction: float) -> str:
    if not count:
        return "0"
    text = f"{count / 1e6:.2f}M" if count >= 1e5 else f"{count / 1e3:.1f}k"
    return f"{text} ({100 * fraction:.1f}%)"


def _acceptance(values) -> str:
    return " ".join(f"{v:.2f}" for v in values)


def _identical(record) -> str:
    same = record.get("greedy_identical")
    return "" if same is None else f"{same[0]}/{same[1]}"


def main_table(records: list[dict]) -> list[str]:
    lines = []
    for mode in dict.fromkeys(r["mode"] for r in records):
        rows = [r for r in records if r["mode"] == mode]
        greedy = not rows[0]["do_sample"]
        lines += ["", f"### {mode}", "",
                  "| method | tokens/s | speedup | tokens/forward | acceptance by position | extra params |"
                  + (" same tokens as generate |" if greedy else ""),
                  "|---|---|---|---|---|---|" + ("---|" if greedy else "")]
        for r in rows:
            lines.append(
                f"| {r['method']} | {_spread(r['tokens_per_second'], r['tokens_per_second_range'], '{:.1f}')} "
                f"| {_spread(r['speedup'], r['speedup_range'], suffix='x')} | {_num(r['tokens_per_forward'])} "
                f"| {_acceptance(r['acceptance_by_position'])} "
                f"| {_params(r['extra_parameters'], r['extra_parameters_fraction'])} |"
                + (f" {_identical(r)} |" if greedy else "")
            )
    return lines


def sweep_table(records: list[dict]) -> list[str]:
    if not records:
        return []
    rows = sweep_rows(records)
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
    lines = ["", f"### useless drafts, default settings: speed relative to plain generate and to selfspec with "
                 f"speculation off, same prompts and rounds; every run decodes exactly max_new_tokens (no EOS stop: "
                 f"equal work) (target: every row >= {TARGET_USELESS}x)", "",
             "| case | mode | method | vs generate | vs speculation off | tokens/forward | acceptance | target |",
             "|---|---|---|---|---|---|---|---|"]
    for r in records:
        lines.append(f"| {r['case']} | {r['mode']} | {r['method']} "
                     f"| {_spread(r['speedup'], r['speedup_range'], suffix='x')} "
                     f"| {_spread(r['vs_speculation_off'], r['vs_speculation_off_range'], suffix='x')} "
                     f"| {_num(r['tokens_per_forward'])} | {_num(r['acceptance'])} | {_verdict(r)} |")
    return lines


def _verdict(record: dict) -> str:
    ratios = [record.get("speedup"), record.get("vs_speculation_off")]
    if None in ratios:
        return ""
    return "met" if min(ratios) >= TARGET_USELESS else "MISSED"


def markdown(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    lines = [
        f"## selfspec benchmark: {report['model_name']} ({report['base_parameters'] / 1e6:.2f}M parameters, "
        f"{s['dtype']})",
        "",
        f"Machine: {m['device_name']}, {m['cpus_available']} CPUs available, torch {m['torch']} with "
        f"{m['torch_threads']} thread(s), transformers {m['transformers']}, Python {m['python']}; load average "
        f"{m['load_average_1min']:.1f} at the start. {s['num_prompts']} held-out {report['prompt_kind']} prompts, "
        f"{s['max_new_tokens']} new tokens, {s['repeats']} rounds, methods in a random order per round, prompt and "
        f"mode; medians over rounds (min-max in brackets). Speedup: over plain `model.generate` in the same round "
        f"and mode. \"default\": the drafter's default settings (num_draft_tokens included). "
        f"{report['seconds']:.0f} s in all.",
    ]
    lines += main_table(report["records"])
    lines += sweep_table(report["sweep"])
    lines += useless_table(report["useless_drafts"])
    costs = report.get("verify_cost", {})
    if costs:
        lines += ["", "Verify cost each selfspec model measured and planned with (one forward verifying k = 0, 1, ... "
                      "drafts, in one-token decodes): " + "; ".join(
                          f"{name} " + " ".join(f"{c:.2f}" for c in curve) for name, curve in costs.items())]
    lines += [""] + [f"Note: {n}" for n in report["notes"]]
    return "\n".join(lines) + "\n"


def write_outputs(report: dict, out: Path) -> None:
    """results.md, results.json and (with matplotlib and a sweep) sweep.png under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(markdown(report))
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    m, s = report["machine"], report["settings"]
    plot_sweep(report["sweep"], out / "sweep.png",
               title=f"{report['model_name']}, {m['device_name']}, {s['dtype']}, {s['threads']} thread(s)")
