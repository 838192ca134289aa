"""Generation with continuous batching (`launch generate`) and serving (`launch serve`)."""
