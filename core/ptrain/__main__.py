import sys

from ptrain.cli import main

sys.exit(main())
