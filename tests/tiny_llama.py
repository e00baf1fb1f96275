"""A tiny Llama model made on the spot (no download), for tests against real vLLM and SGLang
servers.

A byte-level BPE tokenizer trained with `tokenizers` on a few sentences written for this
project, saved with transformers' PreTrainedTokenizerFast, and a 2-layer LlamaForCausalLM
(hidden 128, 4 heads, 2 KV heads, vocab 512) with random weights, saved as safetensors.
Greedy decoding of random weights repeats itself quickly, so ngram speculation (prompt
lookup) finds matches and accepts drafts: what the tests need from it.

    python -m tests.tiny_llama DIR
"""

from __future__ import annotations

import sys

SENTENCES = [
    "The quick brown fox jumps over the lazy dog while the cat sleeps by the fire.",
    "A tensor parallel server splits every layer across the ranks and sums the results.",
    "Small messages cost their latency, large messages cost their bandwidth.",
    "Speculative decoding drafts a few tokens and verifies them in one forward pass.",
    "Write a detailed guide to maintaining a bicycle, covering the chain, brakes and tyres.",
    "Explain step by step how a compiler turns source code into machine code.",
]


def build(path: str, vocab: int = 512, seed: int = 0) -> str:
    """Write the tokenizer and model to `path`; returns `path`."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab, special_tokens=["<s>", "</s>", "<unk>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(SENTENCES * 20, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    fast.save_pretrained(path)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        bos_token_id=0,
        eos_token_id=1,
        torch_dtype="bfloat16",
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.save_pretrained(path, safe_serialization=True)
    return path


if __name__ == "__main__":
    print(build(sys.argv[1]))
