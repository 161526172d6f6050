"""The agents and everything they train on, in layers that import downward only (pyproject.toml's import-linter
contracts): cli > algorithms > run > learn | rollout > model > system > config > core."""
