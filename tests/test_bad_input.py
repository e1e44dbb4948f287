"""Bad input is refused before any process starts, with a message that says what to do.

The topology field checks are in test_topology.py and the CLI's in test_cli.py / test_pd.py; these are the
refusals that need more than one field: device capacity, PD pairs, ports, the decode-side rule, patch names.
Every case must fail in-process, fast, and leave no process behind.
"""
import socket
import time

import pytest

from kit import engine, pd
from kit.topology import Topology, TopologyError

from conftest import MODEL


def _t(**kw) -> Topology:
    return Topology(model=MODEL, random_weights=True, **kw)


def _refused(fn, fragment: str) -> None:
    t0 = time.monotonic()
    with pytest.raises(TopologyError, match=fragment):
        fn()
    assert time.monotonic() - t0 < 5


def test_tp_times_pp_beyond_the_cpu(no_leftovers):
    _refused(lambda: _t(pp=4, tp=4), "exceed what this CPU hosts")


def test_consumer_without_producer(no_leftovers):
    c = _t(pd_role="consumer", connector="nixl")
    _refused(lambda: engine.run(c, [{"kind": "generate", "prompts": ["x"], "max_tokens": 1}]), "needs its producer")
    _refused(lambda: engine.Server(c).start(), "needs its producer")


def test_pd_pair_with_different_models_or_weights(no_leftovers):
    _refused(lambda: pd.PDPair(_t(), Topology(model="tiny-llama-swa", random_weights=True)), "different models")
    _refused(lambda: pd.PDPair(_t(), _t(seed=1)), "differ in seed")
    _refused(lambda: pd.PDPair(_t(), _t(dtype="bfloat16")), "differ in dtype")


def test_pd_consumer_pp_without_a_producer_of_the_same_pp(no_leftovers):
    _refused(lambda: pd.PDPair(_t(pp=1), _t(pp=2)), "needs a producer with the same PP size")


def test_pd_pair_with_different_drafters(no_leftovers):
    _refused(lambda: pd.PDPair(_t(), _t(spec="mtp:2")), "compatibility hash")
    _refused(lambda: pd.PDPair(_t(spec="mtp:1"), _t()), "compatibility hash")


def test_pd_pair_with_an_unknown_connector(no_leftovers):
    _refused(lambda: pd.PDPair(_t(), _t(), connector="tcp"), "connector must be one of")


def test_server_port_in_use(no_leftovers):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        _refused(lambda: engine.Server(_t(), port=port).start(), f"port {port} on 127.0.0.1 is in use")


def test_unknown_patch_name(no_leftovers):
    _refused(lambda: engine.run(_t(pp=2, spec="mtp:1"), [], env={"KIT_PATCHES": "all,-no_such_patch"}),
             "unknown patch 'no_such_patch'")


def test_decode_side_pp_spec_without_the_fix(no_leftovers):
    _refused(lambda: engine.run(_t(pp=2, spec="mtp:1"), [], env={"KIT_PATCHES": "all,-pp_spec_token_history"}),
             "only supported on the prefill side")


def test_eagle3_draft_model_missing(no_leftovers):
    _refused(lambda: Topology(model=MODEL, random_weights=True, spec="eagle3:1"), "eagle3 needs a draft model")
