"""`launch export`: a run's trained weights in the formats other tools load."""
