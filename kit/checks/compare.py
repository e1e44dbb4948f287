"""Correctness as a measurement: a topology's greedy tokens against the PP=1, no-spec reference (``kit compare``)."""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass

from kit.core.flags import (
    add_command,
    add_model_flags,
    add_output_flags,
    add_prompt_flags,
    add_runner_flag,
    read_prompts,
)
from kit.core.prompts import DEFAULT_PROMPTS, load_prompts  # noqa: F401 - kit.checks.compare.load_prompts is public
from kit.core.topology import Spec, Topology, TopologyError
from kit.core.validate import check_count, check_max_tokens, check_temperature
from kit.engine import EngineError, GenerationResult, first_divergence, generate  # noqa: F401 - kit.checks.compare.first_divergence is public


@dataclass
class Comparison:
    topology: Topology
    reference: GenerationResult
    result: GenerationResult
    # Multi-node runs with a drafter: the same drafter at PP=1 on one node, whose counters the nodes must match.
    single_node: GenerationResult | None = None

    @property
    def divergence(self) -> dict | None:
        return first_divergence(self.reference, self.result)

    @property
    def identical(self) -> bool:
        return self.divergence is None

    def to_dict(self) -> dict:
        s = self.result.spec
        return {
            "identical": self.identical,
            "num_prompts": len(self.reference.token_ids),
            "num_tokens": self.reference.num_generated,
            "first_divergence": self.divergence,
            "acceptance": {"num_drafts": s.num_drafts, "num_draft_tokens": s.num_draft_tokens,
                           "num_accepted_tokens": s.num_accepted_tokens, "per_position": s.per_position,
                           "mean_acceptance_length": s.mean_acceptance_length},
            "scheduler": {"run": self.result.scheduler, "reference": self.reference.scheduler},
            **self._single_node_dict(),
            **({"timeline": self.result.topology["timeline"]} if "timeline" in self.result.topology else {}),
            "topology": self.topology.describe(),
            "reference_topology": self.topology.reference().describe(),
            "seconds": {"reference": self.reference.seconds, "run": self.result.seconds,
                        "reference_start": self.reference.topology.get("start_seconds"),
                        "run_start": self.result.topology.get("start_seconds")},
        }


    @property
    def acceptance_equal(self) -> bool | None:
        """Multi-node with a drafter: whether its counters equal the single-node PP=1 run's (else None)."""
        if self.single_node is None:
            return None
        return self.single_node.spec.to_dict() == self.result.spec.to_dict()

    def _single_node_dict(self) -> dict:
        if self.single_node is None:
            return {}
        return {"acceptance_single_node_pp1": self.single_node.spec.to_dict(),
                "acceptance_equal_single_node_pp1": self.acceptance_equal,
                "nodes": self.result.topology.get("nodes"), "network": self.result.topology.get("network"),
                "listening": self.result.topology.get("listening")}


def compare(topology: Topology, prompts: list[str], max_tokens: int = 32, timeout: float = 900.0,
            env: dict[str, str] | None = None, reference: GenerationResult | None = None,
            stop_token_ids: list[int] | None = None, timeline: bool = False) -> Comparison:
    """Run the reference (unless given) and ``topology`` on the same prompts, greedy; compare tokens.

    A multi-node topology (``nodes > 1``) runs through :mod:`kit.engine.multinode` (``backend="mp"``: leader server +
    headless followers; ``"ray"``: the server's Ray executor over the kit's local Ray cluster); with a drafter, the
    same drafter at PP=1 on one node also runs, for its acceptance counters.

    ``timeline``: every step of the run is traced inside its workers (:mod:`kit.worker.steptrace`, on every node) and
    ``result.topology["timeline"]`` is the trace's :func:`kit.worker.steptrace.summary` (decode steps with two
    micro-batches in flight, busy and idle time per stage)."""
    if timeline and stop_token_ids:
        raise TopologyError("a traced run (timeline) takes no stop tokens")
    if reference is None:
        reference = generate(topology.reference(), prompts, max_tokens=max_tokens, top2=True, timeout=timeout, env=env,
                             stop_token_ids=stop_token_ids)
    single = None
    if topology.nodes > 1 and topology.spec is not None:
        single = generate(topology.with_(pp=1, tp=1, nodes=1, backend="mp"), prompts, max_tokens=max_tokens,
                          timeout=timeout, env=env)
    if timeline:
        result = _traced(topology, prompts, max_tokens, timeout, env)
    elif topology.nodes > 1:
        from kit.engine import multinode

        result = multinode.generate(topology, prompts, max_tokens=max_tokens, timeout=timeout, env=env)
    else:
        result = generate(topology, prompts, max_tokens=max_tokens, timeout=timeout, env=env,
                          stop_token_ids=stop_token_ids)
    return Comparison(topology, reference, result, single)


def _traced(topology: Topology, prompts: list[str], max_tokens: int, timeout: float,
            env: dict[str, str] | None) -> GenerationResult:
    """``topology``'s generation with every step traced in its workers; the trace's summary in ``topology``."""
    from kit.checks.placement import traced_placement
    from kit.worker import steptrace

    r = traced_placement(topology, prompts, max_tokens=max_tokens, env=env, timeout=timeout)
    g = r["generation"]
    g.topology["timeline"] = steptrace.summary(steptrace.merge(r["trace"]))
    if r["nodes"]:
        g.topology["nodes"] = r["nodes"]
    return g


# -- kit compare ----------------------------------------------------------------------------------

def register(sub) -> None:
    """Add ``kit compare`` to the ``kit`` command tree (exit 0 identical, 1 not identical or failed, 2 bad input)."""
    p = add_command(sub, "compare", run, help="a topology's greedy tokens against the PP=1 no-spec reference")
    add_model_flags(p)
    add_runner_flag(p)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--spec", default=None, help="METHOD:K, e.g. mtp:2, eagle3:2, ngram:3, or none")
    p.add_argument("--nodes", type=int, default=1,
                   help="spread the PP stages over N nodes (here: local nodes on loopback, a core each)")
    p.add_argument("--backend", default="mp", help="multi-node executor: mp (vLLM's multiprocessing launch) or ray")
    add_prompt_flags(p)
    add_output_flags(p)
    p.add_argument("--compiled", action="store_true", help="torch.compile instead of enforce_eager")
    p.add_argument("--max-num-seqs", type=int, default=None)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--layer-partition", default=None, metavar="N,N[,...]|auto",
                   help="decoder layers per PP stage, first stage first (vLLM's VLLM_PP_LAYER_PARTITION), e.g. 5,3; "
                        "auto: one layer off the last stage per drafter pass (kit.core.partition.auto_partition)")
    p.add_argument("--temperature", type=float, default=0.0,
                   help="> 0: a sampled run (request i seeded --seed + i): acceptance per draft position against "
                        "the target's probabilities of the drafts, instead of comparing greedy tokens")
    p.add_argument("--distribution", action="store_true",
                   help="with --temperature: also test that the output distribution equals the plain engine's")
    p.add_argument("--samples", type=int, default=200, help="samples per context for --distribution")
    p.add_argument("--timeline", action="store_true",
                   help="trace every step inside the workers (every node's) and print the run's step timeline: "
                        "decode steps with two micro-batches in flight, busy / idle per stage (kit.worker.steptrace)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last line")
    p.add_argument("--verbose", action="store_true", help="the summary lines too, with --json")


def run(args: argparse.Namespace) -> int:
    topo = Topology(model=args.model, random_weights=args.random, seed=args.seed, pp=args.pp,
                    spec=Spec.parse(args.spec), dtype=args.dtype, enforce_eager=not args.compiled,
                    max_num_seqs=args.max_num_seqs, max_model_len=args.max_model_len,
                    nodes=args.nodes, backend=args.backend, runner=args.runner,
                    layer_partition=args.layer_partition)
    check_max_tokens(args.max_tokens, topo.model_len)
    if topo.nodes > 1 or topo.backend != "mp":
        from kit.engine.multinode import check_backend

        check_backend(topo)
    if topo.nodes > 1 and (args.temperature != 0 or args.distribution):
        raise TopologyError("--nodes > 1 compares greedy tokens only: drop --temperature / --distribution")
    if args.timeline and (args.temperature != 0 or args.distribution):
        raise TopologyError("--timeline traces greedy runs only: drop --temperature / --distribution")
    prompts = read_prompts(args)
    if args.temperature != 0 or args.distribution:
        return _run_sampled(args, topo, prompts)
    try:
        c = compare(topo, prompts, max_tokens=args.max_tokens, timeout=args.timeout, timeline=args.timeline)
    except EngineError as e:
        print(f"kit compare: engine failed: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"identical": False, "error": str(e), "topology": topo.describe()}))
        return 1
    d = c.to_dict()
    if not args.json or args.verbose:
        print(f"reference : {topo.reference().label()}  ({d['seconds']['reference']:.1f} s)")
        print(f"run       : {topo.label()}  ({d['seconds']['run']:.1f} s)")
        print(f"prompts   : {d['num_prompts']} x {args.max_tokens} tokens")
        print(f"identical : {d['identical']}")
        if d["first_divergence"]:
            print(f"divergence: {d['first_divergence']}")
        a = d["acceptance"]
        print(f"acceptance: drafts={a['num_drafts']} draft_tokens={a['num_draft_tokens']} "
              f"accepted={a['num_accepted_tokens']} per_position={a['per_position']} "
              f"mean_len={a['mean_acceptance_length']}")
        if c.single_node is not None:
            print(f"nodes     : {d['nodes']}")
            print(f"acceptance equal to PP=1 on one node: {c.acceptance_equal} "
                  f"({d['acceptance_single_node_pp1']})")
        if "timeline" in d:
            from kit.worker import steptrace

            t = d["timeline"]
            print(f"timeline  : {t['in_flight']['overlap_steps']} of {t['decode_steps']} decode steps with two "
                  f"micro-batches in flight (ms per step below)")
            print("\n".join(steptrace.TIMELINE_HEAD + [steptrace.summary_line(topo.label(), t)]))
    if args.json:
        print(json.dumps(d))
    return 0 if d["identical"] and c.acceptance_equal is not False else 1


def _run_sampled(args: argparse.Namespace, topo: Topology, prompts: list[str]) -> int:
    """``kit compare --temperature T``: sampled acceptance against theory (and ``--distribution``: the output
    distribution against the plain engine's). Exit 0 when every check holds, 1 when one does not."""
    from kit.checks.sampling import distribution_check, sampled_acceptance

    t = check_temperature(args.temperature, "--temperature")
    check_count(args.samples, "--samples", minimum=10)
    try:
        acc = sampled_acceptance(topo, prompts, t, seed=args.seed, max_tokens=args.max_tokens, timeout=args.timeout)
        d = acc.to_dict()
        ok = acc.agrees
        if args.distribution:
            check, _ = distribution_check(topo, prompts[:4], t, samples=args.samples, tokens=4, seed=args.seed,
                                          timeout=args.timeout)
            d["distribution"] = check.to_dict()
            ok = ok and check.same_distribution
    except EngineError as e:
        print(f"kit compare: engine failed: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"ok": False, "agrees_with_theory": False, "error": str(e), "topology": topo.describe()}))
        return 1
    d["ok"] = ok
    if not args.json or args.verbose:
        print(f"run        : {topo.label()}, temperature {t}, seed {args.seed}, {len(prompts)} prompts x "
              f"{args.max_tokens} tokens")
        print(f"greedy     : accepted {acc.greedy.num_accepted_tokens} of {acc.greedy.num_draft_tokens} drafts "
              f"(rate {acc.greedy.acceptance_rate})")
        print(f"sampled    : accepted {acc.sampled.num_accepted_tokens} of {acc.sampled.num_draft_tokens} drafts "
              f"(rate {acc.sampled.acceptance_rate}, {acc.ratio_to_greedy} x greedy)")
        print("position   reached accepted expected    sd       z")
        for p in d["per_position"]:
            print(f"  {p['position']:<8d} {p['reached']:7d} {p['accepted']:8d} {p['expected']:8.1f} {p['sd']:5.1f} "
                  f"{p['z'] if p['z'] is not None else '-':>7}")
        print(f"theory     : {'agrees' if acc.agrees else 'DISAGREES'} (|z| <= {d['z_limit']} at every position)")
        if args.distribution:
            dd = d["distribution"]
            print(f"distribution: {'same' if dd['same_distribution'] else 'DIFFERENT'} as the plain engine's "
                  f"({dd['num_tests']} chi-square tests, min p {dd['min_p']:.3g}, threshold {dd['threshold']:.3g})")
    if args.json:
        print(json.dumps(d))
    return 0 if ok else 1
