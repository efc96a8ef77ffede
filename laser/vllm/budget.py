"""Former home of the vLLM proposer's chain budget and step cost, kept for callers outside ``laser/``.

Import from :mod:`laser.vllm.chain_budget` (``ChainBudget``) and :mod:`laser.vllm.step_cost`
(``StepCost``, ``prior_cost``) instead; this module goes once no caller uses it.
"""
from laser.vllm.chain_budget import ChainBudget
from laser.vllm.step_cost import StepCost, prior_cost

__all__ = ["ChainBudget", "StepCost", "prior_cost"]
