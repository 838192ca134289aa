"""What a run reports: console progress, metrics.jsonl and summary.json, wandb, FLOPs and MFU."""
