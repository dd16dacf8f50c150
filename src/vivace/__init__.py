"""vivace: train fast coding agents with reinforcement learning in real sandboxed environments."""

__version__ = "0.1.0"
