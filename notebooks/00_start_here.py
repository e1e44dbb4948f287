# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Start here: PP + MTP on real vLLM, token for token
#
# **The question:** can a model split over two pipeline stages (PP=2) with an MTP drafter produce *exactly*
# the tokens of the plain model (PP=1, no speculation)? Greedy decoding is deterministic, so it must — and on
# stock vLLM 0.32 it does not (it does not even start). The kit's patches make it so; this notebook checks it.
#
# **Words you will meet**
# - **PP (pipeline parallelism)**: the decoder layers are split into consecutive stages, one process (rank) each.
#   Rank 0 embeds the tokens; the last rank holds the LM head and samples.
# - **MTP / Eagle3 drafter**: a small extra head that guesses the next *k* tokens; the target model checks all
#   of them in one forward pass and keeps the longest correct prefix (plus one token of its own). Correct
#   speculation never changes greedy output, it only saves target forwards.
# - **PD disaggregation**: one server does the prefill (producer) and hands the KV cache to another that decodes (consumer).
#
# Every other word the notebooks use (verify round, stage and rank, in flight, micro-batch, a\*, ...) is in the
# [Glossary](#Glossary) at the end of this notebook; each notebook links to it.
#
# **Where to go next**
# | notebook | question |
# |---|---|
# | `00_start_here` (this one) | does PP=2 + MTP give the reference's tokens, and what breaks without the patches? |
# | `01_drafter_placement` | where do layers, drafter, embedding, LM head and KV cache live at PP=2 and PP=4? |
# | `02_layer_types_fix` | what does the per-rank layer count break in an Eagle3 draft layer's name? |
# | `03_draft_acceptance` | how many drafts are accepted per position, at PP=1 and PP=2? |
# | `04_pd_kv_handoff` | what moves from producer to consumer, and are the tokens still right? |
# | `05_does_it_pay` | when does speculation pay, at PP=1 and PP=2 (the break-even acceptance rate a\*)? |
# | `06_debugging` | a wrong token: tie or bug, which part of the topology, which step, which patch? |
#
# This notebook runs in about 90 s on 2 cores (three engines); each engine cell says how long it takes.

# %% tags=["parameters"]
# Parameters (papermill / CI can override these)
MODEL = "tiny-mimo"      # a model under data/models/
RANDOM_WEIGHTS = False   # True: seeded random checkpoint (normal init), False: the trained checkpoint
PP = 2
SPEC = "mtp:2"           # METHOD:K
NUM_PROMPTS = 4
MAX_TOKENS = 32
BREAK_PATCHES = "all,-pp_spec_schedule_gate,-pp_microbatches,-decode_side_pp_spec_rule"   # "break it": the gate off
SHOW_DOCTOR = True       # run `kit doctor` below (the report lists the versions anyway)

# %%
import kit
import kit.checks.compare
import kit.lab.notebook
kit.lab.notebook.setup()

# %% [markdown]
# ## The machine and the kit
# `kit doctor` checks the versions and which patches apply in this vLLM. One line shows here; the full report is
# folded under it (click to open), and opens by itself when a patch failed.

# %%
# about 11 s on 2 cores: kit doctor imports vLLM and torch (no engine)
if SHOW_DOCTOR:
    kit.lab.notebook.show_doctor()

# %% [markdown]
# ## A first run
# The kit starts the reference (PP=1, no speculation) and the topology below as real vLLM engines (each in
# its own process group, torn down afterwards), on the same prompts, greedy, float32. A status line under the cell
# shows the phase; the cell prints how long it took on this machine, and how much of that was vLLM starting.

# %%
# about 45 s on 2 cores: two engines, the reference and the topology
import time
from kit.core.topology import Topology
from kit.checks.compare import compare, load_prompts

topo = Topology(model=MODEL, random_weights=RANDOM_WEIGHTS, pp=PP, spec=SPEC)
prompts = load_prompts(limit=NUM_PROMPTS)
t_start = time.monotonic()
cmp = compare(topo, prompts, max_tokens=MAX_TOKENS)
cell_s = time.monotonic() - t_start
d = cmp.to_dict()
print("topology  :", topo.label())
print("identical :", d["identical"], " first divergence:", d["first_divergence"])
print("acceptance:", d["acceptance"])
sec = d["seconds"]
fmt = lambda x: "?" if x is None else f"{x:.1f} s"
print(f"time      : {cell_s:.0f} s for the cell; vLLM start {fmt(sec['reference_start'])} (reference), "
      f"{fmt(sec['run_start'])} ({topo.label()}); generation {fmt(sec['reference'])}, {fmt(sec['run'])}")

# %%
from kit.lab import plots
plots.token_match(cmp.reference.token_ids, cmp.result.token_ids,
                  title=f"{topo.label()} vs PP=1 no-spec: green = same token").show()

# %% [markdown]
# **What it shows:** every cell is one generated token; green means the PP + MTP engine produced the same token
# as the reference. An all-green picture is the claim of this kit: speculation under PP changes *how* tokens are
# produced (fewer target forwards when drafts are accepted), never *which* tokens.

# %%
from kit.lab.notebook import claim
claim(d["identical"], f"{topo.label()} gives the reference's tokens, all {sum(map(len, cmp.reference.token_ids))} of them",
      d["first_divergence"])
claim(d["acceptance"]["num_drafts"] > 0, f"the drafter ran: {d['acceptance']['num_accepted_tokens']} draft tokens accepted")

# %% [markdown]
# **Predict, then run:** the engine above generated every token shown. Did it need as many target forward passes
# (verify rounds) as it generated tokens, fewer, or more?
#
# <details><summary>Answer</summary>
#
# Fewer. Each verify round yields its own token plus every accepted draft, so a round gives
# 1 + (accepted drafts) tokens; with drafts accepted the rounds are fewer than the tokens. The cell below prints
# this run's numbers and checks them.
# </details>

# %%
from IPython.display import Markdown
acc = cmp.result.spec
generated = cmp.result.num_generated
display(Markdown(f"**This run:** {generated} tokens for {len(prompts)} prompts in {acc.num_drafts} verify rounds "
                 f"(plus one prefill per prompt); {acc.num_accepted_tokens} of {acc.num_draft_tokens} draft tokens "
                 f"accepted, {acc.mean_acceptance_length:.2f} tokens per verify round."))
claim(acc.num_accepted_tokens > 0 and acc.num_drafts < generated,
      f"{acc.num_drafts} verify rounds for {generated} tokens: fewer target forwards than tokens")

# %% [markdown]
# ## Break it, then fix it
# Under PP a request's step is still travelling through the stages when the scheduler plans the next batch. Without
# drafts such a request has nothing new to compute and is skipped; *with* drafts stock vLLM 0.32 schedules it
# again, with the drafts at the wrong positions, and the last stage then reads another request's row of logits.
# The kit's `pp_spec_schedule_gate` patch hides those drafts until the step is back. Predict what the same prompts
# give with that patch off, in vLLM's own step loop (`BREAK_PATCHES`: the kit's `pp_microbatches` is off too, since
# with it the drafts come back only after the step's tokens and there is nothing left for the gate to hide; the
# decode-side rule is off as well, or the kit would refuse the engine before it starts), then run it: one more
# engine.
#
# <details><summary>Answer</summary>
#
# Different tokens, and a wrong token can be one of *another* prompt's: the requests leak into each other. The
# picture puts this run (left) beside the run above with every patch on (right); under it the same prompts as text,
# token by token, the reference's token above this run's: a wrong token that another prompt's reference has nearby
# is coloured by that prompt, any other wrong token is red.
# </details>

# %%
# about 20 s on 2 cores: one engine, the gate off
from kit import engine
from kit.checks.compare import first_divergence
broken = engine.generate(topo, prompts, max_tokens=MAX_TOKENS, env={"KIT_PATCHES": BREAK_PATCHES})
ref_ids = cmp.reference.token_ids
plots.token_match_side_by_side(ref_ids, {"pp_spec_schedule_gate off": broken.token_ids,
                                         "all patches on (the run above)": cmp.result.token_ids},
                               title=f"{topo.label()}: the same prompts with the gate off and on (red = not the reference's token)"
                               ).update_layout(meta="main").show()   # meta="main": the report's thumbnail
wrong = [(i, j, g) for i, (r, b) in enumerate(zip(ref_ids, broken.token_ids)) for j, (x, g) in enumerate(zip(r, b)) if x != g]
# A wrong token that another prompt's reference has within two positions: a token that came from that request.
from kit.lab import tokens_view
sources = tokens_view.leak_sources(ref_ids, broken.token_ids, window=2)   # {(prompt, position): that other prompt}
tok = tokens_view.load_tokenizer(MODEL)
tokens_view.show(tokens_view.divergence_html(ref_ids, broken.token_ids, tok, sources=sources, prompts=prompts,
                                             labels=("reference", "gate off")))
fd = first_divergence(cmp.reference, broken)
say = lambda t: tokens_view.describe_token(tok, t)  # noqa: E731
print(f"gate off: {len(wrong)} of {sum(map(len, ref_ids))} tokens differ; first divergence: "
      + (f"prompt {fd['prompt_index']}, position {fd['position']}: expected {say(fd['expected'])}, got {say(fd['got'])}"
         if fd else "none"))
print(f"{len(sources)} wrong tokens another prompt's reference has nearby" + (":" if sources else "."))
for (i, j), i2 in list(sources.items())[:8]:
    print(f"  prompt {i}, position {j}: {say(broken.token_ids[i][j])}, from prompt {i2}")

# %%
claim(first_divergence(cmp.reference, broken) is not None and d["identical"],
      f"without pp_spec_schedule_gate {len(wrong)} of {sum(map(len, ref_ids))} tokens differ from the reference; "
      "with every patch on, none")

# %% [markdown]
# **Takeaway:** with the kit's patches, PP=2 with MTP drafts gives exactly the PP=1 no-spec reference's tokens; with
# the scheduling gate off, a request is scheduled again while its step is in flight and the tokens stop matching.

# %% [markdown]
# ## Glossary
# The words of these notebooks, as the kit uses them (vLLM 0.32, V1 engine).
#
# **Speculative decoding**
# - **greedy reference**: the tokens of the plain engine: PP=1, no speculation, greedy (always the most likely
#   token), float32 (bfloat16 where a model's kernels require it). Greedy decoding is deterministic, so every other
#   topology of the same model must give exactly these tokens; `kit compare` and the notebooks check that.
# - **reference margin**: at the first token where a run differs from the greedy reference, the reference's top-1
#   minus top-2 logprob there (`first_divergence.reference_margin`). Near zero hints at a numerical tie, a large
#   margin means a bug; a small one is no proof of a tie.
# - **draft, drafter**: a draft is a token guessed ahead for a request; the drafter is what guesses it (an MTP
#   layer, an Eagle3 model, n-gram lookup). `METHOD:K` (e.g. `mtp:2`) picks the method and k, the drafts per
#   request per step. Under PP the drafter runs on the last rank only.
# - **MTP**: multi-token prediction: extra layer(s) shipped with the model (MiMo, DeepSeek-V3, Qwen3.5, GLM-4 MoE)
#   that take the target's last hidden state and the next token and predict the token after it. vLLM runs the MTP
#   layer k times to draft k tokens; its KV cache is one more layer (`model.layers.<L>` for a target of L layers).
# - **Eagle3**: a separately trained small draft model (one decoder layer here) that drafts from the target's
#   hidden states after several of its layers (`eagle_aux_hidden_state_layer_ids`); under PP those states come from
#   several ranks (notebook 02).
# - **n-gram**: drafting without a model (prompt lookup): the request's last few tokens are looked up earlier in its
#   own prompt and output, and the tokens that followed there are proposed.
# - **verify round**: one target forward that checks a request's drafts: it runs the request's newest token and its
#   k drafts through the model in one pass and keeps the longest prefix of drafts it accepts (greedy: those equal to
#   its own choice), plus one token of its own, so a round yields 1 to k + 1 tokens. vLLM counts the rounds as
#   `num_drafts`.
# - **acceptance rate**: the share of drafts the target keeps. Per draft position, the rounds whose draft there was
#   accepted divided by the verify rounds (notebook 03 plots it). The single rate *a* of notebooks 03 and 05 is the
#   chance that a position is accepted when the ones before it were, the one that gives the measured tokens per
#   verify round (mean acceptance length): 1 + a + ... + a^k.
#
# **Pipeline parallelism**
# - **PP**: the decoder layers are split into PP consecutive stages, one worker process each; a step's hidden
#   states go from stage to stage. Rank 0 embeds the tokens; the last rank holds the LM head, samples, and drafts.
# - **stage, rank**: a stage is one consecutive range of decoder layers, a rank the worker process that runs it
#   (`Worker_PP0`, `Worker_PP1`, ...). Without tensor parallelism (as here) rank r runs stage r: "stage" speaks of
#   the layers and the order a step crosses them, "rank" of the process and its memory. Several nodes each hold
#   whole stages.
# - **engine core**: vLLM's scheduling loop (`EngineCore`): each step it picks the requests and tokens to compute,
#   hands the step to the workers and applies their sampled tokens and drafts to the requests. A server runs it in a
#   process of its own; the kit's single-node engine runs keep it in the process that calls `LLM`.
# - **in flight**: a step is in flight from when the engine core submits it to the first stage until its sampled
#   tokens are back in the scheduler, and its requests with it. A request in flight has nothing to compute until its
#   token is back, so the stages work at once only on different requests (with drafts stock vLLM 0.32 schedules it
#   again anyway; the kit's `pp_spec_schedule_gate` stops that, as "Break it" above shows).
# - **micro-batch**: the requests of one PP step. With the kit's `pp_microbatches` patch (on by default) the running
#   requests are split into up to PP groups that take turns: while the last stage computes one group, stage 0
#   already computes the next, two micro-batches in flight at PP=2.
# - **empty step**: a step the engine core's batch queue plans while every runnable request is already in flight:
#   it carries no request. Stock vLLM 0.32 runs many under PP; notebook 01's step trace and
#   `kit bench --timeline` count them.
# - **KV cache, KV block**: each attention layer keeps the keys and values of every token a request has computed,
#   so a decode step computes only the new tokens. vLLM stores them in blocks of `block_size` tokens of one layer
#   and gives a request whole blocks. Under PP each rank holds the KV of its own layers only (the last rank also the
#   MTP layer's).
# - **mamba cache**: vLLM's per-request state for linear-attention layers (Gated-DeltaNet in Qwen3.5): a fixed-size
#   state in a state slot instead of KV blocks that grow with the text. With drafts the kit turns prefix caching off
#   and it runs in mode `none`, 1 + k slots per request and layer (one per draft position); the plain reference
#   keeps vLLM's default, prefix caching on and mode `align`.
#
# **Prefill/decode disaggregation**
# - **PD**: a producer server computes a prompt's KV cache and first token, and a consumer server receives that KV
#   and decodes the rest. Here both are `vllm` OpenAI servers on one host, the KV goes over NIXL, and a router sends
#   each request to both, with the same request id.
# - **colocated**: prefill and decode in one engine, as without PD: what a PD consumer's tokens and accepted drafts
#   are compared with (notebook 04, `kit pd --colocated-acceptance`).
# - **NIXL push / pull**: vLLM's two NIXL connectors. Pull (`NixlConnector`): the consumer reads the producer's KV
#   blocks; both sides need the same PP size and KV layer count. Push (`NixlPushConnector`): each producer rank
#   writes its own layers into the consumer's blocks; the kit picks it when PP sizes or layer counts differ, and
#   for a PP>1 consumer.
# - **handshake**: when a NIXL pair first connects, the two sides exchange their registered KV regions and block
#   layout, and vLLM compares a compatibility hash of both configurations (it covers the MTP/Eagle drafter method,
#   not k). A mismatch refuses the pair (`NIXL compatibility hash mismatch`).
#
# **Does it pay (notebook 05)**
# - **a\***: the break-even acceptance rate: the per-position rate *a* at which k drafts give exactly the plain
#   engine's speed, E(a\*, k) = T(k) / T(0) (tokens per verify round against how much dearer a speculative step is
#   than a plain one). Below a\* speculation is slower than none. It belongs to one model, PP size, batch and k, from
#   that engine's measured step costs; "none" when even a = 1 loses.
# - **occupancy**: how full a speculative row's decode steps were against the plain row's: plain steps /
#   (speculative steps x mean acceptance length). 1 when each step carried as many requests as the plain engine's;
#   below 1 when a batch was split (requests in flight, requests finishing at different steps). The prediction at
#   occupancy is the full-step prediction times it.
# %%
display(kit.lab.notebook.where_next("00"))
