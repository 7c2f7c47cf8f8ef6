"""Drafting that needs the model: the draft model, assistant resolution, and the pass cost model (its profile
measured, fitted, stored and checked; :mod:`grammarspec.drafting.cost_model` hands it to the loop's callers)."""
