"""Training on one rank: batch arithmetic, the token-exact loss, optimizer and schedule, step
timing, and the loop that runs one optimizer step per global batch."""
