"""vLLM's PD router (``vllm-router``) in front of the kit's PD pairs (kit.pd.vllm_router).

The first test needs no engine; the second starts a real pair and the router (``-m pd``, under the machine's
vLLM lock).
"""
from __future__ import annotations

import subprocess

import pytest
from conftest import MODEL

from kit import pd
from kit.pd.vllm_router import ROUTERS, choose_router, router_binary, router_command, router_version


def test_the_pinned_router_takes_every_flag_the_kit_passes():
    """The installed vllm-router is the pinned version and its CLI knows each flag of the kit's command line."""
    assert router_version() == "0.1.17"
    help_text = subprocess.run([router_binary(), "--help"], capture_output=True, text=True, timeout=60).stdout
    flags = [a for a in router_command("http://127.0.0.1:1", "http://127.0.0.1:2", 3, 4, 180, 60) if a.startswith("--")]
    assert "--vllm-pd-disaggregation" in flags
    missing = [f for f in flags if f not in help_text]
    assert not missing, missing


def test_an_unknown_router_is_refused_before_any_process():
    p, c = pd.pd_topologies(MODEL, 1, None, 1, None, random_weights=True)
    assert ROUTERS == ("auto", "kit", "vllm-router")
    with pytest.raises(pd.TopologyError, match="router must be one of auto, kit, vllm-router"):
        pd.pd_compare(p, c, ["def add(a, b):\n    return"], router="nginx")


def test_auto_routes_pull_pairs_through_vllm_router_and_push_pairs_through_the_kit():
    assert choose_router("auto", "nixl", 1)[0] == "vllm-router"
    assert choose_router("auto", "nixl-push", 2)[0] == "kit"
    assert choose_router("auto", "nixl-push", 1)[0] == "kit"
    assert choose_router("kit", "nixl", 1)[0] == "kit"
    with pytest.raises(pd.TopologyError, match="drops the producer's pp_size"):
        choose_router("vllm-router", "nixl-push", 2)


@pytest.mark.engine
@pytest.mark.pd
@pytest.mark.ci  # PD pull through vllm-router, the default router of pull pairs
def test_vllm_router_gives_the_reference_tokens_and_kv_bytes(tmp_path, no_leftovers):
    """PP=1 + MTP -> PP=1 + MTP (pull) through vllm-router: the consumer's tokens are the PP=1 no-spec reference's,
    it computes no prompt token, and the KV bytes over NIXL are the ones the model shape gives."""
    p, c = pd.pd_topologies(MODEL, 1, "mtp:2", 1, "mtp:2")
    prompts = ["def add(a, b):\n    return", "The quick brown fox jumps over the lazy dog. " * 12]
    d = pd.pd_compare(p, c, prompts, max_tokens=16, log_dir=tmp_path / "logs", router="vllm-router")
    assert not d["errors"], d["errors"]
    assert d["router"] == "vllm-router" and d["vllm_router"]["version"] == "0.1.17"
    assert d["identical"], d["first_divergence"]
    assert d["handoff_ok"], d["handoff_checks"]
    assert d["kv_bytes_transferred"] == d["kv_bytes_expected"] > 0
    assert d["consumer_prefill_tokens_computed"] == 0
