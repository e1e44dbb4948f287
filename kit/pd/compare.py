"""A PD pair measured against the colocated PP=1, no-spec reference: tokens, KV bytes, recomputation, timings.

:func:`pd_compare` is what ``kit pd`` and notebook 04 run; :func:`acceptance_vs_colocated` sets the consumer's
spec-decode counters next to one plain engine's on the same prompts.
"""
from __future__ import annotations

import contextlib
import time
from pathlib import Path

from kit.core.metrics import SpecCounters
from kit.core.topology import Topology
from kit.core.validate import check_choice, check_count, check_generation
from kit.engine import GenerationResult, first_divergence, generate
from kit.pd.layout import DEFAULT_KV_EXTRA_CONFIG, kv_bytes_expected
from kit.pd.pair import PDPair
from kit.pd.vllm_router import ROUTERS, VllmRouter, choose_router, router_version


def acceptance_vs_colocated(consumer: dict, colocated: dict, n_requests: int, colocated_identical: bool) -> dict:
    """The PD consumer's spec-decode counters next to one colocated engine's on the same prompts.

    ``extra_draft_rounds`` is how many more verify rounds the consumer ran; ``accepted_equal`` whether the
    accepted drafts, in total and per draft position, are the same.
    """
    keys = ("num_drafts", "num_draft_tokens", "num_accepted_tokens", "per_position", "mean_acceptance_length")
    return {
        "consumer": {k: consumer.get(k) for k in keys},
        "colocated": {k: colocated.get(k) for k in keys},
        "accepted_equal": (consumer.get("num_accepted_tokens") == colocated.get("num_accepted_tokens")
                           and list(consumer.get("per_position") or []) == list(colocated.get("per_position") or [])),
        "extra_draft_rounds": (consumer.get("num_drafts") or 0) - (colocated.get("num_drafts") or 0),
        "requests": n_requests,
        "colocated_tokens_identical_to_reference": colocated_identical,
    }


def pd_compare(producer: Topology, consumer: Topology, prompts: list[str], max_tokens: int = 32,
               stream: bool = False, concurrency: int = 1, reference: GenerationResult | None = None,
               connector: str | None = None, timeout: float = 900.0, log_dir: Path | str | None = None,
               env: dict[str, str] | None = None, colocated: bool = False,
               kv_extra_config: dict | None = None, router: str = "auto", api_key: str | None = None) -> dict:
    """Run the prompts through a PD pair and compare the consumer's tokens with the PP=1 no-spec reference.

    The reference (``kit.engine.generate(consumer.reference(), ..., top2=True)``) runs first, in its own
    engine, unless given. Returns a JSON-able dict: ``identical``, ``first_divergence``, ``connector``,
    ``kv_bytes_transferred`` vs ``kv_bytes_expected``, ``consumer_prefill_tokens_computed``, per-request
    records and timings, the consumer's spec-decode counters, ``handoff_ok`` and the logs.
    ``colocated=True`` (consumer with a drafter) also runs the consumer's topology as one plain engine on the
    same prompts and reports its spec-decode counters next to the consumer's (``acceptance_vs_colocated``).
    ``kv_extra_config`` adds ``kv_connector_extra_config`` keys for both servers (over the kit's defaults).
    ``router``: ``"vllm-router"`` (:class:`~kit.pd.vllm_router.VllmRouter`: vLLM's router makes both calls; only
    the end-to-end time and the consumer's answer are seen), ``"kit"`` (:meth:`PDPair.complete`: the producer's
    answer and the prefill/decode split of each request's time are recorded too), or ``"auto"``: vllm-router for
    the pull connector, the kit's router for push (:func:`~kit.pd.vllm_router.choose_router`).
    ``api_key``: both servers answer ``/v1/*`` only with this key (vLLM's ``VLLM_API_KEY``); the routers send it.
    """
    prompts = check_generation(prompts, max_tokens, timeout)
    check_choice(router, ROUTERS, "router")  # before the reference engine starts
    check_count(concurrency, "concurrency")
    # Built first: PDPair checks the pair (models, PP sizes, decode-side rule) before any process starts.
    pair = PDPair(producer, consumer, connector=connector, start_timeout=timeout, log_dir=log_dir, env=env,
                  kv_extra_config={**DEFAULT_KV_EXTRA_CONFIG, **(kv_extra_config or {})}, api_key=api_key)
    router, router_reason = choose_router(router, pair.connector, producer.pp)
    t_ref = None
    if reference is None:
        t0 = time.monotonic()
        reference = generate(consumer.reference(), prompts, max_tokens=max_tokens, top2=True, timeout=timeout, env=env)
        t_ref = round(time.monotonic() - t0, 2)
    coloc = None
    if colocated and consumer.spec is not None:
        coloc = generate(consumer.with_(pd_role=None, connector=None), prompts, max_tokens=max_tokens,
                         timeout=timeout, env=env)
    t0 = time.monotonic()
    with pair:
        t_start = round(time.monotonic() - t0, 2)
        router_info = None
        with contextlib.ExitStack() as stack:
            sender = pair
            if router == "vllm-router":
                sender = stack.enter_context(VllmRouter(pair, api_key=pair.api_key))
                router_info = {"version": router_version(), "start_s": sender.start_seconds,
                               "command": sender.command_line, "log": str(sender.log_path)}
            t1 = time.monotonic()
            recs, totals = sender.complete_many(prompts, max_tokens=max_tokens, stream=stream, concurrency=concurrency)
            t_run = round(time.monotonic() - t1, 2)
        desc = pair.describe()
        kv_log = pair.log_lines("producer", r"KV Transfer metrics", 5) + pair.log_lines("consumer", r"KV Transfer metrics", 5)
        warm = pair.warmup_record.to_dict() if pair.warmup_record else None
    errors = [f"prompt {r.index}: {r.error}" for r in recs if r.error]
    got = GenerationResult(token_ids=[r.token_ids for r in recs], texts=[r.text for r in recs],
                           prompt_token_ids=[r.prompt_token_ids or [] for r in recs], spec=SpecCounters(), seconds=t_run)
    div = first_divergence(reference, got)
    ok = [r for r in recs if r.error is None]
    expected = kv_bytes_expected(producer, consumer, [r.prompt_tokens or 0 for r in ok], desc["block_size"] or 1)
    consumer_computed = totals["consumer_prefill_tokens_computed"]
    prompt_total = sum(r.prompt_tokens or 0 for r in ok)
    handoff = {
        "no_request_errors": not errors,
        "transfers_at_least_one_per_request": totals["kv_transfers"] >= len(ok) > 0,
        "no_failed_transfers": totals["kv_failed_transfers"] == 0,
        "consumer_computed_no_prompt_tokens": consumer_computed == 0,
        "consumer_received_all_prompt_tokens": totals["consumer_external_tokens"] == prompt_total,
        "kv_bytes_equal_expected": totals["kv_bytes_transferred"] == expected["bytes"],
    }
    # The producer's answer is seen by the kit's router only.
    first_tokens_agree = all(r.producer_token_ids[:1] == r.token_ids[:1] for r in ok) if router == "kit" else None
    return {
        "acceptance_vs_colocated": (acceptance_vs_colocated(totals["consumer_spec"], coloc.spec.to_dict(),
                                                            len(ok), coloc.token_ids == reference.token_ids)
                                    if coloc is not None else None),
        "identical": div is None and not errors,
        "first_divergence": div,
        "handoff_ok": all(handoff.values()),
        "handoff_checks": handoff,
        "router": router,
        "router_reason": router_reason,
        "vllm_router": router_info,
        "connector": pair.connector,
        "connector_class": desc["connector_class"],
        "connector_reason": pair.connector_reason,
        "kv_bytes_transferred": totals["kv_bytes_transferred"],
        "kv_bytes_expected": expected["bytes"],
        "kv_expected": expected,
        "kv_transfers": totals["kv_transfers"],
        "kv_descriptors": totals["kv_descriptors"],
        "kv_failed_transfers": totals["kv_failed_transfers"],
        "transfer_recorded_by": totals["transfer_recorded_by"],
        "consumer_prefill_tokens_computed": consumer_computed,
        "consumer_external_tokens": totals["consumer_external_tokens"],
        "consumer_local_cache_hit_tokens": totals["consumer_local_cache_hit_tokens"],
        "prompt_tokens": prompt_total,
        "producer_first_token_equals_consumer_first": first_tokens_agree,
        "consumer_spec": totals["consumer_spec"] if consumer.spec else None,
        "producer_spec": totals["producer_spec"] if producer.spec else None,
        "stream": stream,
        "concurrency": concurrency,
        "num_prompts": len(prompts),
        "max_tokens": max_tokens,
        "errors": errors,
        "requests": [r.to_dict() for r in recs],
        "timings": {"reference_s": t_ref, "pair_start_s": t_start, "requests_s": t_run,
                    "per_request": [{"index": r.index, "prompt_tokens": r.prompt_tokens,
                                     "producer_prefill_s": r.producer_prefill_s, "consumer_ttft_s": r.consumer_ttft_s,
                                     "consumer_ttft_server_ms": r.consumer_ttft_server_ms,
                                     "consumer_s": r.consumer_s, "total_s": r.total_s} for r in recs]},
        "warmup": warm,
        "reference_tokens": reference.token_ids,
        "pair": desc,
        "kv_transfer_log": kv_log,
    }
