"""Patch registry selection and the pure helpers of the correctness patches (small fakes allowed)."""
import importlib
import inspect
import json
import os
from types import SimpleNamespace

import numpy as np
import pytest

from kit import patches
from kit.patches.pp_spec_token_history import fill_history


def test_selection(monkeypatch):
    reg = patches.registry()
    monkeypatch.setenv("KIT_PATCHES", "all")
    assert patches.selected_names() == [n for n, p in reg.items() if not (p.teaching_only or p.opt_in)]
    monkeypatch.setenv("KIT_PATCHES", "none")
    assert patches.selected_names() == []
    monkeypatch.setenv("KIT_PATCHES", "all,-pp_spec_schedule_gate")
    assert "pp_spec_schedule_gate" not in patches.selected_names()
    assert not patches.is_active("pp_spec_schedule_gate")
    monkeypatch.setenv("KIT_PATCHES", "drafter_only_on_last_rank")
    assert patches.selected_names() == ["drafter_only_on_last_rank"]
    monkeypatch.setenv("KIT_PATCHES", "bogus")
    with pytest.raises(ValueError, match="unknown patch 'bogus'"):
        patches.selected_names()


def test_every_patch_is_documented():
    for p in patches.registry().values():
        mod = __import__(f"kit.patches.{p.name}", fromlist=["x"])
        doc = mod.__doc__ or ""
        for f in ("summary", "why", "upstream", "target", "removal"):
            assert getattr(p, f).strip(), (p.name, f)
        assert p.processes and p.processes <= patches.ALL_PROCS, p.name
        assert isinstance(p.runner, patches.Runner) and isinstance(p.kind, patches.Kind), p.name
        assert all(":" in s for s in p.symbols), (p.name, p.symbols)
        assert all(t.startswith("tests/test_") and "::" in t for t in p.tests), (p.name, p.tests)
        if p.opt_in:
            for word in ("What it changes", "Upstream", "Turn on"):
                assert word in doc, (p.name, word)
        elif not p.teaching_only and not p.report_only:
            for word in ("What breaks without it", "Upstream", "Turn off"):
                assert word in doc, (p.name, word)
        assert "findings note" not in doc and "findings note" not in p.upstream, p.name


def test_findings_anchors_exist():
    """Each patch cites the investigation behind it as a heading (anchor) of docs/findings.md."""
    import re
    from pathlib import Path

    findings = Path(patches.__file__).resolve().parents[2] / "docs" / "findings.md"
    if not findings.exists():
        pytest.skip("docs/findings.md is not in this checkout")
    slugs = {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
             for h in re.findall(r"^#+ (.+)$", findings.read_text(), flags=re.M)}
    for p in patches.registry().values():
        assert p.findings in slugs, (p.name, p.findings)


def test_module_name_is_patch_name_and_every_module_is_in_the_index():
    """The registry (INDEX) is the one list: each kit/patches/<name>.py defines PATCH named <name> and is in it."""
    from pathlib import Path

    pkg = Path(patches.__file__).parent
    modules = {f.stem for f in pkg.glob("*.py")} - {"__init__", "docs", "vllm_process"}
    assert modules == set(patches.INDEX), modules ^ set(patches.INDEX)
    assert len(patches.INDEX) == len(set(patches.INDEX))
    reg = patches.registry()
    assert list(reg) == list(patches.INDEX)
    assert all(p.name == n for n, p in reg.items())
    assert patches.errors() == {}


def test_applied_patches_mark_exactly_the_symbols_they_declare():
    """After applying, every declared vLLM symbol carries its patch's mark, and applying again stacks nothing."""
    import importlib

    applied = patches.apply_selected()
    assert {"pp_spec_schedule_gate", "pp_spec_token_history", "drafter_only_on_last_rank"} <= set(applied)
    for name in applied:
        for sym in patches.registry()[name].symbols:
            mod, qual = sym.split(":")
            try:
                obj = importlib.import_module(mod)
            except ImportError:
                continue  # e.g. nixl._api where nixl is not installed
            for part in qual.split("."):
                obj = getattr(obj, part)
            if callable(obj):  # a plain value set by a patch (a class attribute's string) carries no mark
                assert name in patches._marks(obj), (name, sym)
    before = patches.registry()["pp_spec_schedule_gate"]
    from vllm.v1.core.sched.scheduler import Scheduler

    wrapper = Scheduler.schedule
    before.apply()  # a second application (a reload, a second copy of the kit) must not wrap again
    assert Scheduler.schedule is wrapper and patches._marks(wrapper).count("pp_spec_schedule_gate") == 1


def test_docs_patches_md_is_generated_from_the_registry():
    from kit.patches import docs

    want = docs.render()
    have = docs.DOC_PATH.read_text() if docs.DOC_PATH.exists() else ""
    assert have == want, f"docs/patches.md is out of date with kit/patches/: run `{docs.REGENERATE}`"
    for name in patches.INDEX:
        assert f"### {name}" in want


# -- failures never kill a process; process filter ------------------------------------------------------

@pytest.fixture
def isolated(monkeypatch):
    """A private registry state, so fake patches and recorded failures do not leak into other tests."""
    monkeypatch.setattr(patches, "STATE", patches._State())
    monkeypatch.setattr(patches, "_PATCHES", dict(patches._PATCHES))
    return monkeypatch


def _fake(name, needed=lambda: True, apply=lambda: None, processes=(patches.Proc.WORKER,)):
    return patches.Patch(name=name, summary="s", why="w", upstream="u", target="t", symbols=(),
                         processes=set(processes), runner=patches.Runner.ANY, kind=patches.Kind.START_UP,
                         removal="r", tests=(), apply=apply, needed=needed)


def test_a_module_missing_from_disk_is_recorded_and_stops_the_process(isolated, tmp_path):
    isolated.setattr(patches, "INDEX", patches.INDEX + ("no_such_patch",))
    isolated.setenv("KIT_PATCHES", "no_such_patch")
    isolated.setenv("KIT_PATCH_LOG", str(tmp_path / "log.jsonl"))
    with pytest.raises(patches.PatchFailedError, match="patch no_such_patch did not apply .*refusing to run"):
        patches.load_plugin()   # what vLLM calls in every process: fails closed, after recording it
    assert "no_such_patch" not in patches.registry()
    assert patches.errors()["no_such_patch"].startswith("import: ModuleNotFoundError")
    assert "FAILED" in next(r for r in patches.report() if r["name"] == "no_such_patch")["status"]
    fails = patches.failures_in_log(tmp_path / "log.jsonl")
    assert len(fails) == 1 and "no_such_patch" in fails[0] and f"pid {os.getpid()}" in fails[0]


def test_a_raising_needed_or_apply_is_reported_and_undone(isolated, tmp_path):
    class Target:
        def f(self):
            return "orig"

        def g(self):
            return "orig"

    def boom():
        raise RuntimeError("detection exploded")

    def half_apply():
        patches.install(Target, "f", "half", lambda orig: lambda self: "patched")
        raise RuntimeError("second symbol missing")

    isolated.setattr(patches, "INDEX", patches.INDEX + ("bad_needed", "half", "good"))
    isolated.setitem(patches._PATCHES, "bad_needed", _fake("bad_needed", needed=boom))
    isolated.setitem(patches._PATCHES, "half", _fake("half", apply=half_apply))
    isolated.setitem(patches._PATCHES, "good", _fake(
        "good", apply=lambda: patches.install(Target, "g", "good", lambda orig: lambda self: "good")))
    isolated.setenv("KIT_PATCHES", "bad_needed,half,good")
    isolated.setenv("KIT_PATCH_LOG", str(tmp_path / "log.jsonl"))
    with pytest.raises(patches.PatchFailedError) as failed:
        patches.load_plugin()
    assert "bad_needed did not apply" in str(failed.value) and "half did not apply" in str(failed.value)
    assert len(str(failed.value).splitlines()) == 1
    errs = patches.errors()
    assert errs["bad_needed"] == "needed(): RuntimeError: detection exploded"
    assert errs["half"] == "apply(): RuntimeError: second symbol missing"
    assert Target().f() == "orig" and patches.marked(Target.f) is None   # the half-applied patch is undone
    assert Target().g() == "good" and patches.marked(Target.g) == "good"  # the others still apply
    rec = json.loads((tmp_path / "log.jsonl").read_text().splitlines()[-1])
    assert rec["applied"] == ["good"] and set(rec["errors"]) == {"bad_needed", "half"}
    assert len(patches.failures_in_log(tmp_path / "log.jsonl")) == 2


def test_the_launcher_fails_a_run_whose_patches_failed(tmp_path):
    from kit import engine
    from kit.core.topology import Topology

    log = tmp_path / "log.jsonl"
    log.write_text(json.dumps({"pid": 7, "caller": "vllm.v1.worker.worker_base:WorkerWrapperBase.init_worker",
                               "errors": {"pp_spec_token_history": "apply(): AttributeError: x"}}) + "\n")
    with pytest.raises(engine.EngineError, match="patch pp_spec_token_history failed in pid 7"):
        engine.check_patch_log(Topology(model="tiny-mimo", random_weights=True, pp=2), str(log))
    log.write_text(json.dumps({"pid": 8, "errors": {}}) + "\n")
    engine.check_patch_log(Topology(model="tiny-mimo", random_weights=True, pp=2), str(log))


def test_an_unsupported_vllm_or_unknown_name_stays_a_clear_error(isolated):
    isolated.setattr(patches, "SUPPORTED_VLLM", ("0.0.1",))
    isolated.setenv("KIT_PATCHES", "all")
    with pytest.raises(patches.UnsupportedVllmError, match="target vLLM 0.0.1"):
        patches.load_plugin()
    isolated.setenv("KIT_PATCHES", "all,-pp_spec_schedul_gate")
    with pytest.raises(ValueError, match="unknown patch 'pp_spec_schedul_gate'"):
        patches.load_plugin()


def test_process_kind_from_the_plugin_loaders_caller(monkeypatch):
    from vllm.v1.executor.multiproc_executor import MultiprocExecutor
    from vllm.v1.executor.uniproc_executor import UniProcExecutor

    P = patches.Proc
    kinds = lambda *c: patches.process_kinds(c)[0]  # noqa: E731
    monkeypatch.delenv("KIT_PATCH_EVERY_PROCESS", raising=False)
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    assert kinds("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker", {}) == {P.WORKER}
    core = ("vllm.v1.engine.core", "EngineCore.__init__")
    assert kinds(*core, {"executor_class": MultiprocExecutor}) == {P.ENGINE_CORE}
    assert kinds(*core, {"executor_class": UniProcExecutor}) == {P.ENGINE_CORE, P.WORKER}  # PP=1: worker inside
    front = ("vllm.engine.arg_utils", "EngineArgs.__post_init__", {})
    assert kinds(*front) == {P.FRONT_END}
    assert kinds("somewhere.else", "f", {}) == patches.ALL_PROCS
    assert patches.process_kinds(None)[0] == patches.ALL_PROCS   # kit doctor, tests, python -c
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")     # engine core inside the front end
    assert kinds(*front) == patches.ALL_PROCS
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "1")
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "fork")  # children inherit this process's patches
    assert kinds(*core, {"executor_class": MultiprocExecutor}) == {P.ENGINE_CORE, P.WORKER}
    assert kinds(*front) == patches.ALL_PROCS
    monkeypatch.setenv("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    monkeypatch.setenv("KIT_PATCH_EVERY_PROCESS", "1")
    assert kinds("vllm.v1.worker.worker_base", "WorkerWrapperBase.init_worker", {}) == patches.ALL_PROCS


def test_only_the_patches_for_this_process_are_applied(isolated):
    applied = []
    isolated.setattr(patches, "INDEX", patches.INDEX + ("in_worker", "in_core"))
    isolated.setitem(patches._PATCHES, "in_worker", _fake("in_worker", apply=lambda: applied.append("w")))
    isolated.setitem(patches._PATCHES, "in_core", _fake("in_core", apply=lambda: applied.append("c"),
                                                        processes=(patches.Proc.ENGINE_CORE,)))
    isolated.setenv("KIT_PATCHES", "in_worker,in_core")
    assert patches.apply_selected(frozenset({patches.Proc.ENGINE_CORE})) == ["in_core"]
    assert applied == ["c"] and patches.STATE.skipped["in_worker"].startswith("not for this process (worker)")


def test_plugin_loaded_through_vllms_loader_in_a_worker_applies_worker_patches_only(tmp_path):
    """vLLM's own load_general_plugins, called from a function standing where init_worker calls it."""
    import subprocess
    import sys

    code = (
        "import vllm.plugins\n"
        "g = {'__name__': 'vllm.v1.worker.worker_base', 'vllm': vllm}\n"
        "exec('def init_worker():\\n    vllm.plugins.load_general_plugins()\\n', g)\n"
        "g['init_worker']()\n"
    )
    log = tmp_path / "log.jsonl"
    env = dict(os.environ, KIT_PATCH_LOG=str(log), VLLM_PLUGINS="ppmtp_kit_patches")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    rec = json.loads(log.read_text().splitlines()[-1])
    assert rec["processes"] == ["worker"] and rec["errors"] == {}, rec
    assert "pp_spec_token_history" in rec["applied"] and "pp_spec_schedule_gate" not in rec["applied"]
    assert "decode_side_pp_spec_rule" not in rec["applied"]


def test_decode_side_rule(monkeypatch):
    """Decode-side PP + spec is refused only when a correctness patch is off."""
    from kit.patches.decode_side_pp_spec_rule import check

    monkeypatch.setenv("KIT_PATCHES", "all")
    check(2, True, None)  # allowed: the fix is active
    monkeypatch.setenv("KIT_PATCHES", "all,-pp_spec_token_history")
    with pytest.raises(ValueError, match="data parallelism"):
        check(2, True, "kv_consumer")
    check(2, True, "kv_producer")  # the producer side is always fine
    check(1, True, None)


class _State(SimpleNamespace):
    @property
    def num_tokens(self):
        return self.num_prompt_tokens + len(self.output_token_ids)


def _fake_runner(history, prompt_len, in_batch=True):
    state = _State(output_token_ids=list(history), num_prompt_tokens=prompt_len)
    batch = SimpleNamespace(req_id_to_index={"r": 0} if in_batch else {},
                            token_ids_cpu=np.zeros((1, 64), dtype=np.int64),
                            is_token_ids=np.zeros((1, 64), dtype=bool),
                            num_tokens_no_spec=np.array([prompt_len + len(history)]))
    return SimpleNamespace(requests={"r": state}, input_batch=batch), state, batch


def _sched(num_computed, new_tokens, spec=None, all_tokens=None):
    cached = SimpleNamespace(req_ids=["r"], resumed_req_ids=set(), new_token_ids=[new_tokens],
                             num_computed_tokens=[num_computed], all_token_ids=all_tokens or {})
    return SimpleNamespace(scheduled_cached_reqs=cached, scheduled_spec_decode_tokens=spec or {},
                           finished_req_ids=set())


def test_fill_history_appends_accepted_drafts():
    # prompt of 4, history [10]; last step sent drafts [7, 8]; 2 accepted -> scheduler says 7 computed.
    runner, state, batch = _fake_runner([10], 4)
    drafts = {"r": [7, 8]}
    added = fill_history(runner, _sched(num_computed=7, new_tokens=[9]), drafts)
    assert added == 2 and state.output_token_ids == [10, 7, 8]
    assert list(batch.token_ids_cpu[0, 5:7]) == [7, 8] and batch.num_tokens_no_spec[0] == 7
    assert "r" not in drafts


def test_fill_history_prefers_the_schedulers_full_token_list():
    runner, state, _ = _fake_runner([10], 4, in_batch=False)
    truth = {"r": [1, 2, 3, 4, 10, 7, 5, 9]}  # only one of the drafts [7, 8] was accepted... then 5
    fill_history(runner, _sched(num_computed=7, new_tokens=[9], all_tokens=truth), {"r": [7, 8]})
    assert state.output_token_ids == [10, 7, 5]


def test_fill_history_no_gap_no_change_and_remembers_new_drafts():
    runner, state, _ = _fake_runner([10], 4)
    drafts = {}
    assert fill_history(runner, _sched(num_computed=5, new_tokens=[11], spec={"r": [3, 4]}), drafts) == 0
    assert state.output_token_ids == [10] and drafts == {"r": [3, 4]}


def test_accepted_counts_follow_the_scheduler():
    """pp_spec_hybrid_accepted_count: the count a non-last rank gets is what the last rank's sampler set."""
    from kit.patches.pp_spec_hybrid_accepted_count import accepted_counts

    def sched(computed, spec=None, resumed=()):
        cached = SimpleNamespace(req_ids=list(computed), resumed_req_ids=set(resumed),
                                 num_computed_tokens=list(computed.values()))
        return SimpleNamespace(scheduled_cached_reqs=cached, scheduled_spec_decode_tokens=spec or {},
                               finished_req_ids=set())

    runner = SimpleNamespace(requests={r: SimpleNamespace(num_computed_tokens=10) for r in "abcd"})
    prev = {"a": [7, 8], "b": [7, 8], "c": [7, 8, 9]}  # drafts each request carried in its previous step; d none
    # a: 2 of 2 accepted (10 -> 13), b: none accepted (10 -> 11), c: 1 of 3 (10 -> 12), d: a plain step (10 -> 11)
    counts = accepted_counts(runner, sched({"a": 13, "b": 11, "c": 12, "d": 11}, spec={"a": [5, 6]}), prev)
    assert counts == {"a": 3, "b": 1, "c": 2, "d": 1}
    assert prev == {"a": [5, 6]}  # this step's drafts, for the next step
    # A resumed request is re-added by vLLM (count 1 from add_request): left alone; a prefill chunk counts 1.
    runner.requests["a"].num_computed_tokens = 13
    assert accepted_counts(runner, sched({"a": 16}, resumed=["a"]), prev) == {}
    assert accepted_counts(runner, sched({"b": 40}), {}) == {"b": 1}


def _fake_update_states(self, scheduler_output):
    """What vLLM 0.32's ``_update_states`` does to the accepted counts: requests left out of the step leave the
    persistent batch, scheduled ones not in it are (re-)added with count 1 (``InputBatch.add_request``)."""
    batch = self.input_batch
    scheduled = scheduler_output.num_scheduled_tokens
    for req_id in [r for r in batch.req_id_to_index if r not in scheduled]:
        batch.num_accepted_tokens_cpu[batch.req_id_to_index.pop(req_id)] = -1   # a freed row
    for i, req_id in enumerate(scheduler_output.scheduled_cached_reqs.req_ids):
        self.requests[req_id].num_computed_tokens = scheduler_output.scheduled_cached_reqs.num_computed_tokens[i]
        if req_id not in batch.req_id_to_index:
            idx = next(j for j in range(len(batch.num_accepted_tokens_cpu)) if j not in batch.req_id_to_index.values())
            batch.req_id_to_index[req_id] = idx
            batch.num_accepted_tokens_cpu[idx] = 1


@pytest.mark.parametrize("last_rank", [False, True], ids=["first-rank", "last-rank"])
@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_accepted_count_survives_a_step_out_of_the_batch(monkeypatch, patched, last_rank):
    """pp_spec_hybrid_accepted_count: under sync PP with drafts a request sits out every other step (the batch
    queue's in-flight step); vLLM re-adds it with count 1 on every rank. With the patch each rank continues from
    1 + accepted: the non-last ranks from the scheduler, the last rank too for a request that re-entered the batch;
    a request that stayed in the last rank's batch keeps the sampler's count."""
    import vllm.distributed.parallel_state as ps

    from kit.patches import pp_spec_hybrid_accepted_count as m

    monkeypatch.setattr(ps, "get_pp_group", lambda: SimpleNamespace(is_last_rank=last_rank))
    update = m._wrap(_fake_update_states) if patched else _fake_update_states
    runner = SimpleNamespace(
        speculative_config=object(), model_config=SimpleNamespace(is_hybrid=True),
        requests={r: SimpleNamespace(num_computed_tokens=10) for r in "ab"},
        input_batch=SimpleNamespace(req_id_to_index={"a": 0, "b": 1}, num_accepted_tokens_cpu=np.ones(4, np.int64)))

    def step(computed, spec):
        cached = SimpleNamespace(req_ids=list(computed), resumed_req_ids=set(),
                                 num_computed_tokens=list(computed.values()))
        update(runner, SimpleNamespace(scheduled_cached_reqs=cached, scheduled_spec_decode_tokens=spec,
                                       num_scheduled_tokens={r: 3 for r in computed}, finished_req_ids=set()))
        b = runner.input_batch
        return {r: int(b.num_accepted_tokens_cpu[b.req_id_to_index[r]]) for r in computed}

    step({"a": 10, "b": 10}, {"a": [1, 2], "b": [1, 2]})   # both carry 2 drafts
    if last_rank:   # the last rank's sampler: a accepted 2 of 2, b 0 of 2
        runner.input_batch.num_accepted_tokens_cpu[:2] = [3, 1]
    step({}, {})                                            # the in-flight step: both left out of the batch
    assert step({"a": 13, "b": 11}, {}) == ({"a": 3, "b": 1} if patched else {"a": 1, "b": 1})
    # Staying in the batch on the last rank: the sampler's value is left as it is.
    if last_rank and patched:
        runner.input_batch.num_accepted_tokens_cpu[runner.input_batch.req_id_to_index["a"]] = 7
        assert step({"a": 14}, {})["a"] == 7


def test_decode_side_rule_is_checked_before_any_process_starts():
    """The kit refuses decode-side PP + spec without the fix in-process, with process creation blocked (as the
    bad-input table runs its cases): nothing is started to find out."""
    from kit import engine, pd
    from kit.cli import bad_input
    from kit.core.topology import Topology, TopologyError

    t = Topology(model="tiny-mimo", random_weights=True, pp=2, spec="mtp:1")
    started: list[str] = []
    with bad_input._no_processes(started):
        with pytest.raises(TopologyError, match="only supported on the\\s+prefill side"):
            engine.run(t, [], env={"KIT_PATCHES": "all,-pp_spec_token_history"})
        with pytest.raises(TopologyError, match="refused by the kit before starting vLLM"):
            engine.Server(t, env={"KIT_PATCHES": "decode_side_pp_spec_rule"}).start()
        # A consumer PP=2 + MTP without the fix: refused when the pair is built; the producer side is allowed.
        with pytest.raises(TopologyError, match="prefill side"):
            pd.PDPair(Topology(model="tiny-mimo", random_weights=True, pp=2), t, env={"KIT_PATCHES": "all,-pp_spec_schedule_gate"})
        engine.precheck(t.with_(pd_role="producer", connector="nixl-push"), {"KIT_PATCHES": "all,-pp_spec_schedule_gate"})
        # With the fix active (default), or with the rule itself off, nothing is refused.
        engine.precheck(t, {})
        engine.precheck(t, {"KIT_PATCHES": "none"})
    assert started == [], started


_IDLE_AGENT = r"""
import json, time
from kit.patches import apply_selected
apply_selected()   # what the vllm.general_plugins entry point does in every vLLM process
from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config
agent = NixlWrapper("idle", nixl_agent_config(num_threads=4, capture_telemetry=True))  # vLLM's own config
time.sleep(0.5)
c0, t0 = time.process_time(), time.monotonic()
time.sleep(3.0)
print(json.dumps({"cpu": time.process_time() - c0, "wall": time.monotonic() - t0}))
"""


_AGENT_DELAY = r"""
import json
from kit.patches import apply_selected
apply_selected()   # what the vllm.general_plugins entry point does in every vLLM process
from vllm.distributed.nixl_utils import NixlWrapper, nixl_agent_config
import nixl._api as api
real = getattr(api.nixlBind, "__wrapped__", api.nixlBind)   # the compiled bindings module
seen = []
create = real.nixlAgent
def record(name, cfg):
    seen.append(cfg.pthrDelay)
    return create(name, cfg)
real.nixlAgent = record
agent = NixlWrapper("idle", nixl_agent_config(num_threads=4, capture_telemetry=True))  # vLLM's own config
print(json.dumps(seen))
"""


@pytest.mark.parametrize("selection", ["patch-off", "patch-on"])
def test_nixl_progress_delay_sets_the_agents_poll_timeout(selection):
    """A real NIXL agent created the way vLLM 0.32's connector creates it: the configuration it reaches the
    compiled bindings with. Off (stock): nixl's hard-coded pthrDelay = 0 (the busy poll); on: 1000 us.
    Clock-free; what the delay does to an idle agent's CPU is measured by the slow test below."""
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("nixl")
    env = dict(os.environ, KIT_PATCHES="all,-nixl_progress_delay" if selection == "patch-off" else "all")
    env.pop("KIT_NIXL_PTHR_DELAY_US", None)
    out = subprocess.run([sys.executable, "-c", _AGENT_DELAY], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == ([0] if selection == "patch-off" else [1000]), seen


@pytest.mark.slow  # reads CPU time against the wall clock: a loaded machine moves it (the default selection checks the delay)
@pytest.mark.parametrize("selection", ["patch-off", "patch-on"])
def test_nixl_progress_delay_stops_the_idle_agent_spinning(selection):
    """A real NIXL agent created the way vLLM 0.32's connector creates it, doing nothing for 3 s.

    Off (stock): nixl hard-codes pthrDelay=0 and the progress thread burns a core. On: it sleeps in poll().
    """
    import json
    import os
    import subprocess
    import sys

    pytest.importorskip("nixl")
    env = dict(os.environ, KIT_PATCHES="all,-nixl_progress_delay" if selection == "patch-off" else "all")
    out = subprocess.run([sys.executable, "-c", _IDLE_AGENT], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    m = json.loads(out.stdout.strip().splitlines()[-1])
    share = m["cpu"] / m["wall"]
    if selection == "patch-off":
        assert share > 0.5, f"stock NIXL agent used only {share:.0%} of a core while idle: is the spin gone upstream?"
    else:
        assert share < 0.2, f"idle NIXL agent still used {share:.0%} of a core with the patch on"


def test_patch_overhead_times_only_the_wrapper_and_restores_it():
    """kit bench --patch-overhead: each per-step wrapper is timed with its vLLM function swapped for a no-op,
    and the real function is back in place afterwards."""
    from vllm.v1.core.sched.scheduler import Scheduler

    from kit.bench import patch_overhead

    costs = patch_overhead.measure(n=2000)  # applies the selected patches first
    before = Scheduler.schedule.__wrapped__
    patch_overhead.measure(n=2000)
    assert {c.patch for c in costs} >= {"pp_spec_schedule_gate", "pp_spec_token_history"}
    assert all(0 <= c.ns_per_call < 1e6 for c in costs), costs
    cell = next(c for c in Scheduler.schedule.__closure__ if c.cell_contents is before)
    assert cell.cell_contents is before


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_cpu_rope_rotates_every_head_of_mla_shaped_tensors(patched):
    """cpu_rope_layout: vLLM 0.32's CPU rotary kernel mis-rotates a 3-D query and MLA's strided q_pe/k_pe views
    (the real kernel, against vLLM's own pure-PyTorch forward_static); through the patch every row is right and
    the caller's views are updated in place, with nothing else in the fused buffer touched."""
    import torch
    from vllm.config import VllmConfig, set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope
    from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbedding

    from kit.patches import apply_selected

    apply_selected()   # what the plugin does in every vLLM process (idempotent)
    forward_cpu = RotaryEmbedding.forward_cpu
    if not patched:
        forward_cpu = getattr(forward_cpu, "__wrapped__", forward_cpu)
    else:
        assert getattr(forward_cpu, "__kit_patch__", None) == "cpu_rope_layout"
    torch.manual_seed(0)
    T, H, nope, rope_dim = 7, 4, 32, 64
    with set_current_vllm_config(VllmConfig()):
        rope = get_rope(rope_dim, max_position=2048, is_neox_style=False,
                        rope_parameters={"rope_theta": 10000.0, "rope_type": "default"}, dtype=torch.float32)
    pos = torch.arange(T) * 3
    q_full = torch.randn(T, H, nope + rope_dim)
    fused = torch.randn(T, 512 + rope_dim + 64)   # kv_a output: [latent | k_pe | something after]
    q_pe, k_pe = q_full[..., nope:], fused[:, 512:512 + rope_dim].unsqueeze(1)
    want_q, want_k = rope.forward_static(pos, q_pe.clone(), k_pe.clone(), rope.head_size, rope.rotary_dim,
                                         rope.cos_sin_cache, rope.is_neox_style)
    before = fused.clone()
    forward_cpu(rope, pos, q_pe, k_pe)
    q_ok = torch.allclose(q_pe, want_q.view(q_pe.shape), atol=1e-5)
    k_ok = torch.allclose(k_pe, want_k.view(k_pe.shape), atol=1e-5)
    untouched = torch.equal(fused[:, :512], before[:, :512]) and torch.equal(fused[:, 576:], before[:, 576:])
    if patched:
        assert q_ok and k_ok and untouched
    else:
        assert not q_ok and not k_ok, "stock vLLM's CPU rotary kernel now handles MLA layouts: retire the patch"


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_glm4_moe_stage_without_moe_layers(patched):
    """glm4_moe_dense_stage: vLLM 0.32's GLM-4 MoE model refuses a PP stage that holds only dense layers (its
    real extract_moe_parameters, called as the model's __init__ calls it on such a stage); patched, the stage's
    expert counts are 0, as vLLM's DeepSeek-V2 sets them."""
    from types import SimpleNamespace

    from vllm.model_executor.models.glm4_moe import Glm4MixtureOfExperts

    from kit.patches import apply_selected

    apply_selected()
    fn = Glm4MixtureOfExperts.extract_moe_parameters
    stage = SimpleNamespace()
    if not patched:
        with pytest.raises(RuntimeError, match="No Glm4MoE layer found"):
            fn.__wrapped__(stage, None)
        return
    assert fn.__kit_patch__ == "glm4_moe_dense_stage"
    fn(stage, None)
    assert stage.num_logical_experts == 0 and stage.num_local_physical_experts == 0


_IMPORT_QWEN3_5_MTP = """
import json
from kit.patches import apply_selected
apply_selected()   # what the vllm.general_plugins entry point does in every vLLM process
out = {}
try:
    import vllm.model_executor.models.qwen3_5_mtp as m
    out["imported"] = m.Qwen3_5MTP.__name__
    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil
    from transformers.models.qwen2_vl import image_processing_qwen2_vl as tv
    out["same_smart_resize"] = tv.smart_resize is pil.smart_resize
    out["smart_resize"] = list(tv.smart_resize(100, 200))
    try:
        tv.Qwen2VLImageProcessor
    except ModuleNotFoundError as e:
        out["other_name_error"] = e.name
except ModuleNotFoundError as e:
    out["error"] = e.name
print(json.dumps(out))
"""


@pytest.mark.parametrize("selection", ["patch-off", "patch-on"])
def test_qwen3_5_mtp_imports_without_torchvision(selection):
    """qwen_vl_no_torchvision: without torchvision (the CPU setup removes it), vLLM 0.32's Qwen3.5 MTP module fails
    at import (qwen3_5 -> qwen3_vl -> transformers' torchvision image-processing module); with the patch it imports,
    the one name vLLM takes from that module is transformers' PIL smart_resize, and any other name still fails
    naming torchvision. A fresh interpreter per case: an import, once done, cannot be undone in this process."""
    import importlib.util
    import json
    import os
    import subprocess
    import sys

    if importlib.util.find_spec("torchvision") is not None:
        pytest.skip("torchvision is installed here: nothing to show")
    env = dict(os.environ, KIT_PATCHES="all,-qwen_vl_no_torchvision" if selection == "patch-off" else "all")
    out = subprocess.run([sys.executable, "-c", _IMPORT_QWEN3_5_MTP], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    if selection == "patch-off":
        assert got == {"error": "torchvision"}, f"stock vLLM imports Qwen3.5 without torchvision now: retire the patch ({got})"
    else:
        assert got == {"imported": "Qwen3_5MTP", "same_smart_resize": True, "smart_resize": [112, 196],
                       "other_name_error": "torchvision"}, got


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_chunk_boundary_tokens(patched):
    """spec_chunk_boundary_token: vLLM 0.32's real ``prepare_next_token_ids_padded`` for a step with one decode row
    (2 tokens sampled) and one partial prefill (a 10-token prompt, 4 computed, 3 scheduled now): the drafter's input
    after the chunk is the prompt's last token stock (position 9), the token after the chunk patched (position 7).
    The decode row is the same both ways."""
    from types import SimpleNamespace

    import numpy as np
    import torch
    from vllm.platforms.cpu import CpuPlatform
    from vllm.v1.spec_decode.llm_base_proposer import SpecDecodeBaseProposer
    from vllm.v1.utils import CpuGpuBuffer

    from kit.patches import apply_selected
    from kit.patches.spec_chunk_boundary_token import _SCHEDULED

    CpuPlatform.register_triton_kernel_overrides()   # the CPU kernels vLLM's CPU workers use (no Triton-CPU here)
    apply_selected()
    fn = SpecDecodeBaseProposer.prepare_next_token_ids_padded
    if patched:
        assert fn.__kit_patch__ == "spec_chunk_boundary_token"
    else:
        fn = fn.__wrapped__

    class State:   # the fields of vLLM's CachedRequestState the function reads
        def __init__(self, tokens: list[int], computed: int):
            self.tokens, self.num_computed_tokens, self.num_tokens = tokens, computed, len(tokens)

        def get_token_id(self, i: int) -> int:
            return self.tokens[i]

    prompt = list(range(100, 110))
    requests = {"dec": State([1, 2, 3, 4, 5], 3), "pre": State(prompt, 4)}
    batch = SimpleNamespace(num_reqs=2, req_ids=["dec", "pre"], vocab_size=1000,
                            num_tokens_no_spec=np.array([5, 10], dtype=np.int32))
    drafter = SpecDecodeBaseProposer.__new__(SpecDecodeBaseProposer)
    drafter.backup_next_token_ids = CpuGpuBuffer(4, dtype=torch.int32, device="cpu", with_numpy=True)
    setattr(drafter, _SCHEDULED, {"dec": 3, "pre": 3})   # what the runner's wrapper hands over for the step
    sampled = torch.tensor([[41, 42, -1], [-1, -1, -1]], dtype=torch.int32)
    discard = torch.tensor([False, True])
    nxt, valid = fn(drafter, sampled, requests, batch, discard)
    assert nxt[0].item() == 42 and valid.tolist() == [2, 0]
    if patched:
        assert nxt[1].item() == prompt[4 + 3]
    else:
        assert nxt[1].item() == prompt[-1], "stock vLLM gives the token after the chunk now: retire the patch"


_MLA_SPEC_BUDGET = """
import json
from kit.patches import apply_selected
apply_selected()   # what the vllm.general_plugins entry point does in the front end
from vllm.engine.arg_utils import EngineArgs
from kit.core.topology import Topology
args = Topology(model="tiny-deepseek-v3-trained", spec="mtp:1", max_num_batched_tokens=64,
                max_model_len=512).engine_args()
args.pop("worker_extension_cls", None)
sc = EngineArgs(**args).create_engine_config().scheduler_config
print(json.dumps([sc.enable_chunked_prefill, sc.max_num_batched_tokens, sc.max_num_scheduled_tokens]))
"""


@pytest.mark.parametrize("selection", ["patch-off", "patch-on"])
def test_cpu_mla_spec_token_budget(selection):
    """cpu_mla_spec_token_budget: the VllmConfig vLLM 0.32 builds for an MLA model with a drafter on CPU and
    ``max_num_batched_tokens=64``: the CPU platform turns chunked prefill off and raises the batch budget to 2048,
    but the scheduler's budget (``max_num_scheduled_tokens``) stays 64, so a prompt longer than 64 tokens is never
    scheduled (the engine steps on without it; the DeepSeek traffic cells show it end to end). Patched, the
    scheduler's budget follows. A fresh interpreter: building the config sets process environment (LD_PRELOAD)."""
    import json
    import os
    import subprocess
    import sys

    env = dict(os.environ, KIT_PATCHES="all,-cpu_mla_spec_token_budget" if selection == "patch-off" else "all")
    out = subprocess.run([sys.executable, "-c", _MLA_SPEC_BUDGET], env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    chunked, batched, scheduled = json.loads(out.stdout.strip().splitlines()[-1])
    assert not chunked and batched == 2048
    if selection == "patch-off":
        assert scheduled == 64, "stock vLLM keeps the scheduler's budget with the platform's now: retire the patch"
    else:
        assert scheduled == 2048


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_kv_layout_resolves_when_pp_ranks_hold_different_backends(patched):
    """pp_kv_layout_intersect: vLLM 0.32's engine core asserts that every worker reports the same supported KV cache
    layouts; a PP stage of Gated-DeltaNet layers only reports the default (all layouts) while the stage with full
    attention reports the CPU backend's one (what tiny-qwen3_5 at PP=2 reported). Patched, the engine core's own
    function resolves the shared layout; truly disjoint lists still fail."""
    from vllm.config import VllmConfig
    from vllm.v1.engine import core

    from kit.patches import apply_selected

    apply_selected()
    fn = core.resolve_kv_cache_layout
    reported = [["LBNHC", "LBHNC", "BLNHC", "BLHNC", "BHLNC", "LHBNC"], ["LBHNC"]]
    if not patched:
        with pytest.raises(AssertionError, match="Workers disagree on supported KV cache layouts"):
            fn.__wrapped__(VllmConfig(), reported)
        return
    assert fn.__kit_patch__ == "pp_kv_layout_intersect"
    cfg = VllmConfig()
    assert fn(cfg, reported).name == "LBHNC" and cfg.cache_config.kv_cache_layout == "LBHNC"
    assert fn(VllmConfig(), [["LBNHC", "LBHNC"], ["LBNHC", "LBHNC"]]).name == "LBNHC"  # agreeing lists: as before
    with pytest.raises(ValueError, match="No KV cache layout is supported by every"):
        fn(VllmConfig(), [["LBNHC"], ["LBHNC"]])


class _Batch:
    """The parts of vLLM's InputBatch that its decode/prefill reorder reads and moves."""

    def __init__(self, rows: list[tuple[str, int, int]]):   # (request, computed tokens, prompt tokens)
        self.req_ids = [r for r, _, _ in rows]
        self.num_computed_tokens_cpu = np.array([c for _, c, _ in rows])
        self.num_prompt_tokens = np.array([p for _, _, p in rows])

    def swap_states(self, i: int, j: int) -> None:
        for a in (self.req_ids, self.num_computed_tokens_cpu, self.num_prompt_tokens):
            a[i], a[j] = a[j], a[i]


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_pp_ranks_agree_on_the_batch_order(monkeypatch, patched):
    """pp_batch_order_agree: each worker reorders its batch (decodes first) with a threshold from its own layers'
    attention builders. tiny-qwen3_5 at PP=4 (layers L, L, L, F, mtp:2): Gated-DeltaNet ranks ask for 3, the
    full-attention rank for none. In the measured mixed step (request 0 verifying 3 tokens, new prompts 3 and 4)
    vLLM's own reorder gave ranks 0-2 [0, 4, 3] and rank 3 [3, 4, 0]: the last stage read other requests' hidden
    states. With the patch every rank takes the pipeline's minimum and orders the step the same way."""
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from kit.patches import pp_batch_order_agree as m

    own = [3, 3, 3, None]   # what calculate_reorder_batch_threshold found on ranks 0..3 (debug log of the run)
    monkeypatch.setattr(m, "_gather_over_pp", lambda value: list(own))

    def calculate(self):     # stands in for vLLM's per-worker computation
        self.reorder_batch_threshold = own[self.rank]

    so = SimpleNamespace(num_scheduled_tokens={"3": 16, "4": 37, "0": 3})
    orders = []
    for rank in range(4):
        runner = SimpleNamespace(rank=rank, parallel_config=SimpleNamespace(pipeline_parallel_size=4),
                                 kv_cache_config=SimpleNamespace(kv_cache_groups=[object()]),
                                 input_batch=_Batch([("3", 0, 16), ("4", 0, 37), ("0", 39, 12)]))
        (m._wrap(calculate) if patched else calculate)(runner)
        GPUModelRunner._may_reorder_batch(runner, so)   # vLLM's own reorder
        orders.append(runner.input_batch.req_ids)
    if patched:
        assert orders == [["0", "4", "3"]] * 4, orders
    else:
        assert orders == [["0", "4", "3"]] * 3 + [["3", "4", "0"]], orders
    assert m.pipeline_threshold([None, None]) is None and m.pipeline_threshold([3, 1, None]) == 1


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_attention_only_stage_leaves_align_mode(patched):
    """pp_mamba_align_attention_stage: with prefix caching a hybrid model's mamba cache runs in mode 'align' and
    every worker's step looks up its mamba-cache groups; tiny-qwen3_5's rank 3 at PP=4 holds only the full-attention
    layer, and vLLM's lookup asserts. Patched, that stage runs with mode 'none' on its own copy of the cache config;
    a stage with linear-attention layers keeps 'align'."""
    import torch
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec, MambaSpec
    from vllm.v1.worker import mamba_utils

    from kit.patches import pp_mamba_align_attention_stage as m

    def config(names):   # every rank gets the model's groups; a stage's own layers fill them (rank 3: none)
        full = FullAttentionSpec(block_size=16, num_kv_heads=2, head_size=64, dtype=torch.bfloat16)
        gdn = MambaSpec(block_size=16, shapes=((3, 8), (2, 4, 4)), dtypes=(torch.bfloat16,) * 2)
        return KVCacheConfig(num_blocks=4, kv_cache_tensors=[], kv_cache_groups=[
            KVCacheGroupSpec(names[0], gdn), KVCacheGroupSpec(names[1], full)])

    attention_stage = config([[], ["model.layers.3.self_attn.attn"]])
    gdn_stage = config([["model.layers.2.linear_attn"], []])
    shared = SimpleNamespace(mamba_cache_mode="align")
    init = m._wrap(lambda self, cfg: None) if patched else (lambda self, cfg: None)
    modes = []
    for cfg in (attention_stage, gdn_stage):
        runner = SimpleNamespace(cache_config=shared)
        init(runner, cfg)
        modes.append(runner.cache_config.mamba_cache_mode)
    if not patched:
        assert modes == ["align", "align"]
        with pytest.raises(AssertionError, match="no mamba layers in the model"):  # the step's first lookup
            mamba_utils.get_mamba_groups(attention_stage)
        return
    assert modes == ["none", "align"] and shared.mamba_cache_mode == "align"


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_gdn_spec_conv_matches_the_no_spec_kernel(patched):
    """cpu_gdn_spec_cpp_conv: on a CPU with AVX-512 BF16 and no AMX, vLLM 0.32's no-spec GDN path convolves with the
    C++ kernels (packed weight) and the speculation-aware path with torch fallbacks, which round differently. Patched,
    the fallbacks as the speculation-aware code calls them (unpacked weight, wide state buffer) give the C++ kernels'
    numbers bit for bit and leave the same state in the buffer's first width - 1 columns."""
    import torch
    from vllm import _custom_ops as ops

    from kit.patches import cpu_gdn_spec_cpp_conv as m

    if not (torch.cpu._is_avx512_bf16_supported() and hasattr(ops, "causal_conv1d_weight_pack")):
        pytest.skip("no AVX-512 BF16 here: both paths use the torch conv")
    g = importlib.import_module(m._MODULE)
    torch.manual_seed(0)
    dim, width, k, slots = 256, 4, 2, 4
    w = (torch.randn(dim, width) * 0.5).bfloat16()
    layer = SimpleNamespace(conv1d=SimpleNamespace(weight=ops.causal_conv1d_weight_pack(w.clone()),
                                                   _cpu_unpacked_conv_weight=w))
    x_prefill = torch.randn(9, dim).bfloat16().transpose(0, 1)   # one 9-token prompt, as vLLM passes it
    x_decode = torch.randn(1, dim).bfloat16()
    qsl, idx, init = torch.tensor([0, 9], dtype=torch.int32), torch.tensor([2], dtype=torch.int32), torch.tensor([False])

    # The no-spec path: C++ kernels on a (slots, dim, width - 1) state.
    ns_state = torch.zeros(slots, width - 1, dim).bfloat16().transpose(1, 2)
    want_p = ops.causal_conv1d_fwd_cpu(x=x_prefill, weight=layer.conv1d.weight, bias=None, conv_states=ns_state,
                                       query_start_loc=qsl, cache_indices=idx, has_initial_state=init,
                                       silu_activation=True, is_weight_packed=True)
    want_d = ops.causal_conv1d_update_cpu(x=x_decode, conv_states=ns_state, weight=layer.conv1d.weight, bias=None,
                                          silu_activation=True, conv_state_indices=idx, is_weight_packed=True,
                                          num_accepted_tokens=None)
    # The speculation-aware path's calls: unpacked weight, wide (slots, dim, width - 1 + k) buffer.
    # vLLM's own functions, also when an earlier test in this process applied the kit's patches
    fwd, upd, unpacked = (inspect.unwrap(f) for f in (g.causal_conv1d_torch, g.causal_conv1d_update_cpu,
                                                       g._unpacked_conv_weight))
    if patched:
        fwd, upd, unpacked = m._wrap_fwd(fwd), m._wrap_update(upd), m._wrap_unpacked(unpacked)
    buf = torch.zeros(slots, dim, width - 1 + k).bfloat16()
    got_p = fwd(x=x_prefill, weight=unpacked(layer), bias=None, conv_states=buf, query_start_loc=qsl,
                cache_indices=idx, has_initial_state=init, activation="silu")
    got_d = upd(x=x_decode, conv_state=buf[:, :, : width - 1], weight=unpacked(layer), bias=None, activation="silu",
                conv_state_indices=idx)
    same = torch.equal(got_p, want_p) and torch.equal(got_d, want_d)
    if not patched:
        assert not same   # other arithmetic: the torch fallback rounds differently
        return
    assert same and torch.equal(buf[2, :, : width - 1], ns_state[2])


@pytest.mark.parametrize("patched", [False, True], ids=["patch-off", "patch-on"])
def test_gdn_one_token_prefill_reaches_the_conv_kernel(patched):
    """cpu_gdn_one_token_batch: vLLM 0.32's CPU GDN prefill hands the conv kernel ``mixed_qkv`` (a view of the fused
    qkvz projection) transposed; with one token ``.contiguous()`` copies nothing and the kernel refuses the stride.
    Patched, the kernel gets a copy in its layout and computes what it computes for a two-token step's first token."""
    import torch
    from vllm import _custom_ops as ops

    from kit.patches import cpu_gdn_one_token_batch as m

    torch.manual_seed(0)
    dim, z, width = 64, 32, 4
    w = (torch.randn(dim, width) * 0.5).bfloat16()
    fwd = inspect.unwrap(ops.causal_conv1d_fwd_cpu)   # vLLM's own, also if an earlier test applied the patches
    if patched:
        fwd = m._wrap(fwd)

    def prefill(tokens: int):
        qkvz = torch.randn(tokens, dim + z, generator=torch.Generator().manual_seed(1)).bfloat16()
        mixed_qkv = qkvz.split([dim, z], dim=-1)[0].contiguous()     # as forward_cpu and the no-spec path make it
        state = torch.zeros(2, dim, width - 1).bfloat16()
        return fwd(mixed_qkv.transpose(0, 1), w, None, state, torch.tensor([0, tokens], dtype=torch.int32),
                   torch.tensor([1], dtype=torch.int32), torch.tensor([False]), True, False)

    two = prefill(2)      # two tokens: .contiguous() copied, the kernel accepts it either way
    if not patched:
        with pytest.raises(RuntimeError, match="expect x to be transposed"):
            prefill(1)
        return
    assert torch.equal(prefill(1)[:, 0], two[:, 0])   # the same first token: the conv is causal


def _padded(x, running):
    if x == 1 and (running or x > 0):
        return "padded"
    return "plain"


def test_rewrite_changes_one_condition_and_keeps_the_source_location():
    """spec_no_pad_fresh_prompt compiles vLLM's Scheduler.schedule again with one condition narrowed: the helper
    refuses text that is missing or not unique (a vLLM whose source moved fails closed), and the new function
    keeps the original's file and line numbers for tracebacks."""
    from kit.patches.spec_no_pad_fresh_prompt import FIXED, STOCK, _needed, rewrite

    new = rewrite(_padded, "(running or x > 0)", "x > 1")
    assert (_padded(1, True), new(1, True)) == ("padded", "plain")
    assert new.__code__.co_filename == _padded.__code__.co_filename
    assert new.__code__.co_firstlineno == _padded.__code__.co_firstlineno and new.__wrapped__ is _padded
    with pytest.raises(RuntimeError, match="found it 0 times"):
        rewrite(_padded, "no such text", "x")
    assert _needed() is True and STOCK != FIXED   # this vLLM has the padding condition the patch narrows


def test_a_selection_that_starts_with_an_exclusion_means_all_but_it():
    """KIT_PATCHES=-name reads as "every patch but name" (it used to select nothing, silently)."""
    every = patches.selected_names("all")
    assert patches.selected_names("-pp_spec_schedule_gate") == [n for n in every if n != "pp_spec_schedule_gate"]
    assert patches.selected_names("-pp_spec_schedule_gate,-pp_spec_token_history") == patches.selected_names(
        "all,-pp_spec_schedule_gate,-pp_spec_token_history")
    assert patches.selected_names("pp_spec_schedule_gate") == ["pp_spec_schedule_gate"]
    assert patches.selected_names("none") == []
