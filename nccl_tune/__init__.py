"""nccl-tune: measure, choose and keep NCCL settings for tensor-parallel LLM decoding."""

__version__ = "0.1.0"
