"""Modelled: what the server's drafting policy does on a machine whose step times are given, profile against learned.

A busy server's rows (``--batch``) are offered 16-token drafts whose tokens
survive one by one with probability ``--survival``.  Every step the policy
(:func:`grammarspec.policy.allocation.plan_drafts`, packed, as the server plans at batch 2
or more) sizes the drafts on one of:

* ``profile``: the profiled pass cost, fixed (``serve --step-cost profile``);
* ``learned``: a :class:`grammarspec.policy.step_cost.StepCostLearner` started from
  that profile and told every step's modelled seconds (``serve`` by default);

and the step takes the seconds the machine's model gives.  ``none`` verifies no
draft.  The machines:

* ``h200``: the drafted step as the server measured it on an H200 (plain steps
  18 ms at 4 rows and 97 ms at 16; drafted ones 166 and 291 ms), profiled as
  the H200's bare forwards priced it (a pass of up to 256 rows 1.07-1.4 plain
  steps, switch 0.25, per drafting row 0.1);
* ``gpu-flat``: a GPU whose drafted step costs what that profile says;
* ``cpu``: this CPU's server (plain 79 ms at 16 rows; 2 ms more a draft
  token, as its drafted steps took 95 ms with 8), profiled as this CPU's
  ``pass_cost.json`` says (which prices 8 tokens at 16 rows at 0.1 plain steps, 4 ms).

Prints tokens per modelled second against ``none`` for each; the figures are
modelled, not measured.  ``python tools/step_cost_replay.py``.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from grammarspec.policy.adaptive import AdaptiveController  # noqa: E402
from grammarspec.policy.allocation import plan_drafts  # noqa: E402
from grammarspec.policy.step_cost import StepCostLearner  # noqa: E402
from proposers.base import Draft  # noqa: E402
from proposers.cost import PassCost  # noqa: E402

OFFERED = Draft(tokens=tuple(range(10, 26)), sources=("prompt_lookup",) * 16)

#: seconds of a step: (rows stepping, draft tokens verified, drafting rows) -> seconds
Machine = Callable[[int, int, int], float]

H200_PROFILE = PassCost(
    1.07,
    0.0013,
    1,
    switch=0.25,
    per_draft_row=0.1,
    per_token=0.001,
    table={2: 1.07, 4: 1.07, 8: 1.08, 16: 1.1, 64: 1.2, 256: 1.4},
)
CPU_PROFILE = PassCost(
    1.3,
    0.035,
    1,
    switch=0.1,
    per_token=0.00055,
    per_draft_row=0.019,
    table={2: 1.1, 3: 1.1, 4: 1.5, 6: 1.6, 8: 1.9, 12: 2.1, 16: 2.1, 24: 2.2, 32: 2.6, 48: 2.9, 64: 3.4},
)


def _between(batch: int, low: tuple[int, float], high: tuple[int, float]) -> float:
    """Linear in the batch through two measured points (held beyond them)."""
    (b0, t0), (b1, t1) = low, high
    return t0 + (t1 - t0) * (min(max(batch, b0), b1) - b0) / (b1 - b0)


def h200(batch: int, tokens: int, drafting: int) -> float:
    plain = _between(batch, (4, 0.018), (16, 0.097))
    if not tokens:
        return plain
    return _between(batch, (4, 0.166), (16, 0.291)) if batch > 1 else plain * H200_PROFILE.cost(1 + tokens)


def gpu_flat(batch: int, tokens: int, drafting: int) -> float:
    unit = _between(batch, (4, 0.018), (16, 0.097)) / H200_PROFILE.cost(batch)
    return unit * H200_PROFILE.drafted(batch + tokens, tokens, batch=batch, drafting=max(drafting, 1))


def cpu(batch: int, tokens: int, drafting: int) -> float:
    unit = 0.079 / CPU_PROFILE.cost(16)
    return unit * CPU_PROFILE.cost(batch) + 0.002 * tokens  # 16 ms more for 8 draft tokens at 16 rows


MACHINES: dict[str, tuple[Machine, PassCost]] = {
    "h200": (h200, H200_PROFILE),
    "gpu-flat": (gpu_flat, H200_PROFILE),
    "cpu": (cpu, CPU_PROFILE),
}
POLICIES = ("none", "profile", "learned")


def simulate(
    machine: Machine, profile: PassCost, policy: str, batch: int, survival: float, steps: int, seed: int = 0
) -> dict[str, Any]:
    """``steps`` modelled steps of ``batch`` rows under ``policy``: tokens, seconds and the draft tokens each
    step admitted (``learner``: the learned policy's :class:`StepCostLearner`)."""
    if policy not in POLICIES:
        raise ValueError(f"policy {policy!r} is not one of {', '.join(POLICIES)}")
    rng = random.Random(seed)
    controllers = [AdaptiveController() for _ in range(batch)]
    learner = StepCostLearner(profile) if policy == "learned" else None
    tokens = seconds = 0.0
    admitted: list[int] = []
    per_step: list[tuple[float, float]] = []  # running (tokens, seconds) after each step
    for _ in range(steps):
        if policy == "none" or (learner is not None and learner.wants_plain_step()):
            lengths = [0] * batch  # the learner's probe: a plain step, as the loop takes it
        else:
            lengths = plan_drafts([OFFERED] * batch, controllers, batch, learner.cost(batch) if learner else profile)
        for controller, k in zip(controllers, lengths):
            controller.allocated(k, len(OFFERED))
            right = 0  # the draft's leading tokens the target would write
            while right < len(OFFERED) and rng.random() < survival:
                right += 1
            accepted = min(right, k)
            next_token = OFFERED.tokens[k] if right > k else -1  # the target's own token after the accepted ones
            controller.record(OFFERED.truncate(k), accepted, OFFERED, next_token=next_token)
            tokens += accepted + 1
        drafted, drafting = sum(lengths), sum(1 for k in lengths if k)
        took = machine(batch, drafted, drafting)
        if learner is not None:
            learner.observe(rows=batch + drafted, batch=batch, tokens=drafted, drafting=drafting, seconds=took)
        seconds += took
        admitted.append(drafted)
        per_step.append((tokens, seconds))
    return {"tokens": tokens, "seconds": seconds, "admitted": admitted, "learner": learner, "per_step": per_step}


def _rate(run: dict[str, Any], start: int) -> float:
    """Tokens per second from step ``start`` on."""
    (t0, s0), (t1, s1) = run["per_step"][start - 1], run["per_step"][-1]
    return (t1 - t0) / (s1 - s0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--batch", default="4,16", help="rows decoding together (default: 4,16)")
    parser.add_argument("--survival", default="0.35,0.8", help="per-token survival of the drafts (default: 0.35,0.8)")
    parser.add_argument("--steps", type=int, default=400)
    args = parser.parse_args(argv)
    print(
        "Modelled (tools/step_cost_replay.py): tokens per modelled second against none over the second half of "
        f"{args.steps} steps (the whole run in brackets); draft tokens a step over the second half.\n"
    )
    print("| machine | rows | survival | profile x none | learned x none | drafts a step: profile / learned |")
    print("|---|---|---|---|---|---|")
    for name, (machine, profile) in MACHINES.items():
        for batch in (int(b) for b in args.batch.split(",")):
            for p in (float(s) for s in args.survival.split(",")):
                runs = {policy: simulate(machine, profile, policy, batch, p, args.steps) for policy in POLICIES}
                whole = {policy: run["tokens"] / run["seconds"] for policy, run in runs.items()}
                half = {policy: _rate(run, args.steps // 2) for policy, run in runs.items()}
                late = {policy: runs[policy]["admitted"][args.steps // 2 :] for policy in ("profile", "learned")}
                drafts = " / ".join(f"{sum(v) / len(v):.1f}" for v in late.values())
                ratios = [
                    f"{half[policy] / half['none']:.2f} ({whole[policy] / whole['none']:.2f})"
                    for policy in ("profile", "learned")
                ]
                print(f"| {name} | {batch} | {p:g} | {ratios[0]} | {ratios[1]} | {drafts} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
