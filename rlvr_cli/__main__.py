"""`python -m rlvr_cli ...` runs the `rlvr` command."""

from rlvr_cli import main

raise SystemExit(main())
