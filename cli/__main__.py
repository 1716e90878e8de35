"""`python -m cli` runs the `slicex` command (how tests and `slicex up` start actor processes)."""

from cli.main import main

raise SystemExit(main())
