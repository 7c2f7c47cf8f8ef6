"""assistant= values -> proposers."""

from __future__ import annotations

import pytest

from grammarspec.drafting.assistant import draft_maker
from grammarspec.drafting.draft_model import DraftModelProposer
from proposers import PRESETS
from proposers import resolve_assistant as resolve
from proposers.base import Proposer
from proposers.compose import CompositeProposer
from proposers.jump_forward import JumpForwardProposer
from proposers.prompt_lookup import PromptLookupProposer
from proposers.schema_ngram import SchemaNgramProposer
from tests.proposer_fakes import fixed
from tests.toy_models import ToyCausalLM


def resolve_assistant(assistant, draft_model=None):
    """The one resolver, with the runtime's draft-model maker (as generate passes it)."""
    return resolve(assistant, draft_model, make_draft=draft_maker())


def kinds(proposer):
    return [type(p) for p in proposer.proposers]


@pytest.mark.parametrize(
    "name, kind",
    [
        ("prompt_lookup", PromptLookupProposer),
        ("schema_ngram", SchemaNgramProposer),
        ("jump_forward", JumpForwardProposer),
    ],
)
def test_single_presets(name, kind):
    proposer = resolve_assistant(name)
    assert type(proposer) is kind and isinstance(proposer, Proposer)
    assert resolve_assistant(f"  {name.upper()} ").__class__ is kind  # forgiving about case and spaces


def test_auto_combines_the_cheap_drafters_and_adds_a_draft_model_when_given():
    auto = resolve_assistant("auto")
    assert isinstance(auto, CompositeProposer)
    assert kinds(auto) == [JumpForwardProposer, SchemaNgramProposer, PromptLookupProposer]
    model = ToyCausalLM(16)
    auto = resolve_assistant("auto", draft_model=model)
    assert kinds(auto)[-1] is DraftModelProposer and auto.fallbacks == [auto.proposers[-1]]


def test_nothing_to_do():
    assert resolve_assistant(None) is None
    assert resolve_assistant("none") is None
    assert resolve_assistant([]) is None


def test_draft_model_in_every_form():
    model = ToyCausalLM(16)
    assert isinstance(resolve_assistant(model), DraftModelProposer)
    assert isinstance(resolve_assistant(None, draft_model=model), DraftModelProposer)
    assert isinstance(resolve_assistant("draft_model", draft_model=model), DraftModelProposer)
    with pytest.raises(ValueError, match="needs a draft model"):
        resolve_assistant("draft_model")


def test_fresh_objects_every_call():
    a, b = resolve_assistant("auto"), resolve_assistant("auto")
    assert a is not b and all(x is not y for x, y in zip(a.proposers, b.proposers))


def test_lists_are_flattened_into_one_composite():
    mine = fixed("mine", [1, 2])
    combined = resolve_assistant(["jump_forward", mine, "auto"])
    assert isinstance(combined, CompositeProposer)
    assert kinds(combined) == [
        JumpForwardProposer,
        type(mine),
        JumpForwardProposer,
        SchemaNgramProposer,
        PromptLookupProposer,
    ]
    assert combined.name == "jump_forward+mine+jump_forward+schema_ngram+prompt_lookup"
    assert resolve_assistant([mine]) is mine
    assert resolve_assistant(mine) is mine


def test_bad_values_say_what_is_accepted():
    with pytest.raises(ValueError) as info:
        resolve_assistant("ngram")
    for name in PRESETS:
        assert repr(name) in str(info.value)
    with pytest.raises(TypeError, match="preset name"):
        resolve_assistant(42)
    with pytest.raises(TypeError, match="preset name"):
        resolve_assistant(["auto", 3.5])


def test_auto_learns_the_targets_splits_once_per_step(smol_tokenizer, monkeypatch):
    """The three drafters of "auto" share one SplitPreferences, taught by the composite alone, once a step."""
    from proposers.text import SplitPreferences
    from tests.proposer_replay import replay

    learned: list[int] = []
    observe = SplitPreferences.observe

    def counting(self, context):
        learned.append(id(self))
        return observe(self, context)

    monkeypatch.setattr(SplitPreferences, "observe", counting)
    auto = resolve_assistant("auto")
    assert all(p.splits is auto.splits for p in auto.proposers if hasattr(p, "splits"))
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    }
    tok = smol_tokenizer
    prompt = tok.encode("Ada Lovelace is 36 years old.", add_special_tokens=False)
    reference = tok.encode('{"name":"Ada Lovelace","age":36}', add_special_tokens=False)
    result = replay(auto, tok, schema, prompt, reference, 8)
    assert result is not None and result.steps > 1
    assert set(learned) == {id(auto.splits)}  # no member keeps a learner of its own
    assert len(learned) == result.steps  # one lesson per step, none twice


def test_building_the_cheap_presets_never_imports_the_runtime():
    """Layering: proposers/ sits below grammarspec/ (only the draft-model drafter needs it)."""
    import subprocess
    import sys

    code = (
        "import sys; from proposers import resolve_assistant; "
        "[resolve_assistant(p) for p in ('auto', 'schema_ngram', 'jump_forward', 'prompt_lookup', ['auto'])]; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'grammarspec'))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_capabilities_are_declared_not_read_from_classes():
    """The composite's leader and the tokenizer check follow declared capabilities, whatever the class."""
    import torch

    from grammarspec.inputs import needs_tokenizer
    from proposers.base import EMPTY_DRAFT, Draft, ForcedSpanDrafter, TextDrafter

    class Forcing:
        name = "forcing"
        needs_tokenizer = True

        def start(self, request):
            pass

        def forced(self, context, grammar, k):
            return Draft(tokens=(7,), sources=(self.name,))

        def propose(self, context, grammar, k):
            return EMPTY_DRAFT

        def commit(self, draft, num_accepted, committed):
            pass

    leader, follower = Forcing(), fixed("follower", [8, 9])
    assert isinstance(leader, ForcedSpanDrafter) and isinstance(leader, TextDrafter)
    composite = CompositeProposer([follower, leader])
    assert composite.leaders == [leader] and composite.followers == [follower]
    draft = composite.propose([1], None, 3)
    assert draft.tokens[0] == 7 and draft.sources[0] == "forcing"  # the declared leader drafts first
    assert needs_tokenizer(composite) and needs_tokenizer(resolve_assistant("auto"))
    assert not needs_tokenizer(follower) and not needs_tokenizer(resolve_assistant("prompt_lookup"))
    model = ToyCausalLM(vocab_size=56, seed=0)
    with pytest.raises(ValueError, match="needs the tokenizer"):
        import grammarspec

        grammarspec.generate(model, torch.tensor([[1, 2]]), assistant=[leader], max_new_tokens=2)
