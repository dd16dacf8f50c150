"""Sampling: the token-in/token-out engine, sampler backends and the OpenAI-compatible server."""
