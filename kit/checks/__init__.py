"""Correctness as a measurement: greedy tokens against the PP=1 reference (:mod:`~kit.checks.compare`,
:mod:`~kit.checks.matrix`), sampled acceptance and distributions (:mod:`~kit.checks.sampling`), where things live
(:mod:`~kit.checks.placement`), PyTorch-vs-vLLM parity (:mod:`~kit.checks.parity`), the zoo's start-up probe and
the fault harness (:mod:`~kit.checks.faults`).

May import :mod:`kit.core`, :mod:`kit.patches`, :mod:`kit.worker`, :mod:`kit.zoo`, :mod:`kit.engine` and
:mod:`kit.pd`.
"""
