"""A user's own project: a model package trained by `launch` (see ../README.md)."""
