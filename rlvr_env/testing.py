"""Tiny, offline models for tests and examples: a character tokenizer built
locally and a few-layer Llama built from a config. Nothing is downloaded."""

from __future__ import annotations

import string

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARACTERS = string.digits + string.ascii_letters + string.punctuation + " \n"

# A minimal chat template so CompletionEnv/TokenEnv can render chat messages.
CHAR_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'][0] | upper }}:{{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}A:{% endif %}"
)


def available_devices() -> list[str]:
    """The devices a test can run on here: the CPU, and CUDA where torch sees a GPU."""
    import torch

    return ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def build_char_tokenizer(characters: str = CHARACTERS):
    """A PreTrainedTokenizerFast with one token per character plus pad/bos/eos/unk."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS)}
    for ch in characters:
        vocab.setdefault(ch, len(vocab))
    backend = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    backend.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    backend.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token=PAD, bos_token=BOS, eos_token=EOS, unk_token=UNK
    )
    tokenizer.chat_template = CHAR_CHAT_TEMPLATE
    tokenizer.padding_side = "left"
    return tokenizer


def build_tiny_model(tokenizer, hidden_size: int = 64, num_layers: int = 2, num_heads: int = 4, seed: int = 0,
                     max_position_embeddings: int = 512):
    """A randomly initialised LlamaForCausalLM sized for CPU tests (~100k parameters); ``max_position_embeddings`` is
    its context (RoPE: no weights depend on it), longer for the multi-turn tasks' char-tokenized prompts."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=max(1, num_heads // 2),
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def saved_tiny_model(path, **sizes):
    """``build_tiny_model`` (``sizes``: its hidden_size, num_layers, num_heads, seed, max_position_embeddings) saved with
    the char tokenizer to ``path``, a model directory any loader takes; returns ``path``."""
    tokenizer = build_char_tokenizer()
    build_tiny_model(tokenizer, **sizes).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# The learning tests' task: 1-digit sums, the prompt alone ("3+4="), no format credit.
ADDITION_KWARGS = {"digits": 1, "terms": 2, "operators": "+", "prompt_template": "{expression}=", "format_weight": 0.0}


def biased_addition_model(path, steps: int = 400, seed: int = 0, wrong_fraction: float = 0.65,
                          rambling_fraction: float = 0.0, rambling_length: int = 12):
    """Save (to ``path``) a tiny model supervised ``steps`` AdamW steps on 1-digit sums whose answers are often wrong:
    a ``wrong_fraction`` of them is the true sum + 1, so the model learns that bias (greedy accuracy ~20% at 0.65) but
    still samples right answers often enough for a verifiable reward to reinforce. A ``rambling_fraction`` of answers
    run on for ``rambling_length`` characters before their end, so completions are truncated at a small token budget
    (what DAPO's overlong filtering and soft penalty act on)."""
    import torch

    from rlvr_env import make_task

    tokenizer = build_char_tokenizer()
    task = make_task("rlvr/Arithmetic-v0", **ADDITION_KWARGS)
    model = build_tiny_model(tokenizer, hidden_size=64, num_layers=2, seed=seed)
    generator = torch.Generator().manual_seed(seed)

    def batch() -> list[str]:
        problems = [task.problem(int(i), 999) for i in torch.randint(0, 10**6, (32,), generator=generator)]
        off_by_one = (torch.rand(len(problems), generator=generator) < wrong_fraction).tolist()
        # drawn only when asked for: the learning tests' models (no rambling) keep their random stream
        rambling = ((torch.rand(len(problems), generator=generator) < rambling_fraction).tolist() if rambling_fraction
                    else [False] * len(problems))
        answers = [str(int(p.answer) + wrong) + (" so" * rambling_length if ramble else "")
                   for p, wrong, ramble in zip(problems, off_by_one, rambling)]
        return [p.prompt + answer + tokenizer.eos_token for p, answer in zip(problems, answers)]

    return supervise_and_save(model, tokenizer, (batch() for _ in range(steps)), path)


def supervise_and_save(model, tokenizer, batches, path, lr: float = 3e-3, add_special_tokens: bool = True,
                       decay_steps: int = 0):
    """One AdamW step (``lr``, decayed linearly to 0 over ``decay_steps`` when not 0) per list of texts in
    ``batches``, next-token loss on every token but padding; then ``model`` and ``tokenizer`` saved to ``path``,
    which is returned. How the tiny models of tests and examples learn a behaviour to start RL from."""
    import torch

    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LinearLR(optimizer, 1.0, 0.0, decay_steps) if decay_steps else None
    for texts in batches:
        batch = tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=add_special_tokens)
        labels = batch.input_ids.masked_fill(batch.attention_mask == 0, -100)
        model(**batch, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if schedule is not None:
            schedule.step()
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path
