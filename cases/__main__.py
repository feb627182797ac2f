import sys

from cases.cli import main

sys.exit(main())
