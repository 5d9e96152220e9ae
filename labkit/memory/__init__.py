"""Where training memory goes, predicted and measured (notebooks 02 and 11), read in one direction:
probe (run a model's forward without side effects) < timeline (the layer-by-layer replay of a step's peak) <
workspaces (cuDNN's, measured per layer on a GPU) < model (parameters, gradients, optimizer state, activations)
< checks (the model against what a real step allocates); host and device measure what a process really holds.
"""

# the modules a learner uses (what the notebooks import; docs/api.md lists their names, one line each)
__all__ = ["checks", "host", "model"]
