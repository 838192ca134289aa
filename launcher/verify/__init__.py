"""`launch verify`: certify that a split trains the same model as one big batch."""
