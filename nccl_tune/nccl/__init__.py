"""What NCCL is and what it says: the variable catalogue and its grammar per variable
(settings), the installed libnccl (ncclinfo) and its debug log (debuglog, nccllog), the tuner-plugin
CSV format (tuner), `nvidia-smi topo -m` pastes (topology) and nccl-tests output
(nccltests).

Imports only the root modules (errors, stats, store): this is the bottom layer of NCCL
knowledge, read by every layer above it.
"""
