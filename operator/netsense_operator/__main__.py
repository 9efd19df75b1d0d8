import sys

from netsense_operator.main import main

sys.exit(main())
