import sys

from pipefill.cli import main

sys.exit(main())
