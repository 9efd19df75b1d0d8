import sys

from netsense.cli import main

sys.exit(main())
