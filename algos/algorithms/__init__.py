"""The algorithms: each is credit assignment plus a per-micro-batch loss over algos.core, and presets, on the shared
update engine (algos.learn) and run loop (algos.run). grpo.py (GRPO, DAPO, Dr. GRPO, RLOO, REINFORCE++), ppo.py
(PPO with GAE and a critic), dpo.py (offline and online DPO)."""
