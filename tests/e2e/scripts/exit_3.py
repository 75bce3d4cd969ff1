"""A script whose own exit code is 3 (the code potluck's planned stop also uses)."""

import sys

print("the script chose exit code 3", flush=True)
sys.exit(3)
