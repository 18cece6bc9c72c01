"""The benchmark's arithmetic: entries (one run each) -> one record per (method, mode) with medians over rounds,
min-max spreads, ratios paired by round against baseline methods, acceptance by position and token identity
(greedy against generate, seeded sampling against speculation off with the same seed).
Knows nothing about models, decoding or output formats.
"""
from __future__ import annotations

import statistics

from selfspec.bench.schedule import Entry
from selfspec.stats import GenerationStats


def per_round(entries: list[Entry]) -> dict[int, float]:
    """round -> tokens per second over that round's prompts (total tokens / total seconds)."""
    tokens, seconds = {}, {}
    for e in entries:
        tokens[e.round] = tokens.get(e.round, 0) + e.run.new_tokens
        seconds[e.round] = seconds.get(e.round, 0.0) + e.run.seconds
    return {r: tokens[r] / seconds[r] for r in tokens if seconds[r] > 0}


def ratios(entries: list[Entry], baseline: list[Entry]) -> list[float]:
    """Per round: this method's tokens per second over the baseline's in the same round (same prompts and mode)."""
    mine, theirs = per_round(entries), per_round(baseline)
    return [mine[r] / theirs[r] for r in sorted(mine) if r in theirs]


def _sum_lists(lists: list[list[int]]) -> list[int]:
    total = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for i, v in enumerate(x):
            total[i] += v
    return total


def summarize(entries: list[Entry], order: list[str], baselines: dict[str, str], base_parameters: int,
              identical_to: dict[str, str] | None = None,
              across_modes: dict[str, tuple[str, dict[str, str]]] | None = None) -> list[dict]:
    """One record per (method, mode): modes in the order they were run, methods in `order` (their names).

    baselines: record key -> method name, e.g. {"speedup": "generate", "vs_speculation_off": "selfspec speculation
    off"}: the median over rounds of the per-round ratio against that method in the same mode (None where that method
    did not run in the mode).
    identical_to: mode name -> method name: records of that mode get `identical` = [runs whose tokens equal that
    method's on the same round and prompt, runs compared] (default: greedy modes against the first baseline).
    across_modes: record key -> (method name, {mode name: baseline's mode name}): records of those modes get the
    ratio against that method in another mode, same rounds (keyed sampling against unseeded speculation off); None
    in other modes.
    """
    groups: dict[tuple[str, str], list[Entry]] = {}
    for e in sorted(entries, key=lambda e: (e.round, e.prompt)):
        groups.setdefault((e.method.name, e.mode.name), []).append(e)
    if identical_to is None:
        reference = next(iter(baselines.values()), None)
        identical_to = {e.mode.name: reference for e in entries if not e.mode.do_sample}
    records = []
    for (name, mode), group in groups.items():
        record = _record(group, base_parameters)
        for key, baseline in baselines.items():
            values = ratios(group, groups.get((baseline, mode), []))
            record[key], record[key + "_range"] = _median(values), _range(values)
        for key, (baseline, mode_of) in (across_modes or {}).items():
            values = ratios(group, groups.get((baseline, mode_of[mode]), [])) if mode in mode_of else []
            record[key], record[key + "_range"] = _median(values), _range(values)
        reference = identical_to.get(mode)
        if reference is not None and name != reference:
            expected = {(e.round, e.prompt): e.run.token_ids for e in groups.get((reference, mode), [])}
            pairs = [(e.run.token_ids, expected[(e.round, e.prompt)]) for e in group if (e.round, e.prompt) in expected]
            record["identical"] = [sum(a == b for a, b in pairs), len(pairs)] if pairs else None
            # tokens before each run's first difference from the reference's, of the reference's tokens
            record["agreeing_tokens"] = [sum(_common_prefix(a, b) for a, b in pairs), sum(len(b) for _, b in pairs)]
            record["identical_to"] = reference
        records.append(record)
    modes = list(dict.fromkeys(e.mode.name for e in entries))
    return sorted(records, key=lambda r: (modes.index(r["mode"]), order.index(r["method"])))


def _record(group: list[Entry], base_parameters: int) -> dict:
    method, mode, runs = group[0].method, group[0].mode, [e.run for e in group]
    rounds = per_round(group)
    forwards = [r.target_forwards for r in runs]
    new_tokens = sum(r.new_tokens for r in runs)
    # Per-position acceptance as GenerationStats defines it, over all runs' counts.
    pooled = GenerationStats(drafted_by_position=_sum_lists([r.drafted_by_position for r in runs]),
                             accepted_by_position=_sum_lists([r.accepted_by_position for r in runs]))
    drafted = sum(pooled.drafted_by_position)
    return {
        "method": method.name,
        "family": method.family,
        "drafter": method.drafter,
        "num_draft_tokens": method.num_draft_tokens if method.num_draft_tokens is not None else "default",
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
        "tokens_per_forward": new_tokens / sum(forwards) if None not in forwards and sum(forwards) else None,
        "acceptance": sum(pooled.accepted_by_position) / drafted if drafted else None,
        "acceptance_by_position": pooled.acceptance_by_position,
        "drafted_by_position": pooled.drafted_by_position,
        "extra_parameters": method.extra_parameters,
        "extra_parameters_fraction": method.extra_parameters / base_parameters if base_parameters else 0.0,
        "seeded": mode.seeded,
        "keyed": mode.keyed,
        "title": mode.title or mode.name,
        "identical": None,  # [runs whose tokens equal `identical_to`'s, runs compared]
        "agreeing_tokens": None,  # [tokens before each run's first difference from `identical_to`'s, of its tokens]
        "identical_to": None,
    }


def _median(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def _range(values) -> list[float] | None:
    values = list(values)
    return [min(values), max(values)] if values else None


def _common_prefix(a, b) -> int:
    """How many leading tokens two runs share."""
    a, b = list(a), list(b)
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
