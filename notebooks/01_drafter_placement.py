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
# the MTP drafter and which KV cache? Everything below is read from the **live engine**: the kit adds a method
# to every vLLM worker (`worker_extension_cls`) and calls it with `LLM.collective_rpc`.

# %% tags=["parameters"]
MODEL = "tiny-mimo"
RANDOM_WEIGHTS = False   # the trained checkpoint: its drafts are accepted, so the step trace shows accepted drafts
SPEC = "mtp:2"
PP_SIZES = [2, 4]
TRACE_PP = 2             # the engine of this PP size (one of PP_SIZES) also generates, with every step traced
TRACE_PROMPTS = 2
TRACE_TOKENS = 16
PATCHES_FOR_FAILURE = "all,-drafter_only_on_last_rank"   # the run that shows what breaks

# %%
import kit
import kit.compare
import kit.notebook
kit.notebook.setup()

# %% [markdown]
# One engine per PP size in `PP_SIZES`, each started, asked and stopped (on 2 cores about 35 s at PP=2 and
# 55 s at PP=4). The `TRACE_PP` engine then also generates a few tokens with every step traced inside each worker
# (`kit_trace_start` / `kit_trace_read`, see *One decode step across the ranks* below), which adds a few seconds.

# %%
import pandas as pd
from kit import engine, plots, steptrace
from kit.compare import load_prompts
from kit.notebook import claim
from kit.placement import summary_rows
from kit.topology import Topology
from IPython.display import Markdown

trace_prompts = load_prompts(limit=TRACE_PROMPTS)
layouts, trace, traced = {}, None, None
for pp in PP_SIZES:
    topo = Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=pp, spec=SPEC)
    jobs = [{"kind": "inspect"}]
    if pp == TRACE_PP:
        jobs += [{"kind": "rpc", "method": "kit_trace_start"},
                 {"kind": "generate", "prompts": trace_prompts, "max_tokens": TRACE_TOKENS},
                 {"kind": "rpc", "method": "kit_trace_read"}]
    res = engine.run(topo, jobs)
    layouts[pp] = sorted(res["jobs"][0], key=lambda r: (r["pp_rank"], r["tp_rank"]))
    if pp == TRACE_PP:
        traced = engine.GenerationResult.from_dict(res["jobs"][2])
        trace = steptrace.merge(res["jobs"][3])
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
# ## The failure without the kit's drafter guard
# Stock vLLM 0.32 creates the drafter only on the last rank, but other start-up paths touch `self.drafter` on
# every rank. Turning the kit's `drafter_only_on_last_rank` patch off shows the crash (caught here; about 40 s on
# 2 cores until the worker fails).

# %%
from kit.engine import EngineError
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
# The `TRACE_PP` engine above generated a few tokens with every step traced inside each worker (`kit.steptrace`:
# timestamps from `time.monotonic()`, one clock for all processes on the host). In one step: the engine core's
# scheduler sends the step's requests to every rank; rank 0 embeds the tokens (the request's newest token plus its
# k drafts from the previous step) and runs its layers; the hidden states go stage to stage; the last rank runs its
# layers, the LM head, and samples, which verifies the drafts (accepted: the longest prefix the target agrees with);
# then the MTP layer takes the last hidden state and the sampled token and proposes the next k drafts. The drafts go
# back to the engine core with the sampled tokens, and the scheduler puts them into the request's *next* step, on
# rank 0 again.
#
# **Predict, then run:** while request A's step is still on its way through the stages, can the scheduler put A
# into the next step too? (Stock vLLM 0.32 with sync PP: without drafts, A has nothing new to compute then.)
#
# <details><summary>Answer</summary>
#
# Not with the kit: its `pp_spec_schedule_gate` patch hides A's drafts while A is in flight, so A is skipped exactly
# as without speculation, and its next step starts on rank 0 only after its drafts came back from the last rank
# (the arrows in the picture). Stock vLLM 0.32 does schedule it again: the drafts from the step *before* are already
# stored on the request, so A looks like it has k tokens to compute, they land at the wrong positions, and the last
# stage reads another request's logits (notebook 00 breaks it). The cell under the picture checks that no request is
# in two steps at once and that each step with drafts starts after the drafts were proposed.
# </details>

# %%
last_rank = TRACE_PP - 1
by_step = steptrace.steps(trace)
# A window of decode steps (every request past its prefill) from the middle of the run.
decode = [s for s, v in sorted(by_step.items())
          if 0 in v["forward"] and all(n <= 1 + 8 for n, _ in v["forward"][0]["reqs"].values())]
window = decode[len(decode) // 3: len(decode) // 3 + 6]
plots.step_swimlane(trace, TRACE_PP, steps=window,
                    title=f"{Topology(model=MODEL, pp=TRACE_PP, spec=SPEC).label()}: decode steps {window[0]}-{window[-1]} "
                    "as each rank ran them (bar: s<step> <request>+<drafts it verifies>)").update_layout(meta="main").show()

# %% [markdown]
# **What it shows:** each row is one process; time runs left to right. A step's bar on rank 0 is followed by the
# same step on the next rank (its grey part: waiting for the previous stage's hidden states), then the last rank's
# sample (how many drafts were accepted) and the MTP layer's proposal; the arrow is the drafts' way back through
# the scheduler to that request's next step on rank 0. While one request is in flight, rank 0 runs the other one:
# the pipeline keeps both stages busy only because there are two requests to alternate.
#
# The `hist+N` marks are the second correctness patch at work. Rank 0 is sent only each request's newest sampled
# token, never the drafts the last rank accepted, so at the start of a step its copy of the request's token history
# is short by exactly the drafts accepted in the request's previous step. `pp_spec_token_history` fills them in
# (they are a prefix of the drafts rank 0 was sent); without it, a request that leaves the batch and comes back is
# rebuilt on rank 0 from a history with holes, and the first stage embeds the wrong tokens.

# %%
kinds_on = {kind: sorted({e["rank"] for e in trace if e["kind"] == kind}) for kind in ("forward", "sample", "propose")}
claim(kinds_on["propose"] == [last_rank] and kinds_on["sample"] == [last_rank] and kinds_on["forward"] == list(range(TRACE_PP)),
      f"every rank runs a forward per step; only the last rank ({last_rank}) samples and runs the MTP drafter "
      f"({sum(e['kind'] == 'propose' for e in trace)} proposals)", kinds_on)
# Per request, its steps in order, and the interval each was in flight: rank 0's start to the last rank's proposal.
flights = {}
for s, v in sorted(by_step.items()):
    if 0 not in v["forward"] or v["propose"] is None:
        continue
    for r, (n, k) in v["forward"][0]["reqs"].items():
        flights.setdefault(r, []).append((s, v["forward"][0]["t0"], v["propose"]["t1"], k))
late = [(r, a[0], b[0]) for r, fl in flights.items() for a, b in zip(fl, fl[1:]) if b[1] < a[2]]
n_pairs = sum(len(fl) - 1 for fl in flights.values())
claim(n_pairs > 0 and not late,
      f"no request is in two steps at once: in all {n_pairs} consecutive step pairs of {len(flights)} requests, the "
      "next step starts on rank 0 after the last rank proposed the drafts it verifies", late)
with_drafts = sum(1 for fl in flights.values() for s in fl[1:] if s[3] > 0)
claim(with_drafts > 0, f"{with_drafts} of those next steps verify drafts")

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
claim(pairs and not mismatch and total_gap > 0,
      f"rank 0's history is short by exactly the drafts the last rank accepted in the previous step ({total_gap} tokens "
      f"over {len(pairs)} steps): what pp_spec_token_history fills in", mismatch[:5])
