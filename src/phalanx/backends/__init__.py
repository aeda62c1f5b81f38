"""Backends: how N node agents are started somewhere. See ``base.Backend`` for the contract."""
