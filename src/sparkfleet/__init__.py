"""sparkfleet: launch, stage, verify, benchmark and evaluate multi-node LLM serving deployments."""

__version__ = "0.1.0"
