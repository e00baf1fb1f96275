"""Decisions and their renderings: per-(cell, size) summaries with intervals (report),
ranking cells by time saved per token and the cell an export writes (recommendation),
the tuner-plugin rules for that cell (tuner_rows), `recommend` as one call
(recommend_run: RecommendRequest -> run -> RecommendResult), the exported profile, conf
file and tuner CSV, which render those decisions (export), and plots (plotting,
recommend_plot).

May import spec, measure, model, live, nccl and the root modules; never commands or
integration.
"""
