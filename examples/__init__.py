"""Runnable examples for graceful: an OpenAI-compatible inference server and Kubernetes manifests."""
