"""The only place that touches a node: Transports (local, ssh, a scripted mock), Runtimes
(docker, process), the fan-out over nodes, instance markers, and the code shipped to nodes."""
