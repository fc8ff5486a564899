"""Communication: moving activations and gradients between ranks (in-memory or torch.distributed),
with optional precision compression (APC) and injected delays for tests."""
