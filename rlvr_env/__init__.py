"""Reasoning tasks as Gymnasium environments."""
