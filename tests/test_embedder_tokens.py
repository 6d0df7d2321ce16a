"""The sentence-transformers embedder's token counts: the tokenizer's word pieces, each text whole."""
from __future__ import annotations

from extras import need


def test_count_tokens_are_the_tokenizers_word_pieces():
    need("sentence_transformers")
    from memforest_gpu.mergers.embedders import SentenceTransformerEmbedder

    emb = SentenceTransformerEmbedder(device="cpu")
    texts = ["a b c", "Caroline went to the LGBTQ support group yesterday.", "日本語 テキスト", "word " * 600, " "]
    tok = emb.model.tokenizer
    want = [len(tok(t, add_special_tokens=False, truncation=False, verbose=False)["input_ids"]) for t in texts]
    assert emb.count_tokens(texts) == want
    assert want[3] == 600  # past the model's 256-token window: not truncated
    assert emb.count_tokens([]) == []
