"""What runs on each rank: init, build, train loop, teardown. `python -m launcher.worker CONFIG`."""
