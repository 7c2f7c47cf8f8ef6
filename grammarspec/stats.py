"""Statistics every generation reports."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["GenerationStats", "FINISH_REASONS"]

#: stop: the grammar completed (or EOS in unconstrained mode); stop_string: a stop
#: string matched; length: max_new_tokens reached (a grammar-constrained output is
#: then incomplete and never claimed valid); error: the row's own work raised
#: (grammarspec/engine/isolation.py: its output is what it committed before, never valid).
FINISH_REASONS = ("stop", "eos", "stop_string", "length", "error")


@dataclass
class GenerationStats:
    """What one generate call did.

    ``accepted_per_forward`` -- new tokens per target forward pass -- is the
    number that matters: a verify pass costs about one plain decoding step.
    """

    new_tokens: int = 0
    #: target passes that scored this row (the one that read its prompt and sampled, then one per step)
    target_forwards: int = 0
    #: target passes that only read a chunk of this row's prompt, beside other rows' steps (it joined a busy
    #: batch: :func:`grammarspec.engine.prompt_reading.prompt_plan`); not in ``target_forwards``
    prompt_passes: int = 0
    forced_tokens: int = 0
    proposed: dict[str, int] = field(default_factory=dict)
    accepted: dict[str, int] = field(default_factory=dict)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    grammar_seconds: float = 0.0
    total_seconds: float = 0.0
    #: the first step -- the prompt pass -- ends at this time (from the start
    #: of decoding) having committed this many tokens; what follows is the
    #: decode phase that speculation speeds up
    first_step_seconds: float = 0.0
    first_step_tokens: int = 0
    finish_reason: str = "length"
    #: seconds of the batch steps this row took part in, per phase of the step
    #: (forced, propose, walk, forward, verify, commit: grammarspec.engine.step.run_step)
    phases: dict[str, float] = field(default_factory=dict)
    #: per target forward: (proposal length, accepted draft tokens)
    steps: list[tuple[int, int]] = field(default_factory=list)
    #: the final proposal length and whether speculation was still on
    final_k: int = 0
    speculating: bool = True
    #: the grammar backend that constrained this call, why it was chosen, and the
    #: schema features it does not enforce (grammars.capabilities)
    grammar_backend: str = ""
    backend_reason: str = ""
    unenforced_keywords: list[str] = field(default_factory=list)
    #: constrained calls: whether the output validates against the full request
    #: (grammars.validation.output_errors; False when cut by the token limit),
    #: and jsonschema's errors.  A finished-but-invalid output has finish_reason
    #: "stop", valid False and the errors.  None without a constraint.
    valid: bool | None = None
    schema_errors: list[str] = field(default_factory=list)

    @property
    def accepted_per_forward(self) -> float:
        return self.new_tokens / self.target_forwards if self.target_forwards else 0.0

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds > 0 else 0.0

    @property
    def acceptance_rate(self) -> float:
        proposed = sum(self.proposed.values())
        return sum(self.accepted.values()) / proposed if proposed else 0.0

    def count(self, sources: tuple[str, ...], num_accepted: int) -> None:
        """Add one verified draft: ``sources`` names each token's proposer."""
        for i, name in enumerate(sources):
            self.proposed[name] = self.proposed.get(name, 0) + 1
            if i < num_accepted:
                self.accepted[name] = self.accepted.get(name, 0) + 1
            else:
                self.accepted.setdefault(name, 0)

    def as_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("steps")
        out["accepted_per_forward"] = round(self.accepted_per_forward, 3)
        out["tokens_per_second"] = round(self.tokens_per_second, 2)
        out["acceptance_rate"] = round(self.acceptance_rate, 3)
        return out

    def summary(self) -> str:
        """One human-readable paragraph."""
        per = ", ".join(f"{name} {self.accepted.get(name, 0)}/{n}" for name, n in sorted(self.proposed.items()))
        return (
            f"{self.new_tokens} new tokens in {self.target_forwards} target forward passes "
            f"({self.accepted_per_forward:.2f} tokens/pass), {self.forced_tokens} grammar-forced; "
            f"accepted/proposed: {per or 'no drafts'}; "
            f"time {self.total_seconds:.2f}s (draft {self.draft_seconds:.2f}s, verify "
            f"{self.verify_seconds:.2f}s, grammar {self.grammar_seconds * 1e3:.1f}ms); "
            f"{self.tokens_per_second:.1f} tokens/s; finish: {self.finish_reason}"
        )
