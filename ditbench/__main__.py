import sys

from ditbench.cli import main

sys.exit(main())
