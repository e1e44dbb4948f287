"""Root-cause extraction from vLLM logs (pure; no engine)."""
from kit.procs import root_cause


def test_root_cause_strips_colour_and_process_prefixes(tmp_path):
    esc = "\x1b"
    log = tmp_path / "engine.log"
    lines = [
        f"{esc}[0;36m(Worker_PP1 pid=27437){esc}[0;0m {esc}[31mERROR{esc}[0m {esc}[90m12-01 07:42:35{esc}[0m "
        f"{esc}[90m[multiproc_executor.py:953]{esc}[0m Traceback (most recent call last):",
        f"{esc}[0;36m(Worker_PP1 pid=27437){esc}[0;0m {esc}[31mERROR{esc}[0m {esc}[90m12-01 07:42:35{esc}[0m "
        f"{esc}[90m[multiproc_executor.py:953]{esc}[0m     raise ValueError(f\"Duplicate layer name: {{prefix}}\")",
        f"{esc}[0;36m(Worker_PP1 pid=27437){esc}[0;0m {esc}[31mERROR{esc}[0m {esc}[90m12-01 07:42:35{esc}[0m "
        f"{esc}[90m[multiproc_executor.py:953]{esc}[0m ValueError: Duplicate layer name: model.layers.2.self_attn.attn",
    ]
    log.write_text("\n".join(lines) + "\n")
    got = root_cause(log)
    assert got[0] == "in Worker_PP1:"
    assert got[-1] == "ValueError: Duplicate layer name: model.layers.2.self_attn.attn"
    assert not any(esc in line for line in got)
