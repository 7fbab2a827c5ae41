import sys

from .export import main

sys.exit(main())
