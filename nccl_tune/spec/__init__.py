"""Speculative decoding: tokens per cycle, cycle time and the decision (cycle), acceptance
conventions (accept), verify cost against tokens (verify) and against the batch
(saturation: per-sequence cost and the compute-bound knee), the cycle fit from measured
tok/s alone (cyclefit), reconciliation of given figures (reconcile), option text to inputs
(options), the step planner (planner), the planner under a profile for `recommend
--spec-steps` (profile_steps), and vLLM's per-batch-size schedule (schedule).

May import `nccl_tune.model` and the root modules (fileio: the schedule is written
atomically); never measure, decide or commands.
"""
