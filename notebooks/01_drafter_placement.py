# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Where does everything live under PP?
#
# **The question:** with PP=2 and PP=4, which rank holds which decoder layers, the embedding, the LM head,
# the MTP drafter and which KV cache? And how does one decode step with drafts travel across those ranks?
# Everything below is read from the **live engine**: the kit adds methods to every vLLM worker
# (`worker_extension_cls`) and calls them with `LLM.collective_rpc`; one of them times every step inside each worker.
#
# Words used here (stage and rank, in flight, micro-batch, empty step, engine core, ...) are defined in the
# [Glossary](00_start_here.ipynb#Glossary) of notebook 00.
#
# About 3.5 minutes on 2 cores (seven engines); each engine cell says how long it takes.

# %% tags=["parameters"]
MODEL = "tiny-mimo"
RANDOM_WEIGHTS = False   # the trained checkpoint: its drafts are accepted, so the step trace shows accepted drafts
SPEC = "mtp:2"
PP_SIZES = [2, 4]
TRACE_PP = 2             # the engine of this PP size (one of PP_SIZES) also generates, with every step traced
NODES = 2                # one more engine: TRACE_PP stages over this many local nodes, inspected (1: skip it)
TRACE_PROMPTS = 2
TRACE_TOKENS = 16
PATCHES_FOR_FAILURE = "all,-drafter_only_on_last_rank"   # the run that shows what breaks
HYBRID_MODEL = "tiny-qwen3_5"   # a hybrid (linear + full attention) model with its MTP drafter
HYBRID_PP = 4                   # its PP size (0: skip that section)

# %%
import kit
import kit.checks.compare
import kit.lab.notebook
kit.lab.notebook.setup()

# %% [markdown]
# One engine per PP size in `PP_SIZES`, each started, asked and stopped (a status line shows each one's phase). The
# `TRACE_PP` engine also generates a few tokens with every step traced inside each worker (`kit_trace_start` /
# `kit_trace_read`, see *One decode step with drafts, across the ranks* below).

# %%
# about 65 s on 2 cores: one traced engine per PP size
import pandas as pd
from kit.lab import plots
from kit.worker import steptrace
from kit.checks.compare import load_prompts
from kit.lab.notebook import claim
from kit.checks.placement import summary_rows, traced_placement
from kit.core.topology import Topology
from IPython.display import Markdown

trace_prompts = load_prompts(limit=TRACE_PROMPTS)
layouts, trace, traced = {}, None, None
for pp in PP_SIZES:
    run = traced_placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=pp, spec=SPEC),
                           trace_prompts if pp == TRACE_PP else None, max_tokens=TRACE_TOKENS)
    layouts[pp] = run["ranks"]
    if pp == TRACE_PP:
        traced, trace = run["generation"], steptrace.merge(run["trace"])
    display(pd.DataFrame(summary_rows(layouts[pp])).set_index("pp_rank"))

# %%
n_layers = Topology(model=MODEL, random_weights=True).info.num_layers
for pp, ranks in layouts.items():
    plots.placement_lanes(ranks, n_layers, title=f"PP={pp}: layers per rank, drafter on the last rank").show()

# %% [markdown]
# **What it shows:** the decoder layers are split into consecutive ranges; rank 0 alone embeds tokens, the
# last rank alone has the LM head — and the MTP drafter (with its own copy of embedding and LM head) lives
# only on the last rank, next to the sampler whose tokens it extends. Each rank's KV cache holds only its own
# layers' KV; the drafter's layer KV sits on the last rank.

# %%
for pp, ranks in layouts.items():
    last = max(r["pp_rank"] for r in ranks)
    covered = sorted(i for r in ranks for i in r["layers"])
    claim(covered == list(range(n_layers)), f"PP={pp}: the {n_layers} decoder layers are split over the {pp} ranks, "
          "each layer on exactly one", covered)
    where = {r["pp_rank"]: (bool(r["drafter"] and r["drafter"].get("params")), r["embedding"], r["lm_head"]) for r in ranks}
    claim(all(v == (rk == last, rk == 0, rk == last) for rk, v in where.items()),
          f"PP={pp}: the drafter and the LM head only on rank {last}, the embedding only on rank 0",
          "(drafter, embedding, lm_head) per rank: " + str(where))

# %% [markdown]
# ## The KV cache of each rank
# **Predict, then look:** at the largest PP size run here, how many layers' KV does each rank allocate, and which
# rank holds the MTP layer's?
#
# <details><summary>Answer</summary>
#
# Each rank its own target layers, and the last rank one more: the MTP layer's KV (`model.layers.<L>` for a target of
# L layers: vLLM names it after all target layers), because the drafter that attends over it runs there. The picture
# and the claims below read it from the live workers' KV cache configuration.
# </details>

# %%
plots.kv_layers_per_rank(layouts, n_layers).show()
for pp, ranks in layouts.items():
    last = max(r["pp_rank"] for r in ranks)
    for r in ranks:
        got = sorted(int(n.split(".")[2]) for n in r["kv_cache"]["layers"])
        want = sorted(r["layers"]) + ([n_layers] if r["pp_rank"] == last else [])
        claim(got == want, f"PP={pp} rank {r['pp_rank']}: KV for layers {got}"
              + (f" (layer {n_layers}: the MTP layer)" if r["pp_rank"] == last else ""), f"expected {want}")

# %% [markdown]
# ## A hybrid model: where Qwen3.5's recurrent state lives
# Qwen3.5 mixes two kinds of layers. A Gated-DeltaNet layer (linear attention) keeps, per request, a fixed-size
# state: a short conv window and a delta-rule matrix, in vLLM's "mamba cache", whatever the length of the text. A
# full-attention layer keeps KV that grows with every token. `tiny-qwen3_5` has three Gated-DeltaNet layers, then
# one full-attention layer, and the `qwen3_5_mtp` drafter (itself one full-attention layer). With speculation a
# request's recurrent state must be able to roll back when drafts are rejected.
#
# **Predict, then look:** at PP=4 with `mtp:2`, which ranks hold recurrent state and which KV, how many state slots
# does each request get, and where does the drafter run?
#
# <details><summary>Answer</summary>
#
# One layer per rank: ranks 0-2 each hold one Gated-DeltaNet layer's state and no KV at all; rank 3 holds layer 3's
# KV, the MTP layer's KV and the drafter. Each request gets 1 + k = 3 state slots per linear-attention layer (the state
# after each verified token, so the next step continues from the last accepted one). The drafter runs on rank 3
# only and is never given another rank's hidden states: vLLM PR #46003's claim for `qwen3_5_mtp`, checked on the running
# engine. A pipeline whose stages hold different kinds of layers needed kit patches to start
# (`pp_kv_layout_intersect`) and to give the PP=1 tokens when requests enter mid-run (`pp_batch_order_agree`; without
# speculation also `pp_mamba_align_attention_stage`): see `docs/findings.md`.
# </details>

# %%
# about 40 s on 2 cores: one Qwen3.5 engine (nothing when HYBRID_PP is 0)
if HYBRID_PP:
    from kit import engine

    hybrid_k = 2
    hyb = engine.run(Topology(model=HYBRID_MODEL, random_weights=True, pp=HYBRID_PP, spec=f"mtp:{hybrid_k}"),
                     [{"kind": "rpc", "method": "kit_watch_drafter"}, {"kind": "inspect"},
                      {"kind": "generate", "prompts": load_prompts(limit=4), "max_tokens": 16},
                      {"kind": "rpc", "method": "kit_drafter_calls"}], timeout=900)
    _, hyb_ranks, hyb_gen, hyb_calls = hyb["jobs"]
    hyb_ranks = sorted(hyb_ranks, key=lambda r: r["pp_rank"])
    hyb_calls = {c["pp_rank"]: c for c in hyb_calls}
    rows = []
    for r in hyb_ranks:
        mamba = [g for g in r["kv_cache"]["groups"] if g["spec"] == "MambaSpec" and g["layers"]]
        kv = [n for g in r["kv_cache"]["groups"] if g["spec"] != "MambaSpec" for n in g["layers"]]
        rows.append({"pp_rank": r["pp_rank"], "layers": r["layers"],
                     "linear-attention state (layers)": [n for g in mamba for n in g["layers"]],
                     "state slots per request": sorted({1 + g["num_speculative_blocks"] for g in mamba}),
                     "state per slot, KiB": sorted({round(plots.state_bytes(g) / 1024) for g in mamba}),
                     "full-attention KV (layers)": kv,
                     "drafter": (r["drafter"] or {}).get("model_class") if (r["drafter"] or {}).get("params") else "",
                     "drafter calls (with PP input)": (f"{hyb_calls[r['pp_rank']]['calls']} "
                                                       f"({hyb_calls[r['pp_rank']]['with_intermediates']})"
                                                       if "calls" in hyb_calls[r["pp_rank"]] else "")})
    display(pd.DataFrame(rows).set_index("pp_rank"))
    plots.hybrid_state_lanes(hyb_ranks, hyb_calls, title=f"{HYBRID_MODEL} at PP={HYBRID_PP} + mtp:{hybrid_k}: "
                             "what each rank keeps per request (read from the live workers)").show()

# %% [markdown]
# **What it shows:** the pipeline splits the model by layer, so the kinds of state split with it: the first stages
# carry only fixed-size recurrent state (the same bytes per request at token 10 or token 10,000), the last stage
# only growing KV. The green boxes give the state slots per request and the bytes of one slot (conv window plus
# delta-rule matrix); the orange box the drafter's forward calls while it generated, and how many of them were
# handed PP intermediates (none).

# %%
if HYBRID_PP:
    last = hyb_ranks[-1]["pp_rank"]
    gdn = {r["pp_rank"]: sorted(n for g in r["kv_cache"]["groups"] if g["spec"] == "MambaSpec" for n in g["layers"])
           for r in hyb_ranks}
    layer_types = Topology(model=HYBRID_MODEL, random_weights=True).info.config["layer_types"]
    own = {r["pp_rank"]: sorted(f"model.layers.{i}.linear_attn" for i in r["layers"]
                                if layer_types[i] == "linear_attention") for r in hyb_ranks}
    claim(gdn == own and sum(map(len, gdn.values())) == layer_types.count("linear_attention"),
          f"each rank's mamba cache holds exactly its own Gated-DeltaNet layers ({sum(map(len, gdn.values()))} in all)", gdn)
    kv = {r["pp_rank"]: sorted(n for g in r["kv_cache"]["groups"] if g["spec"] != "MambaSpec" for n in g["layers"])
          for r in hyb_ranks}
    claim(all(not v for rk, v in kv.items() if rk != last) and "model.layers.3.self_attn.attn" in kv[last]
          and any(n.startswith("mtp.") for n in kv[last]),
          f"full-attention KV only on rank {last}: layer 3's and the MTP layer's", kv)
    slots = {1 + g["num_speculative_blocks"] for r in hyb_ranks for g in r["kv_cache"]["groups"]
             if g["spec"] == "MambaSpec" and g["layers"]}
    claim(slots == {1 + hybrid_k} and all(g["mamba_cache_mode"] == "none" for r in hyb_ranks
                                          for g in r["kv_cache"]["groups"] if g["spec"] == "MambaSpec"),
          f"with mtp:{hybrid_k} every request gets {1 + hybrid_k} state slots per linear-attention layer", slots)
    drafters = [r["pp_rank"] for r in hyb_ranks if (r["drafter"] or {}).get("params")]
    c = hyb_calls[last]
    claim(drafters == [last] and hyb_ranks[-1]["drafter"]["model_class"] == "Qwen3_5MTP" and c["calls"] > 0
          and c["with_intermediates"] == 0 and hyb_gen["spec"]["num_drafts"] > 0,
          f"the Qwen3_5MTP drafter is on rank {last} only; its forward ran {c['calls']} times while "
          f"{hyb_gen['spec']['num_drafts']} drafts were proposed, never with PP intermediates", (drafters, c))

# %% [markdown]
# ## Which node holds what
# With `NODES = 2` one more engine runs the `TRACE_PP` topology as a two-node deployment on this machine, through
# vLLM's own multi-node launch (`kit.engine.multinode`): node 0 on 127.0.0.2 and core 0 runs the
# API server, the engine core and the first stage's worker; node 1 on 127.0.0.3 and core 1 is a headless follower
# with the other stage's worker. Both nodes run in a network namespace the run makes for itself (where the kit can:
# root, as in CI), so none of their sockets is reachable from outside the run; the kit talks to the leader through a
# Unix socket, with the server's API key. Its workers are read the same way as above, through the leader (vLLM's
# `/collective_rpc`), and each also reports where it runs: its `VLLM_HOST_IP`, its cores, and its process, found in
# one node's process tree. It also generates the traced prompts again, to see the stages pipeline across the nodes.
#
# **Predict, then look:** which node holds the embedding, which the LM head, the MTP drafter and the MTP layer's KV?
#
# <details><summary>Answer</summary>
#
# A node holds whole pipeline stages, so everything follows the stage: node 0 (127.0.0.2) runs stage 0, with the
# embedding and the first layers' KV; node 1 (127.0.0.3) runs the last stage, with the LM head, the drafter and the
# MTP layer's KV. Only hidden states (one tensor per step) cross from node 0 to node 1, and sampled tokens and drafts
# go back to node 0's engine core.
# </details>

# %%
# about 45 s on 2 cores: one engine over two nodes (nothing when NODES is 1)
if NODES > 1:
    run = traced_placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=TRACE_PP, spec=SPEC, nodes=NODES),
                           trace_prompts, max_tokens=TRACE_TOKENS)
    ranks, nodes = run["ranks"], run["nodes"]
    t_nodes = steptrace.summary(steptrace.merge(run["trace"]))
    display(pd.DataFrame(nodes).set_index("rank"))
    display(pd.DataFrame(summary_rows(ranks)).set_index("pp_rank"))
    plots.placement_lanes(ranks, n_layers, title=f"PP={TRACE_PP} on {NODES} nodes: each stage, with its layers, "
                          "on its own node (as its worker reports)").show()

# %%
if NODES > 1:
    per_node = TRACE_PP // NODES
    ip = {n["rank"]: n["ip"] for n in nodes}
    cores = {n["rank"]: n["cores"] for n in nodes}
    claim(all(r["node"] == r["pp_rank"] // per_node and r["host_ip"] == ip[r["node"]] and r["cpu_affinity"] == cores[r["node"]]
              for r in ranks),
          f"each of the {TRACE_PP} stages runs on its node: stage 0 on node 0 ({ip[0]}), the last stage on node "
          f"{NODES - 1} ({ip[NODES - 1]}), each worker on its node's address and cores",
          [(r["pp_rank"], r["node"], r["host_ip"], r["cpu_affinity"]) for r in ranks])
    last = ranks[-1]
    claim(bool((last["drafter"] or {}).get("params")) and last["lm_head"] and n_layers in
          [int(n.split(".")[2]) for n in last["kv_cache"]["layers"]] and ranks[0]["embedding"] and ranks[0]["node"] == 0
          and not any((r["drafter"] or {}).get("params") for r in ranks[:-1]),
          f"node {last['node']} ({last['host_ip']}) holds the last stage's LM head, the MTP drafter (there only) and the "
          f"MTP layer's KV (layer {n_layers}); node 0 holds the embedding",
          [(r["node"], r["lm_head"], r["embedding"], r["kv_cache"]["layers"]) for r in ranks])
    # The same prompts, traced on both nodes (one clock: both nodes are this host): the stages pipeline across nodes
    # as they do inside one, and the tokens are those of the one-node run above.
    ov = t_nodes["in_flight"]["overlap_steps"]
    claim(run["generation"].token_ids == traced.token_ids and ov >= t_nodes["decode_steps"] // 2 and ov > 0,
          f"across {NODES} nodes the same {run['generation'].num_generated} tokens as on one node, and {ov} of "
          f"{t_nodes['decode_steps']} decode steps started on node 0 while the previous one ran on node {NODES - 1}",
          (ov, t_nodes["decode_steps"]))

# %% [markdown]
# ## The failure without the kit's drafter guard
# Stock vLLM 0.32 creates the drafter only on the last rank, but other start-up paths touch `self.drafter` on
# every rank. Turning the kit's `drafter_only_on_last_rank` patch off shows the crash (caught here: the engine runs
# until the worker fails).

# %%
# about 20 s on 2 cores: one engine that stops while starting
from kit.engine import EngineError
from kit.checks.placement import placement
err = None
try:
    placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=2, spec=SPEC),
              env={"KIT_PATCHES": PATCHES_FOR_FAILURE}, timeout=300)
except EngineError as e:
    err = str(e)
print(err or "no error: the run started")

# %%
claim(err is not None and "has no attribute 'drafter'" in err,
      "without drafter_only_on_last_rank a non-last rank touches a drafter it does not have, and the engine fails",
      "expected the missing-drafter crash")

# %% [markdown]
# ## One decode step with drafts, across the ranks
# The `TRACE_PP` engine above generated a few tokens with every step traced inside each worker (`kit.worker.steptrace`:
# timestamps from `time.monotonic()`, one clock for all processes on the host). In one step: the engine core's
# scheduler sends the step's requests to every rank; rank 0 embeds the tokens (the request's newest token plus its
# k drafts from the previous step) and runs its layers; the hidden states go stage to stage; the last rank runs its
# layers and the LM head and samples, which verifies the drafts (accepted: the longest prefix the target agrees
# with); then the MTP layer takes the last hidden state and the sampled token and proposes the next k drafts. The
# engine core collects the drafts, its scheduler puts them into the request's *next* step, on rank 0 again.
#
# **Predict, then run:** two requests decode at PP=2, and vLLM keeps up to PP steps in flight so that both stages
# can work at once. Will rank 0 run one step while the last rank still runs the one before? And can one request be
# in two consecutive steps?
#
# <details><summary>Answer</summary>
#
# On stock vLLM 0.32 with drafts and sync scheduling, neither: the scheduler puts both requests into every step, and
# right after it submits a step the engine core asks the last rank for that step's drafts (`EngineCore.post_step`
# -> `take_draft_token_ids`), a call that waits until the step has been sampled and drafted, so the steps run one
# after another. The kit's `pp_microbatches` (on by default) changes the first answer to yes: the running requests
# take turns in PP micro-batches (here one request each), and each step's drafts come back with its output instead
# of through that waiting call, so rank 0 computes one request's step while the last rank still computes the other
# request's. The second answer stays no: a request counts as in flight until its step's tokens and drafts are
# back, and a request in flight is skipped, so the step after it carries the other request, or nothing at all (an
# empty step). On stock vLLM the drafts reach the request before its step's tokens are processed, the scheduler
# takes it again with the drafts at the wrong positions, and the last stage reads another request's logits
# (notebook 00 breaks it; `pp_spec_schedule_gate` is the fix). The cell under the picture checks all three.
# </details>

# %%
last_rank = TRACE_PP - 1
by_step = steptrace.steps(trace)
ran = [s for s, v in sorted(by_step.items()) if 0 in v["forward"]]   # the steps that computed something
# A window of decode steps (every request past its prefill) from the middle of the run.
decode = [s for s in ran if all(n <= 1 + 8 for n, _ in by_step[s]["forward"][0]["reqs"].values())]
window = decode[len(decode) // 3: len(decode) // 3 + 4]
plots.step_swimlane(trace, TRACE_PP, steps=window,
                    title=f"{Topology(model=MODEL, pp=TRACE_PP, spec=SPEC).label()}: decode steps {window[0]}-{window[-1]} "
                    "as each rank ran them (s<step> <request>, h<N>: rank 0's history N tokens short)").update_layout(meta="main").show()

# %% [markdown]
# **What it shows:** each row is one process's work; time runs left to right (hover a bar for its tokens and
# drafts). A step's bar on rank 0 is followed by
# the same step on the last rank (its grey part: waiting for rank 0's hidden states), the sample (`r:N ok`: drafts
# accepted) and the MTP layer's proposal; then the engine core collects the drafts, and the arrow is their way back
# through the scheduler to that request's next step on rank 0. A request never rides in two adjacent steps (the
# step after it carries the other request, or nothing), and the next step starts on rank 0 while the previous one is
# still on the last rank: two micro-batches in flight, one per stage.
#
# The `hN` marks are the second correctness patch at work. Rank 0 is sent only each request's newest sampled
# token, never the drafts the last rank accepted, so at the start of a step its copy of the request's token history
# is short by exactly the drafts accepted in the request's previous step. `pp_spec_token_history` fills them in
# (they are a prefix of the drafts rank 0 was sent); without it, a request that leaves the batch and comes back is
# rebuilt on rank 0 from a history with holes, and the first stage embeds the wrong tokens.

# %%
kinds_on = {kind: sorted({e["rank"] for e in trace if e["kind"] == kind}) for kind in ("forward", "sample", "propose")}
claim(kinds_on["propose"] == [last_rank] and kinds_on["sample"] == [last_rank] and kinds_on["forward"] == list(range(TRACE_PP)),
      f"every rank runs a forward per step; only the last rank ({last_rank}) samples and runs the MTP drafter "
      f"({sum(e['kind'] == 'propose' for e in trace)} proposals)", kinds_on)
# Two micro-batches in flight: a step whose rank-0 forward started before the previous computed step's last-rank
# forward ended (the pp_microbatches patch; stock vLLM 0.32 with drafts never does it).
pipelined = [(a, b) for a, b in zip(ran, ran[1:])
             if by_step[b]["forward"][0]["t0"] < by_step[a]["forward"][last_rank]["t1"]]
claim(len(pipelined) >= len(ran) // 2, f"{len(pipelined)} of the {len(ran)} steps started on rank 0 while the previous "
      "step was still on the last rank: two micro-batches in flight", len(pipelined))
# Per request, its steps in order: (step, rank 0's start, when its drafts were proposed, drafts it verifies)
flights = {}
for s in ran:
    v = by_step[s]
    for r, (n, k) in v["forward"][0]["reqs"].items():
        flights.setdefault(r, []).append((s, v["forward"][0]["t0"], v["propose"]["t1"], k))
# Step numbers count every step the engine core sent, empty ones too (nothing to compute: every running request
# was in flight). A request is never in two adjacent steps s and s + 1: step s + 1 carries other requests or nothing.
twice = [(r, a[0], b[0]) for r, fl in flights.items() for a, b in zip(fl, fl[1:]) if b[0] == a[0] + 1]
empty = (max(ran) - min(ran) + 1) - len(ran)
claim(sum(len(fl) for fl in flights.values()) > len(flights) and not twice,
      f"no request of {len(flights)} was in two adjacent steps (the gate skips a request while its step is in flight): "
      f"{len(ran)} steps computed, {empty} steps in between were empty", twice)
late = [(r, a[0], b[0]) for r, fl in flights.items() for a, b in zip(fl, fl[1:]) if b[1] < a[2]]
with_drafts = sum(1 for fl in flights.values() for x in fl[1:] if x[3] > 0)
claim(with_drafts > 0 and not late, f"each of the {with_drafts} steps that verify drafts started after those drafts "
      "were proposed", late)

# %% [markdown]
# ## The pipeline before and after: stock vLLM, vLLM's own loop with the gate, the kit's micro-batches
# **Predict, then run:** the same two prompts again at PP=2 on two more engines: one with `pp_microbatches` off
# (vLLM 0.32's own step loop, every other kit patch on), and one as stock vLLM 0.32 runs it (the scheduling gate
# off too). Drawn over the same span of time, how many steps will start on rank 0 while the previous step is still
# on the last rank, and how busy will each stage be? And what will stock vLLM do with a request whose step is
# still in flight?
#
# <details><summary>Answer</summary>
#
# Without the patch none: every step carries every running request, and the engine core waits for each step's drafts
# before it schedules the next, so one stage always waits for the other. With it the requests take turns, and the
# two stages compute at the same time for at least half of the decode steps. The cell prints this run's counts and
# each stage's busy share.
#
# Stock vLLM schedules it again: the gate-off panel has no empty step, every step carries both requests though
# the step before carried them too, and the tokens go wrong. Notebook 06 follows that from the wrong token to
# the row of logits it was read from.
# </details>
#
# The figure is animated: **Play** (or drag the slider under it) runs time forward in all panels at once, a dotted
# line marking "now", so you can watch each step enter rank 0, move on to rank 1 and leave. Before you press it,
# it shows the whole span.

# %%
# about 40 s on 2 cores: two traced engines, the kit loop off and stock vLLM
before = traced_placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=TRACE_PP, spec=SPEC),
                          trace_prompts, max_tokens=TRACE_TOKENS, env={"KIT_PATCHES": "all,-pp_microbatches"})
trace_before = steptrace.merge(before["trace"])
stock = traced_placement(Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=TRACE_PP, spec=SPEC), trace_prompts,
                         max_tokens=TRACE_TOKENS,
                         env={"KIT_PATCHES": "all,-pp_spec_schedule_gate,-pp_microbatches,-decode_side_pp_spec_rule"})
trace_stock = steptrace.merge(stock["trace"])
runs = {"gate off too (stock vLLM 0.32: wrong tokens)": trace_stock,
        "pp_microbatches off (vLLM 0.32's loop with the gate)": trace_before,
        "pp_microbatches on (the kit's default)": trace}
t_off, t_on = steptrace.summary(trace_before), steptrace.summary(trace)
from kit.lab.pipeline_plots import busy_share, decode_left_ms, decode_window, pipeline_lanes
# Eight decode steps of the unpipelined run, or less where a run has no steps left to draw (a short run).
span_ms = min([8 * 1000 * t_off["period"]] + [left for left in map(decode_left_ms, runs.values()) if left])
pipeline_lanes(runs, TRACE_PP, span_ms=span_ms,
               title=f"{Topology(model=MODEL, pp=TRACE_PP, spec=SPEC).label()}: the same {span_ms:.0f} ms of decoding, "
                     "a lane per stage, s<step> on each bar").update_layout(meta="pipeline").show()
busy = {label: [busy_share(ev, r, decode_window(ev, span_ms)) for r in range(TRACE_PP)] for label, ev in runs.items()}
ov_off, ov_on = t_off["in_flight"]["overlap_steps"], t_on["in_flight"]["overlap_steps"]
per_req_off, per_req_on = (t["period"] / t["reqs_per_step"] for t in (t_off, t_on))
display(Markdown(
    f"**This run:** off, {ov_off} of {t_off['decode_steps']} decode steps had two micro-batches in flight, a decode "
    f"step every {1000 * t_off['period']:.1f} ms; on, {ov_on} of {t_on['decode_steps']}, a step every "
    f"{1000 * t_on['period']:.1f} ms (each carrying {t_on['reqs_per_step']:.1f} requests against "
    f"{t_off['reqs_per_step']:.1f}: {1000 * t_off['period'] / t_off['reqs_per_step']:.1f} ms per request off, "
    f"{1000 * t_on['period'] / t_on['reqs_per_step']:.1f} ms on: per request the micro-batched run was "
    f"{'faster' if per_req_on < per_req_off else 'not faster'}). Busy share of the span drawn, per stage: off "
    + ", ".join(f"{100 * b:.0f} %" for b in busy[list(runs)[1]]) + "; on "
    + ", ".join(f"{100 * b:.0f} %" for b in busy[list(runs)[2]]) + ". Empty steps between the first and the last "
    f"decode step (the outlined bars): {t_off['empty_steps']} off, {t_on['empty_steps']} on."))

# %% [markdown]
# **What it shows:** the top panel is stock vLLM: the steps follow each other with no empty step, each carrying both
# requests although the step before carried them too (they were in flight): that is the defect, and its tokens
# differ from the others' (claimed below). In the middle panel the bars form a staircase: a step on rank 0, then the
# same step on rank 1 (its grey part waiting for rank 0's hidden states), then no computing on rank 0 until the
# step's drafts are back, and every second step is empty (both requests in flight). In the bottom panel the
# requests alternate, one colour per micro-batch (the same colour in every panel), and rank 0
# starts one request's step while rank 1 still computes the other's. An outlined bar is an empty step: the engine
# core sent a step with no request in it because every running request was in flight. The trace has no timestamp
# for such a step (nothing computed), so it is drawn over the gap on each rank between the computed steps around it
# (the hover says which). A label that does not fit its bar is left out; hovering any bar gives its step, requests
# and times. The same tokens come out either way (the matrix checks both); what changes is how much of the time
# each stage has work. Whether the overlap also finishes sooner depends on what a step of one request costs
# against a step of two: the time per request above says which way it went in this run; `kit bench --timeline`
# measures what the overlap wins on a larger model (docs/results/bench.md, "PP micro-batches in flight and the
# layer split").

# %%
claim(ov_off == 0 and t_off["decode_steps"] > 0,
      f"with pp_microbatches off no decode step started while the previous one ran on the last rank "
      f"(0 of {t_off['decode_steps']})", ov_off)
claim(ov_on >= t_on["decode_steps"] // 2 and ov_on > 0,
      f"with it on {ov_on} of {t_on['decode_steps']} decode steps did", ov_on)
from kit.checks.inflight import rides
stock_rides = rides(trace_stock)
claim(len(stock_rides) > 0 and stock["generation"].token_ids != traced.token_ids,
      f"with the gate off too (stock vLLM 0.32), {len(stock_rides)} steps carried a request still in flight and the "
      "tokens differ from the other runs' (notebook 06 follows them to the row of logits they were read from)",
      stock_rides[:4])
claim(traced.token_ids == before["generation"].token_ids and
      traced.spec.num_accepted_tokens == before["generation"].spec.num_accepted_tokens,
      f"both runs generated the same {traced.num_generated} tokens with the same "
      f"{traced.spec.num_accepted_tokens} drafts accepted", before["generation"].token_ids)

# %% [markdown]
# **Predict, then run:** at the start of a request's step, by how many tokens is rank 0's copy of its token history
# short of what the scheduler has counted?
#
# <details><summary>Answer</summary>
#
# By the number of drafts the last rank accepted in the request's previous step (0 when none was accepted). The
# cell below compares the two for every step of the run.
# </details>

# %%
accepted_at = {(r, s): a for s, v in by_step.items() if v["sample"] for r, a in v["sample"]["accepted"].items()}
pairs = []   # (request, step, history gap on rank 0, drafts accepted in the request's previous step)
for r, fl in flights.items():
    for prev, nxt in zip(fl, fl[1:]):
        gap = by_step[nxt[0]]["forward"][0]["history_gap"].get(r)
        if gap is not None:
            pairs.append((r, nxt[0], gap, accepted_at.get((r, prev[0]))))
mismatch = [p for p in pairs if p[2] != p[3]]
total_gap = sum(p[2] for p in pairs)
display(Markdown(f"**This run:** {len(pairs)} steps of {len(flights)} requests on rank 0; the history was short in "
                 f"{sum(p[2] > 0 for p in pairs)} of them, by {total_gap} tokens in all, and the last rank had accepted "
                 f"{sum(p[3] or 0 for p in pairs)} drafts in the steps before them. Tokens generated: "
                 f"{traced.num_generated}, drafts accepted: {traced.spec.num_accepted_tokens}."))
claim(bool(pairs) and not mismatch and total_gap > 0,
      f"rank 0's history is short by exactly the drafts the last rank accepted in the previous step ({total_gap} tokens "
      f"over {len(pairs)} steps): what pp_spec_token_history fills in", mismatch[:5])

# %% [markdown]
# **Takeaway:** the MTP drafter, the LM head and the MTP layer's KV live on the last rank only, the embedding on rank
# 0 only; with the kit's schedule two micro-batches are in flight at PP=2, across nodes too, and rank 0's token
# history lags by exactly the drafts the last rank accepted, which `pp_spec_token_history` fills in.
# %%
display(kit.lab.notebook.where_next("01"))
