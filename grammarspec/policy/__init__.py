"""Pure drafting policy: how many tokens to draft per row, from the pass cost it is handed and acceptance.

No profiler, no disk, no model runs: the pass cost comes in as a value (:mod:`grammarspec.policy.cost`).
"""
