"""The `slicex` command line: the one package that may import every actor (the kernel `slicex/` imports none)."""
