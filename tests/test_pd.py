"""PD disaggregation (kit.pd): a producer and a consumer vLLM server joined by a real NIXL connector.

The first block needs no engine (connector choice, expected KV bytes, metric parsing, CLI input checks).
The engine tests start real servers: run them one pair at a time under the machine's vLLM lock, e.g.
``flock /tmp/ppmtp-vllm.lock .venv/bin/python -m pytest -m engine tests/test_pd.py``.
"""
from __future__ import annotations

import json

import pytest
from conftest import MODEL

from kit import pd
from kit.core.models import ModelError, resolve_model
from kit.core.topology import Topology

# The trained tiny-mimo checkpoint may not be written yet: fall back to the same architecture's stand-in.
STANDIN = "/tmp/devmimo"


def _model() -> tuple[str, bool]:
    """(model, random_weights): tiny-mimo with its trained weights when present, else random weights."""
    for name in (MODEL, STANDIN):
        try:
            info = resolve_model(name)
        except ModelError:
            continue
        return name, not info.has_trained_weights
    pytest.skip(f"neither {MODEL} nor {STANDIN} is available")


PROMPTS = [
    "def add(a, b):\n    return",
    "import os\n",
    # Over 128 tokens: more than one KV block moves.
    "The quick brown fox jumps over the lazy dog. " * 12,
    "for i in range(10):\n    print(",
]


def _pd_run(tmp_path, producer_pp, producer_spec, consumer_pp, consumer_spec, prompts, **kw):
    """One pair through ``pd_compare`` (result kept in tmp_path) with the checks every PD test makes:
    no request errors, tokens identical to the reference, the handoff worked. Returns (producer, result)."""
    m, r = _model()
    p, c = pd.pd_topologies(m, producer_pp, producer_spec, consumer_pp, consumer_spec, random_weights=r)
    d = pd.pd_compare(p, c, prompts, max_tokens=16, log_dir=tmp_path / "logs", **kw)
    (tmp_path / "result.json").write_text(json.dumps(d, indent=1))
    assert not d["errors"], d["errors"]
    assert d["identical"], d["first_divergence"]
    assert d["handoff_ok"], d["handoff_checks"]
    return p, d


# -- no engine -------------------------------------------------------------------------------------

def test_connector_choice_and_reason():
    m, r = _model()
    p1, c1 = pd.pd_topologies(m, 1, None, 1, None, random_weights=r)
    assert pd.choose_connector(p1, c1)[0] == "nixl"
    p2, c2 = pd.pd_topologies(m, 2, "mtp:2", 1, None, random_weights=r)
    conn, why = pd.choose_connector(p2, c2)
    assert conn == "nixl-push" and "Number of KV layers must match" in why
    # An MTP producer with a drafter-less consumer: vLLM's handshake would refuse it, so the kit does first.
    with pytest.raises(pd.TopologyError, match="compatibility hash"):
        pd.PDPair(p2, c2)
    pd.PDPair(p2, c2, kv_extra_config={"enforce_handshake_compat": False})  # allowed, on purpose
    p2, c2 = pd.pd_topologies(m, 2, "mtp:2", 1, "mtp:1", random_weights=r)  # k may differ
    conn, why = pd.choose_connector(p2, c2)
    pair = pd.PDPair(p2, c2)  # nothing starts before __enter__
    assert pair.connector == "nixl-push" and pair.connector_reason == why
    assert pair.producer_topology.kv_transfer_config()["kv_connector"] == "NixlPushConnector"
    assert pair.consumer_topology.kv_transfer_config()["kv_role"] == "kv_consumer"


def test_a_pp2_consumer_is_pushed_to_by_a_producer_of_the_same_pp_only():
    m, r = _model()
    p2, c2 = pd.pd_topologies(m, 2, "mtp:2", 2, "mtp:2", random_weights=r)
    conn, why = pd.choose_connector(p2, c2)
    assert conn == "nixl-push" and "nixl_pp_consumer" in why
    p1, c2 = pd.pd_topologies(m, 1, "mtp:2", 2, "mtp:2", random_weights=r)
    with pytest.raises(pd.TopologyError, match="needs a producer with the same PP size"):
        pd.PDPair(p1, c2)


def test_kv_extra_entries_parse_as_json_when_they_can():
    assert pd.parse_kv_extra(["enforce_handshake_compat=false", "kv_lease_duration=30", "x=a b"]) == {
        "enforce_handshake_compat": False, "kv_lease_duration": 30, "x": "a b"}
    with pytest.raises(pd.TopologyError, match="KEY=VALUE"):
        pd.parse_kv_extra(["no-equals-sign"])


def test_kv_bytes_expected_from_model_shape():
    m, r = _model()
    p, c = pd.pd_topologies(m, 2, "mtp:2", 1, None, random_weights=r)
    cfg = p.info.config
    per_token = cfg["num_key_value_heads"] * cfg.get("head_dim", cfg["hidden_size"] // cfg["num_attention_heads"]) * 2 * 4
    e = pd.kv_bytes_expected(p, c, [10, 129], block_size=128)
    assert e["blocks"] == [1, 2]
    assert e["layers"] == [f"model.layers.{i}" for i in range(cfg["num_hidden_layers"])]
    assert e["bytes"] == cfg["num_hidden_layers"] * 3 * 128 * per_token
    # The MTP layer's KV moves only to a consumer that has an MTP layer too.
    p3, c3 = pd.pd_topologies(m, 1, "mtp:2", 1, "mtp:2", random_weights=r)
    assert len(pd.kv_bytes_expected(p3, c3, [10], 128)["layers"]) == cfg["num_hidden_layers"] + 1


def test_acceptance_vs_colocated_compares_accepted_drafts_and_rounds():
    c = {"num_drafts": 162, "num_draft_tokens": 324, "num_accepted_tokens": 166, "per_position": [94, 72],
         "mean_acceptance_length": 2.02}
    one = {"num_drafts": 154, "num_draft_tokens": 308, "num_accepted_tokens": 166, "per_position": [94, 72],
           "mean_acceptance_length": 2.08}
    a = pd.acceptance_vs_colocated(c, one, 8, True)
    assert a["accepted_equal"] and a["extra_draft_rounds"] == 8 and a["requests"] == 8
    worse = dict(c, num_accepted_tokens=150, per_position=[90, 60])
    assert not pd.acceptance_vs_colocated(worse, one, 8, True)["accepted_equal"]


def test_counters_from_prometheus_text():
    text = "\n".join([
        '# HELP vllm:nixl_bytes_transferred x',
        'vllm:nixl_bytes_transferred_sum{engine="0",model_name="m"} 262144.0',
        'vllm:nixl_bytes_transferred_count{engine="0",model_name="m"} 1.0',
        'vllm:nixl_num_descriptors_sum{engine="0",model_name="m"} 4.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="local_compute"} 3.0',
        'vllm:prompt_tokens_by_source_total{engine="0",model_name="m",source="external_kv_transfer"} 10.0',
        'vllm:prompt_tokens_total{engine="0",model_name="m"} 13.0',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 5.0',
        'vllm:cache_config_info{block_size="128",engine="0"} 1.0',
    ])
    c = pd.Counters.from_text(text)
    assert (c.nixl_bytes, c.nixl_transfers, c.nixl_descriptors) == (262144, 1, 4)
    assert (c.local_compute, c.external_kv_transfer, c.prompt_tokens) == (3, 10, 13)
    assert c.spec.num_drafts == 5
    assert (c - pd.Counters()).nixl_bytes == 262144
    assert pd.block_size_from_metrics(text) == 128


def test_fatal_log_lines(tmp_path):
    log = tmp_path / "producer.log"
    log.write_text("\n".join([
        "(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063] WorkerProc hit an exception.",
        "(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063] Traceback (most recent call last):",
        '(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063]   File "a.py", line 1, in f',
        "(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063]     g()",
        '(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063]   File "base_worker.py", line 1716, in register_kv_caches',
        "(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063]     assert self.num_regions % num_local_layers == 0",
        "(Worker_PP1 pid=1) ERROR 12-01 03:27:51 [multiproc_executor.py:1063] AssertionError",
    ]))
    lines = pd.fatal_log_lines(log)
    assert lines[0].startswith('File "base_worker.py", line 1716') and lines[-1] == "AssertionError"
    (tmp_path / "ok.log").write_text("INFO all good\n")
    assert pd.fatal_log_lines(tmp_path / "ok.log") == []


def test_main_bad_input_exits_2_before_any_server(tmp_path, capsys):
    from kit.cli import main

    m, r = _model()
    rnd = ["--random"] if r else []
    assert main(["pd", "--model", "no-such-model", "--random"]) == 2
    assert main(["pd", "--model", m, *rnd, "--producer-spec", "mtp"]) == 2  # k missing
    assert main(["pd", "--model", m, *rnd, "--max-tokens", "0"]) == 2
    assert main(["pd", "--model", m, *rnd, "--prompts", str(tmp_path / "none.jsonl")]) == 2
    assert main(["pd", "--model", m, *rnd, "--producer-pp", "9"]) == 2
    assert main(["pd", "--model", m, *rnd, "--consumer-pp", "2"]) == 2  # a PP=2 consumer needs a PP=2 producer
    assert main(["pd", "--model", m, *rnd, "--write", str(tmp_path / "no-folder" / "pd.md")]) == 2
    err = capsys.readouterr().err
    assert "error" in err and all(line.startswith("kit pd: error: ") for line in err.strip().splitlines()), err


def _pair_result(identical=True):
    """What kit.pd.compare.pd_compare returns, the keys the results block reads."""
    return {"identical": identical, "router": "kit", "vllm_router": None, "router_reason": "push pair",
            "first_divergence": None if identical else {"prompt_index": 2, "position": 1, "expected": 434,
                                                         "got": 496, "reference_margin": 0.0113},
            "errors": [], "consumer_spec": {"num_drafts": 162, "num_accepted_tokens": 166, "per_position": [94, 72]},
            "handoff_checks": {"no_request_errors": True, "kv_bytes_equal_expected": identical},
            "connector_class": "NixlPushConnector", "connector_reason": "producer PP=2", "num_prompts": 8,
            "stream": False, "concurrency": 1, "timings": {"pair_start_s": 45.04, "requests_s": 5.1, "per_request": []},
            "handoff_ok": identical, "kv_expected": {"formula": "5 layers"},
            "kv_bytes_transferred": 5242880, "kv_bytes_expected": 5242880 if identical else 4194304,
            "kv_transfers": 16, "consumer_prefill_tokens_computed": 0, "consumer_external_tokens": 203,
            "prompt_tokens": 203, "acceptance_vs_colocated": None}


def test_a_pair_run_is_written_as_one_row_with_what_was_checked(tmp_path, monkeypatch):
    """``kit pd --write``: the block of one pair run (no server here: pd_compare's result is given)."""
    from kit.cli import main
    from kit.core.results import HEADER, blocks
    from kit.pd import cli as pd_cli

    body = pd_cli.pair_block(_pair_result(), "pp2 mtp:2", "pp1 mtp:2", 40)
    assert "| **identical** | 5,242,880 = 5,242,880 | 16 | 0 / 203 of 203 | 162 / 166 [94, 72] | all hold |" in body
    assert "Producer pp2 mtp:2 -> consumer pp1 mtp:2; connector NixlPushConnector" in body
    bad = pd_cli.pair_block(_pair_result(identical=False), "pp2 mtp:2", "pp1 mtp:2", 40)
    assert "prompt 2 leaves the reference at token 1 (got 496, expected 434; the reference's top-2 margin there " \
           "0.011)" in bad and "5,242,880 != 4,194,304" in bad and "failed: kv_bytes_equal_expected" in bad

    m, r = _model()
    monkeypatch.setattr(pd_cli, "pd_compare", lambda *a, **k: _pair_result())
    doc = tmp_path / "pd.md"
    argv = ["pd", "--model", m, *(["--random"] if r else []), "--producer-spec", "mtp:2", "--consumer-spec", "mtp:2",
            "--write", str(doc)]
    assert main(argv) == 0
    (b,) = blocks(doc.read_text())
    assert HEADER.search(b.group("body")) and "Command: `kit pd --model" in b.group("body")
    assert "| **identical** |" in b.group("body")


# -- real servers ----------------------------------------------------------------------------------

def test_a_taken_side_channel_port_is_refused_before_the_server_starts(monkeypatch):
    """A NIXL side-channel port held by another socket: one clear error before any process starts (before, vLLM's
    listener thread failed to bind and its engine waited for it until the start deadline)."""
    import socket

    from kit import engine
    from kit.engine import server

    def no_process(*a, **kw):
        raise AssertionError("a process was started")

    monkeypatch.setattr(server, "ManagedProcess", no_process)
    t = Topology(model=MODEL, random_weights=True)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        srv = engine.Server(t, env={"VLLM_NIXL_SIDE_CHANNEL_PORT": str(port)}, in_pair=True)
        with pytest.raises(pd.TopologyError, match=f"NIXL side-channel port {port} on 127.0.0.1 is in use"):
            srv.start(timeout=30)


def test_the_api_key_goes_to_the_server_environment_and_every_request(monkeypatch):
    """``api_key``: given to vLLM as VLLM_API_KEY (not on the command line), and sent by the kit's one HTTP client
    on every call: GET and POST of kit.pd.client (the router's), Server.post. A stand-in HTTP endpoint records
    the headers (vLLM's own 401 is checked in the PD engine test below)."""
    import http.server
    import threading

    from kit import engine
    from kit.engine import server

    got: list = []

    class H(http.server.BaseHTTPRequestHandler):
        def _answer(self):
            got.append((self.command, self.path, self.headers.get("Authorization")))
            if self.command == "POST":
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
            body = json.dumps({"data": [{"id": "m"}], "choices": [{"text": ""}]}).encode()
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_GET = do_POST = _answer

        def log_message(self, *a):
            pass

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        t = Topology(model=MODEL, random_weights=True)
        srv = engine.Server(t, port=httpd.server_address[1], api_key="s3cret")
        assert pd.model_id(srv) == "m"
        pd.post_json(srv, "/v1/completions", {"prompt": "x"})
        srv.post("/v1/completions", {"prompt": "x"})
    finally:
        httpd.shutdown()
    assert [a for _, _, a in got] == ["Bearer s3cret"] * 3, got
    started = {}
    monkeypatch.setattr(server, "ManagedProcess", lambda cmd, env=None, **kw: started.update(cmd=cmd, env=env)
                        or (_ for _ in ()).throw(RuntimeError("stop here")))
    with pytest.raises(RuntimeError, match="stop here"):
        engine.Server(t, api_key="s3cret", in_pair=True).start(timeout=30)
    assert started["env"]["VLLM_API_KEY"] == "s3cret" and "s3cret" not in " ".join(started["cmd"])


@pytest.mark.engine
@pytest.mark.pd
def test_router_streaming_and_concurrent_requests(no_leftovers):
    """One pair (producer PP=1 -> consumer PP=1, pull): non-streaming, streaming, and 4 requests at once all
    return the colocated reference's greedy tokens, and every prompt token's KV comes over NIXL."""
    from kit.engine import generate

    m, r = _model()
    max_tokens = 12
    p, c = pd.pd_topologies(m, 1, None, 1, None, random_weights=r)
    ref = generate(c.reference(), PROMPTS, max_tokens=max_tokens, top2=True)
    with pd.PDPair(p, c) as pair:
        assert pair.connector == "nixl"
        one = pair.complete(PROMPTS[0], max_tokens=max_tokens)
        assert one.error is None, one.error
        assert one.token_ids == ref.token_ids[0]
        assert one.producer_token_ids == ref.token_ids[0][:1]
        assert one.producer_prefill_s > 0 and one.total_s >= one.consumer_s > 0
        assert one.kv_transfer_params and one.kv_transfer_params.get("do_remote_prefill") is True

        recs, totals = pair.complete_many(PROMPTS, max_tokens=max_tokens, stream=True, concurrency=4)
        for i, rec in enumerate(recs):
            assert rec.error is None, rec.error
            assert rec.stream and rec.token_ids == ref.token_ids[i], (i, rec.token_ids, ref.token_ids[i])
            assert rec.consumer_ttft_s is not None and 0 < rec.consumer_ttft_s <= rec.consumer_s
        assert len({rec.request_id for rec in recs}) == len(PROMPTS)
        prompt_tokens = sum(rec.prompt_tokens for rec in recs)
        assert totals["consumer_prefill_tokens_computed"] == 0
        assert totals["consumer_external_tokens"] == prompt_tokens
        assert totals["kv_failed_transfers"] == 0 and totals["kv_transfers"] >= len(PROMPTS)
        expected = pd.kv_bytes_expected(p, c, [rec.prompt_tokens for rec in recs], pair.block_size)
        assert totals["kv_bytes_transferred"] == expected["bytes"]


@pytest.mark.engine
@pytest.mark.pd
def test_pp2_mtp_producer_to_pp1_consumer_is_token_identical(tmp_path, no_leftovers):
    """vLLM PR #46003's scenario: PP=2 + MTP k=2 on the prefill side, PP=1 + MTP k=2 decode. Push connector
    (heterogeneous PP).

    Tokens, bytes (4 target layers from two PP ranks + the MTP layer), zero recomputation, one transfer per
    producer rank per request. Before ``nixl_cpu_affinity`` this pair stalled for minutes in about half of the runs.
    """
    p, d = _pd_run(tmp_path, 2, "mtp:2", 1, "mtp:2", PROMPTS[:3])
    assert d["connector"] == "nixl-push"
    assert d["consumer_prefill_tokens_computed"] == 0
    assert d["kv_bytes_transferred"] == d["kv_bytes_expected"], (d["kv_bytes_transferred"], d["kv_expected"])
    assert d["kv_transfers"] == 2 * len(PROMPTS[:3]), d["kv_transfers"]
    assert f"model.layers.{p.info.num_layers}" in d["kv_expected"]["layers"], "the MTP layer's KV must move"


@pytest.mark.engine
@pytest.mark.pd
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_pp2_mtp_producer_registers_its_mtp_region(tmp_path, no_leftovers, patched):
    """Patch nixl_pp_draft_regions: without it a PP=2 + MTP producer dies registering its KV with NIXL
    (the last rank holds 2 target layers + the MTP layer = 3 regions, divided by 2 local layers); with it
    both servers start and the producer's last rank slices the consumer's regions at the right offset."""
    from kit.engine.procs import ProcessFailed

    m, r = _model()
    p, c = pd.pd_topologies(m, 2, "mtp:2", 1, "mtp:2", random_weights=r)
    env = {} if patched else {"KIT_PATCHES": "all,-nixl_pp_draft_regions"}
    pair = pd.PDPair(p, c, env=env, warmup=False, log_dir=tmp_path / "logs")
    if patched:
        with pair:
            assert pair.connector == "nixl-push"
        assert "num_regions % num_local_layers" not in (tmp_path / "logs" / "producer.log").read_text()
    else:
        with pytest.raises((pd.PDError, ProcessFailed, RuntimeError)) as e:
            with pair:
                pass
        assert "num_regions % num_local_layers == 0" in str(e.value) + (tmp_path / "logs" / "producer.log").read_text()


@pytest.mark.engine
@pytest.mark.pd
# Patched (PD push PP=2 -> PP=2 + MTP) runs on every change (marker ci); stock vLLM's refusal only under -m pd.
@pytest.mark.parametrize("patched", [False, pytest.param(True, marks=pytest.mark.ci)], ids=["patch-off", "patch-on"])
def test_pp2_consumer_is_fed_stage_by_stage(tmp_path, no_leftovers, patched):
    """Patch nixl_pp_consumer: stock vLLM 0.32 refuses a decode server with PP>1 under NIXL; with the patch a
    PP=2 + MTP producer feeds a PP=2 + MTP consumer stage by stage: the consumer's tokens equal the reference,
    it computes no prompt token, and every KV layer's bytes arrive (the MTP layer's on the last stage)."""
    from kit.engine.procs import ProcessFailed

    if not patched:
        m, r = _model()
        p, c = pd.pd_topologies(m, 2, "mtp:2", 2, "mtp:2", random_weights=r)
        pair = pd.PDPair(p, c, env={"KIT_PATCHES": "all,-nixl_pp_consumer"}, warmup=False, log_dir=tmp_path / "logs")
        with pytest.raises((pd.PDError, ProcessFailed, RuntimeError)) as e:
            with pair:
                pass
        text = str(e.value) + (tmp_path / "logs" / "consumer.log").read_text()
        assert "consumer (decode) does not support pipeline_parallel_size > 1" in text
        return
    p, d = _pd_run(tmp_path, 2, "mtp:2", 2, "mtp:2", PROMPTS[:3])
    assert d["connector"] == "nixl-push"
    assert d["consumer_prefill_tokens_computed"] == 0
    assert d["kv_bytes_transferred"] == d["kv_bytes_expected"], (d["kv_bytes_transferred"], d["kv_expected"])
    assert d["kv_transfers"] == 2 * len(PROMPTS[:3]), d["kv_transfers"]
    assert f"model.layers.{p.info.num_layers}" in d["kv_expected"]["layers"], "the MTP layer's KV must move"
    assert d["consumer_spec"]["num_drafts"] > 0


@pytest.mark.engine
@pytest.mark.pd
@pytest.mark.slow
def test_pp2_producer_to_pp1_consumer_push_streaming(tmp_path, no_leftovers):
    """Heterogeneous PP without a drafter (push): streaming, 4 at once, token-identical, all KV moved."""
    _, d = _pd_run(tmp_path, 2, None, 1, None, PROMPTS, stream=True, concurrency=4)
    assert d["connector"] == "nixl-push" and d["transfer_recorded_by"] == "producer"


@pytest.mark.engine
@pytest.mark.pd
@pytest.mark.slow
def test_mtp_on_both_sides_moves_the_mtp_layer(tmp_path, no_leftovers):
    """PP=1 + MTP -> PP=1 + MTP (pull): the MTP layer's KV moves too; the consumer's drafts are counted."""
    p, d = _pd_run(tmp_path, 1, "mtp:2", 1, "mtp:2", PROMPTS[:3])
    assert d["connector"] == "nixl"
    assert len(d["kv_expected"]["layers"]) == p.info.num_layers + p.info.num_mtp_layers
    assert d["consumer_spec"]["num_drafts"] > 0


@pytest.mark.engine
@pytest.mark.pd
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_pd_workers_keep_their_cores(tmp_path, no_leftovers, patched):
    """vLLM 0.32's NIXL worker init pins the worker's forward thread to the last core of each NUMA node
    (``os.sched_setaffinity(0, rsv_cores_for_kv)``): both servers' workers then share one core. With the
    ``nixl_cpu_affinity`` patch each worker keeps the cores the kit gave its server."""
    import os

    import psutil

    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < 2:
        pytest.skip("needs 2 cores to tell the servers' halves apart")
    m, r = _model()
    p, c = pd.pd_topologies(m, 1, None, 1, None, random_weights=r)
    env = {"KIT_PATCHES": "all" if patched else "all,-nixl_cpu_affinity"}
    with pd.PDPair(p, c, log_dir=tmp_path / "logs", env=env, warmup=False) as pair:
        seen = {}
        for role, srv in (("producer", pair.producer), ("consumer", pair.consumer)):
            workers = [q for q in psutil.Process(srv.proc.pid).children(recursive=True) if "Worker" in q.name()]
            assert workers, f"no worker process under the {role}"
            seen[role] = {q.pid: sorted(os.sched_getaffinity(q.pid)) for q in workers}
    half = len(cores) // 2
    want = {"producer": cores[:half], "consumer": cores[half:]}
    if patched:
        for role in seen:
            for pid, aff in seen[role].items():
                assert set(aff) <= set(want[role]), (role, pid, aff, want[role])
    else:
        producer_affs = [aff for aff in seen["producer"].values()]
        assert all(aff == [cores[-1]] for aff in producer_affs), (
            f"stock vLLM no longer pins the producer's workers to the last core: {seen}")


@pytest.mark.engine
@pytest.mark.pd
def test_pd_tree_listens_on_loopback_only_and_wants_its_api_key(no_leftovers):
    """A PP=2 producer and a PP=1 consumer started with an API key. While a streamed request runs, every socket
    that the whole tree accepts on (both servers' front ends, engine cores and PP workers, and the router: this
    process) is on loopback; the vLLM workers bound the machine's address before ``Topology.env`` carried
    ``kit.core.topology.LOOPBACK_ENV``. A ``/v1`` request without the key gets HTTP 401 from both servers, while the
    router's requests, which carry it, pass (the warm-up round trip included)."""
    import threading
    import time

    import psutil

    from kit.engine.procs import is_loopback, listening_sockets

    m, r = _model()
    p, c = pd.pd_topologies(m, 2, None, 1, None, random_weights=r)
    seen: dict = {}
    with pd.PDPair(p, c, api_key="kit-test-key") as pair:
        def look() -> None:
            time.sleep(1.0)  # the request is running
            tree = pair.producer.proc.tree() + pair.consumer.proc.tree() + [psutil.Process()]
            seen["titles"] = [" ".join(x.cmdline()) for x in tree if x.is_running()]
            seen["sockets"] = listening_sockets(tree)

        th = threading.Thread(target=look)
        th.start()
        rec = pair.complete(PROMPTS[2], max_tokens=300, stream=True)
        th.join()
        assert rec.error is None, rec.error
        assert any("Worker_PP1" in t for t in seen["titles"]), seen["titles"]  # the workers were looked at
        assert seen["sockets"], "no listening socket found: the look saw nothing"
        outside = [s for s in seen["sockets"] if not is_loopback(s["ip"])]
        print(f"{len(seen['titles'])} processes, {len(seen['sockets'])} listening sockets, outside loopback: {outside}")
        assert not outside, outside
        for srv in (pair.producer, pair.consumer):
            body = {"model": pair.model_name["producer"], "prompt": "x", "max_tokens": 1}
            assert srv.http().post(srv.url + "/v1/completions", json=body, timeout=30).status_code == 401
            assert srv.http().get(srv.url + "/v1/models", timeout=30).status_code == 401
            # Every route of the live server, requested without the key: 401 but the liveness probe.
            routes = srv.routes()
            assert len(routes) > 20 and ("POST", "/invocations") in routes, routes
            assert srv.open_routes() == {("GET", "/health"): 200}
            print(f"{srv.name}: {len(routes)} routes, 401 without the key on all but GET /health")
            assert srv.post("/v1/completions", {**body, "model": pd.model_id(srv)})["choices"]
