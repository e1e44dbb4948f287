"""ppmtp-kit: learn, check and debug speculative decoding (MTP, Eagle3) under PP and PD in vLLM.

Layers (bottom to top): ``topology``, ``models``, ``metrics``, ``vllm_process``, ``patches``, ``tiny`` (the PyTorch models and
their trainers) -> ``procs``, ``engine``/``runner`` -> ``compare``, ``tiny.parity`` -> ``cli``, ``tiny.cli``.
Notebooks call ``kit`` only.
"""
__version__ = "0.1.0"
