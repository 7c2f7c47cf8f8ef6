"""The report of ``bench-serve --drafts``: per-arm sums, each drafting arm over plain decoding, and the markdown.

Pure functions over the records :mod:`grammarspec.bench.drafts` keeps per request (``tokens``,
``target_forwards``, ``forced_tokens``, ``proposed``, ``accepted``, ``seconds``: its own wall time, ``round``: 0 for the first
request of its schema or turn of its conversation, ``output``: its tokens).  A request is *warm* from round
1 on: the server has seen its schema (``repeat``) or its conversation (``agent``) before.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from grammarspec.bench.records import rates, source_totals

__all__ = [
    "SPLITS",
    "arm_totals",
    "drafts_markdown",
    "ratios_over",
    "replay_arm",
    "same_outputs",
    "split_totals",
]

#: The request sets the ratios are taken over: every request, and the warm ones (round >= 1).
SPLITS = ("all", "warm")
#: The per-request figures the ratios compare.
RATIO_METRICS = ("tokens_per_second", "tokens_per_pass")


def arm_totals(records: Sequence[dict[str, Any]], seconds: float) -> dict[str, Any]:
    """One arm's counts over ``records`` with tokens per pass and per second of ``seconds`` (its wall time),
    and the draft tokens proposed and accepted per source.  Pure."""
    tokens = sum(r["tokens"] for r in records)
    passes = sum(r["target_forwards"] for r in records)
    return {
        **rates(len(records), tokens, passes, seconds),
        "proposed": source_totals(records, "proposed"),
        "accepted": source_totals(records, "accepted"),
    }


def split_totals(records: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per split (:data:`SPLITS`), the counts and rates of its requests; tokens per second over the requests'
    own seconds summed (the throughput at concurrency 1; above it, tokens per request-second).  Pure.

    >>> s = split_totals([{"tokens": 4, "target_forwards": 4, "seconds": 2.0, "round": 0},
    ...                   {"tokens": 6, "target_forwards": 2, "seconds": 1.0, "round": 1}])
    >>> s["all"]["tokens_per_second"], s["warm"]["tokens_per_pass"], s["warm"]["requests"]
    (3.3333333333333335, 3.0, 1)
    """
    chosen = {"all": list(records), "warm": [r for r in records if r["round"] >= 1]}
    return {
        split: rates(
            len(subset),
            sum(r["tokens"] for r in subset),
            sum(r["target_forwards"] for r in subset),
            sum(r["seconds"] for r in subset),
        )
        for split, subset in chosen.items()
    }


def ratios_over(
    splits: Mapping[str, Mapping[str, Mapping[str, Any]]], base: str = "none"
) -> dict[str, dict[str, dict[str, float | None]]]:
    """``arm -> split -> metric -> arm's / base's`` for every arm of ``splits`` (arm -> :func:`split_totals`)
    but ``base``; ``None`` where the base's figure is 0.  Empty without ``base``.  Pure.

    >>> plain = {"all": {"tokens_per_second": 10.0, "tokens_per_pass": 1.0}}
    >>> ratios_over({"none": plain, "on": {"all": {"tokens_per_second": 40.0, "tokens_per_pass": 3.5}}})
    {'on': {'all': {'tokens_per_second': 4.0, 'tokens_per_pass': 3.5}}}
    """
    if base not in splits:
        return {}
    out: dict[str, dict[str, dict[str, float | None]]] = {}
    for arm, per in splits.items():
        if arm == base:
            continue
        out[arm] = {}
        for split, figures in per.items():
            reference = splits[base][split]
            out[arm][split] = {
                metric: figures[metric] / reference[metric] if reference[metric] else None for metric in RATIO_METRICS
            }
    return out


def same_outputs(a: Sequence[dict[str, Any]], b: Sequence[dict[str, Any]]) -> tuple[int, int]:
    """``(equal, compared)``: requests (by id) whose outputs are the same token for token.  Pure."""
    by_id = {r["id"]: r["output"] for r in a}
    compared = [r for r in b if r["id"] in by_id]
    return sum(list(by_id[r["id"]]) == list(r["output"]) for r in compared), len(compared)


def replay_arm(server_arms: Sequence[str]) -> str:
    """The server arm whose outputs the vLLM arms are held against (and whose agent turns they replay): ``on``,
    else ``off``, else ``none`` (greedy: its turns are the same).  Pure."""
    return next(arm for arm in ("on", "off", "none") if arm in server_arms)


def drafts_markdown(result: dict[str, Any], command: str) -> str:
    """Per arm, the counts, tokens per pass and tokens per second; each drafting arm over ``none``; drafts per
    source; the vLLM arms' table."""
    arms = result["arms"]
    reference = next(iter(arms), None)
    lines = [
        f"`{command}`",
        "",
        f"Workload `{result['workload']}`, {result['concurrency']} clients at once, greedy. "
        '`none`: every request with `"assistant": "none"` (plain decoding); '
        "`on`: drafts from earlier outputs (the server's index); `off`: `--draft-memory-mb 0`.",
    ]
    if arms:
        lines += [
            "",
            "| arm | requests | tokens | target passes | tokens / pass | tokens/s | suffix accepted / proposed | "
            f"outputs = `{reference}`'s |",
            "|---|---|---|---|---|---|---|---|",
        ]
    for arm, data in arms.items():
        suffix = f"{data['accepted'].get('suffix', 0)}/{data['proposed'].get('suffix', 0)}"
        same = data.get("identical")
        lines.append(
            f"| {arm} | {data['requests']} | {data['tokens']} | {data['passes']} | {data['tokens_per_pass']:.3f} | "
            f"{data['tokens_per_second']:.1f} | {suffix} | {f'{same[0]}/{same[1]}' if same else '-'} |"
        )
    lines += _ratio_markdown(result)
    if arms:
        lines += ["", "Accepted / proposed draft tokens per source:", ""]
    for arm, data in arms.items():
        per = ", ".join(f"{n} {data['accepted'].get(n, 0)}/{p}" for n, p in sorted(data["proposed"].items()))
        lines.append(f"- {arm}: {per or 'no drafts'}")
    equal, compared = result["identical"]
    if compared:
        lines += ["", f"- outputs identical to `{reference}`'s: {equal}/{compared} requests of the other arms"]
    on = arms.get("on", {}).get("index")
    if on:
        lines.append(
            f"- the index at the end: {on['bytes'] / 2**20:.1f} MB of {on['max_bytes'] / 2**20:.0f}, "
            f"{on['outputs']} outputs, {on['ngrams']} n-grams, {on['scopes']} scopes, {on['evictions']} evicted"
        )
    if result.get("vllm"):
        lines += ["", *_vllm_markdown(result), ""]
    lines.append("- tokens/s follows the machine's load; the counts do not.")
    return "\n".join(lines) + "\n"


def _ratio_markdown(result: dict[str, Any]) -> list[str]:
    """Each drafting arm over ``none``, all requests and the warm ones (none without a ``none`` arm)."""
    ratios = result.get("ratios") or {}
    if not ratios:
        return []
    seen = "its schema" if result["workload"] == "repeat" else "its conversation"
    lines = [
        "",
        f"Over `none`, in tokens per second (over the requests' own seconds: throughput at 1 client) and in tokens "
        f"per target pass (`none`'s is above 1 where the grammar forces tokens: they take no pass); warm: the "
        f"requests after the first of {seen} (the server has seen one before):",
        "",
        "| arm | requests (warm) | tok/s x `none` | warm tok/s x `none` | tokens/pass x `none` | "
        "warm tokens/pass x `none` |",
        "|---|---|---|---|---|---|",
    ]
    for arm, per in ratios.items():
        splits = result["arms"][arm]["splits"]
        cells = [_times(per[split][metric]) for metric in RATIO_METRICS for split in SPLITS]
        lines.append(f"| {arm} | {splits['all']['requests']} ({splits['warm']['requests']}) | {' | '.join(cells)} |")
    return lines


def _times(ratio: float | None) -> str:
    return "-" if ratio is None else f"{ratio:.2f}x"


def _vllm_markdown(result: dict[str, Any]) -> list[str]:
    """The vLLM arms: one request at a time through one engine per arm, against ``vllm`` without drafts."""
    vllm = result["vllm"]
    plain = vllm.get("vllm", {})
    arms = result["arms"]
    server = {r["id"]: r["output"] for r in arms[replay_arm(list(arms))]["records"]} if arms else {}
    lines = [
        "vLLM, the same requests one at a time through one engine per arm (tokens include the stop token; "
        "target passes = tokens - accepted drafts):",
        "",
        "| vLLM arm | requests | tokens | target passes | tokens / pass | tokens/s | x `vllm` tok/s | "
        "accepted / proposed | outputs = `vllm`'s | outputs = the server's |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for arm, data in vllm.items():
        if "error" in data:
            lines.append(f"| {arm} | failed: {data['error'][:200]} | | | | | | | | |")
            continue
        speed = plain.get("tokens_per_second")
        ratio = f"{data['tokens_per_second'] / speed:.2f}x" if speed else "-"
        same_plain = _count_same(plain.get("outputs", {}), data["outputs"])
        same_server = _count_same(server, data["outputs"])
        lines.append(
            f"| `{arm}` | {data['requests']} | {data['tokens']} | {data['passes']} | {data['tokens_per_pass']:.3f} | "
            f"{data['tokens_per_second']:.1f} | {ratio} | {data['accepted']}/{data['proposed']} | "
            f"{same_plain} | {same_server} |"
        )
    refused = {task: error for data in vllm.values() for task, error in data.get("refused", {}).items()}
    if refused:
        first = next(iter(refused.values()))
        lines += ["", f"vLLM refused {len(refused)} of the requests in some arm (left out of its row): {first[:300]}"]
    return lines


def _count_same(reference: dict[str, Any], outputs: dict[str, Any]) -> str:
    """``"equal/compared"`` over the request ids both hold (``-`` when none)."""
    shared = [key for key in outputs if key in reference]
    return f"{sum(list(reference[k]) == list(outputs[k]) for k in shared)}/{len(shared)}" if shared else "-"
