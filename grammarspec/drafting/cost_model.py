"""The target's pass cost model as the loop drafts by it: profiled once per model and machine, checked, measured again.

:func:`batch_cost_model` gives one :class:`~proposers.cost.PassCost` per
model, device, dtype, thread count and head kernel, chosen by
``$GRAMMARSPEC_PASS_COST``: ``profile`` (the default) measures it at first use
(:mod:`grammarspec.drafting.pass_profile`) and keeps it on disk for the next
process (:mod:`grammarspec.drafting.profile_store`); ``prior`` takes the CPU
prior (:func:`grammarspec.policy.cost.prior_cost`), for draft lengths that never
depend on the machine.  :func:`checked_cost_model` readies it before a call
and hands back its :class:`~grammarspec.drafting.profile_check.ProfileCheck`;
a check that disagrees has it measured again before the next call.

The loop does not call these itself: its owner (``generate``, a
:class:`grammarspec.Conversation`, the server) hands it a
:class:`ProfiledCost`, which calls them when the loop first needs the cost
(:class:`grammarspec.policy.cost.PassCostSource`), so a call that never drafts
never profiles.
"""

from __future__ import annotations

import os
import warnings
from typing import Any

from grammarspec.drafting.pass_profile import Measured, profile_or_prior
from grammarspec.drafting.profile_check import ProfileCheck
from grammarspec.drafting.profile_store import forget_profile, stored_measurement
from grammarspec.policy.cost import Clock, prior_cost
from proposers.cost import PassCost

__all__ = [
    "PASS_COST_ENV",
    "ProfiledCost",
    "batch_cost_model",
    "checked_cost_model",
    "measure_cost_model",
]


class ProfiledCost:
    """``model``'s pass cost as ``$GRAMMARSPEC_PASS_COST`` chooses it (:func:`batch_cost_model`), and its check
    (:func:`checked_cost_model`): the :class:`~grammarspec.policy.cost.PassCostSource` that ``generate`` and the
    server hand the decoding loop.  Holds the model only; measures when the loop first asks."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def cost(self) -> PassCost:
        return batch_cost_model(self.model)

    def checked(self, clock: Clock) -> ProfileCheck | None:
        return checked_cost_model(self.model, clock)


_COST_MODELS: dict[tuple[Any, ...], PassCost] = {}
#: The measured profile behind each profiled cost model (none for the prior, or where profiling failed) ...
_MEASURED: dict[tuple[Any, ...], Measured] = {}
#: ... its check against the passes the loops of this process timed ...
_CHECKS: dict[tuple[Any, ...], ProfileCheck] = {}
#: ... and the keys whose check disagreed (-> why): measured again before the next call that drafts on them.
_STALE: dict[tuple[Any, ...], str] = {}
#: Profiles measured again in this process, per key: each later check asks for twice the passes.
_REMEASURED: dict[tuple[Any, ...], int] = {}
PASS_COST_ENV = "GRAMMARSPEC_PASS_COST"
_PASS_COST_MODES = ("profile", "prior")


def batch_cost_model(model: Any, *, clock: Clock | None = None) -> PassCost:
    """The pass cost model of ``model`` on its device, dtype and this process's thread count.

    ``$GRAMMARSPEC_PASS_COST`` chooses it: ``profile`` (the default) times a
    few passes once per such key at first use (by ``clock``, default
    ``time.perf_counter``; :func:`grammarspec.drafting.pass_profile.measure_profile`) and keeps the curve on
    disk for the next process (:func:`grammarspec.drafting.profile_store.stored_measurement`); ``prior`` takes the
    CPU prior :class:`PassCost`, for draft lengths that never depend on the
    machine.  Either way one :class:`PassCost` per key within a call: the HF
    loop does not teach it measured times (a timing-dependent cost would make
    draft lengths, and so seeded samples and floating-point ties, drift within
    a call); between calls a profile that the passes of a lone row disagree
    with is measured again (:func:`checked_cost_model`).  The vLLM proposer teaches
    its own, and the server's loop prices steps by a
    :class:`~grammarspec.policy.step_cost.StepCostLearner` that starts from it.
    Raises ``ValueError`` for any other value.  Does not change state beyond
    creating (and profiling) the model on first use.
    """
    mode, key, label = _cost_key(model)
    found = _COST_MODELS.get(key)
    if found is None:
        if mode == "profile":
            found = _measure(model, key, label, clock)
        else:
            found = _COST_MODELS[key] = prior_cost()
    return found


def checked_cost_model(model: Any, clock: Clock | None = None) -> ProfileCheck | None:
    """Before a call whose rows draft on the profile: ``model``'s profile ready for the whole call, and the check of
    it against the passes this call times (``None`` where there is nothing to check: the prior, or a model that
    could not be profiled).

    The profile is measured now at first use (by ``clock``), and measured again
    where the passes of an earlier call disagreed with it
    (:class:`~grammarspec.drafting.profile_check.ProfileCheck`): between calls, never
    within one, so a call's draft lengths follow one curve.  A check that
    disagrees warns once (a ``RuntimeWarning`` naming the model and what
    disagreed) and deletes the stored entry, so a process that ends first
    leaves the next one to measure it.  Changes the cost models (and the
    stored profiles) when it measures.
    """
    mode, key, label = _cost_key(model)
    if mode != "profile":
        return None
    why = _STALE.pop(key, None)
    if why is not None:
        _REMEASURED[key] = _REMEASURED.get(key, 0) + 1
        _measure(model, key, label, clock, why=f"the passes timed disagreed: {why}")
    elif key not in _COST_MODELS:
        _measure(model, key, label, clock)
    return _CHECKS.get(key)


def measure_cost_model(model: Any, why: str, clock: Clock | None = None) -> str:
    """Measure ``model``'s profile now, whatever is stored (``why``: kept in the entry), and keep it for this process
    and the next; the label it is stored under.  Raises ``ValueError`` where no profile would be stored: the
    prior mode, or a model with no name or device.  Changes the cost models and the stored profiles."""
    mode, key, label = _cost_key(model)
    if label is None:
        if mode != "profile":
            raise ValueError(f"{PASS_COST_ENV}={mode}: drafts are sized by the CPU prior, no profile is used; unset it")
        raise ValueError("the model has no name or device to store a profile under (a model built in code)")
    _STALE.pop(key, None)
    _measure(model, key, label, clock, why=why)
    return label


def _measure(model: Any, key: tuple[Any, ...], label: str | None, clock: Clock | None, why: str = "") -> PassCost:
    """Profile ``model`` (stored under ``label``; ``why``: again, whatever is stored) and keep it and its check
    under ``key``.  Changes the cost models."""
    if label is not None:  # a named model: one profile per machine, kept on disk
        measured = stored_measurement(model, label, clock=clock, why=why)
    else:  # a model built in code: profiled for this process only
        measured = profile_or_prior(model, clock=clock, why=why)
    _COST_MODELS[key] = measured.cost
    _CHECKS.pop(key, None)
    _MEASURED.pop(key, None)
    if measured.step_seconds is not None:
        _MEASURED[key] = measured
        name = label.split("|")[0] if label else "the model"
        _CHECKS[key] = ProfileCheck(
            measured,
            steps=PROFILE_CHECK_STEPS << _REMEASURED.get(key, 0),
            window=PROFILE_CHECK_WINDOW << _REMEASURED.get(key, 0),
            on_disagree=lambda reason: _disagreed(key, label, name, reason),
        )
    return measured.cost


#: Passes of a lone row a bin of rows needs before its median is compared (:class:`ProfileCheck`), and the most it
#: keeps; doubled for each time the profile was measured again in this process.
PROFILE_CHECK_STEPS = 16
PROFILE_CHECK_WINDOW = 64


def _disagreed(key: tuple[Any, ...], label: str | None, name: str, reason: str) -> None:
    """A check disagreed: one notice; the profile is measured again before the next call (and by the next process,
    its stored entry deleted)."""
    _STALE[key] = reason
    if label is not None:
        forget_profile(label)
    warnings.warn(
        f"grammarspec: the pass-cost profile of {name} disagrees with the passes this process timed ({reason}); "
        "measuring it again before the next call (see `grammarspec profile --show`)",
        RuntimeWarning,
        stacklevel=2,
    )


def _cost_key(model: Any) -> tuple[str, tuple[Any, ...], str | None]:
    """``(mode, key, label)``: ``$GRAMMARSPEC_PASS_COST``'s mode, the in-process key of ``model``'s cost model and
    the label of its stored profile (``None``: not stored, a model built in code, or the prior).  Pure."""
    import torch

    mode = os.environ.get(PASS_COST_ENV, "profile").strip().lower() or "profile"
    if mode not in _PASS_COST_MODES:
        raise ValueError(
            f"{PASS_COST_ENV}={os.environ[PASS_COST_ENV]!r}: expected one of {', '.join(_PASS_COST_MODES)}"
        )
    try:
        parameter = next(model.parameters())
        device, dtype = str(parameter.device), str(parameter.dtype)
    except (AttributeError, StopIteration, TypeError):
        device, dtype = "unknown", "unknown"
    config = getattr(model, "config", None)
    name = getattr(config, "name_or_path", "") or ""  # an unnamed model (built in code) is only itself
    from grammarspec.model.prepacked_head import PrepackedLinear

    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    packed = isinstance(head, PrepackedLinear)  # another head kernel, another curve
    threads = torch.get_num_threads()
    key = (mode, name or type(model).__name__, id(model) if not name else None, device, dtype, threads, packed)
    label = None
    if mode == "profile" and name and device != "unknown":
        where = torch.cuda.get_device_name(parameter.device) if parameter.device.type == "cuda" else device
        label = f"{name}|{where}|{dtype}|threads={threads}|torch={torch.__version__}"
        if packed:
            label += "|head=prepacked"
    return mode, key, label
