"""``python -m trn2core``: the same command line as the ``trn2core`` console script."""

from .cli import main

raise SystemExit(main())
