import sys

from aprof.cli import main

sys.exit(main())
