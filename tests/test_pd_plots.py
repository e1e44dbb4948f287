"""kit.lab.pd_plots: notebook 04's block picture from pd_compare-shaped data (no engine)."""
from kit.lab import pd_plots


def _split(n, rank, pp):
    """vLLM's even split for the sizes used here (get_pp_indices without its env override)."""
    per = n // pp
    return rank * per, (rank + 1) * per if rank < pp - 1 else n


LAYERS = [f"model.layers.{i}" for i in range(5)]  # 4 target layers + the MTP layer (model.layers.4)


def _run(layers, prompt_tokens, block_ids, bytes_per_cell=100, block_size=4):
    blocks = [-(-n // block_size) for n in prompt_tokens]
    reqs = [{"index": i, "error": None, "prompt_tokens": n, "kv_transfer_params": {"remote_block_ids": [ids]}}
            for i, (n, ids) in enumerate(zip(prompt_tokens, block_ids))]
    reqs.insert(1, {"index": 9, "error": "boom", "prompt_tokens": None, "kv_transfer_params": None})  # skipped
    return {"requests": reqs, "kv_expected": {"layers": layers, "blocks": blocks, "block_size": block_size,
                                              "bytes_per_layer_block": bytes_per_cell}}


def test_layer_owners_follow_the_split_and_put_the_mtp_layer_last():
    assert pd_plots.layer_owners(LAYERS, 4, 2, _split) == {
        "model.layers.0": 0, "model.layers.1": 0, "model.layers.2": 1, "model.layers.3": 1, "model.layers.4": 1}
    assert set(pd_plots.layer_owners(LAYERS, 4, 1, _split).values()) == {0}


def test_block_layout_rows_columns_writers_and_bytes():
    owners = pd_plots.layer_owners(LAYERS, 4, 2, _split)
    sent = pd_plots.block_layout(_run(LAYERS, [5, 3], [[7, 8], [2]]), LAYERS, owners, "model.layers.4")
    assert [(c["request"], c["block"], c["producer_block"], c["first_token"], c["last_token"]) for c in sent["columns"]] \
        == [(0, 0, 7, 0, 3), (0, 1, 8, 4, 4), (1, 0, 2, 0, 2)]
    assert sent["rank_layers"] == {0: LAYERS[:2], 1: LAYERS[2:]} and sent["unwritten"] == []
    assert sent["rank_bytes"] == {0: 2 * 3 * 100, 1: 3 * 3 * 100} and sent["total_bytes"] == 5 * 3 * 100

    # a producer without the drafter: the consumer's MTP region is written by nobody
    held = pd_plots.block_layout(_run(LAYERS[:4], [5], [[1, 2]]), LAYERS,
                                 pd_plots.layer_owners(LAYERS[:4], 4, 2, _split), "model.layers.4")
    assert held["writer"]["model.layers.4"] is None and held["unwritten"] == ["model.layers.4"]
    assert held["total_bytes"] == 4 * 2 * 100
    # no block ids returned: the columns stay, their source is unknown
    bare = _run(LAYERS, [4], [[]])
    bare["requests"][0]["kv_transfer_params"] = None
    assert [c["producer_block"] for c in pd_plots.block_layout(bare, LAYERS, owners)["columns"]] == [None]


def test_block_picture_has_one_colour_and_one_legend_entry_per_rank_and_not_written_only_where_drawn():
    owners = pd_plots.layer_owners(LAYERS, 4, 2, _split)
    sent = pd_plots.block_layout(_run(LAYERS, [5, 3], [[7, 8], [2]]), LAYERS, owners, "model.layers.4")
    held = pd_plots.block_layout(_run(LAYERS[:4], [5, 3], [[1, 2], [3]]), LAYERS,
                                 pd_plots.layer_owners(LAYERS[:4], 4, 2, _split), "model.layers.4")

    fig = pd_plots.kv_block_layout({"sent": sent})
    assert [t.name for t in fig.data if t.showlegend] == ["written by producer rank 0", "written by producer rank 1"]
    assert [t.marker.color for t in fig.data] == [pd_plots.RANK_COLORS[0], pd_plots.RANK_COLORS[1]]
    assert [len(t.x) for t in fig.data] == [2 * 3, 3 * 3]  # every cell once: layers x blocks
    assert all(t.marker.pattern.shape in (None, "") for t in fig.data)  # no hatching where something was written

    fig = pd_plots.kv_block_layout({"sent": sent, "withheld": held})
    legend = [t.name for t in fig.data if t.showlegend]
    assert legend == ["written by producer rank 0", "written by producer rank 1", "not written (no rank sent this layer)"]
    empty = [t for t in fig.data if t.name.startswith("not written")]
    assert len(empty) == 1 and empty[0].xaxis == "x2" and list(empty[0].base) == [4 - 0.45] * 3  # the MTP row only
    assert empty[0].marker.pattern.shape == "/"
    assert list(fig.layout.yaxis.ticktext)[-1] == "layers.4 (MTP)"
    # no colour of a rank is used for anything else in the notebook's set
    others = {pd_plots.PRODUCER, pd_plots.CONSUMER, pd_plots.CONSUMER_DECODE, pd_plots.ENGINE, pd_plots.HATCH,
              *pd_plots.PHASE_COLORS.values()}
    assert not others & set(pd_plots.RANK_COLORS)


def test_timeline_splits_the_consumer_at_its_first_token_when_measured():
    r = {"index": 0, "producer_prefill_s": 0.5, "consumer_s": 1.5, "consumer_ttft_s": None,
         "consumer_ttft_server_ms": 250.0}
    assert pd_plots.timeline_steps(r) == [("producer prefill", 0.0, 0.5), ("consumer: KV in + first token", 0.5, 0.25),
                                          ("consumer decode", 0.75, 1.25)]
    assert pd_plots.timeline_steps({**r, "consumer_ttft_server_ms": None}) == [
        ("producer prefill", 0.0, 0.5), ("consumer: KV in + decode", 0.5, 1.5)]
    fig = pd_plots.request_timeline([r, {**r, "index": 1}])
    assert [t.name for t in fig.data if t.showlegend] == ["producer prefill", "consumer: KV in + first token",
                                                         "consumer decode"]
