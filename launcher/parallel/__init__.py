"""The device mesh and its named dimensions, and the tensor-parallel plans per model family.

Above models/ (a plan knows a model's layers), below engines/ (an engine composes FSDP2 or a
data-parallel all-reduce over the mesh's data-parallel dimension). Everything that imports
DTensor is imported inside the tp path: a run with parallel.tp=1 imports nothing more.
"""
