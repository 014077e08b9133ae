import sys

from kvlib.course.cli import main

sys.exit(main())
