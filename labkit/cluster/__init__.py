"""Many machines on one box: emulated nodes (network namespaces and a shaped link), jobs launched per node with
torchrun, the link measured and modelled, and the scripts a real cluster runs (notebook 12)."""
