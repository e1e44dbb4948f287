"""``kit pd``: a producer/consumer pair on real vLLM servers, compared with the PP=1 no-spec reference.

Exit 0 identical and the handoff worked, 1 otherwise, 2 bad input (before any server starts).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import datetime, timezone

from kit.core.flags import (
    add_command,
    add_model_flags,
    add_output_flags,
    add_prompt_flags,
    parse_assignments,
    read_prompts,
)
from kit.core.topology import Spec, TopologyError
from kit.core.validate import check_api_key, check_count, check_max_tokens
from kit.engine import EngineError
from kit.pd.client import PDError
from kit.pd.compare import pd_compare
from kit.pd.layout import DEFAULT_KV_EXTRA_CONFIG, check_pair, pd_topologies
from kit.pd.vllm_router import ROUTERS, choose_router


def parse_kv_extra(items: list[str]) -> dict:
    """``--kv-extra`` entries: ``kv_connector_extra_config`` keys, values read as JSON when they parse."""
    return parse_assignments(items, "--kv-extra", json_values=True)


def register(sub) -> None:
    """Add ``kit pd`` to the ``kit`` command tree."""
    p = add_command(sub, "pd", run, help="producer (prefill) hands KV to a consumer (decode); compare with the reference",
                    description="PD disaggregation on real vLLM servers with a NIXL connector: producer (prefill) "
                                "-> consumer (decode), compared with the PP=1 no-spec reference")
    add_model_flags(p)
    p.add_argument("--producer-pp", type=int, default=1)
    p.add_argument("--producer-spec", default=None, help="METHOD:K on the producer, e.g. mtp:2 (or none)")
    p.add_argument("--consumer-pp", type=int, default=1)
    p.add_argument("--consumer-spec", default=None, help="METHOD:K on the consumer (or none)")
    p.add_argument("--connector", choices=["auto", "nixl", "nixl-push"], default="auto",
                   help="pull (nixl), push (nixl-push), or auto: push when the KV layer layouts differ")
    add_prompt_flags(p)
    add_output_flags(p)
    p.add_argument("--stream", action="store_true", help="stream from the consumer")
    p.add_argument("--concurrency", type=int, default=1, help="requests in flight at once")
    p.add_argument("--router", choices=list(ROUTERS), default="auto",
                   help="who sends each request's prefill and decode calls: vLLM's vllm-router, the kit (also records "
                        "the producer's answer and the prefill/decode time split), or auto: vllm-router for the pull "
                        "connector, the kit for push (vllm-router 0.1.17 drops a push producer's pp_size)")
    p.add_argument("--colocated-acceptance", action="store_true",
                   help="also run the consumer topology as one plain engine and compare spec-decode acceptance")
    p.add_argument("--kv-extra", action="append", default=[], metavar="KEY=VALUE",
                   help="a kv_connector_extra_config entry for both servers (VALUE read as JSON when it parses), "
                        "e.g. enforce_handshake_compat=false; repeatable")
    p.add_argument("--api-key", default=os.environ.get("KIT_API_KEY"), metavar="KEY",
                   help="both servers answer /v1/* only with this key (vLLM's VLLM_API_KEY); the router sends it. "
                        "Default: $KIT_API_KEY (an environment variable keeps the key out of the process list)")
    p.add_argument("--json", action="store_true", help="print one JSON object as the last stdout line")
    p.add_argument("--write", default=None, metavar="FILE",
                   help="also write the pair's result into FILE (docs/results/pd.md) as this command's results block")


def run(args: argparse.Namespace) -> int:
    from kit.core.results import check_writable

    if getattr(args, "write", None) and (why := check_writable(args.write)):
        raise TopologyError(why)
    started = datetime.now(timezone.utc)
    check_api_key(args.api_key, "--api-key")
    check_count(args.concurrency, "--concurrency")
    prod, cons = pd_topologies(args.model, args.producer_pp, Spec.parse(args.producer_spec), args.consumer_pp,
                               Spec.parse(args.consumer_spec), random_weights=args.random, seed=args.seed,
                               dtype=args.dtype)
    check_max_tokens(args.max_tokens, cons.model_len)
    if not args.random and not prod.info.has_trained_weights:
        raise TopologyError(f"model {prod.info.name} ships no trained weights: use random weights (--random)")
    prompts = read_prompts(args)
    kv_extra = parse_kv_extra(args.kv_extra)
    connector = None if args.connector == "auto" else args.connector
    chosen, _ = check_pair(prod, cons, connector, None, {**DEFAULT_KV_EXTRA_CONFIG, **kv_extra})  # refuses what vLLM would
    choose_router(args.router, chosen, prod.pp)
    try:
        d = pd_compare(prod, cons, prompts, max_tokens=args.max_tokens, stream=args.stream,
                       concurrency=args.concurrency, connector=connector, timeout=args.timeout,
                       colocated=args.colocated_acceptance, kv_extra_config=kv_extra, router=args.router,
                       api_key=args.api_key)
    except (EngineError, PDError) as e:
        print(f"kit pd: failed: {e}", file=sys.stderr)
        if args.json:
            print(json.dumps({"identical": False, "handoff_ok": False, "error": str(e)}))
        if getattr(args, "write", None):
            _write(args, started, f"**failed**: {str(e).splitlines()[0][:300]}")
        return 1
    if getattr(args, "write", None):
        _write(args, started, pair_block(d, prod.label(), cons.label(), args.max_tokens))
    if args.json:
        print(json.dumps(d))
    else:
        _print_summary(d, prod.label(), cons.label(), args)
    return 0 if d["identical"] and d["handoff_ok"] else 1


def _print_summary(d: dict, producer: str, consumer: str, args: argparse.Namespace) -> None:
    print(f"connector : {d['connector_class']} ({d['connector_reason']})")
    print(f"router    : {d['router']}" + (f" {d['vllm_router']['version']} (started in {d['vllm_router']['start_s']} s; "
                                              f"log {d['vllm_router']['log']})" if d["vllm_router"] else "")
          + f"; {d['router_reason']}")
    print(f"producer  : {producer}   consumer: {consumer}")
    print(f"prompts   : {d['num_prompts']} x {args.max_tokens} tokens, stream={args.stream}, "
          f"concurrency={args.concurrency}")
    print(f"identical : {d['identical']}" + (f"  divergence {d['first_divergence']}" if d["first_divergence"] else ""))
    print(f"kv bytes  : measured {d['kv_bytes_transferred']} in {d['kv_transfers']} transfers, "
          f"expected {d['kv_bytes_expected']} ({d['kv_expected']['formula']})")
    print(f"consumer  : prefill tokens computed {d['consumer_prefill_tokens_computed']}, "
          f"received {d['consumer_external_tokens']} of {d['prompt_tokens']}")
    print(f"handoff   : {'ok' if d['handoff_ok'] else 'FAILED'} {d['handoff_checks']}")
    for t in d["timings"]["per_request"]:
        split = (f"prefill {t['producer_prefill_s']} s, consumer ttft {t['consumer_ttft_s']} s "
                 if t["producer_prefill_s"] is not None else "")  # the kit's router sees the two calls apart
        print(f"  #{t['index']}: {t['prompt_tokens']} prompt tokens, {split}(server ttft {t['consumer_ttft_server_ms']} ms), "
              f"total {t['total_s']} s")
    if d["consumer_spec"]:
        print(f"consumer spec: {d['consumer_spec']}")
    if d["acceptance_vs_colocated"]:
        a = d["acceptance_vs_colocated"]
        print(f"vs colocated: accepted equal {a['accepted_equal']} (consumer {a['consumer']['per_position']}, "
              f"colocated {a['colocated']['per_position']}), extra verify rounds {a['extra_draft_rounds']} "
              f"for {a['requests']} requests")
    for e in d["errors"]:
        print(f"error: {e}")


def pair_block(d: dict, producer: str, consumer: str, max_tokens: int) -> str:
    """The results block of one pair run: what ran, then one row of what was checked (``kit pd --write``)."""
    router = d["router"] + (f" {d['vllm_router']['version']}" if d["vllm_router"] else "")
    if d["identical"]:
        tokens = "**identical**"
    elif d["first_divergence"]:
        fd = d["first_divergence"]
        margin = fd.get("reference_margin")
        tokens = (f"**not identical**: prompt {fd['prompt_index']} leaves the reference at token {fd['position']} "
                  f"(got {fd['got']}, expected {fd['expected']}"
                  + (f"; the reference's top-2 margin there {margin:.3f})" if margin is not None else ")"))
    else:
        tokens = f"**not identical**: {len(d['errors'])} request(s) failed"
    spec = d["consumer_spec"]
    drafts = (f"{spec['num_drafts']} / {spec['num_accepted_tokens']} {spec['per_position']}" if spec else "-")
    failed = [k for k, ok in d["handoff_checks"].items() if not ok]
    rows = [f"Producer {producer} -> consumer {consumer}; connector {d['connector_class']} ({d['connector_reason']}); "
            f"router {router} ({d['router_reason']}); {d['num_prompts']} prompts x {max_tokens} tokens, greedy, "
            f"stream={d['stream']}, concurrency {d['concurrency']}; compared with the PP=1 no-spec reference; "
            f"pair start {d['timings']['pair_start_s']:.1f} s, requests {d['timings']['requests_s']:.1f} s.", "",
            "| tokens vs reference | KV bytes measured = expected | transfers | consumer computed / received prompt "
            "tokens | consumer drafts / accepted [per position] | handoff checks |",
            "|---|---|---|---|---|---|",
            f"| {tokens} | {d['kv_bytes_transferred']:,} "
            f"{'=' if d['kv_bytes_transferred'] == d['kv_bytes_expected'] else '!='} {d['kv_bytes_expected']:,} | "
            f"{d['kv_transfers']} | {d['consumer_prefill_tokens_computed']} / "
            f"{d['consumer_external_tokens']} of {d['prompt_tokens']} | {drafts} | "
            f"{'all hold' if not failed else 'failed: ' + ', '.join(failed)} |"]
    if d["acceptance_vs_colocated"]:
        a = d["acceptance_vs_colocated"]
        rows += ["", f"Against one colocated engine of the consumer's topology: accepted equal {a['accepted_equal']} "
                     f"(consumer {a['consumer']['per_position']}, colocated {a['colocated']['per_position']}), "
                     f"{a['extra_draft_rounds']} extra verify rounds for {a['requests']} requests."]
    rows += [f"\nError: {e}" for e in d["errors"][:3]]
    return "\n".join(rows)


def _write(args: argparse.Namespace, started: datetime, body: str) -> None:
    """Write ``body`` into ``--write``'s file as this command's results block."""
    from kit.core.results import block_key, command_line, write_block

    argv = list(getattr(args, "argv", None) or [])
    write_block(args.write, block_key("kit pd", argv), body, command_line("kit pd", argv), when=started,
                until=datetime.now(timezone.utc), title="PD disaggregation: measured")
    print(f"kit pd: wrote the result into {args.write}", file=sys.stderr)
