"""The fork-server template: the process that forks kernels, its host-side client, heap
filling and isolation."""
