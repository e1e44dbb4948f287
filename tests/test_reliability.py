"""No hangs, no orphans: dead workers surface fast with their cause; nothing outlives its caller."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import pytest
from conftest import MODEL, ROOT

from kit import engine
from kit.checks.faults import kill_tree
from kit.checks.faults import kill_when_generating as _kill_when_generating
from kit.checks.faults import vllm_processes as _vllm_children
from kit.core.topology import Topology
from kit.engine.procs import RUN_ID_ENV, leftover_vllm_processes, new_run_id

pytestmark = [pytest.mark.engine, pytest.mark.reliability]
PROMPTS = ["def add(a, b):\n    return", "import os\n"]


def test_dead_worker_is_reported_within_30s(no_leftovers):
    t = Topology(model=MODEL, random_weights=True, pp=2)
    stop, rid = threading.Event(), new_run_id()
    killed: list = []
    killer = threading.Thread(target=_kill_when_generating, args=("VLLM::Worker_PP1", stop, rid, killed),
                              daemon=True)
    killer.start()
    with pytest.raises(engine.EngineError) as e:
        # Long enough that the kill lands while generating (8 x 900 tokens took only seconds once the engine
        # decoded at ~1000 tok/s, and the kill missed it).
        engine.generate(t, PROMPTS * 32, max_tokens=900, timeout=600, env={RUN_ID_ENV: rid})
    stop.set()
    msg = str(e.value)
    assert "Worker_PP1" in msg and "died" in msg, msg
    reported_at = time.monotonic()
    assert killed, "the worker was never killed"
    # Reported within 30 s of the kill (stock vLLM waited ~5 minutes).
    assert reported_at - killed[0] < 30, reported_at - killed[0]


def test_caller_killed_leaves_no_vllm_process(tmp_path, no_leftovers):
    """The caller (a notebook kernel, say) dies hard mid-run: the runner and all vLLM children follow it."""
    script = tmp_path / "caller.py"
    script.write_text(textwrap.dedent(f"""
        import sys; sys.path.insert(0, {str(ROOT)!r})
        from kit import engine
        from kit.core.topology import Topology
        engine.generate(Topology(model={MODEL!r}, random_weights=True, pp=2), ["x = 1"] * 4, max_tokens=2000)
    """))
    t_start, rid = time.time(), new_run_id()
    caller = subprocess.Popen([sys.executable, str(script)], env={**os.environ, RUN_ID_ENV: rid})
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and not _vllm_children("VLLM::Worker_PP1", rid):
        time.sleep(1)
    assert _vllm_children("VLLM::Worker_PP1", rid), "the engine never started"
    time.sleep(3)
    caller.kill()
    caller.wait()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and leftover_vllm_processes(since=t_start, owner=caller.pid):
        time.sleep(1)
    assert not leftover_vllm_processes(since=t_start, owner=caller.pid)


def test_a_fault_in_one_run_leaves_the_run_beside_it_alone(no_leftovers):
    """Two PP=2 runs started side by side on this machine, each with its own run id. A's stage-1 worker is killed as
    soon as it exists (found by A's id, not by its title, which B's stage-1 worker shares) while B's stage-1 worker
    is alive too. A reports the death; B finishes with the PP=1 reference's tokens."""
    from kit.engine.procs import run_processes

    t = Topology(model=MODEL, random_weights=True, pp=2)
    rid_a, rid_b = new_run_id(), new_run_id()
    b_prompts, b_tokens = PROMPTS * 64, 900
    got: dict = {}
    b_workers: list = []

    def run_b() -> None:
        try:
            got["b"] = engine.generate(t, b_prompts, max_tokens=b_tokens, timeout=600, env={RUN_ID_ENV: rid_b},
                                       quiet=True)
        except Exception as e:  # noqa: BLE001 - the assertion below shows it
            got["b_error"] = e

    def b_running() -> bool:  # the kill happens while B's stage-1 worker is alive and B has not finished
        b_workers[:] = [p.pid for p in _vllm_children("VLLM::Worker_PP1", rid_b)]
        return bool(b_workers) and "b" not in got and "b_error" not in got

    b = threading.Thread(target=run_b)
    b.start()
    stop, killed = threading.Event(), []

    def kill_a() -> None:  # A's stage-1 worker, as soon as it exists (A is starting), while B runs
        while not stop.is_set():
            victims = _vllm_children("VLLM::Worker_PP1", rid_a)
            if victims and b_running():
                killed.append((time.monotonic(), [p.pid for p in victims]))
                for p in victims:
                    p.kill()
                return
            time.sleep(0.2)

    threading.Thread(target=kill_a, daemon=True).start()
    t_a, err = time.monotonic(), None
    try:
        # Long enough that A still runs when B's workers are up: the run that generates first leaves the other's start
        # little of the 2 cores (seen: with 32 copies A finished before B's stage-1 worker existed, nothing killed;
        # and B generating held A's start back for 90 s).
        engine.generate(t, PROMPTS * 256, max_tokens=900, timeout=600, env={RUN_ID_ENV: rid_a}, quiet=True)
    except engine.EngineError as e:
        err = e
    stop.set()
    b.join(timeout=600)
    assert killed and b_workers, ("A's stage-1 worker was never killed while B's ran", killed, b_workers)
    assert err is not None and "Worker_PP1" in str(err), (
        f"A's stage-1 worker was killed {killed[0][0] - t_a:.1f} s into A's run (victims {killed[0][1]}), and A "
        f"{'finished' if err is None else 'failed otherwise'}", err)
    assert not run_processes(rid_a)
    assert "b_error" not in got, got.get("b_error")
    ref = engine.generate(t.reference(), b_prompts, max_tokens=b_tokens)
    assert got["b"].token_ids == ref.token_ids


@pytest.mark.slow
def test_twenty_starts_and_stops_leave_nothing(no_leftovers):
    """20 cycles: in-process engines (PP=1 and PP=2), `vllm serve` servers, and engines killed mid-request;
    after each cycle no vLLM process of this test is left."""
    for i in range(20):
        t = Topology(model=MODEL, random_weights=True, pp=1 + (i % 2))
        if i % 4 == 3:  # a worker killed mid-request
            stop, rid = threading.Event(), new_run_id()
            killed: list = []
            th = threading.Thread(target=_kill_when_generating, args=("VLLM::Worker", stop, rid, killed), daemon=True)
            th.start()
            with pytest.raises(engine.EngineError):
                # Long enough that the kill lands while generating (see the dead-worker test).
                engine.generate(t, PROMPTS * 32, max_tokens=900, timeout=600, env={RUN_ID_ENV: rid})
            stop.set()
            assert killed, i
        elif i % 4 == 1:  # a server: start, one request, stop
            with engine.Server(t) as srv:
                from kit.pd import _model_id

                body = {"model": _model_id(srv), "prompt": PROMPTS[0], "max_tokens": 4, "temperature": 0.0}
                assert srv.post("/v1/completions", body)["choices"][0]["text"] is not None
        else:
            engine.generate(t, PROMPTS, max_tokens=4)
        assert not leftover_vllm_processes(owner=os.getpid()), (i, leftover_vllm_processes(owner=os.getpid()))


# -- PD fault injection -----------------------------------------------------------------------------

def _pd_pair():
    from kit import pd

    p, c = pd.pd_topologies(MODEL, 1, None, 1, None, random_weights=True)
    return pd, p, c


def _kill_server_tree(srv) -> None:
    kill_tree(srv.proc.tree())


def _plain_completion(srv, prompt: str, max_tokens: int) -> list[int]:
    """A request without kv_transfer_params: the server computes it alone (a PD server also serves these)."""
    from kit.pd import _model_id, _post_json

    body = {"model": _model_id(srv), "prompt": prompt, "max_tokens": max_tokens, "temperature": 0.0,
            "ignore_eos": True, "return_token_ids": True}
    return _post_json(srv, "/v1/completions", body, {}, 120, srv.name)["choices"][0]["token_ids"]


@pytest.mark.pd
def test_pd_faults_are_reported_fast_and_survivors_keep_serving(no_leftovers, monkeypatch):
    """Consumer killed mid-decode, then (a new pair) producer killed after prefill: each time the caller gets a
    PDError naming the dead server within 30 s, and the surviving server answers the next request with the
    reference's tokens."""
    from kit.engine import generate
    from kit.pd import client

    pd, p, c = _pd_pair()
    ref = generate(c.reference(), PROMPTS, max_tokens=48)

    # 1. the consumer dies mid-decode (streaming, long output): killed as its first streamed tokens arrive (a kill
    # at a fixed 2 s once came after the 1000 tokens were already decoded, and nothing failed).
    with pd.PDPair(p, c) as pair:
        ok = pair.complete(PROMPTS[0], max_tokens=48)
        assert ok.error is None and ok.token_ids == ref.token_ids[0], ok.error
        killed = []
        events = client.post_events

        def kill_at_first_tokens(*args, **kwargs):
            for chunk in events(*args, **kwargs):
                yield chunk
                if not killed and any(ch.get("token_ids") for ch in chunk.get("choices") or []):
                    killed.append(time.monotonic())
                    _kill_server_tree(pair.consumer)

        monkeypatch.setattr(client, "post_events", kill_at_first_tokens)
        rec = pair.complete(PROMPTS[1], max_tokens=1000, stream=True)
        monkeypatch.undo()
        assert rec.error and "consumer" in rec.error and ("died" in rec.error or "failed" in rec.error), rec.error
        assert killed and time.monotonic() - killed[0] < 30
        # The producer survives and still serves correctly.
        assert _plain_completion(pair.producer, PROMPTS[1], 48) == ref.token_ids[1]

    # 2. the producer dies after the prefill, before the consumer reads its KV
    with pd.PDPair(p, c) as pair:
        orig = pair._watched

        def watched(what, fn, *args):
            out = orig(what, fn, *args)
            if what == "producer prefill":
                _kill_server_tree(pair.producer)
            return out

        pair._watched = watched
        t0 = time.monotonic()
        rec = pair.complete(PROMPTS[0], max_tokens=16)
        assert rec.error and "producer died" in rec.error, rec.error
        assert time.monotonic() - t0 < 60
        pair._watched = orig
        # The consumer survives and computes a plain request itself, correctly.
        assert _plain_completion(pair.consumer, PROMPTS[0], 48) == ref.token_ids[0]


@pytest.mark.pd
def test_pd_kv_transfer_timeout_is_reported_with_its_cause_and_the_pair_keeps_serving(no_leftovers):
    """The KV transfer times out: the producer's lease (2 s here) runs out before the consumer asks for the
    blocks (the router pauses 5 s between the two calls). The push connector then never writes them. The
    caller gets a PDError within the pair's request deadline that quotes the producer's own log line about
    the expired blocks, and the same pair then serves the next request with the reference's tokens."""
    from kit.engine import generate

    pd, p, c = _pd_pair()
    ref = generate(c.reference(), PROMPTS, max_tokens=16)
    with pd.PDPair(p, c, connector="nixl-push", request_timeout=30, kv_extra_config={"kv_lease_duration": 2}) as pair:
        t0 = time.monotonic()
        rec = pair.complete(PROMPTS[0], max_tokens=16, pause_before_decode=5.0)
        took = time.monotonic() - t0
        assert rec.error, "the consumer got tokens although the producer had released the blocks"
        assert "timed out" in rec.error, rec.error
        assert "expired" in rec.error.lower() and rec.request_id in rec.error, rec.error
        assert took < 5.0 + 30 + 15, took
        nxt = pair.complete(PROMPTS[1], max_tokens=16)
        assert nxt.error is None, nxt.error
        assert nxt.token_ids == ref.token_ids[1]


# -- back to back -----------------------------------------------------------------------------------

def _stress_run(i: int) -> tuple[list[str], str]:
    """Run ``i`` of the stress test: even ``kit compare`` (PP=2 + MTP k=2), odd ``kit pd`` (PP=2 + MTP producer,
    PP=1 + MTP consumer: vLLM's NIXL handshake wants the same drafter method on both sides), as a user types them;
    returns the command and '' or its failure's cause."""
    common = ["--model", MODEL, "--random", "--limit", "2", "--max-tokens", "16", "--quiet"]
    if i % 2 == 0:
        argv = ["compare", "--pp", "2", "--spec", "mtp:2", *common]
    else:
        argv = ["pd", "--producer-pp", "2", "--producer-spec", "mtp:2", "--consumer-pp", "1", "--consumer-spec", "mtp:2", *common]
    out = subprocess.run([sys.executable, "-m", "kit", *argv], capture_output=True, text=True, timeout=600,
                         env={**os.environ, "PYTHONPATH": str(ROOT)})
    if out.returncode == 0:
        return argv, ""
    tail = [l for l in (out.stderr + out.stdout).splitlines() if l.strip()][-12:]
    return argv, f"exit {out.returncode}: " + "\n    ".join(tail)


@pytest.mark.slow
def test_back_to_back_compare_and_pd(no_leftovers):
    """``kit compare`` and ``kit pd`` alternating, each started the moment the previous one ended: every run
    passes, and a failure is reported with its cause (the last lines the run printed). ``KIT_STRESS_RUNS``
    runs (20) from run ``KIT_STRESS_START`` (0): a long series can be run in chunks that keep the alternation."""
    start = int(os.environ.get("KIT_STRESS_START", "0"))
    count = int(os.environ.get("KIT_STRESS_RUNS", "20"))
    failures, took = [], []
    for i in range(start, start + count):
        t0 = time.monotonic()
        argv, cause = _stress_run(i)
        took.append(round(time.monotonic() - t0, 1))
        if cause:
            failures.append(f"run {i} (kit {' '.join(argv)}): {cause}")
        left = leftover_vllm_processes(owner=os.getpid())
        if left:
            failures.append(f"after run {i}: processes left {left}")
    print(f"runs {start}..{start + count - 1}: seconds {took}")
    assert not failures, "\n".join(failures)
