import sys

from chiptrace.cli import main

sys.exit(main())
