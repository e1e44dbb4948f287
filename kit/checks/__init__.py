"""Correctness as a measurement: greedy tokens against the PP=1 reference (:mod:`~kit.checks.compare`,
:mod:`~kit.checks.matrix`), sampled acceptance and distributions (:mod:`~kit.checks.sampling`), where things live
(:mod:`~kit.checks.placement`), PyTorch-vs-vLLM parity (:mod:`~kit.checks.parity`), the zoo's start-up probe,
the fault harness (:mod:`~kit.checks.faults`) and whether the patches fit a vLLM source tree
(:mod:`~kit.checks.patch_compat`).

May import :mod:`kit.core`, :mod:`kit.patches`, :mod:`kit.worker`, :mod:`kit.zoo`, :mod:`kit.engine` and
:mod:`kit.pd`.
"""
