"""ppmtp-kit: learn, check and debug speculative decoding (MTP, Eagle3) under PP and PD in vLLM.

Layers (bottom to top): ``topology``, ``models``, ``metrics``, ``patches``, ``tinymodel`` ->
``procs``, ``engine``/``runner`` -> ``compare`` -> ``cli``. Notebooks call ``kit`` only.
"""
__version__ = "0.1.0"
