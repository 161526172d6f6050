"""Models: loading a policy (loading.py: the embedded default or a local directory), the policy's log-probs and head
(policy.py), PPO's critic (value.py) and learned reward models (reward.py)."""
