"""launcher: Hydra-configured distributed training for PyTorch with a token-exact loss."""

__version__ = "0.1.0"
