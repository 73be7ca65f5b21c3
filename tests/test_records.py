"""The results page's GPU tables are rendered from ``docs/data/gpu.json``, not typed by hand."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).parent.parent
spec = importlib.util.spec_from_file_location("records", ROOT / "docs" / "hooks" / "records.py")
records = importlib.util.module_from_spec(spec)
spec.loader.exec_module(records)

RECORD = {
    "machine": {"device": "NVIDIA H200", "torch": "2.11.0+cu130", "cuda": "13.0"},
    "commit": "0123456789abcdef", "command": "python benchmarks/gpu.py", "identical_tokens": True,
    "roofline_ms": 0.126, "step_ms": {"1": 1.234, "64": 2.5}, "step_ms_eager": {"1": 19.3},
    "r": {"4": 1.07}, "r_eager": {"4": 1.52}, "speedup_b1": {"prompt lookup": 2.31},
    "speedup_b1_eager": {"prompt lookup": 1.1},
    "engine": {"32": {"plain_tok_s": 4321.0, "plain_tok_s_eager": 900.0, "hf_tok_s": 1500.0,
                      "default_over_plain": 0.99}},
    "bf16": {"identical_fraction": 0.987, "identical_outputs": 6, "outputs": 7},
}


def test_every_figure_of_the_record_reaches_the_page():
    page = records.render_gpu(RECORD)
    for text in ("NVIDIA H200", "0123456789", "| 1 | 1.234 | 19.300 |", "| 4 | 1.07 | 1.52 |",
                 "| prompt lookup | 2.31x | 1.10x |", "| 32 | 4,321 | 900 | 1,500 | 0.99x |",
                 "98.7 %", "6 of 7"):
        assert text in page, text


def test_the_marker_becomes_the_record_or_a_note(tmp_path):
    config = {"docs_dir": str(tmp_path)}
    page = records.on_page_markdown("a\n<!-- minispec-record: gpu -->\nb", None, config, None)
    assert "No `docs/data/gpu.json` is committed yet" in page and "gpu_session.sh" in page
    (tmp_path / "data").mkdir()
    import json
    (tmp_path / "data" / "gpu.json").write_text(json.dumps(RECORD))
    page = records.on_page_markdown("a\n<!-- minispec-record: gpu -->\nb", None, config, None)
    assert "| 1 | 1.234 | 19.300 |" in page and "<!--" not in page
