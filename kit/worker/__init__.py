"""What runs inside vLLM's worker processes: the worker extension (:mod:`~kit.worker.ext`, the RPCs the kit calls
with ``collective_rpc``), the acceptance probe and the step trace.

Loaded by vLLM in its workers, so it may import :mod:`kit.core` only.
"""
