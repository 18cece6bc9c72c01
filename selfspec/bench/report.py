"""The benchmark's output: markdown tables from the report dict (the main table: one row per method, a column group
per mode), and writing results.md, results.json and the plots.
Knows nothing about models or decoding.
"""
from __future__ import annotations

import json
from pathlib import Path

from selfspec.bench.plot import plot_sweep, plot_table, sweep_rows

TARGET_USELESS = 0.95  # drafts that cannot help may cost at most 5 %


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
    same, agreeing = record.get("identical"), record.get("agreeing_tokens")
    if same is None:
        return ""
    if same[0] == same[1] or not agreeing or not agreeing[1]:
        return f"{same[0]}/{same[1]}"
    return f"{same[0]}/{same[1]} ({100 * agreeing[0] / agreeing[1]:.0f}% of tokens)"


# The table's columns per kind of mode: one column group per mode that ran, in the order the modes ran; a method
# with no record in a mode (generate and llama.cpp are never seeded or keyed) leaves that group's cells empty.
def _x(key):
    return lambda r: _spread(r.get(key), r.get(key + "_range"), suffix="x")


def _tokens_per_forward(record) -> str:
    return _num(record["tokens_per_forward"])


COLUMNS = {
    "greedy": [("tokens/s", lambda r: _spread(r["tokens_per_second"], r["tokens_per_second_range"], "{:.1f}")),
               ("vs generate", _x("speedup")), ("vs speculation off", _x("vs_speculation_off")),
               ("tokens/forward", _tokens_per_forward), ("identical to generate", _identical)],
    "sampled": [("vs generate", _x("speedup")), ("vs speculation off", _x("vs_speculation_off")),
                ("tokens/forward", _tokens_per_forward)],
    "keyed": [("vs speculation off (unseeded)", _x("vs_unseeded_off")), ("tokens/forward", _tokens_per_forward)],
    "seeded": [("vs speculation off", _x("vs_speculation_off")), ("tokens/forward", _tokens_per_forward),
               ("identical to speculation off", _identical)],
}


def _kind(record) -> str:
    if not record["do_sample"]:
        return "greedy"
    return "seeded" if record.get("seeded") else "keyed" if record.get("keyed") else "sampled"


def main_table(records: list[dict]) -> list[str]:
    """One row per method, one column group per mode that ran (greedy, sampled, keyed, seeded sampled)."""
    modes = list(dict.fromkeys(r["mode"] for r in records))
    if not modes:
        return []
    groups = []
    for mode in modes:
        rows = {r["method"]: r for r in records if r["mode"] == mode}
        first = next(iter(rows.values()))
        groups.append((first.get("title") or mode, rows, COLUMNS[_kind(first)]))
    header = ["method"] + [f"{title}: {column}" for title, _, cells in groups for column, _ in cells]
    lines = ["", "| " + " | ".join(header) + " |", "|---" * len(header) + "|"]
    for method in dict.fromkeys(r["method"] for r in records):
        row = [method]
        for _, rows, cells in groups:
            record = rows.get(method)
            row += [cell(record) if record is not None else "" for _, cell in cells]
        lines.append("| " + " | ".join(row) + " |")
    return lines


def _caption(report: dict) -> str:
    m, s = report["machine"], report["settings"]
    kinds = {}
    for r in report["records"]:
        kinds.setdefault(_kind(r), {}).setdefault((r["temperature"], r["top_p"]), r)
    how = ""
    if "sampled" in kinds or "seeded" in kinds:
        settings = list({**kinds.get("sampled", {}), **kinds.get("seeded", {})})
        how += "Sampled: " + " and ".join(f"temperature {t:g}" + (f", top-p {p:g}" if p else " without top-p")
                                          for t, p in settings)
        how += ", without a seed (the global generator, as a user's call; selfspec verifies by rejection sampling). "
    if "seeded" in kinds:
        how += ("Seeded: the same with selfspec's seed= (the same seed per prompt and round for every method; tokens "
                "compared with speculation off's under that seed). ")
    if "keyed" in kinds:
        how += ("Keyed: unseeded calls that each draw a fresh seed and pass it as seed= (the keyed coupling), speedups "
                "over unseeded speculation off at the same temperature. ")
    llama = (", llama.cpp's too (its context is reset before each run: no prompt reuse)"
             if any(r["family"] == "llama.cpp" for r in report["records"]) else "")
    return (
        f"Machine: {m['device_name']} ({' '.join(m.get('cpu_flags') or []) or 'no SIMD flags read'}; "
        f"{m.get('quantized_products') or 'quantized products: ' + m.get('quantized_backend', 'float')}), {m['cpus_available']} CPUs available, torch {m['torch']} with "
        f"{m['torch_threads']} thread(s), transformers {m['transformers']}, Python {m['python']}; load average "
        f"{m['load_average_1min']:.1f} at the start. {s['num_prompts']} held-out {report['prompt_kind']} prompts, "
        f"{s['max_new_tokens']} new tokens at most (EOS stops a run), {s['repeats']} round(s), methods in a random "
        f"order per round, prompt and mode. Tokens/s include the prefill for every row{llama} (wall clock around each "
        f"whole call). Speedups are ratios to `generate` or to selfspec with speculation off in the same round and mode, "
        f"medians over rounds (min-max in brackets); tokens/forward: new tokens per target forward; identical: runs "
        f"whose tokens equal the baseline's on the same prompt and round (where some differ: the share of all tokens before "
        f"each run's first difference). {how}\"default\": the drafter's default "
        f"settings (num_draft_tokens included). {report['seconds']:.0f} s in all."
    )


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
    s = report["settings"]
    lines = [
        f"## selfspec benchmark: {report['model_name']} ({report['base_parameters'] / 1e6:.2f}M parameters, "
        f"{s['dtype']})",
        "",
        f"`{report.get('command', 'python -m selfspec.bench')}`",
        "",
        _caption(report),
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
    """results.md, results.json and (with matplotlib) speedup.png, and sweep.png after a sweep, under `out`."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.md").write_text(markdown(report))
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    m, s = report["machine"], report["settings"]
    title = f"{report['model_name']}, {m['device_name']}, {s['dtype']}, {s['threads']} thread(s)"
    plot_table(report["records"], out / "speedup.png", title=title)
    plot_sweep(report["sweep"], out / "sweep.png", title=title)
