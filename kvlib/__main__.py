import sys

from kvlib.app.cli import main

sys.exit(main())
