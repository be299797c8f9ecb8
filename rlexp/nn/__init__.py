"""Layer 1, the networks: the component protocol, activations, initializers, layers and norms, the composed
networks (MLP, convolutional, recurrent) and their registry, target updates, host acting."""
