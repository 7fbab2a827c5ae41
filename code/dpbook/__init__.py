"""dpbook: the companion package of chapter 4 (data parallelism: DP, DDP, FSDP)."""

__version__ = "0.1.0"
