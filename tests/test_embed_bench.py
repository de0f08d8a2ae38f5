"""bench/bench_embed.py compares like with like: on a tiny model and a few proteins and sentences, the pipeline,
ESM-style sorted padded batches and `encoderlab embed` (packed and not) give the same mean vectors, and its table
renders. The timing itself is not tested."""

import importlib.util
from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "bench_embed.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_embed", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_method_computes_the_same_vectors(bench, shared_data, tmp_path):
    for kind, make_input, count in (("protein", bench.protein_input, 12), ("text", bench.text_input, 20)):
        model = bench.save_model(tmp_path / kind, kind, "tiny")
        path = make_input(tmp_path, count)
        found = {}
        for method, runner in bench.RUNNERS.items():
            out = tmp_path / f"{kind}_{method}.npy"
            runner(str(model), path, out, "cpu", 2048)
            found[method] = np.load(out)
        assert found["pipeline"].shape[0] == count
        for method, vectors in found.items():
            np.testing.assert_allclose(vectors, found["pipeline"], atol=1e-5, rtol=0, err_msg=f"{kind} {method}")
    rows = [
        {
            "data": "uniprot",
            "method": "packed",
            "sequences_per_s": 2.0,
            "tokens_per_s": 900.0,
            "peak_rss_mib": 600.0,
            "vs_pipeline": 2.1,
            "vs_sorted": 1.1,
            "max_abs_diff": 1e-7,
        }
    ]
    table = bench.markdown(rows, {})
    assert "| uniprot | packed | 2.0 | 900 | 600 | 2.10x | 1.10x | 1.0e-07 |" in table
