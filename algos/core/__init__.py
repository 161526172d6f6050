"""Pure tensor functions shared by every agent (GRPO, DAPO, PPO).

No models, no environments, no state: tensors in, tensors out, shapes in each
function's one-line docstring. B = rows (completions), T = completion tokens,
V = vocabulary, H = hidden size, G = group size.
"""
