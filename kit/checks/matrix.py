"""The correctness matrix: which topologies must be token-identical to the PP=1, no-spec reference.

One place for the cells, used by ``tests/test_correctness.py`` (the fast subset in CI, everything
with ``-m slow``) and by ``kit matrix`` / ``kit matrix`` (prints a markdown table; ``--write docs/results/matrix.md``
also writes it there, headed by date, machine, versions and the command, see :mod:`kit.core.results`).
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone

from kit.checks import traffic
from kit.checks.compare import Comparison, compare, load_prompts
from kit.core.flags import add_command
from kit.core.models import PROMPTS_DIR
from kit.core.results import block_key, check_writable, command_line, write_block
from kit.core.topology import Topology, TopologyError
from kit.engine import GenerationResult, generate


@dataclass(frozen=True)
class Cell:
    model: str
    random: bool
    pp: int
    spec: str
    eager: bool = True
    max_num_seqs: int | None = None
    fast: bool = False  # part of the CI subset
    # PP of the no-spec reference. 1 everywhere, except where PP itself changes greedy tokens at near-ties
    # (random DeepSeek MLA weights): a second cell against the same-PP, no-spec engine isolates speculation.
    ref_pp: int = 1
    # The prompt file under data/prompts/ ("joining": one- to few-token prompts that join running requests).
    prompts: str = "default"
    # Traffic the repository's prompts never send (kit.checks.traffic): its prompts, stop token and engine setting.
    traffic: bool = False
    # Patches turned off for this cell's run (not its reference), e.g. ("pp_microbatches",): vLLM's own step loop.
    patches_off: tuple[str, ...] = ()
    # Decoder layers per PP stage (Topology.layer_partition); () = vLLM's even split.
    layer_partition: tuple[int, ...] = ()

    @property
    def id(self) -> str:
        w = "random" if self.random else "trained"
        s = f"{self.model}-{w}-pp{self.pp}-{self.spec.replace(':', '')}"
        if not self.eager:
            s += "-compiled"
        if self.max_num_seqs:
            s += f"-seqs{self.max_num_seqs}"
        if self.ref_pp != 1:
            s += f"-vs-pp{self.ref_pp}-nospec"
        if self.prompts != "default":
            s += f"-{self.prompts}"
        if self.traffic:
            s += "-traffic"
        for name in self.patches_off:
            s += f"-no-{name.replace('_', '-')}"
        if self.layer_partition:
            s += "-layers" + "-".join(map(str, self.layer_partition))
        return s

    def env(self) -> dict[str, str] | None:
        """The run's environment: ``KIT_PATCHES`` without :attr:`patches_off` (None: every patch)."""
        return {"KIT_PATCHES": ",".join(["all"] + [f"-{n}" for n in self.patches_off])} if self.patches_off else None

    def prompt_list(self) -> list[str]:
        """The cell's prompts: the first :data:`NUM_PROMPTS` of ``data/prompts/<prompts>.jsonl``."""
        if self.traffic:
            return traffic.prompts(str(self.topology().model_path()), self.k)
        return load_prompts(None if self.prompts == "default" else PROMPTS_DIR / f"{self.prompts}.jsonl",
                            limit=NUM_PROMPTS)

    @property
    def k(self) -> int:
        """Drafts per step (0 without speculation)."""
        return int(self.spec.split(":")[1]) if ":" in self.spec else 0

    def stop_token_ids(self) -> list[int] | None:
        return traffic.stop_token_ids(str(self.topology().model_path())) if self.traffic else None

    def topology(self) -> Topology:
        extra = {}
        if self.traffic:
            extra = traffic.engine_args(traffic.plain_kv(Topology(model=self.model, random_weights=self.random).info.config))
        return Topology(model=self.model, random_weights=self.random, pp=self.pp, spec=self.spec,
                        enforce_eager=self.eager, max_num_seqs=self.max_num_seqs,
                        layer_partition=self.layer_partition or None, **extra)


MAX_TOKENS = 40
NUM_PROMPTS = 8

CELLS: list[Cell] = []
# PP=1 with speculation: the acceptance baseline the PP>1 cells' per-position counts must equal.
for k in (1, 2, 3):
    CELLS.append(Cell("tiny-mimo", False, 1, f"mtp:{k}"))
CELLS.append(Cell("tiny-mimo", True, 1, "ngram:2"))
CELLS.append(Cell("tiny-mimo", True, 1, "ngram:3", max_num_seqs=3))
CELLS.append(Cell("tiny-mimo", False, 1, "mtp:2", max_num_seqs=3))
for pp in (2, 4):
    for k in (1, 2, 3):
        for random in (True, False):
            # Not in the CI subset: trained PP=2 mtp:2 is asserted there by notebook 03 (same tokens as PP=1 and
            # the plain engine, same acceptance counts); the PP=4 trained cell below covers re-entering requests.
            CELLS.append(Cell("tiny-mimo", random, pp, f"mtp:{k}"))
    CELLS.append(Cell("tiny-mimo", True, pp, "ngram:2", fast=(pp == 2)))
    CELLS.append(Cell("tiny-mimo", True, pp, "ngram:3", max_num_seqs=3, fast=(pp == 2)))
    CELLS.append(Cell("tiny-mimo", False, pp, "mtp:2", max_num_seqs=3, fast=(pp == 4)))
# CI runs the trained PP=2 cell compiled (torch.compile and the CPU build's graph mode, not eager), and the same
# cell eager in vLLM's own step loop (pp_microbatches off: one step in flight, drafts taken after each step) beside
# the default loop's PP=4 cell above.
CELLS.append(Cell("tiny-mimo", False, 2, "mtp:2", eager=False, fast=True))
CELLS.append(Cell("tiny-mimo", True, 2, "mtp:2", eager=False))
CELLS.append(Cell("tiny-mimo", False, 2, "mtp:2", patches_off=("pp_microbatches",), fast=True))
# The other drafter families that start on CPU: PP 2/4 x k 1..3 (DeepSeek-V3 and GLM-4 MoE on seeded random weights,
# Eagle3 on the trained tiny-llama-swa and its trained drafter, so that drafts are accepted and counted).
# CI runs GLM-4 MoE at PP=4, where a stage holds dense layers only (patch glm4_moe_dense_stage).
for pp in (2, 4):
    for k in (1, 2, 3):
        CELLS.append(Cell("tiny-deepseek-v3", True, pp, f"mtp:{k}"))
        CELLS.append(Cell("tiny-llama-swa-trained", False, pp, f"eagle3:{k}"))
        CELLS.append(Cell("tiny-glm4-moe", True, pp, f"mtp:{k}", fast=(pp == 4 and k == 2)))
CELLS.append(Cell("tiny-deepseek-v3", True, 2, "mtp:2", ref_pp=2))
# Qwen3.5 (Gated-DeltaNet + full attention hybrid, qwen3_5_mtp drafter), trained (kit/zoo/tiny/qwen3_5.py,
# data/models/README.md): PP 1/2/4 x MTP k 1..3, and max_num_seqs below the prompt count (requests leave and
# re-enter the batch: the per-request recurrent state in each stage's mamba cache must survive); n-gram drafts give
# steps with fewer than k drafts (patch cpu_gdn_spec_conv_window). bf16 and prefix caching off come from
# kit.core.models.model_requirements. The zoo's random weights (drafts never accepted, logits one bf16 step apart) test
# that a speculative engine computes what the no-spec engine computes (patch cpu_gdn_spec_cpp_conv).
for pp in (1, 2, 4):
    for k in (1, 2, 3):
        CELLS.append(Cell("tiny-qwen3_5-trained", False, pp, f"mtp:{k}"))
    # CI runs PP=4 with requests leaving and re-entering the batch: the hybrid accepted-count path on every rank,
    # three stages of Gated-DeltaNet layers only and a last stage of the full-attention layer and the MTP drafter.
    CELLS.append(Cell("tiny-qwen3_5-trained", False, pp, "mtp:2", max_num_seqs=3, fast=(pp == 4)))
    # PP=1 in CI: n-gram steps with fewer than k drafts, through the GDN roll (cpu_gdn_spec_conv_window), on any CPU.
    CELLS.append(Cell("tiny-qwen3_5-trained", False, pp, "ngram:2", fast=(pp == 1)))
    CELLS.append(Cell("tiny-qwen3_5-trained", False, pp, "ngram:2", max_num_seqs=3))
    for k in (1, 2, 3):
        CELLS.append(Cell("tiny-qwen3_5", True, pp, f"mtp:{k}"))
    CELLS.append(Cell("tiny-qwen3_5", True, pp, "ngram:2", max_num_seqs=3))
# Trained DeepSeek-V3 (kit/zoo/tiny/deepseek.py, data/models/README.md): PP=1 with speculation is the acceptance
# baseline for the PP=2 and PP=4 cells.
for k in (1, 2, 3):
    for pp in (1, 2, 4):
        if k == 2 or pp in (1, 2):
            CELLS.append(Cell("tiny-deepseek-v3-trained", False, pp, f"mtp:{k}"))
# mimo-py-18m (kit/zoo/tiny/trainers.py): the larger trained MiMo, same vLLM classes as tiny-mimo, PP 1/2/4 x MTP k 1..3.
# Not in the CI subset: it exercises no code path that tiny-mimo's fast cells do not, at several times the cost.
for k in (1, 2, 3):
    for pp in (1, 2, 4):
        CELLS.append(Cell("mimo-py-18m", False, pp, f"mtp:{k}"))
# Traffic the repository's prompts never send (data/prompts/joining.jsonl): one- and few-token prompts that wait for
# a free slot (max_num_seqs=3) and join requests that are decoding or verifying drafts. A one-token step was fatal on
# Qwen3.5 (patch cpu_gdn_one_token_batch) and a one-token prompt joining drafts got a speculative row with another
# request's state (patch spec_no_pad_fresh_prompt). Random weights without drafts are compared with the same PP's
# no-spec engine: PP alone flips an exact tie of the PP=1 reference there (docs/findings.md).
for model, random in (("tiny-qwen3_5-trained", False), ("tiny-qwen3_5", True)):
    for pp in (1, 2, 4):
        for spec in ("none", "mtp:2"):
            fast = (not random and pp == 1 and spec == "mtp:2") or (random and pp == 2 and spec == "none")
            CELLS.append(Cell(model, random, pp, spec, max_num_seqs=3, prompts="joining", fast=fast,
                              ref_pp=pp if random and spec == "none" else 1))
# The same traffic for the other families (trained weights where the zoo has them, so that drafts are accepted).
for pp in (1, 2, 4):
    CELLS.append(Cell("tiny-mimo", False, pp, "mtp:2", max_num_seqs=3, prompts="joining"))
    CELLS.append(Cell("tiny-mimo", True, pp, "ngram:2", max_num_seqs=3, prompts="joining"))
for pp in (1, 2):
    CELLS.append(Cell("tiny-deepseek-v3-trained", False, pp, "mtp:2", max_num_seqs=3, prompts="joining"))
CELLS.append(Cell("tiny-glm4-moe", True, 2, "mtp:2", max_num_seqs=3, prompts="joining"))
CELLS.append(Cell("tiny-llama-swa-trained", False, 2, "eagle3:2", max_num_seqs=3, prompts="joining"))
# Real traffic (kit.checks.traffic): prompt lengths around the draft window and the KV block, chunked prefill, shared
# prefixes, a stop token, requests joining and leaving, KV pressure; every family at the PP sizes it runs.
for pp in (1, 2, 4):
    CELLS.append(Cell("tiny-mimo", False, pp, "mtp:2", max_num_seqs=traffic.MAX_NUM_SEQS, traffic=True))
    CELLS.append(Cell("tiny-qwen3_5-trained", False, pp, "mtp:2", max_num_seqs=traffic.MAX_NUM_SEQS, traffic=True))
# CI runs the DeepSeek (MLA, trained MTP) and Eagle3 traffic cells at PP=2: the slice of real traffic in the
# default selection, and the one MLA and one Eagle3 cell there (patch cpu_mla_spec_token_budget: the long prompts).
for pp in (1, 2, 4):
    CELLS.append(Cell("tiny-mimo", True, pp, "ngram:2", max_num_seqs=traffic.MAX_NUM_SEQS, traffic=True))
    CELLS.append(Cell("tiny-deepseek-v3-trained", False, pp, "mtp:2", max_num_seqs=traffic.MAX_NUM_SEQS, traffic=True,
                      fast=(pp == 2)))
    CELLS.append(Cell("tiny-glm4-moe", True, pp, "mtp:2", max_num_seqs=traffic.MAX_NUM_SEQS, traffic=True))
    CELLS.append(Cell("tiny-llama-swa-trained", False, pp, "eagle3:2", max_num_seqs=traffic.MAX_NUM_SEQS, traffic=True,
                      fast=(pp == 2)))

# Uneven layer splits (Topology.layer_partition, vLLM's VLLM_PP_LAYER_PARTITION): the last stage, which also drafts,
# with fewer target layers (the speed lever of docs/results/bench.md) and with more; a stage of one layer of one kind
# (Qwen3.5's full-attention layer alone, GLM-4 MoE's dense layer alone). Each must match the PP=1 reference and accept
# exactly the drafts its even-split cell accepts (tests/test_correctness.py).
for model, random, pp, spec, seqs, part in (
        ("mimo-py-18m", False, 2, "mtp:2", None, (5, 3)), ("mimo-py-18m", False, 4, "mtp:2", None, (3, 2, 2, 1)),
        ("tiny-mimo", False, 2, "mtp:2", 3, (3, 1)), ("tiny-qwen3_5-trained", False, 2, "mtp:2", None, (3, 1)),
        ("tiny-qwen3_5-trained", False, 2, "mtp:2", None, (1, 3)),
        ("tiny-llama-swa-trained", False, 2, "eagle3:2", None, (3, 1)),
        ("tiny-deepseek-v3-trained", False, 2, "mtp:2", None, (1, 3)), ("tiny-glm4-moe", True, 2, "mtp:2", None, (1, 3))):
    CELLS.append(Cell(model, random, pp, spec, max_num_seqs=seqs, layer_partition=part))


_REFS: dict[tuple, GenerationResult] = {}


def reference_for(topology: Topology, prompts: list[str], max_tokens: int, ref_pp: int = 1,
                  stop_token_ids: list[int] | None = None) -> GenerationResult:
    """The no-spec reference (PP=1 unless ``ref_pp``) for a topology's model and weights (cached per process); a
    traffic topology's prefill budget and KV blocks stay (only ``max_num_seqs`` goes)."""
    ref = topology.reference().with_(max_num_seqs=None, pp=ref_pp)
    key = (ref.label(), ref.seed, ref.dtype, ref.max_num_batched_tokens, tuple(sorted(ref.extra_engine_args.items())),
           tuple(prompts), max_tokens, tuple(stop_token_ids or ()))
    if key not in _REFS:
        _REFS[key] = generate(ref, prompts, max_tokens=max_tokens, top2=True, stop_token_ids=stop_token_ids)
    return _REFS[key]


def run_cell(cell: Cell, prompts: list[str] | None = None, max_tokens: int = MAX_TOKENS) -> Comparison:
    prompts = prompts or cell.prompt_list()
    stop = cell.stop_token_ids()
    ref = reference_for(cell.topology(), prompts, max_tokens, ref_pp=cell.ref_pp, stop_token_ids=stop)
    return compare(cell.topology(), prompts, max_tokens=max_tokens, reference=ref, stop_token_ids=stop, env=cell.env())


def counters_key(c: Cell) -> tuple:
    """What a PP>1 cell's accepted drafts per position must equal: those of the PP=1 cell with this key in the same
    run. Everything that decides the drafts (weights, drafter, step loop, batch limit, prompts, traffic) is in it;
    the PP size, the layer split and the patches turned off are not (none of them may change the drafts)."""
    return (c.model, c.random, c.spec, c.eager, c.max_num_seqs, c.prompts, c.traffic)


def register(sub) -> None:
    """Add ``kit matrix`` to the ``kit`` command tree (exit 1 when a cell differs or fails)."""
    p = add_command(sub, "matrix", run, help="run the correctness matrix and print a markdown table")
    p.add_argument("--fast", action="store_true", help="only the CI subset")
    p.add_argument("--match", default="", help="only cells whose id contains this")
    p.add_argument("--cells", default="", metavar="ID[,ID...]",
                   help="only these cells (exact ids, comma-separated; `kit matrix --list` prints them)")
    p.add_argument("--list", action="store_true", help="print the selected cells' ids and exit")
    p.add_argument("--jsonl", default=None, help="append one JSON record per cell here")
    p.add_argument("--write", default=None, metavar="FILE",
                   help="also write the table into FILE (e.g. docs/results/matrix.md), replacing this command's block")


def run(args: argparse.Namespace) -> int:
    argv = list(getattr(args, "argv", None) or [])
    if args.write and (why := check_writable(args.write)):
        raise TopologyError(why)
    wanted = [x for x in args.cells.split(",") if x]
    unknown = sorted(set(wanted) - {c.id for c in CELLS})
    if unknown:
        raise TopologyError(f"--cells: no cell {', '.join(unknown)} (kit matrix --list prints the ids)")
    cells = [c for c in CELLS if (c.fast or not args.fast) and args.match in c.id and (not wanted or c.id in wanted)]
    if args.list:
        print("\n".join(c.id for c in cells))
        return 0
    started, t_start = datetime.now(timezone.utc), time.monotonic()
    # Traffic cells also say what the scheduler met: preemptions and prefix-cache hits (tokens) in the run.
    sched = any(c.traffic for c in cells)
    lines = ["| cell | identical | first divergence | drafts | accepted | per position | = PP=1 counters |"
             + (" preempted | prefix-cache hits |" if sched else "") + " s |",
             "|---|---|---|---|---|---|---|" + ("---|---|" if sched else "") + "---|"]
    print("\n".join(lines), flush=True)
    bad = 0
    # Accepted drafts per position must not depend on PP: each PP>1 cell against its PP=1 sibling of this run.
    pp1: dict[tuple, list[int]] = {}
    for c in cells:
        t0 = time.monotonic()
        try:
            cmp = run_cell(c)
            d = cmp.to_dict()
            a = d["acceptance"]
            sibling = counters_key(c)
            same = "-"
            if c.spec != "none" and c.pp == 1:
                pp1[sibling] = a["per_position"]
            elif c.spec != "none" and sibling in pp1:
                same = "yes" if pp1[sibling] == a["per_position"] else "**NO**"
            row = (c.id, "yes" if d["identical"] else "**NO**", d["first_divergence"] or "", a["num_drafts"],
                   a["num_accepted_tokens"], a["per_position"], same)
            if sched:
                run_s = d["scheduler"]["run"]
                row += (run_s.get("preemptions", ""), run_s.get("prefix_cache_hits", ""))
            row += (round(time.monotonic() - t0),)
            bad += not d["identical"] or same == "**NO**"
            if args.jsonl:
                with open(args.jsonl, "a") as f:
                    f.write(json.dumps({"cell": c.id, **d}) + "\n")
        except Exception as e:
            row = (c.id, "**ERROR**", str(e).splitlines()[0][:120], "", "", "", "") + ("", "") * sched \
                + (round(time.monotonic() - t0),)
            bad += 1
        lines.append("| " + " | ".join(str(x) for x in row) + " |")
        print(lines[-1], flush=True)
    if args.write:
        plain = not cells or any(not c.traffic for c in cells)
        note = (f"{len(cells)} cell{'' if len(cells) == 1 else 's'}, "
                + (f"{NUM_PROMPTS} prompts x {MAX_TOKENS} new tokens each" if plain else f"up to {MAX_TOKENS} new tokens per prompt")
                + ", greedy, against the "
                f"no-spec reference of the same weights; {bad} not identical or failed; kit patches "
                f"{os.environ.get('KIT_PATCHES') or 'all (default)'}; "
                f"{time.monotonic() - t_start:.0f} s in all (\"s\": per cell, engine starts included)."
                + (f" Cells ending in -traffic: the {len(traffic.lengths(2)) + 2} prompts of kit.checks.traffic (lengths "
                   f"{', '.join(map(str, traffic.lengths(2)))} tokens at k=2 and two sharing {2 * traffic.BLOCK} tokens), "
                   f"stop token {traffic.STOP_TEXT!r}, max_num_seqs {traffic.MAX_NUM_SEQS}, "
                   f"max_num_batched_tokens {traffic.PREFILL_BUDGET}, {traffic.KV_BLOCKS} KV blocks of {traffic.BLOCK} "
                   "tokens, the same in the reference; \"preempted\": requests the scheduler preempted in the cell's run "
                   "(vllm:num_preemptions), \"prefix-cache hits\": prompt tokens read from the prefix cache there "
                   "(vllm:prefix_cache_hits; the MLA and hybrid families run without prefix caching on CPU)."
                   if sched else ""))
        write_block(args.write, block_key("kit.checks.matrix", argv, skip=("--write", "--jsonl")), note + "\n\n" +
                    "\n".join(lines), command_line("kit matrix", argv), when=started,
                    title="Correctness matrix")
    return 1 if bad else 0
