"""``python -m dpbook.doctor``: what this machine can run and which mode each part of the book
takes here (the logic is ``dpbook.tools.doctor``)."""

import sys

from .tools.doctor import main

if __name__ == "__main__":
    sys.exit(main())
