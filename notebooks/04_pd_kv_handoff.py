# ---
# jupyter:
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # PD disaggregation: what moves from the prefill server to the decode server?
#
# **The question:** a *producer* server (with an MTP drafter) computes a prompt's KV cache and hands it
# to a *consumer* server (also with MTP) that decodes. What exactly travels — which layers, how many
# blocks and bytes — and are the consumer's tokens still exactly those of one plain engine (PP=1, no speculation)?
#
# Everything below is real: two `vllm` OpenAI servers on loopback, vLLM's NIXL connector with its CPU buffer,
# and the kit's router doing the two-step request flow (prefill with `do_remote_decode`, then decode with the
# `kv_transfer_params` the producer returned, same request id on both calls).
#
# Words used here (PD, NIXL push / pull, handshake, colocated, ...) are defined in the
# [Glossary](00_start_here.ipynb#Glossary) of notebook 00.
#
# About 2.5 minutes on 2 cores (PD pairs of two servers, and plain engines beside them); each engine cell says how long it takes.

# %% tags=["parameters"]
MODEL = "tiny-mimo"
RANDOM_WEIGHTS = False
PRODUCER_PP = 2          # vLLM PR #46003's scenario: PP=2 + MTP prefill server (push connector); 1 = pull
PRODUCER_SPEC = "mtp:2"
CONSUMER_PP = 1
CONSUMER_SPEC = "mtp:2"
NUM_PROMPTS = 4
MAX_TOKENS = 24
PATCHES_WITHOUT_FIX = "all,-pp_spec_schedule_gate"   # for the decode-side rule demo (no engine starts)

# %%
import kit
import kit.checks.compare
import kit.lab.notebook
kit.lab.notebook.setup()

# %%
from kit import pd
from kit.lab import pd_plots
from kit.checks.compare import load_prompts

producer, consumer = pd.pd_topologies(MODEL, PRODUCER_PP, PRODUCER_SPEC, CONSUMER_PP, CONSUMER_SPEC,
                                      random_weights=RANDOM_WEIGHTS)
connector, reason = pd.choose_connector(producer, consumer)
print("producer :", producer.label())
print("consumer :", consumer.label())
print("connector:", connector, "-", reason)
moved = pd.kv_layers_moved(producer, consumer)
print("KV layers that move:", moved)
# Which producer rank sends which of them: each stage holds its own layers (vLLM's get_pp_indices, what its workers
# use), and the MTP layer (named after all target layers) sits with the drafter on the last stage.
from vllm.distributed.utils import get_pp_indices
n_target = producer.info.num_layers
mtp_name = f"model.layers.{n_target}"
owners = pd_plots.layer_owners(moved, n_target, producer.pp, get_pp_indices)
for rank in range(producer.pp):
    print(f"  producer rank {rank} sends:", [n for n in moved if owners[n] == rank])

# %% [markdown]
# **Which layers move:** the target's decoder layers `model.layers.0..L-1` from *every* producer PP rank (each
# rank sends its own, listed above for this run's `PRODUCER_PP`), plus the MTP layer's KV (`model.layers.L`, which vLLM names after all target layers) when
# both sides run the drafter: the consumer's drafter needs the prompt's KV for its own attention, or its first
# drafts would attend to nothing.
#
# The next cell starts a reference engine, the consumer's topology as one engine, and then the producer and
# consumer servers, one status line per engine or server.

# %%
# about 90 s on 2 cores: the reference engine, one PD pair and the colocated engine
from kit import engine
prompts = load_prompts(limit=NUM_PROMPTS)
# The reference: one plain engine, PP=1, no speculation (kept for the second pair further down).
reference = engine.generate(consumer.reference(), prompts, max_tokens=MAX_TOKENS, top2=True)
# colocated=True: the consumer's topology also runs as one plain engine, for the acceptance comparison below.
# router="kit": the kit's router makes the two calls and times each (the timeline below); vLLM's vllm-router
# (the default for pull pairs) makes them inside one request.
d = pd.pd_compare(producer, consumer, prompts, max_tokens=MAX_TOKENS, colocated=True, reference=reference,
                  router="kit")
print("identical to the colocated PP=1 reference:", d["identical"], d["first_divergence"] or "")
print("handoff checks:", d["handoff_checks"])
print("KV bytes: measured", d["kv_bytes_transferred"], " expected", d["kv_bytes_expected"], " =", d["kv_expected"]["formula"])
print("consumer prefill tokens computed itself:", d["consumer_prefill_tokens_computed"],
      " received:", d["consumer_external_tokens"], "of", d["prompt_tokens"])
print("consumer spec-decode counters:", d["consumer_spec"])

# %%
import pandas as pd_
rows = []
for r, exp in zip([x for x in d["requests"] if not x["error"]], d["kv_expected"]["per_request"]):
    rows.append({"prompt": r["index"], "prompt tokens": r["prompt_tokens"], "blocks": -(-r["prompt_tokens"] // d["kv_expected"]["block_size"]),
                 "producer block ids": pd_plots.producer_blocks(r["kv_transfer_params"]),
                 "KV bytes measured": r["kv_bytes_transferred"], "KV bytes expected": exp,
                 "consumer computed": r["consumer_prefill_tokens_computed"],
                 "producer prefill s": r["producer_prefill_s"], "consumer s": r["consumer_s"]})
table = pd_.DataFrame(rows).set_index("prompt")
display(table)

# %% [markdown]
# ### Which producer rank wrote which of the consumer's blocks
# The consumer's KV cache as the connector filled it, one cell per layer and block: a row per KV layer of the
# consumer (on this CPU build each layer's cache is one NIXL memory region; the MTP layer's region is the last row),
# a column per prompt block of each request, in order (the whole blocks the connector moves), and each cell in the
# colour of the producer PP rank that wrote it. Which rank holds which layer is vLLM's own split (`get_pp_indices`,
# printed above); each cell's source block on the producer comes from the `kv_transfer_params` the producer returned
# (`remote_block_ids`: under each column, and in the table above). One producer block id can come back for several
# requests: they run one after another, and the producer frees a request's blocks once the consumer has them, so the
# next request is given the same block. The consumer's own block ids are not drawn: neither server reports them (they
# travel only inside the connector's registration message), so a column is named by its request and the block's place
# in the prompt.

# %%
from IPython.display import Markdown
consumer_layers = pd.kv_layer_names(consumer)
sent = pd_plots.block_layout(d, consumer_layers, owners, mtp_name)
n_blocks = len(sent["columns"])
pd_plots.kv_block_layout(
    {f"{producer.label()} -> {consumer.label()}": sent},
    title=f"The consumer's KV blocks, by the producer rank that wrote them ({n_blocks} blocks of "
          f"{sent['block_size']} tokens, {d['connector_class']})").show()
display(Markdown(
    f"**This run:** {len(consumer_layers)} consumer KV layers x {n_blocks} prompt blocks of {sent['block_size']} tokens "
    f"({sent['bytes_per_cell']:,} B per layer per block). Producer " + "; producer ".join(
        f"rank {k} wrote {', '.join(pd_plots.short(n, mtp_name) for n in v)}: {len(v)} layers x {n_blocks} "
        f"blocks = {sent['rank_bytes'][k]:,} B" for k, v in sent["rank_layers"].items())
    + f". Together {sent['total_bytes']:,} B; the connector reported {d['kv_bytes_transferred']:,} B in "
      f"{d['kv_transfers']} transfers for {len(d['kv_expected']['blocks'])} requests."))

# %%
from kit.lab.notebook import claim
def holders(name, prod):
    """The producer ranks whose share of the model holds this KV layer: vLLM's split of the target layers, and the
    MTP layer with the drafter on the last rank (a producer without the drafter has none)."""
    i = pd_plots.layer_index(name)
    return [r for r in range(prod.pp) if get_pp_indices(n_target, r, prod.pp)[0] <= i < get_pp_indices(n_target, r, prod.pp)[1]
            or (i >= n_target and prod.spec is not None and r == prod.pp - 1)]
claim(all(holders(n, producer) == [sent["writer"][n]] for n in consumer_layers),
      f"each of the consumer's {len(consumer_layers)} KV layers in the picture was written by exactly the one producer "
      f"rank that holds it: " + "; ".join(f"rank {k}: {', '.join(pd_plots.short(n, mtp_name) for n in v)}"
                                          for k, v in sent["rank_layers"].items()),
      {n: (holders(n, producer), sent["writer"][n]) for n in consumer_layers})
claim(n_blocks == sum(-(-r["prompt_tokens"] // sent["block_size"]) for r in d["requests"] if not r["error"])
      and sent["total_bytes"] == d["kv_bytes_transferred"],
      f"the picture's {len(consumer_layers)} x {n_blocks} cells of {sent['bytes_per_cell']:,} B are the "
      f"{d['kv_bytes_transferred']:,} B the connector moved", (sent["total_bytes"], d["kv_bytes_transferred"]))
claim(d["kv_transfers"] == len(sent["rank_layers"]) * len(d["kv_expected"]["blocks"]),
      f"the connector counted {d['kv_transfers']} transfers for {len(d['kv_expected']['blocks'])} requests: one per "
      f"request from each of the {len(sent['rank_layers'])} producer ranks", d["kv_transfers"])

# %%
pd_plots.request_timeline(d["timings"]["per_request"],
                          title=f"{producer.label()} -> {consumer.label()}: each request's timeline "
                                "(s, measured by the router)").show()

# %% [markdown]
# **What it shows:** the picture has no gap and no overlap: every consumer KV layer was written by one producer rank,
# the one that holds the layer, in every prompt block of every request, and the cells add up to the bytes the
# connector reported (the table above has them per request: measured = what the model's shape predicts, moved layers
# x whole blocks x block size x KV heads x head size x 2 for K and V x 4 bytes in float32). With push (a PP>1
# producer) each rank writes its own layers in a transfer of its own, so the connector counts one transfer per rank
# per request. The timeline: the producer computes the prompt and its first token; the consumer then receives the
# blocks (pushed, or pulled with the pull connector) and decodes the rest (it computed none of the prompt itself),
# split at its first token where that time was measured.

# %%
claim(d["identical"], f"the consumer's {sum(len(t) for t in reference.token_ids)} tokens are the plain engine's",
      d["first_divergence"])
claim(d["consumer_prefill_tokens_computed"] == 0,
      f"the consumer computed none of the {d['prompt_tokens']} prompt tokens itself (received {d['consumer_external_tokens']})")
claim(d["kv_bytes_transferred"] == d["kv_bytes_expected"]
      and all(r["kv_bytes_transferred"] == e for r, e in zip(d["requests"], d["kv_expected"]["per_request"])),
      f"every request's KV bytes measured = expected from the shape ({d['kv_bytes_transferred']:,} B in all)",
      (d["kv_bytes_transferred"], d["kv_bytes_expected"]))
if producer.spec and consumer.spec:
    claim(f"model.layers.{producer.info.num_layers}" in d["kv_expected"]["layers"],
          f"the MTP layer's KV (model.layers.{producer.info.num_layers}) is among the layers that move")

# %% [markdown]
# **Predict, then run:** how many prompt tokens did the consumer compute itself, and why?
#
# <details><summary>Answer</summary>
#
# None: every prompt token's KV arrived from the producer, so the consumer's scheduler counts them as computed
# ("external") tokens and starts decoding at once. The claim above checks it; had the handoff failed, vLLM would
# recompute the prompt on the consumer and the count would be the prompt length.
# </details>

# %% [markdown]
# ## Does the consumer's drafter accept as much as on one engine?
# The consumer's MTP drafter attends to the prompt through the MTP layer's KV that the producer sent. If that KV
# were missing or wrong, its drafts would be worse and fewer would be accepted. So: run the consumer's topology
# once more as one plain engine (no PD) on the same prompts, and put the two sets of spec-decode counters side by side.

# %%
a = d["acceptance_vs_colocated"]
print("consumer :", a["consumer"])
print("colocated:", a["colocated"])
print("accepted drafts equal (total and per position):", a["accepted_equal"],
      "| extra verify rounds on the consumer:", a["extra_draft_rounds"], "for", a["requests"], "requests")
pd_plots.draft_counts({"PD consumer": a["consumer"], "colocated engine": a["colocated"]},
                      [dict(color=pd_plots.CONSUMER), dict(color=pd_plots.ENGINE)],
                      title="accepted drafts per position, and verify rounds: PD consumer vs one engine").show()

# %% [markdown]
# **What it shows:** the accepted drafts are the same at every draft position — the drafter on the consumer
# proposes exactly what it proposes on one engine, which it could not do without the MTP layer's KV from the
# producer. The one difference is by design of the handoff: the consumer runs up to one extra verify round per
# request, and nothing in that round is accepted, so its mean acceptance length is at most the colocated engine's,
# lower by those extra rounds (this run's numbers are printed below). A consumer request starts without drafts of
# its own — the producer drafted for its own prefill step, and those drafts do not travel — so its first round
# verifies drafts that are rejected; every later round matches the colocated engine's one for one.

# %%
claim(a["accepted_equal"], f"the consumer accepted the same drafts per position as one engine: {a['consumer']['per_position']}",
      f"{a['consumer']['per_position']} vs {a['colocated']['per_position']}")
claim(a["colocated_tokens_identical_to_reference"], "the colocated engine's tokens are the reference's")
claim(0 <= a["extra_draft_rounds"] <= a["requests"],
      f"{a['extra_draft_rounds']} extra verify rounds on the consumer for {a['requests']} requests: at most one each", a)
display(Markdown(
    f"**This run** ({NUM_PROMPTS} prompts x {MAX_TOKENS} tokens, {producer.label()} -> {consumer.label()}): "
    f"the consumer ran {a['extra_draft_rounds']} more verify rounds than the colocated engine for "
    f"{a['requests']} requests; mean acceptance length {a['consumer']['mean_acceptance_length']:.2f} on the "
    f"consumer against {a['colocated']['mean_acceptance_length']:.2f} on one engine."))

# %% [markdown]
# ## And if the MTP layer's KV did not arrive?
# The claim above is that the consumer's drafter *needs* the MTP layer's KV from the producer. Test it: run a
# producer **without** the drafter (PP=2, no MTP: it never computes the MTP layer's KV, so the connector has
# nothing to send for it) into the same MTP consumer. vLLM refuses such a pair by default — the NIXL
# handshake's compatibility hash covers the MTP configuration (`NIXL compatibility hash mismatch`) — so this
# run turns that check off (`enforce_handshake_compat=false`, a documented connector option). The consumer's
# MTP layer then attends over prompt KV blocks that were never written. One more server pair starts.
#
# **Predict, then run:** in the run above, which producer rank sent the MTP layer's KV? And in this run, how many
# bytes will the connector move for the MTP layer?
#
# <details><summary>Answer</summary>
#
# The last rank: the MTP layer lives with the drafter there, so its KV is written there and leaves from there.
# In this run none: the producer has no MTP layer, so nothing is written or sent for it; the consumer's MTP layer
# reads blocks nobody filled. The block picture after the run shows both runs side by side, and the cell under it
# checks both answers.
# </details>

# %%
# about 60 s on 2 cores: a second PD pair
# Push from a PP=2 producer is the only 0.32 NIXL path that leaves one consumer layer out (each producer stage
# writes its own layers; nobody writes the MTP layer's region). The consumer here runs at PP=1.
no_mtp_producer = producer.with_(pp=2, spec=None)
mtp_consumer = consumer.with_(pp=1)
print("KV layers that move now:", pd.kv_layers_moved(no_mtp_producer, mtp_consumer))
w = pd.pd_compare(no_mtp_producer, mtp_consumer, prompts, max_tokens=MAX_TOKENS, reference=reference,
                  kv_extra_config={"enforce_handshake_compat": False})
print("identical:", w["identical"], "| handoff:", w["handoff_ok"], "| KV bytes", w["kv_bytes_transferred"],
      "expected", w["kv_bytes_expected"])
with_kv, without_kv = d["consumer_spec"], w["consumer_spec"]
print("consumer accepted with the MTP layer's KV   :", with_kv["num_accepted_tokens"], with_kv["per_position"],
      "in", with_kv["num_drafts"], "rounds")
print("consumer accepted without the MTP layer's KV:", without_kv["num_accepted_tokens"], without_kv["per_position"],
      "in", without_kv["num_drafts"], "rounds")
# The withheld run hatched, as the consumer's unwritten MTP region is in the block picture below.
pd_plots.draft_counts({"MTP layer's KV sent": with_kv, "MTP layer's KV withheld": without_kv},
                      [dict(color=pd_plots.CONSUMER), pd_plots.hatched(pd_plots.CONSUMER)],
                      title="PD consumer's drafter with and without the MTP layer's prompt KV").show()

# %% [markdown]
# **What it shows:** the tokens stay identical — the target model's KV all arrived, and speculative decoding
# only changes *how fast* tokens come, never which ones. But the drafter, reading an unwritten prompt KV in its
# own attention layer, gets fewer drafts accepted and the consumer needs at least as many verify rounds for the
# same tokens (this run's counts are printed below the assertions). That is why the kit counts the MTP layer among
# the layers that must move, and why vLLM's handshake refuses a producer whose MTP configuration differs.

# %% [markdown]
# ## The KV that moved, block by block
# Both runs in the block picture of the first section, side by side: the same consumer KV layers (rows) and prompt blocks
# (columns), each cell in the colour of the producer rank that wrote it. In the withheld run the producer has no MTP
# layer, so no rank holds it and nothing is written into the consumer's MTP region: that row is hatched white ("not
# written" in the legend). The cell below checks each panel against the model's shape and the connector's bytes.

# %%
withheld = pd_plots.block_layout(
    w, pd.kv_layer_names(mtp_consumer),
    pd_plots.layer_owners(w["kv_expected"]["layers"], n_target, no_mtp_producer.pp, get_pp_indices), mtp_name)
pd_plots.kv_block_layout(
    {f"MTP layer's KV sent<br>({producer.label()})": sent, f"withheld<br>({no_mtp_producer.label()})": withheld},
    title=f"The consumer's KV blocks, by the producer rank that wrote them ({NUM_PROMPTS} prompts)",
).update_layout(meta="main").show()
display(Markdown(
    f"**This run:** with the MTP layer's KV sent, {len(sent['layers']) - len(sent['unwritten'])} of "
    f"{len(sent['layers'])} consumer KV layers were written ({sent['total_bytes']:,} B); withheld, "
    f"{len(withheld['layers']) - len(withheld['unwritten'])} of {len(withheld['layers'])} "
    f"({withheld['total_bytes']:,} B), the unwritten one " + ", ".join(pd_plots.short(n, mtp_name) for n in withheld["unwritten"])
    + ". Withheld, " + "; ".join(f"producer rank {k} wrote {', '.join(pd_plots.short(n, mtp_name) for n in v)} "
                                 f"({withheld['rank_bytes'][k]:,} B)" for k, v in withheld["rank_layers"].items()) + "."))

# %%
claim(all(holders(n, no_mtp_producer) == ([withheld["writer"][n]] if withheld["writer"][n] is not None else [])
          for n in withheld["layers"]),
      f"in the withheld run too each consumer KV layer was written by the one producer rank that holds it, and a layer no "
      f"rank holds by nobody: {', '.join(pd_plots.short(n, mtp_name) for n in withheld['unwritten'])} unwritten",
      {n: (holders(n, no_mtp_producer), withheld["writer"][n]) for n in withheld["layers"]})
claim(sent["total_bytes"] == d["kv_bytes_transferred"] and withheld["total_bytes"] == w["kv_bytes_transferred"],
      f"each panel's cells add up to the connector's bytes: {d['kv_bytes_transferred']:,} and {w['kv_bytes_transferred']:,}",
      ((sent["total_bytes"], d["kv_bytes_transferred"]), (withheld["total_bytes"], w["kv_bytes_transferred"])))
if producer.spec and consumer.spec:
    claim(sent["writer"].get(mtp_name) == producer.pp - 1,
          f"the MTP layer's KV ({n_blocks} blocks x {sent['bytes_per_cell']:,} B) was written by the last producer rank, "
          f"{producer.pp - 1}")
claim(withheld["unwritten"] == [mtp_name], f"in the withheld run nothing was written for the MTP layer only ({mtp_name})",
      withheld["unwritten"])
claim(w["identical"], "withholding the MTP layer's KV leaves the tokens unchanged", w["first_divergence"])
claim(w["handoff_ok"], "the withheld run's handoff checks pass", w["handoff_checks"])
claim(mtp_name not in w["kv_expected"]["layers"], "the MTP layer is not among the withheld run's moved layers")
claim(without_kv["num_accepted_tokens"] < with_kv["num_accepted_tokens"] and without_kv["num_drafts"] >= with_kv["num_drafts"],
      f"without the MTP layer's KV the consumer accepted fewer drafts ({without_kv['num_accepted_tokens']} vs "
      f"{with_kv['num_accepted_tokens']}) in no fewer rounds ({without_kv['num_drafts']} vs {with_kv['num_drafts']})",
      (without_kv, with_kv))
display(Markdown(
    f"**This run** ({NUM_PROMPTS} prompts x {MAX_TOKENS} tokens): accepted {without_kv['num_accepted_tokens']} "
    f"{list(without_kv['per_position'])} in {without_kv['num_drafts']} rounds without the MTP layer's KV, against "
    f"{with_kv['num_accepted_tokens']} {list(with_kv['per_position'])} in {with_kv['num_drafts']} rounds with it."))

# %% [markdown]
# ## What does not run on vLLM 0.32 (CPU), observed
# - **Producer PP=2 + MTP** (the scenario of vLLM PR #46003, run above) needs the push connector (the only 0.32 NIXL mode
#   that pairs different PP sizes) and three kit patches. Stock, the producer's last PP worker fails while
#   registering its KV regions (`assert num_local_layers > 0 and self.num_regions % num_local_layers == 0`: 2
#   target layers *plus* the MTP layer's KV on that rank; `nixl_pp_draft_regions`). And on a CPU host the pair
#   stalls for minutes at random: NIXL's CPU init pins each worker's forward thread to the machine's last core
#   (`os.sched_setaffinity`, `nixl_cpu_affinity` undoes it), so all three workers shared one core, and every NIXL
#   agent's progress thread spun a core of its own (`pthrDelay = 0`; `nixl_progress_delay`).
# - **Consumer PP=2**: stock vLLM refuses it (`NixlPushConnector consumer (decode) does not support
#   pipeline_parallel_size > 1.`). The kit's `nixl_pp_consumer` patch runs it when the producer has the same PP
#   size (`PRODUCER_PP = CONSUMER_PP = 2` above): producer stage s writes into consumer stage s. A PP=1 producer
#   into a PP=2 consumer would need one stage's layers split across two destinations; the kit refuses that pair
#   before anything starts.
# - **MTP on the consumer only**: the handshake refuses (`NIXL compatibility hash mismatch ... Prefill and
#   decode instances have incompatible configurations`) unless the check is turned off, as in the run above.
#
# ## The decode-side rule
# vLLM PR #46003 (not in 0.32.0) forbids MTP with PP>1 on a decode (consumer) server, because stock vLLM's
# PP + speculation produces wrong tokens. With the kit's correctness patches active it is allowed (and verified
# above for the producer; the tests check a PP=2 consumer too). With them off, the kit's `decode_side_pp_spec_rule` patch
# refuses the engine with a ValueError at configuration time (inside every vLLM process); the kit checks the
# same rule before it starts anything, so the refusal below comes before any vLLM process starts.

# %%
# under a second: refused before any process starts
from kit import engine
from kit.core.topology import Topology, TopologyError
t = Topology(model=MODEL, random_weights=True, pp=2, spec="mtp:1")   # a decode-side engine: no PD producer role
rule_err = None
try:
    engine.generate(t, prompts[:1], max_tokens=4, env={"KIT_PATCHES": PATCHES_WITHOUT_FIX})
except TopologyError as e:
    rule_err = str(e)
print(rule_err or "no error: the engine ran")
engine.precheck(t)   # default KIT_PATCHES=all: allowed (raises otherwise)
claim(bool(rule_err) and "only supported on the prefill side" in rule_err,
      "with the correctness patches off the decode-side rule refuses PP=2 + MTP before any process starts; "
      "with them on it is allowed")

# %% [markdown]
# **Takeaway:** a PD pair's decode server gives one plain engine's tokens; the producer's ranks send every prompt KV
# byte the model's shape predicts, the MTP layer's included, and a producer that withholds the MTP layer's KV costs
# accepted drafts, not correctness.
# %%
display(kit.lab.notebook.where_next("04"))
