"""The policy as training sees it: its LM head, the log-probs of sampled completions, position ids
of left-padded rows, and the token ids it stops at."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch.distributed.fsdp import FSDPModule

from algos.core.logprobs import DEFAULT_CHUNK_SIZE, LogitTransform, logprobs_from_hidden
from algos.model.attention import recomputes_in_backward, takes_sdpa_masks, training_attention
from algos.model.compiled import compiled_layers, has_compiled_layers


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, L] attention mask (left padding) -> [B, L] positions counting from each row's first real token."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def lm_head_of(model: torch.nn.Module, vocab_size: int | None = None) -> tuple[torch.Tensor, LogitTransform]:
    """The LM head's [V, H] weight and the transform the model applies to its logits (read from its config).
    ``vocab_size`` (the tokenizer's length) drops the rows past it: embedding tables are often padded
    (Qwen2.5: 151,936 rows for 151,665 tokens), and the rollout samples from the tokenizer's ids only."""
    head = model.get_output_embeddings()
    if not isinstance(head, torch.nn.Linear) or head.bias is not None:
        raise TypeError(f"completion_logprobs needs a bias-free linear LM head, got {type(head).__name__}")
    config = model.config.get_text_config()
    scale = 1.0 / config.logits_scaling if getattr(config, "logits_scaling", None) else getattr(config, "logit_scale", None)
    transform = LogitTransform(scale=float(scale or 1.0), softcap=getattr(config, "final_logit_softcapping", None))
    if vocab_size is None or vocab_size >= head.weight.shape[0]:
        return head.weight, transform  # a slice's backward would zero-fill a second [V, H] gradient per call
    return head.weight[:vocab_size], transform


@torch.no_grad()
def check_lm_head(model: torch.nn.Module, vocab_size: int | None = None) -> None:
    """Raise ValueError unless ``lm_head_of`` reproduces the model's own logits on a probe input; otherwise
    completion_logprobs would train a distribution other than the one the rollout samples."""
    weight, transform = lm_head_of(model, vocab_size)
    probe = (torch.arange(1, 9, device=weight.device) % weight.shape[0])[None]
    was_training = model.training
    model.eval()  # no dropout: both passes must see the same network
    try:
        expected = model(input_ids=probe).logits[0, :, : weight.shape[0]].float()
        got = transform(model.get_decoder()(input_ids=probe).last_hidden_state[0] @ weight.T).float()
    finally:
        model.train(was_training)
    difference = (got - expected).abs().max().item()
    if not difference <= 2e-2 * expected.abs().max().item() + 1e-4:
        raise ValueError(
            f"{type(model).__name__}'s logits differ from its LM head's output by up to {difference:.3g}: the model "
            f"transforms its logits in a way completion_logprobs does not know (it knows logit_scale, logits_scaling "
            f"and final_logit_softcapping), so training would use other log-probs than the rollout's"
        )


def completion_logprobs(
    model: torch.nn.Module,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    prompt_width: int,
    temperature: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK_SIZE,
    vocab_size: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """[B, P+T] ids and mask -> ([B, T] log-probs of the completion tokens, [B, T] entropy), fp32,
    0 where the completion mask is 0.

    Work a plain forward would waste is skipped, with the same result up to float rounding (~5e-7): identical prompts (a
    GRPO group) run through the model once and their KV cache, graph included, serves every
    row of the group; a group's completions are packed several to a decoder row, so right padding is mostly not
    computed; columns of padding no row uses are cut; the LM head projects only the
    completion's tokens, in chunks, so [B, T, V] logits never exist. ``vocab_size``: see ``lm_head_of``.
    A model with gradient checkpointing on (model.gradient_checkpointing) runs every row whole when a gradient is
    wanted: a recomputed layer would append its keys to a shared cache a second time. So does one sharded by FSDP2
    (distributed.strategy = "fsdp2"), always: each decoder call gathers every layer's shards, so every rank must make
    the same calls whatever its rows (the shared prompt takes one call, or two). So does one whose decoder layers are
    compiled (algos/model/compiled.py), in one decoder call through them: a compiled layer must not see a KV cache.
    """
    weight, transform = lm_head_of(model, vocab_size)
    completion_ids, completion_mask = input_ids[:, prompt_width:], attention_mask[:, prompt_width:]
    valid = completion_mask.bool()
    logp = torch.zeros(completion_ids.shape, dtype=torch.float32, device=input_ids.device)
    entropy = torch.zeros_like(logp)
    used = int(completion_mask.sum(-1).max()) if completion_ids.numel() else 0
    if used == 0:
        return logp, entropy
    # Leading columns that are padding in every prompt change nothing.
    first = int(attention_mask[:, :prompt_width].any(0).int().argmax())
    checkpointed = recomputes_in_backward(model)
    valid_used = valid[:, :used]
    ids, mask, width = input_ids[:, first:], attention_mask[:, first:], prompt_width - first
    whole_rows = checkpointed or has_compiled_layers(model) or any(isinstance(m, FSDPModule) for m in model.modules())
    with training_attention(model, input_ids.device), compiled_layers(model):
        if whole_rows:
            hidden = _whole_rows_hidden(model, ids, mask, width, used)[valid_used]
        else:
            hidden = _shared_prompt_hidden(model, ids, mask, width, valid_used.sum(-1).tolist(),
                                           _packing_attention(model, width + used))
    taken, spread = logprobs_from_hidden(
        hidden, weight, completion_ids[:, :used][valid_used], temperature, chunk_size, transform
    )
    logp[valid] = taken
    entropy[valid] = spread
    return logp, entropy


def _packing_attention(model: torch.nn.Module, rows_length: int) -> str | None:
    """The decoder's attention (SDPA's or "eager") where it takes the custom [B, 1, Q, K] mask packed rows need,
    else None: transformers passes such a mask through unchanged to SDPA (boolean; algos/model/attention.py's
    functions take SDPA's masks) and eager attention (additive), and a sliding window shorter than the rows would not
    apply to it."""
    config = model.config.get_text_config()
    window = getattr(config, "sliding_window", None)
    implementation = config._attn_implementation
    packs = (takes_sdpa_masks(implementation) or implementation == "eager") and not (window and window < rows_length)
    return implementation if packs else None


def _pack_rows(owner: list[int], fed: list[int]) -> tuple[list[int], list[tuple[int, int]]]:
    """First-fit, longest row first: rows (their prompt, how many tokens each feeds) -> each decoder row's prompt, and
    each row's (decoder row, offset). A decoder row is as long as the longest row and holds rows of one prompt only."""
    capacity = max(fed)
    bin_owner: list[int] = []
    bin_fill: list[int] = []
    placed = [(0, 0)] * len(fed)
    for row in sorted(range(len(fed)), key=lambda r: -fed[r]):
        if fed[row] == 0:
            continue  # a one-token row: its token is predicted from the prompt's last state
        fits = [b for b, (o, fill) in enumerate(zip(bin_owner, bin_fill)) if o == owner[row] and fill + fed[row] <= capacity]
        if fits:
            b = fits[0]
        else:
            b = len(bin_owner)
            bin_owner.append(owner[row])
            bin_fill.append(0)
        placed[row] = (b, bin_fill[b])
        bin_fill[b] += fed[row]
    return bin_owner, placed


def _shared_prompt_hidden(model, input_ids, attention_mask, width: int, lengths: list[int],
                          packing_attention: str | None) -> torch.Tensor:
    """[B, W+T] ids and mask (prompt width W), each row's completion length -> [sum(lengths), H] hidden states that
    predict the completion tokens, row by row. Each distinct prompt runs once, its KV cache shared by the rows that
    have it. With a ``packing_attention`` (see _packing_attention), the completions of one prompt are packed several
    to a decoder row, each attending to the prompt and its own earlier tokens, so a short row costs little padding
    (one bench step of SmolLM2, 8 groups of 8 rows up to 64 tokens: 2497 tokens fed in 3960 slots unpacked, 2727
    packed); without, each row is a decoder row of its own, padded to the longest."""
    from transformers import DynamicCache

    device = input_ids.device
    prompts = torch.cat([input_ids[:, :width], attention_mask[:, :width]], 1)
    unique, owner = torch.unique(prompts, dim=0, return_inverse=True)  # owner: Long[B], each row's prompt
    prompt_ids, prompt_mask = unique[:, :width], unique[:, width:]
    owners = owner.tolist()
    # Position j predicts token j + 1: token 0 comes from the prompt's last state, token t from completion state
    # t - 1, so a row feeds all its tokens but the last.
    fed = [max(n - 1, 0) for n in lengths]
    pack = packing_attention is not None
    bin_owner, placed = _pack_rows(owners, fed) if pack else (owners, [(row, 0) for row in range(len(fed))])
    capacity = max(fed)
    sources = torch.zeros(len(bin_owner), capacity, dtype=torch.long)  # where each fed token is in the completions
    segment = torch.full((len(bin_owner), capacity), -1, dtype=torch.long)  # which row each fed token belongs to
    hidden_index = []  # per completion token, its hidden state in [prompts' last states; decoder rows' states]
    positions = torch.zeros_like(sources)
    prompt_lengths = prompt_mask.sum(-1).tolist()
    for row, ((b, offset), count) in enumerate(zip(placed, fed)):
        span = torch.arange(count)
        if count:
            sources[b, offset : offset + count] = row * input_ids.shape[1] + width + span
            segment[b, offset : offset + count] = row
            positions[b, offset : offset + count] = prompt_lengths[owners[row]] + span
        if lengths[row]:
            hidden_index += [torch.tensor([owners[row]]), len(unique) + b * capacity + offset + span]
    fed_ids = input_ids.reshape(-1)[sources.to(device)]  # (a padding slot reads the first prompt token: never attended)
    # One embedding lookup for both decoder calls: each lookup's backward zero-fills a [V, H] gradient.
    embeds = model.get_input_embeddings()(torch.cat([prompt_ids.reshape(-1), fed_ids.reshape(-1)]))
    prompt_embeds, fed_embeds = embeds.split([prompt_ids.numel(), fed_ids.numel()])

    decoder, cache = model.get_decoder(), DynamicCache(config=model.config)
    prompt_hidden = decoder(
        inputs_embeds=prompt_embeds.reshape(*prompt_ids.shape, -1),
        attention_mask=prompt_mask,
        position_ids=position_ids_from_mask(prompt_mask),
        past_key_values=cache,
        use_cache=True,
    ).last_hidden_state
    table = prompt_hidden[:, -1]
    if capacity:
        bins = torch.tensor(bin_owner, device=device)
        cache.batch_select_indices(bins)  # each decoder row gets its prompt's keys and values (indexing keeps the graph)
        segment = segment.to(device)
        if pack:
            additive = packing_attention == "eager"  # eager attention adds its mask to the scores
            mask = _packed_mask(prompt_mask[bins], segment, embeds.dtype if additive else None)
        else:
            mask = torch.cat([prompt_mask[bins], (segment >= 0).long()], -1)
        completion_hidden = decoder(
            inputs_embeds=fed_embeds.reshape(len(bin_owner), capacity, -1),
            attention_mask=mask,
            position_ids=positions.to(device),
            past_key_values=cache,
            use_cache=True,
        ).last_hidden_state
        table = torch.cat([table, completion_hidden.reshape(-1, completion_hidden.shape[-1])])
    return table[torch.cat(hidden_index).to(device)]


def _packed_mask(prompt_mask: torch.Tensor, segment: torch.Tensor, additive: torch.dtype | None) -> torch.Tensor:
    """[n, W] prompt mask, [n, C] row ids (-1 padding) -> [n, 1, C, W+C] mask of what each token may attend to: its
    prompt, and the earlier tokens of its own row. Boolean (True = attend), or 0 / dtype-min in ``additive``."""
    width = segment.shape[1]
    causal = torch.ones(width, width, dtype=torch.bool, device=segment.device).tril()
    own = (segment[:, :, None] == segment[:, None, :]) & causal
    mask = torch.cat([prompt_mask.bool()[:, None, :].expand(-1, width, -1), own], -1)[:, None]
    if additive is None:
        return mask
    return torch.zeros(mask.shape, dtype=additive, device=mask.device).masked_fill_(~mask, torch.finfo(additive).min)


def _whole_rows_hidden(model, input_ids, attention_mask, width: int, used: int) -> torch.Tensor:
    """[B, W+T] ids and mask -> [B, used] hidden states that predict the first ``used`` completion tokens, every row
    through the decoder whole, its layers recomputed in backward."""
    ids, mask = input_ids[:, : width + used - 1], attention_mask[:, : width + used - 1]
    with recomputed_layers(model):
        hidden = model.get_decoder()(
            input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False
        ).last_hidden_state
    return hidden[:, width - 1 :]


@contextlib.contextmanager
def recomputed_layers(model: torch.nn.Module) -> Iterator[None]:
    """transformers recomputes a checkpointed layer only while that layer is in training mode. Set the layers' own
    flag, not their children's: attention and dropout stay in eval mode (no dropout, as in every other forward)."""
    layers = [m for m in model.modules() if getattr(m, "gradient_checkpointing", None) is True]
    modes = [layer.training for layer in layers]
    for layer in layers:
        layer.training = True
    try:
        yield
    finally:
        for layer, mode in zip(layers, modes):
            layer.training = mode


def stop_token_ids(model, tokenizer) -> list[int]:
    """The tokenizer's EOS and the model's generation_config EOS ids (Qwen2.5: <|im_end|> and <|endoftext|>),
    the ids model.generate and vllm stop at, so both rollout backends end rows where the env does."""
    generation = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    listed = generation if isinstance(generation, (list, tuple)) else [generation]
    ids = {tokenizer.eos_token_id, *listed} - {None}
    return sorted(i for i in ids if 0 <= i < len(tokenizer))
