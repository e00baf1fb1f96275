"""Settings on a live machine: `.env` profiles and their grammar (profile), the linter
(lint), NCCL conf files (conffile), running processes' environments (procenv, procmem)
and what this machine offers NCCL (sysinfo, for `doctor`).

May import `nccl_tune.nccl` and the root modules; never model, measure, spec or decide.
"""
