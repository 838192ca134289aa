"""What cannot change unnoticed: checkpoint files (a digest each, checked on every load) and the
data a run read (its sources' digests, compared on resume)."""
