"""Which PD pairs run and how: the connector (pull or push) and why, the pair checks, the KV volume expected.

Everything here is decided from the two :class:`~kit.core.topology.Topology` objects alone, before any process
starts: :func:`check_pair` refuses what vLLM 0.32 would refuse, :func:`choose_connector` picks pull
(``NixlConnector``) or push (``NixlPushConnector``) with its reason, :func:`kv_bytes_expected` gives the bytes
NIXL must move for prompts of given lengths.
"""
from __future__ import annotations

import math

from kit.core.topology import Spec, Topology, TopologyError
from kit.engine import precheck

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def pd_topologies(model: str, producer_pp: int = 1, producer_spec: str | Spec | None = None, consumer_pp: int = 1,
                  consumer_spec: str | Spec | None = None, random_weights: bool = False, **common) -> tuple[Topology, Topology]:
    """Producer and consumer topologies from PP sizes and spec settings (``METHOD:K``)."""
    p = Topology(model=model, random_weights=random_weights, pp=producer_pp, spec=producer_spec, **common)
    c = Topology(model=model, random_weights=random_weights, pp=consumer_pp, spec=consumer_spec, **common)
    return p, c



def kv_layer_names(t: Topology) -> list[str]:
    """Attention layers holding KV in an engine of this topology (all PP ranks together).

    Target layers are ``model.layers.0..L-1``; a MiMo/DeepSeek MTP drafter adds ``model.layers.L..``
    (vLLM's ``mtp_start_layer_idx = num_hidden_layers``), held by the last PP rank.
    """
    info = t.info
    names = [f"model.layers.{i}" for i in range(info.num_layers)]
    if t.spec is not None and t.spec.method == "mtp":
        names += [f"model.layers.{info.num_layers + i}" for i in range(info.num_mtp_layers)]
    return names


def choose_connector(producer: Topology, consumer: Topology) -> tuple[str, str]:
    """``("nixl" | "nixl-push", reason)`` for this producer/consumer pair on vLLM 0.32.

    Raises :class:`TopologyError` for a consumer with PP>1 fed by a producer of another PP size: the kit's
    ``nixl_pp_consumer`` patch pairs producer stage s with consumer stage s, nothing splits one stage's layers.
    """
    if consumer.pp > 1:
        if producer.pp != consumer.pp:
            raise TopologyError(
                f"a PD consumer with PP={consumer.pp} needs a producer with the same PP size (got producer "
                f"pp={producer.pp}): vLLM 0.32's NIXL refuses decode-side PP, and the kit's nixl_pp_consumer patch "
                "feeds consumer stage s from producer stage s only. Use --producer-pp "
                f"{consumer.pp}, or a PP=1 consumer")
        return "nixl-push", (
            f"consumer PP={consumer.pp}: vLLM 0.32 refuses decode-side PP ('does not support "
            "pipeline_parallel_size > 1'); the kit's nixl_pp_consumer patch lets push run it, each producer PP "
            "stage writing its layers into the consumer stage that holds the same layers")
    if producer.pp != consumer.pp:
        return "nixl-push", (
            f"heterogeneous PP (producer pp={producer.pp}, consumer pp={consumer.pp}): the pull connector on "
            "vLLM 0.32 fails the handshake with 'AssertionError: Number of KV layers must match between prefill "
            "and decode' (nixl/base_worker.py); with push each producer PP rank writes its own layers")
    np_, nc = len(kv_layer_names(producer)), len(kv_layer_names(consumer))
    if np_ != nc:
        return "nixl-push", (
            f"the producer has {np_} KV layers and the consumer {nc} (an MTP layer on one side only): pull "
            "asserts equal layer counts at the handshake ('Number of KV layers must match'), so push")
    return "nixl", (f"same PP (pp={producer.pp}) and the same {np_} KV layers on both sides: the default pull "
                    "connector (NixlConnector; the consumer reads the producer's blocks)")


def hidden_state_drafter(t: Topology) -> str | None:
    """The drafter method vLLM's NIXL compatibility hash covers (MTP/Eagle: they hold KV layers), else None."""
    return t.spec.method if t.spec is not None and t.spec.method in ("mtp", "eagle", "eagle3") else None


def kv_layers_moved(producer: Topology, consumer: Topology) -> list[str]:
    """KV layers whose blocks the connector moves from producer to consumer.

    Target layers from every producer PP rank; an MTP layer's KV only where both sides hold it
    (a consumer without the drafter has no region to receive it).
    """
    c = set(kv_layer_names(consumer))
    return [n for n in kv_layer_names(producer) if n in c]


def kv_block_bytes(t: Topology) -> int:
    """Bytes of one layer's KV for one block *token* (K and V), as the CPU cache lays it out."""
    cfg = t.info.config
    kv_heads = int(cfg.get("num_key_value_heads") or cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // int(cfg["num_attention_heads"]))
    return kv_heads * head_dim * 2 * DTYPE_BYTES[t.dtype]


def kv_bytes_expected(producer: Topology, consumer: Topology, prompt_tokens: list[int], block_size: int) -> dict:
    """Expected bytes over NIXL for prompts of these lengths: whole blocks, per moved layer.

    ``layers x ceil(prompt_tokens / block_size) x block_size x kv_heads x head_dim x 2 (K,V) x dtype bytes``.
    """
    layers = kv_layers_moved(producer, consumer)
    per_token = kv_block_bytes(producer)
    blocks = [math.ceil(n / block_size) for n in prompt_tokens]
    per_req = [len(layers) * b * block_size * per_token for b in blocks]
    return {"bytes": sum(per_req), "per_request": per_req, "blocks": blocks, "layers": layers,
            "block_size": block_size, "bytes_per_layer_block": block_size * per_token,
            "formula": (f"{len(layers)} layers x blocks x {block_size} tokens x {per_token} B/token "
                        f"(kv_heads x head_dim x 2 x {DTYPE_BYTES[producer.dtype]} B)")}


# NIXL's own knobs (``kv_connector_extra_config``). The producer keeps a request's blocks for
# ``kv_lease_duration`` seconds (default 30) waiting for the consumer; on 2 loaded cores the consumer's first
# handshake alone took longer than that (seen: push mode, the lease expired, the consumer waited for ever).
DEFAULT_KV_EXTRA_CONFIG = {"kv_lease_duration": 120}


def as_served(t: Topology, kv_extra: dict | None = None) -> Topology:
    """The topology as the pair serves it: per-request metrics in responses, NIXL's extra config.

    Both go through ``extra_engine_args`` (which :meth:`Topology.serve_args` turns into flags), so
    :mod:`kit.core.topology` needs no change: ``kv_transfer_config`` is the topology's own plus
    ``kv_connector_extra_config``.
    """
    extra = dict(t.extra_engine_args)
    extra.setdefault("enable_per_request_metrics", True)
    kv = t.kv_transfer_config()
    if kv is not None and kv_extra and "kv_transfer_config" not in extra:
        extra["kv_transfer_config"] = {**kv, "kv_connector_extra_config": dict(kv_extra)}
    return t.with_(extra_engine_args=extra)


def check_pair(producer: Topology, consumer: Topology, connector: str | None = None,
               env: dict[str, str] | None = None, kv_extra_config: dict | None = None) -> tuple[str, str]:
    """Refuse, before any process starts, a pair vLLM 0.32 would refuse; return ``(connector, reason)``.

    Same model, weights, seed and dtype; a PP pairing the connector supports (:func:`choose_connector`); the
    decode-side PP + spec rule on each side; the same MTP/Eagle drafter method on both sides unless the NIXL
    handshake check is turned off (``enforce_handshake_compat: False`` in ``kv_extra_config``).
    """
    if producer.info.path != consumer.info.path:
        raise TopologyError(f"producer and consumer load different models ({producer.model} vs {consumer.model})")
    for what, a, b in (("random_weights", producer.random_weights, consumer.random_weights),
                       ("seed", producer.seed, consumer.seed), ("dtype", producer.dtype, consumer.dtype)):
        if a != b:
            raise TopologyError(f"producer and consumer differ in {what} ({a!r} vs {b!r}): the KV would not fit")
    auto, reason = choose_connector(producer, consumer)  # refuses a PP pairing no connector runs, forced or not
    if connector is None:
        connector = auto
    else:
        if consumer.pp > 1 and connector == "nixl":
            raise TopologyError(f"a PD consumer with PP={consumer.pp} runs with the push connector only: vLLM 0.32's "
                                "pull connector (nixl) refuses decode-side PP at start-up; use --connector nixl-push "
                                "or auto")
        reason = f"requested by the caller ({connector})"
    for t, role in ((producer, "producer"), (consumer, "consumer")):  # decode-side PP + spec rule
        precheck(t.with_(pd_role=role, connector=connector), env, in_pair=True)
    pd_, cd_ = hidden_state_drafter(producer), hidden_state_drafter(consumer)
    if pd_ != cd_ and (kv_extra_config or {}).get("enforce_handshake_compat", True) is not False:
        raise TopologyError(
            f"producer drafter {pd_ or 'none'} vs consumer drafter {cd_ or 'none'}: vLLM 0.32's NIXL handshake "
            "refuses this pair ('NIXL compatibility hash mismatch'; the hash covers MTP/Eagle drafters, whose "
            "KV layers move too). Give both sides the same drafter method (k may differ), or pass "
            "kv_extra_config={'enforce_handshake_compat': False} (kit pd --kv-extra "
            "enforce_handshake_compat=false) to run it anyway and see what the missing drafter KV costs")
    return connector, reason
