"""Make a tiny random Llama model and its tokenizer, for running a real vLLM on a CPU in tests.

No hub is reached: the weights are random (fixed seed) and the tokenizer is a byte-level BPE
trained here on text this script generates, so the same files come out on every machine.

    python tests/vllm/make_model.py /work/vllm-model

The directory then holds what ``vllm serve DIR`` needs: ``config.json``,
``generation_config.json``, ``model.safetensors``, ``tokenizer.json``,
``tokenizer_config.json`` and ``chat_template.jinja`` (for ``/v1/chat/completions``).

Shape: hidden 128, 2 attention heads of head_dim 64 (vLLM's CPU attention refuses head_dim 16:
"Unsupported CPU attention configuration"), 2 layers, intermediate 256, 16384 positions,
float32, a vocabulary of 1024 tokens (about 1000 merges plus the special tokens).

Needs ``torch``, ``transformers`` and ``tokenizers`` (all three come with vLLM).
"""

from __future__ import annotations

import os
import random
import sys
from pathlib import Path

SEED = 1234
VOCAB_SIZE = 1024

BOS, EOS, PAD = "<s>", "</s>", "<pad>"
ROLE_TOKENS = ["<|system|>", "<|user|>", "<|assistant|>"]

# Each message: its role token, a newline, the content, the end token, a newline. The
# assistant's turn is opened by add_generation_prompt and ends with EOS, which is what stops it.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' + '\n' + message['content'] + eos_token + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' + '\n' }}{% endif %}"
)

_WORDS = (
    "the a an of to in and or is are was were be been has have had do does did not no yes "
    "server request stream token tokens model engine drain drains draining ready live startup "
    "pod node cluster balancer gateway proxy client clients retry retries deadline budget grace "
    "period signal shutdown process worker workers socket queue batch prefill decode cache memory "
    "time second seconds minute fast slow small large first last next every each one two three "
    "four five six seven eight nine ten hundred thousand python rust go java code test tests "
    "function class method value values list dict string number error errors result results "
    "hello world question answer please thank you what why how when where who which this that "
    "these those here there now then today tomorrow yesterday morning evening night day week "
    "run runs running ran start starts started stop stops stopped send sends sent read write "
    "open close closed connection connections header headers body frame frames event events "
    "data done finish finished reason length stop limit limits count counts metric metrics"
).split()


def corpus(seed: int = SEED, lines: int = 4000) -> list[str]:
    """Deterministic training text: sentences from a fixed word list, some numbers and
    punctuation, and a few lines of code, so the merges cover what tests will send."""
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 16))]
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 9999)))
        sentence = " ".join(words)
        out.append(sentence[0].upper() + sentence[1:] + rng.choice([".", "?", "!", ",", ":", ";"]))
        if rng.random() < 0.1:
            name = rng.choice(_WORDS)
            out.append(f"def {name}(x, y=1):\n    return x + y * {rng.randint(0, 99)}\n")
    return out


def make_tokenizer(seed: int = SEED, vocab_size: int = VOCAB_SIZE):
    """A ``PreTrainedTokenizerFast``: byte-level BPE (so any text encodes, no unknown token)
    with BOS/EOS/PAD, the chat role tokens and a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=[BOS, EOS, PAD, *ROLE_TOKENS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        additional_special_tokens=ROLE_TOKENS,
        model_max_length=16384,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def make_model(path: str | os.PathLike[str], seed: int = SEED) -> Path:
    """Write the tokenizer and a random ``LlamaForCausalLM`` to ``path``; return it."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(seed)

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        max_position_embeddings=16384,
        rms_norm_eps=1e-6,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).to(torch.float32)
    model.generation_config = GenerationConfig(
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(f"usage: {sys.argv[0]} DIR")
    print(make_model(sys.argv[1]))
