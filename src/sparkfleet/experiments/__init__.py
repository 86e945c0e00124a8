"""A/B experiments between recipe variants: the runner, its verdict rule, storage and report."""
