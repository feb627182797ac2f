"""`python -m flashcheck ...` is the `flashcheck` command."""
import sys

from flashcheck.cases.cli import main

sys.exit(main())
