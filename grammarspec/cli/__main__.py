"""``python -m grammarspec.cli``: the command line."""

from grammarspec.cli.main import main

raise SystemExit(main())
