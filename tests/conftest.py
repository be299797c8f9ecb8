import torch

from rlexp.registry import register

torch.set_num_threads(1)
register()  # the schemas and resolvers every test that composes a config needs
