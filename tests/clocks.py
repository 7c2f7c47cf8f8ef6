"""Fake clocks and a model that spends fake time: timings that depend on no machine's speed or load.

:class:`FakeClock` is what the profiler (``clock=``), the decoding loop
(``decode_batch(..., clock=...)``) and the step cost learner
(``StepCostLearner(clock=...)``) read instead of ``time.perf_counter``.
:class:`ClockedToy` is the toy target whose every forward advances its clock
by what a pass of that many tokens costs on a simulated machine, so the
profile's passes and the loop's steps take exactly the seconds the test says.
"""

from __future__ import annotations

import torch

from tests.toy_models import ToyCausalLM


class FakeClock:
    """Seconds that move only when told: by ``advance``, and by ``tick`` on every read.  Changes on every read."""

    def __init__(self, tick: float = 0.0) -> None:
        self.now, self.tick, self.reads = 0.0, tick, 0

    def __call__(self) -> float:
        self.reads += 1
        self.now += self.tick
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


class ClockedToy(ToyCausalLM):
    """:class:`ToyCausalLM` (named ``name``, one float32 parameter: a device and a dtype, so its profile is stored)
    whose forward over ``n`` tokens advances ``clock`` by ``fixed + per_token * n`` seconds, times ``burst`` for
    the forwards whose count is in ``bursty`` (another process's busy moment)."""

    def __init__(self, clock: FakeClock, name: str, fixed: float, per_token: float, vocab: int = 40) -> None:
        super().__init__(vocab, seed=3)
        self.config.name_or_path = name
        self.clock, self.fixed, self.per_token = clock, fixed, per_token
        self.weight = torch.nn.Parameter(torch.zeros(1))
        self.forwards, self.burst, self.bursty = 0, 1.0, range(0)

    def seconds(self, tokens: int) -> float:
        """What a forward over ``tokens`` tokens costs on the simulated machine (burst aside).  Pure."""
        return self.fixed + self.per_token * tokens

    def forward(self, input_ids, cache=None, use_cache=True, logits_to_keep=0, attention_mask=None, position_ids=None):
        factor = self.burst if self.forwards in self.bursty else 1.0
        self.forwards += 1
        self.clock.advance(factor * self.seconds(int(input_ids.numel())))
        return super().forward(input_ids, cache, use_cache, logits_to_keep, attention_mask, position_ids)
