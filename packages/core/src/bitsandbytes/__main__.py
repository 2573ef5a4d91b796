import sys

from bitsandbytes.diagnostics.main import main

if __name__ == "__main__":
    sys.exit(main())
