"""The child side: ``vllm.LLM`` for a topology in this process (:class:`LocalEngine`).

It runs in the kit's child process (:mod:`kit.engine.child`); a caller that uses it directly must be importable by
spawned workers (a script with a ``__main__`` guard).
"""
from __future__ import annotations

import os
import time

from kit.core.metrics import SpecCounters, scheduler_counters
from kit.core.topology import PARTITION_ENV, Topology
from kit.engine.progress import generation_bar
from kit.engine.result import GenerationResult


# The layer split the kit last put into this process's environment: an engine started later in the same process
# (a notebook, a test) without a split must not inherit it.
_kit_partition: str | None = None


def _apply_env(topology: Topology) -> None:
    global _kit_partition
    for k, v in topology.env().items():
        os.environ.setdefault(k, v)
    env = topology.vllm_env()
    os.environ.update(env)  # an explicit runner choice or layer split wins over the caller's environment
    if PARTITION_ENV not in env and _kit_partition is not None and os.environ.get(PARTITION_ENV) == _kit_partition:
        del os.environ[PARTITION_ENV]
    _kit_partition = env.get(PARTITION_ENV)


class LocalEngine:
    """``vllm.LLM`` for a topology, in this process. Use as a context manager."""

    def __init__(self, topology: Topology):
        self.topology = topology
        self.llm = None

    def __enter__(self) -> "LocalEngine":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        _apply_env(self.topology)
        from vllm import LLM

        args = self.topology.engine_args()
        args.setdefault("worker_extension_cls", "kit.worker.ext.KitWorkerExtension")
        self.llm = LLM(**args)

    def counters(self) -> SpecCounters:
        return SpecCounters.from_metrics(self.llm.get_metrics())

    def generate(self, prompts: list[str], max_tokens: int = 32, temperature: float = 0.0,
                 top2: bool = False, seed: int | None = None, ignore_eos: bool = True,
                 stop_token_ids: list[int] | None = None, progress_lines: bool = False) -> GenerationResult:
        """``progress_lines``: print a line per finished prompt (the runner's log, followed by kit.engine.progress)."""
        from vllm import SamplingParams

        # With a seed, request i gets seed + i: its own reproducible generator (the same seed for every request
        # would make repeated prompts draw identical samples).
        sp = [SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=ignore_eos,
                             logprobs=2 if top2 else None, seed=None if seed is None else seed + i,
                             stop_token_ids=list(stop_token_ids or []))
              for i in range(len(prompts))]
        # One metrics reading before and one after, for both the drafts' and the scheduler's counters.
        metrics = self.llm.get_metrics()
        before, sched_before = SpecCounters.from_metrics(metrics), scheduler_counters(metrics)
        t0 = time.monotonic()
        outs = self.llm.generate(prompts, sp, use_tqdm=generation_bar if progress_lines else False)
        secs = time.monotonic() - t0
        metrics = self.llm.get_metrics()
        spec = SpecCounters.from_metrics(metrics) - before
        sched = {k: v - sched_before[k] for k, v in scheduler_counters(metrics).items()}
        tops = None
        if top2:
            tops = []
            for o in outs:
                rows = []
                for tok, lp in zip(o.outputs[0].token_ids, o.outputs[0].logprobs or []):
                    ranked = sorted(lp.values(), key=lambda x: -x.logprob)
                    rows.append([float(tok), ranked[0].logprob, ranked[1].logprob if len(ranked) > 1 else float("-inf")])
                tops.append(rows)
        return GenerationResult(
            token_ids=[list(o.outputs[0].token_ids) for o in outs],
            texts=[o.outputs[0].text for o in outs],
            prompt_token_ids=[list(o.prompt_token_ids) for o in outs],
            spec=spec, seconds=secs, top2=tops, topology=self.topology.describe(), scheduler=sched)

    def inspect(self) -> list[dict]:
        """Per-rank placement, gathered from each live worker."""
        return self.llm.collective_rpc("kit_placement")

    def close(self) -> None:
        if self.llm is not None:
            try:
                self.llm.llm_engine.engine_core.shutdown()
            except Exception:
                pass
            self.llm = None
