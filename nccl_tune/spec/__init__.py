"""Speculative decoding: tokens per cycle and cycle time (cycle), acceptance conventions
(accept), verify cost against tokens (verify), option text to inputs (options), the step
planner (planner), and the planner under a profile for `recommend --spec-steps`
(profile_steps).

May import `nccl_tune.model` and the root modules; never measure, decide or commands.
"""
