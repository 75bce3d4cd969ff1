"""``python -m potluck ...`` is the same as the ``potluck`` command."""

from potluck.cli import main

raise SystemExit(main())
