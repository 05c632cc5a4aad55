"""`jaxpod rl ARGS` as a script, for launched test clusters (each host runs it)."""
import sys

from jaxpod.cli.main import main

if __name__ == "__main__":
  sys.exit(main(["rl", *sys.argv[1:]]))
