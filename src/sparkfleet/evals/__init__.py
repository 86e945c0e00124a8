"""Quality, needle and memory-guard evaluations of a deployment or an endpoint."""
