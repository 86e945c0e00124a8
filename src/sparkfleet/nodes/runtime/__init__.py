"""Ways to run one rank on a node: ``docker`` containers and host ``process`` groups."""
