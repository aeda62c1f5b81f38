"""Moving bytes: the state directory to and from object storage (fsspec). Channels grow here."""
