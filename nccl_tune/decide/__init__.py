"""Decisions and their renderings: per-(cell, size) summaries with intervals (report),
ranking cells by time saved per token (recommendation), the exported profile, conf file
and tuner CSV (export), and plots (plotting).

May import spec, measure, model, live, nccl and the root modules; never commands or
integration.
"""
