"""The gateway backend: kernels run by a Jupyter Enterprise Gateway (or Jupyter Server), driven
over its REST API and one websocket per kernel (docs/scale-out.md)."""
