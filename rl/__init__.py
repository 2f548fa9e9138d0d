"""Federated reinforcement learning on securefed: FedHPD and its baselines."""
